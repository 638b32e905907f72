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

from ..core.sizing import CalibrationPlacement, StageMemory
from ..errors import InputError
from ..facts.geometry import DTYPE_BYTES, ModelShape, kv_heads_per_rank
from ..facts.gpus import GPU
from ..facts.recipes import KV_MIN_SM, RECIPE_MIN_SM
from .weights import WeightBreakdown, weight_bytes

GiB = 1 << 30
KiB = 1 << 10


OMIT_NONE = {"omit_none": True}  # field metadata: left out of the JSON when None (a field of the other device's plan)


def to_doc(x: Any) -> Any:
    """The JSON value of a plan record: its ``to_json``, else a dataclass's fields in order (one marked
    :data:`OMIT_NONE` left out when None); lists and dicts of them likewise."""
    if hasattr(x, "to_json"):
        return x.to_json()
    if dataclasses.is_dataclass(x):
        return {f.name: to_doc(v) for f in dataclasses.fields(x) if (v := getattr(x, f.name)) is not None or "omit_none" not in f.metadata}
    if isinstance(x, (list, tuple)):
        return [to_doc(v) for v in x]
    if isinstance(x, dict):
        return {k: to_doc(v) for k, v in x.items()}
    return x


@dataclasses.dataclass(frozen=True)
class VisibleGpu:
    """A GPU visible on this host (``nvidia-smi``) and its free memory now (None when unreadable)."""

    name: str | None
    memory_bytes: int
    free_bytes: int | None


@dataclasses.dataclass(frozen=True)
class HostCpu:
    """The host CPU a CPU plan runs on: its RAM (total, available now) and the measured memory bandwidth."""

    name: str
    memory_bytes: int | None
    available_bytes: int | None
    bandwidth_gb_s: float
    bandwidth_source: str


@dataclasses.dataclass(frozen=True)
class CpuMemory:
    """Host memory of a CPU plan: weights + the static KV cache + activations against the host's RAM."""

    host_bytes: int | None
    available_bytes: int | None
    weights_bytes: int
    kv_cache_bytes: int
    activations_bytes: int
    total_needed_bytes: int


@dataclasses.dataclass(frozen=True)
class GpuMemory:
    """Memory of one GPU rank: weights + activations + runtime, the free rest and the KV pool taken from it."""

    gpu_bytes: int
    weights_bytes: int
    activations_bytes: int
    runtime_overhead_bytes: int
    free_after_load_bytes: int
    kv_pool_bytes: int
    unused_bytes: int


@dataclasses.dataclass(frozen=True)
class PlanTarget:
    """What the plan is for: ``kind`` (``gpu``/``cpu``) and why, the GPUs visible here, and the device planned on
    (``None``: no GPU named or visible, the plan is ``unplanned``); in the JSON the device's fields follow ``gpus``."""

    kind: str
    why: str
    gpus: tuple[VisibleGpu, ...] = ()
    device: GPU | HostCpu | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "why": self.why, "gpus": to_doc(self.gpus), **(to_doc(self.device) if self.device else {})}


@dataclasses.dataclass(frozen=True)
class PlanModel:
    """The model's shape as planned (:class:`~pipeline.facts.geometry.ModelShape`) and where it was read from."""

    source: str
    architecture: str
    num_parameters: int
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    rope_type: str | None
    rope_factor: float
    max_seq_len_limit: int


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """The config values the plan used (``max_seq_len`` as set, without the draft tokens)."""

    recipe: str
    kv_cache: str
    high_precision_dtype: str
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int
    max_num_tokens: int
    tokens_per_block: int
    kv_cache_free_gpu_mem_fraction: float
    max_beam_width: int
    build: str
    allow_unsafe_lengths: bool


@dataclasses.dataclass(frozen=True)
class PlanWeights:
    """Weight bytes: whole, quantized, high precision, the fullest rank (and each pipeline stage's: GPU plans only)."""

    total_bytes: int
    quantized_bytes: int
    high_precision_bytes: int
    per_rank_bytes: int
    per_stage_rank_bytes: list[int] | None = dataclasses.field(metadata=OMIT_NONE)
    high_precision_modules: list[str]
    bits_per_param: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanKvCache:
    """The KV cache: dtype, bytes per element, token (model, rank), paged block (GPU), sequence and all slots (CPU)."""

    dtype: str
    bytes_per_element: int
    bytes_per_token_model: int
    bytes_per_token_rank: int
    tokens_per_block: int | None = dataclasses.field(default=None, metadata=OMIT_NONE)
    bytes_per_block_rank: int | None = dataclasses.field(default=None, metadata=OMIT_NONE)
    blocks_per_sequence: int | None = dataclasses.field(default=None, metadata=OMIT_NONE)
    bytes_per_sequence_rank: int
    bytes_all_slots: int | None = dataclasses.field(default=None, metadata=OMIT_NONE)


@dataclasses.dataclass(frozen=True)
class PlanCapacity:
    """The KV pool in blocks and tokens (GPU plans only), sequences of ``max_seq_len`` that fit, the concurrency."""

    kv_blocks: int | None = dataclasses.field(metadata=OMIT_NONE)
    kv_tokens: int | None = dataclasses.field(metadata=OMIT_NONE)
    max_sequences_at_max_seq_len: int | None
    max_batch_size: int
    effective_concurrency: int


