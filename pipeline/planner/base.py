"""What a plan is computed from and what it writes: the config's knobs (:class:`Knobs`), the plan document
(:class:`Plan`), the formulas both device plans share (KV element bytes, activations, the decode roofline) and byte units.

Rule: the GPU plan (:mod:`.gpu`), the CPU plan (:mod:`.cpu`) and the stages' memory (:mod:`.stages`) read and write
only these types; :func:`pipeline.planner.plan.plan` puts them together.

Formulas and sources:

* **KV cache** per token element: FP8/INT8 KV = 1 byte, else the export dtype (TensorRT-LLM memory.md;
  docs/reference/tensorrt_llm.md §5).
* **Activations**: with packed input and paged KV, TensorRT fixes activation memory at build time
  from ``max_num_tokens`` (TensorRT-LLM memory.md; NVIDIA/TensorRT-LLM issue #1222).  Estimate: ``max_num_tokens`` x (2 x hidden
  + q/k/v width + 2 x intermediate) / TP x activation bytes (the live tensors of one decoder layer)
  + fp32 logits for ``max_batch_size`` rows.  An estimate, not TensorRT's number.
* **Decode roofline**: one decode step must read every weight of a rank once and each sequence's KV
  cache; time >= bytes / memory bandwidth (the memory-bound lower bound).  Reported at batch 1 and
  at the largest concurrency that fits, with every sequence at ``max_seq_len`` (worst case).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..errors import InputError
from ..facts.geometry import DTYPE_BYTES, ModelShape, kv_heads_per_rank
from ..facts.recipes import KV_MIN_SM, RECIPE_MIN_SM
from .weights import WeightBreakdown, weight_bytes

GiB = 1 << 30
KiB = 1 << 10


@dataclasses.dataclass
class Plan:
    """The memory/speed plan.  ``status`` is ``ok``, ``warn`` (works but tight: see ``warnings``),
    ``refused`` (cannot work: ``refusals`` carry the numbers) or ``unplanned`` (no target to plan for:
    see ``notes``).  All sizes are bytes, times seconds, rates tokens/s."""

    status: str
    target: dict[str, Any]
    model: dict[str, Any]
    config: dict[str, Any]
    weights: dict[str, Any] = dataclasses.field(default_factory=dict)
    kv_cache: dict[str, Any] = dataclasses.field(default_factory=dict)
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)
    capacity: dict[str, Any] = dataclasses.field(default_factory=dict)
    decode: dict[str, Any] = dataclasses.field(default_factory=dict)
    refusals: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    stages: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Predicted peak memory of each pipeline stage on this host (:mod:`pipeline.core.sizing`)."""

    def settle(self) -> Plan:
        """``status`` from what was found: ``refused`` with refusals, else ``warn`` with warnings, else ``ok``."""
        self.status = "refused" if self.refusals else ("warn" if self.warnings else "ok")
        return self

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["schema"] = "pipeline.plan/v1"
        return d


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The config values a plan reads, normalised (:func:`knobs`); ``max_seq_len`` includes the draft tokens."""

    recipe: str
    kv_cache: str
    hp_dtype: str
    group_size: int
    exclude: tuple[str, ...]
    sensitive: str
    tp: int
    pp: int
    max_batch_size: int
    max_seq_len: int
    max_input_len: int
    max_num_tokens: int
    tokens_per_block: int
    fraction: float
    beam: int


def knobs(cfg: Any, kind: str) -> Knobs:
    """The :class:`Knobs` of ``cfg`` for a ``kind`` (``gpu``/``cpu``) plan.

    Raises:
        InputError: an unknown recipe, KV cache dtype or high-precision dtype, naming the field.
    """
    q, b = cfg.quant, cfg.build
    hp_field = "quant.export_dtype" if kind == "gpu" or q.recipe != "none" else "model.dtype"
    hp = q.export_dtype if hp_field == "quant.export_dtype" else cfg.model.dtype
    if hp not in ("float16", "bfloat16", "float32"):
        raise InputError(f"{hp_field}={hp!r}: must be float16, bfloat16 or float32.")
    if q.recipe not in RECIPE_MIN_SM:
        raise InputError(f"quant.recipe={q.recipe!r}: unknown; use one of {sorted(RECIPE_MIN_SM)}.")
    if q.kv_cache_dtype not in KV_MIN_SM:
        raise InputError(f"quant.kv_cache_dtype={q.kv_cache_dtype!r}: unknown; use one of {sorted(KV_MIN_SM)}.")
    return Knobs(
        q.recipe,
        q.kv_cache_dtype,
        hp,
        max(1, q.group_size),
        tuple(str(x) for x in q.exclude_modules or ()),
        q.sensitive_preset,
        max(1, cfg.parallel.tp_size),
        max(1, cfg.parallel.pp_size),
        max(1, b.max_batch_size),
        max(1, b.max_seq_len + max(0, b.speculative.max_draft_len)),
        b.max_input_len,
        max(1, b.max_num_tokens),
        max(1, b.tokens_per_block),
        min(1.0, max(0.0, b.kv_cache_free_gpu_mem_fraction)),
        max(1, b.max_beam_width),
    )


def kv_elem_bytes(k: Knobs) -> int:
    """Bytes of one KV-cache element (module docstring)."""
    return 1 if k.kv_cache in ("fp8", "int8") else DTYPE_BYTES[k.hp_dtype]


def activation_bytes(shape: ModelShape, k: Knobs) -> int:
    """Activation memory fixed at build time (module docstring)."""
    act = DTYPE_BYTES[k.hp_dtype]
    qkv = (math.ceil(shape.num_heads / k.tp) + 2 * kv_heads_per_rank(shape.num_kv_heads, k.tp)) * shape.head_dim
    per_tok = 2 * shape.hidden_size + qkv + 2 * math.ceil(shape.intermediate_size / k.tp)
    logits = k.max_batch_size * k.beam * math.ceil(shape.vocab_size / k.tp) * 4
    return int(k.max_num_tokens * per_tok * act + logits)


def roofline(weights_slice: int, kv_tok_slice: int, context: int, batch: int, bw: float) -> dict[str, float] | None:
    """The memory-bound decode bound at ``batch`` sequences of ``context`` tokens (module docstring); None without a bandwidth."""
    if bw <= 0 or batch < 1:
        return None
    step_bytes = weights_slice + batch * kv_tok_slice * context
    t = step_bytes / bw
    return {
        "batch": batch,
        "context_tokens": context,
        "bytes_per_step": int(step_bytes),
        "step_s_min": t,
        "tok_s_per_seq_max": 1.0 / t,
        "tok_s_aggregate_max": batch / t,
    }


def gib(b: float | int | None) -> str:
    """``1.23 GiB`` (``?`` when unknown), for messages."""
    if b is None:
        return "?"
    return f"{b / GiB:.2f} GiB"


def fmt_bytes(b: float | int | None) -> str:
    """Human-readable size (binary units)."""
    if b is None:
        return "-"
    b = float(b)
    for unit, f in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", KiB)):
        if abs(b) >= f:
            return f"{b / f:.2f} {unit}"
    return f"{int(b)} B"


def weights_of(shape: ModelShape, k: Knobs, *, recipe: str | None = None, parallel: bool = True) -> WeightBreakdown:
    """:func:`.weights.weight_bytes` of ``shape`` under the knobs ``k`` (``recipe`` instead of ``k.recipe`` when given;
    over ``k.tp`` x ``k.pp`` ranks, or one with ``parallel=False``)."""
    tp, pp = (k.tp, k.pp) if parallel else (1, 1)
    return weight_bytes(
        shape,
        recipe or k.recipe,
        hp_dtype=k.hp_dtype,
        group_size=k.group_size,
        exclude=list(k.exclude),
        sensitive=k.sensitive,
        tp=tp,
        pp=pp,
    )


def weights_doc(w: WeightBreakdown, per_rank_bytes: int, per_stage_rank_bytes: list[int] | None = None) -> dict[str, Any]:
    """``Plan.weights`` of a breakdown (``per_stage_rank_bytes`` only where pipeline stages are planned: GPU)."""
    doc: dict[str, Any] = {
        "total_bytes": w.total_bytes,
        "quantized_bytes": w.quantized_bytes,
        "high_precision_bytes": w.high_precision_bytes,
        "per_rank_bytes": per_rank_bytes,
    }
    if per_stage_rank_bytes is not None:
        doc["per_stage_rank_bytes"] = per_stage_rank_bytes
    doc["high_precision_modules"] = w.high_precision_modules
    doc["bits_per_param"] = round(8 * w.total_bytes / max(1, w.num_parameters), 3)
    return doc


def kv_doc(k: Knobs, shape: ModelShape, bytes_per_token_rank: int) -> dict[str, Any]:
    """The first fields of ``Plan.kv_cache``, both devices: dtype, element bytes, bytes per token (model and rank)."""
    return {
        "dtype": k.kv_cache if k.kv_cache != "none" else k.hp_dtype,
        "bytes_per_element": kv_elem_bytes(k),
        "bytes_per_token_model": shape.kv_bytes_per_token(kv_elem_bytes(k)),
        "bytes_per_token_rank": bytes_per_token_rank,
    }