@dataclasses.dataclass(frozen=True)
class Roofline:
    """The memory-bound decode bound at ``batch`` sequences of ``context_tokens`` each (:func:`roofline`)."""

    batch: int
    context_tokens: int
    bytes_per_step: int
    step_s_min: float
    tok_s_per_seq_max: float
    tok_s_aggregate_max: float


@dataclasses.dataclass(frozen=True)
class PlanDecode:
    """The decode bound at batch 1 and at full concurrency (None without a bandwidth) and what it assumes."""

    bandwidth_bytes_s: float
    batch1: Roofline | None
    full: Roofline | None
    weights_only_step_s_min: float | None
    assumption: str


@dataclasses.dataclass(frozen=True)
class PlannedCalibration(CalibrationPlacement):
    """A :class:`pipeline.core.sizing.CalibrationPlacement` and where calibration runs, its dtype and the model's bytes
    in it; in the JSON those three come first."""

    device: str
    dtype: str
    model_bytes: int

    def to_json(self) -> dict[str, Any]:
        first = ("device", "dtype", "model_bytes")
        return {k: getattr(self, k) for k in (*first, *(f.name for f in dataclasses.fields(CalibrationPlacement)))}


@dataclasses.dataclass(frozen=True)
class PlanStages:
    """Each stage's predicted peak memory (:mod:`pipeline.core.sizing`), the host's RAM, the calibration when it runs."""

    host_total_bytes: int | None
    predicted: dict[str, StageMemory]
    calibration_placement: PlannedCalibration | None = dataclasses.field(default=None, metadata=OMIT_NONE)


@dataclasses.dataclass
class Plan:
    """The memory/speed plan.  ``status`` is ``ok``, ``warn`` (works but tight: see ``warnings``),
    ``refused`` (cannot work: ``refusals`` carry the numbers) or ``unplanned`` (no target to plan for:
    see ``notes``; the device's sections are None, ``{}`` in the JSON).  All sizes are bytes, times seconds, rates
    tokens/s."""

    status: str
    target: PlanTarget
    model: PlanModel
    config: PlanConfig
    weights: PlanWeights | None = None
    kv_cache: PlanKvCache | None = None
    memory: GpuMemory | CpuMemory | None = None
    capacity: PlanCapacity | None = None
    decode: PlanDecode | None = None
    refusals: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    stages: PlanStages | None = None

    def settle(self) -> Plan:
        """``status`` from what was found: ``refused`` with refusals, else ``warn`` with warnings, else ``ok``."""
        self.status = "refused" if self.refusals else ("warn" if self.warnings else "ok")
        return self

    def to_json(self) -> dict[str, Any]:
        """The plan document (schema ``pipeline.plan/v1``): ``plan.json``, ``pipeline plan --json``, the run summary."""
        d = {f.name: {} if (v := getattr(self, f.name)) is None else to_doc(v) for f in dataclasses.fields(self)}
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


def roofline(weights_slice: int, kv_tok_slice: int, context: int, batch: int, bw: float) -> Roofline | None:
    """The memory-bound decode bound at ``batch`` sequences of ``context`` tokens (module docstring); None without a bandwidth."""
    if bw <= 0 or batch < 1:
        return None
    step_bytes = weights_slice + batch * kv_tok_slice * context
    t = step_bytes / bw
    return Roofline(batch, context, int(step_bytes), t, 1.0 / t, batch / t)


def decode_doc(slice_bytes: int, kv_tok_slice: int, k: Knobs, concurrency: int, bw: float, assumption: str) -> PlanDecode:
    """``Plan.decode``: the roofline of a ``slice_bytes`` weight slice at batch 1 and at ``concurrency`` sequences of
    ``max_seq_len`` (None without a bandwidth), and the weights-only step."""
    one, full = (roofline(slice_bytes, kv_tok_slice, k.max_seq_len, n, bw) for n in (1, concurrency))
    return PlanDecode(bw, one, full, slice_bytes / bw if bw > 0 else None, assumption)


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


def weights_doc(w: WeightBreakdown, per_rank_bytes: int, per_stage_rank_bytes: list[int] | None = None) -> PlanWeights:
    """``Plan.weights`` of a breakdown (``per_stage_rank_bytes`` only where pipeline stages are planned: GPU)."""
    bits = round(8 * w.total_bytes / max(1, w.num_parameters), 3)
    return PlanWeights(
        w.total_bytes, w.quantized_bytes, w.high_precision_bytes, per_rank_bytes, per_stage_rank_bytes, w.high_precision_modules, bits
    )


def kv_doc(k: Knobs, shape: ModelShape, bytes_per_token_rank: int, **device: Any) -> PlanKvCache:
    """``Plan.kv_cache``: dtype, element bytes, bytes per token (model and rank), both devices; ``device``: the fields
    of the GPU's paged blocks or the CPU's static slots, and bytes per sequence."""
    dtype = k.kv_cache if k.kv_cache != "none" else k.hp_dtype
    per_token_model = shape.kv_bytes_per_token(kv_elem_bytes(k))
    return PlanKvCache(
        dtype=dtype,
        bytes_per_element=kv_elem_bytes(k),
        bytes_per_token_model=per_token_model,
        bytes_per_token_rank=bytes_per_token_rank,
        **device,
    )
