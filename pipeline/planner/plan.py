"""Memory and speed plan: weights, KV cache, activations, capacity and a decode roofline.

Every formula and its source:

* **Weights** per recipe = sum over linear layers of the packed weight bytes plus their scales, plus
  the layers kept in high precision (embeddings, norms, biases, ``quant.exclude_modules`` such as
  ``lm_head``, ``quant.sensitive_preset`` layers) in ``quant.export_dtype``.  Packed sizes: FP8 and
  INT8 1 byte, INT4 0.5 byte per weight; scales as ModelOpt exports them for TensorRT-LLM
  (docs/reference/tensorrt_llm.md §3): FP8 one fp32 weight scale and one fp32 activation
  scale per layer; INT8 per-output-channel fp32 weight scales (SmoothQuant adds per-input-channel
  smoothing scales); INT4 AWQ/WO one fp16 scale per ``quant.group_size`` inputs per output channel
  (AWQ adds an fp16 ``prequant_scaling_factor`` per input channel; W4A8 adds an fp32 activation scale).
* **Sharding** (TensorRT-LLM checkpoint layout, docs/source/legacy/architecture/checkpoint.md): column-parallel layers (q, k, v, gate, up)
  split their outputs, row-parallel layers (o, down) their inputs over ``parallel.tp_size``; K/V heads are
  replicated when TP exceeds their count; ``lm_head`` is split along the vocabulary (padded to a
  multiple of TP); the embedding table is replicated (``use_parallel_embedding`` is off by default).
  Pipeline parallelism splits decoder layers as evenly as possible; the embedding sits on the first
  stage, ``lm_head`` and the final norm on the last.  The plan reports the fullest rank.
* **KV cache** per token = 2 x layers x KV heads x head_dim x bytes per element (TensorRT-LLM memory.md; docs/reference/tensorrt_llm.md §5);
  FP8/INT8 KV = 1 byte, else the export dtype.  The pool holds whole blocks of ``tokens_per_block``.
* **Activations**: with packed input and paged KV, TensorRT fixes activation memory at build time
  from ``max_num_tokens`` (TensorRT-LLM memory.md; NVIDIA/TensorRT-LLM issue #1222).  Estimate: ``max_num_tokens`` x (2 x hidden
  + q/k/v width + 2 x intermediate) / TP x activation bytes (the live tensors of one decoder layer)
  + fp32 logits for ``max_batch_size`` rows.  An estimate, not TensorRT's number.
* **KV capacity**: TensorRT-LLM allocates ``kv_cache_free_gpu_mem_fraction`` of the memory left after
  weights, activations and runtime buffers (memory.md).  Runtime buffers: ``RUNTIME_OVERHEAD_BYTES``
  (assumption: CUDA context + cuBLAS workspaces, about 1 GiB) + per-sequence decoder buffers.
* **Decode roofline**: one decode step must read every weight of a rank once and each sequence's KV
  cache; time >= bytes / memory bandwidth (the memory-bound lower bound).  Reported at batch 1 and
  at the largest concurrency that fits, with every sequence at ``max_seq_len`` (worst case).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any

from ..core.hostinfo import local_gpus
from ..core.sizing import host_memory, host_memory_bandwidth_gbs, load_shape, plan_device
from ..errors import InputError
from ..facts.geometry import DTYPE_BYTES, Linear, ModelShape, kv_heads_per_rank
from ..facts.gpus import GPU, lookup
from ..facts.recipes import KV_MIN_SM, RECIPE_MIN_SM, RECIPES

GiB = 1 << 30
KiB = 1 << 10
RUNTIME_OVERHEAD_BYTES = 1 * GiB
"""Assumed CUDA context + cuBLAS/TensorRT workspaces per GPU (not published by TensorRT-LLM; an
estimate of the usual 0.3-0.5 GiB context plus workspaces)."""
TP_CHOICES = (1, 2, 4, 8)
FEW_SEQUENCES = 4
"""Fewer sequences than this at max_seq_len makes the plan 'barely works'."""


# --------------------------------------------------------------------------- inputs


# --------------------------------------------------------------------------- host


# --------------------------------------------------------------------------- weights
def _high_precision(lin: Linear, shape: ModelShape, exclude: list[str], sensitive: str) -> bool:
    names: tuple[str, ...]
    if lin.name == "lm_head":
        names = ("lm_head",)
    else:
        names = (lin.name, lin.name.split(".")[-1])
    if any(fnmatch.fnmatchcase(n, pat) for n in names for pat in exclude):
        return True
    if sensitive in ("first_last", "first_last_attn_out") and lin.layer in (0, shape.num_layers - 1):
        return True
    if sensitive in ("attn_out", "first_last_attn_out") and lin.name.endswith("o_proj"):
        return True
    return False


def _linear_bytes(out_f: int, in_f: int, recipe: str, hp_bytes: float, group: int) -> float:
    """Bytes of one (out_f x in_f) weight under ``recipe`` including its scales (module docstring)."""
    n = out_f * in_f
    if recipe == "auto":  # planned as int8 weight-only: an upper bound at the default 8-bit budget (quant.auto)
        recipe = "int8_wo"
    if recipe == "none":
        return n * hp_bytes
    if recipe == "fp8":
        return n + 2 * 4
    if recipe == "int8_wo":
        return n + out_f * 4
    if recipe == "int8_sq":
        return n + out_f * 4 + in_f * 4
    if recipe in RECIPES and RECIPES[recipe].grouped:  # int4_awq, int4_rtn (int4_wo), w4a8_awq
        b = n / 2 + math.ceil(in_f / group) * out_f * 2
        if recipe in ("int4_awq", "w4a8_awq"):
            b += in_f * 2
        if recipe == "w4a8_awq":
            b += 4
        return b
    raise InputError(f"quant.recipe={recipe!r}: unknown recipe")


def _shard(lin: Linear, shape: ModelShape, tp: int) -> tuple[int, int]:
    """(out, in) features of ``lin`` on one TP rank (see module docstring)."""
    if tp == 1:
        return lin.out_features, lin.in_features
    if lin.split == "col":
        return math.ceil(lin.out_features / tp), lin.in_features
    if lin.split == "row":
        return lin.out_features, math.ceil(lin.in_features / tp)
    if lin.split == "kv":
        return kv_heads_per_rank(shape.num_kv_heads, tp) * shape.head_dim, lin.in_features
    if lin.split == "qkv":
        return (math.ceil(shape.num_heads / tp) + 2 * kv_heads_per_rank(shape.num_kv_heads, tp)) * shape.head_dim, lin.in_features
    if lin.split == "vocab":
        return math.ceil(shape.vocab_size / tp), lin.in_features
    return lin.out_features, lin.in_features


@dataclasses.dataclass
class WeightBreakdown:
    """Bytes per pipeline stage on one TP rank (``stages[i]``) and the totals (whole model, 1 rank)."""

    total_bytes: int
    quantized_bytes: int
    high_precision_bytes: int
    per_stage_rank_bytes: list[int]
    high_precision_modules: list[str]
    num_parameters: int

    @property
    def max_rank_bytes(self) -> int:
        return max(self.per_stage_rank_bytes)

    @property
    def tp_slice_bytes(self) -> int:
        """All stages of one TP slice: what one token's decode step reads end to end."""
        return sum(self.per_stage_rank_bytes)


def stage_layers(num_layers: int, pp: int) -> list[list[int]]:
    """Decoder layer indices per pipeline stage (as even as possible, earlier stages get the extra)."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def _smaller_weights_fix(shape: ModelShape, k: Any, host_total: int) -> str:
    """The fix for weights that do not fit the host's RAM: int4 weights when they would fit, else a larger host."""
    if "int4" in str(k.recipe):
        return "a larger host (the weights are already int4)."
    int4 = weight_bytes(shape, "int4_awq", hp_dtype=k.hp_dtype, group_size=k.group_size, exclude=list(k.exclude), sensitive=k.sensitive)
    if int4.total_bytes < host_total:
        return f"quant=int4_awq ({_gib(int4.total_bytes)} of weights) or a larger host."
    return f"a larger host (even int4 weights need {_gib(int4.total_bytes)})."


def weight_bytes(
    shape: ModelShape,
    recipe: str,
    *,
    hp_dtype: str = "float16",
    group_size: int = 128,
    exclude: list[str] | None = None,
    sensitive: str = "none",
    tp: int = 1,
    pp: int = 1,
) -> WeightBreakdown:
    """Weight bytes of ``shape`` under ``recipe`` (see module docstring), whole model and per rank.

    Args:
        hp_dtype: dtype of the tensors kept in high precision (``quant.export_dtype``).
        exclude: fnmatch patterns of modules kept in high precision (``quant.exclude_modules``).
        tp, pp: tensor / pipeline parallel sizes.
    Returns: :class:`WeightBreakdown` (bytes, ints).
    """
    hp = DTYPE_BYTES[hp_dtype]
    exclude = list(exclude or [])
    stages = stage_layers(shape.num_layers, pp)
    layer_stage = {L: s for s, ls in enumerate(stages) for L in ls}
    per_stage = [0.0] * pp
    total = quant = hpb = 0.0
    hp_modules: list[str] = []
    for lin in shape.linears():
        # a tied lm_head is still counted: the engine keeps its own (vocab-parallel) copy on the last stage
        keep = recipe == "none" or _high_precision(lin, shape, exclude, sensitive)
        r = "none" if keep else recipe
        b_full = _linear_bytes(lin.out_features, lin.in_features, r, hp, group_size)
        o, i = _shard(lin, shape, tp)
        b_rank = _linear_bytes(o, i, r, hp, group_size)
        if lin.bias:
            b_full += lin.out_features * hp
            b_rank += o * hp
        total += b_full
        if keep:
            hpb += b_full
            if recipe != "none":
                hp_modules.append(lin.name)
        else:
            quant += b_full
        s = pp - 1 if lin.layer < 0 else layer_stage[lin.layer]
        per_stage[s] += b_rank
    emb = shape.vocab_size * shape.hidden_size * hp
    norms_layer = 2 * shape.hidden_size * hp
    total += emb + norms_layer * shape.num_layers + shape.hidden_size * hp
    hpb += emb + norms_layer * shape.num_layers + shape.hidden_size * hp
    per_stage[0] += emb
    for s, ls in enumerate(stages):
        per_stage[s] += norms_layer * len(ls)
    per_stage[-1] += shape.hidden_size * hp
    return WeightBreakdown(int(total), int(quant), int(hpb), [int(x) for x in per_stage], _compress(hp_modules), shape.num_parameters)


def _compress(names: list[str]) -> list[str]:
    """``model.layers.0.self_attn.o_proj, model.layers.1...`` -> ``*.self_attn.o_proj (x N)``."""
    by_suffix: dict[str, int] = {}
    out = []
    for n in names:
        if n.startswith("model.layers."):
            suf = n.split(".", 3)[3]
            by_suffix[suf] = by_suffix.get(suf, 0) + 1
        else:
            out.append(n)
    return out + [f"model.layers.*.{s} (x{c})" for s, c in by_suffix.items()]


# --------------------------------------------------------------------------- plan
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

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["schema"] = "pipeline.plan/v1"
        return d


@dataclasses.dataclass(frozen=True)
class _Knobs:
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


def _knobs(cfg: Any, kind: str) -> _Knobs:
    q, b = cfg.quant, cfg.build
    hp_field = "quant.export_dtype" if kind == "gpu" or q.recipe != "none" else "model.dtype"
    hp = q.export_dtype if hp_field == "quant.export_dtype" else cfg.model.dtype
    if hp not in ("float16", "bfloat16", "float32"):
        raise InputError(f"{hp_field}={hp!r}: must be float16, bfloat16 or float32.")
    if q.recipe not in RECIPE_MIN_SM:
        raise InputError(f"quant.recipe={q.recipe!r}: unknown; use one of {sorted(RECIPE_MIN_SM)}.")
    if q.kv_cache_dtype not in KV_MIN_SM:
        raise InputError(f"quant.kv_cache_dtype={q.kv_cache_dtype!r}: unknown; use one of {sorted(KV_MIN_SM)}.")
    return _Knobs(
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


def _kv_elem_bytes(k: _Knobs) -> int:
    return 1 if k.kv_cache in ("fp8", "int8") else DTYPE_BYTES[k.hp_dtype]


def _activation_bytes(shape: ModelShape, k: _Knobs) -> int:
    act = DTYPE_BYTES[k.hp_dtype]
    qkv = (math.ceil(shape.num_heads / k.tp) + 2 * kv_heads_per_rank(shape.num_kv_heads, k.tp)) * shape.head_dim
    per_tok = 2 * shape.hidden_size + qkv + 2 * math.ceil(shape.intermediate_size / k.tp)
    logits = k.max_batch_size * k.beam * math.ceil(shape.vocab_size / k.tp) * 4
    return int(k.max_num_tokens * per_tok * act + logits)


def _decoder_buffers(k: _Knobs) -> int:
    # output ids + sequence-length bookkeeping (int32) for every slot; small next to the KV cache
    return k.max_batch_size * k.beam * k.max_seq_len * 4 * 2


def _gpu_numbers(shape: ModelShape, k: _Knobs, gpu: GPU) -> dict[str, Any]:
    """Pure computation for one set of knobs on one GPU (no warnings)."""
    w = weight_bytes(
        shape, k.recipe, hp_dtype=k.hp_dtype, group_size=k.group_size, exclude=list(k.exclude), sensitive=k.sensitive, tp=k.tp, pp=k.pp
    )
    layers_rank = max(len(x) for x in stage_layers(shape.num_layers, k.pp))
    kv_tok = shape.kv_bytes_per_token(_kv_elem_bytes(k), k.tp, layers_rank)
    kv_tok_slice = shape.kv_bytes_per_token(_kv_elem_bytes(k), k.tp)  # all layers of one TP slice
    block = kv_tok * k.tokens_per_block
    act = _activation_bytes(shape, k)
    overhead = RUNTIME_OVERHEAD_BYTES + _decoder_buffers(k)
    free = gpu.memory_bytes - w.max_rank_bytes - act - overhead
    pool = max(0, int(free * k.fraction))
    blocks = pool // block if block else 0
    blocks_per_seq = math.ceil(k.max_seq_len / k.tokens_per_block)
    seqs = blocks // blocks_per_seq // k.beam
    return dict(
        w=w,
        kv_tok=kv_tok,
        kv_tok_slice=kv_tok_slice,
        block=block,
        act=act,
        overhead=overhead,
        free=free,
        pool=pool,
        blocks=blocks,
        tokens=blocks * k.tokens_per_block,
        blocks_per_seq=blocks_per_seq,
        seqs=seqs,
    )


def _roofline(weights_slice: int, kv_tok_slice: int, context: int, batch: int, bw: float) -> dict[str, float] | None:
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


def plan(cfg: Any) -> Plan:
    """Memory and speed plan for ``cfg`` (a composed :class:`pipeline.core.config.PipelineConfig`).

    It does not validate ``cfg``: its callers have (the runner, ``pipeline plan``, one plan per GPU of ``--gpus``), and
    the public ``pipeline.plan`` (:func:`pipeline.validation.checked_plan`) runs the run's checks first, so a config a
    run refuses is never planned as ``ok``.  This module sits below the stage checks (they import it), so it cannot
    import :mod:`pipeline.validation` itself.

    Never raises for a plan that does not fit: it returns ``status='refused'`` with the numbers.
    Raises :class:`InputError` when the model's config.json cannot be read or ``target.gpu`` is
    unknown.  Does not import torch; on a CPU target it measures host bandwidth (~0.2 s, cached)."""
    shape, src = load_shape(cfg)
    kind, gpu, why = plan_device(cfg)
    k = _knobs(cfg, kind)
    b = cfg.build
    model = {
        "source": src,
        "architecture": shape.architecture,
        "num_parameters": shape.num_parameters,
        "layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "heads": shape.num_heads,
        "kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_positions": shape.max_positions,
        "rope_type": shape.rope_type,
        "rope_factor": shape.rope_factor,
        "max_seq_len_limit": shape.max_seq_len_limit,
    }
    conf = {
        "recipe": k.recipe,
        "kv_cache": k.kv_cache,
        "high_precision_dtype": k.hp_dtype,
        "tp_size": k.tp,
        "pp_size": k.pp,
        "max_batch_size": k.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_draft_len": b.speculative.max_draft_len,
        "max_num_tokens": k.max_num_tokens,
        "tokens_per_block": k.tokens_per_block,
        "kv_cache_free_gpu_mem_fraction": k.fraction,
        "max_beam_width": k.beam,
        "build": b.name,
        "allow_unsafe_lengths": bool(getattr(cfg, "allow_unsafe_lengths", False)),
    }
    p = Plan("ok", {"kind": kind, "why": why}, model, conf)
    if conf["allow_unsafe_lengths"] and k.max_seq_len > shape.max_seq_len_limit:
        p.warnings.append(
            f"allow_unsafe_lengths=true: max_seq_len={k.max_seq_len} exceeds the model's {shape.max_seq_len_limit} "
            f"positions; quality beyond that length is untested (recorded in this plan)."
        )
    if shape.sliding_window and shape.sliding_window < k.max_seq_len:
        p.notes.append(
            f"config.json has sliding_window={shape.sliding_window}; the KV sizing assumes a full cache "
            f"(TensorRT-LLM allocates max_attention_window_size = max_seq_len unless told otherwise)."
        )
    _stage_memory(p, cfg, shape)
    if kind == "gpu" and gpu is None:
        p.status = "unplanned"
        p.notes.append(f"{why}. Name one: target.gpu=<{'|'.join(sorted(_catalogue_keys()))}>.")
        return p
    if kind == "cpu":
        return _cpu_plan(p, shape, k)
    assert gpu is not None  # kind == "gpu" with gpu None returned above
    return _gpu_plan(p, shape, k, gpu)


def _devices(cfg: Any, have_gpu: bool) -> tuple[str, str]:
    """(calibration device, evaluate device), each ``cpu`` or ``cuda``: ``calibration.device`` / ``eval.device`` as set,
    ``auto`` = CUDA when the plan has a GPU (visible here, or named with ``target.gpu``)."""
    cal = str(getattr(cfg.calibration, "device", "auto")).strip().lower()
    ev = str(getattr(cfg.eval, "device", "auto")).strip().lower()
    c = ("cuda" if have_gpu else "cpu") if cal == "auto" else ("cpu" if cal == "cpu" else "cuda")
    e = ("cuda" if have_gpu else "cpu") if ev == "auto" else ("cpu" if ev == "cpu" else "cuda")
    return c, e


def plan_room(
    cfg: Any,
    named: GPU | None,
    local: list[tuple[dict[str, Any], GPU]],
    local_free: list[int],
    host_available: int | None,
    disk_free: int | None,
) -> tuple[str, str, Any, list[str]]:
    """Where quantize and evaluate run and the figures their placement is decided from, from the device facts alone
    (``local``: :func:`pipeline.core.hostinfo.local_gpus`; ``local_free``: :func:`pipeline.core.hostinfo.gpu_free_bytes`;
    ``host_available``: MemAvailable; ``disk_free``: the store's free disk). Returns (calibration device, evaluate
    device, :class:`pipeline.core.sizing.Room`, notes).

    The GPU is the one ``calibration.device=cuda:N`` names (else GPU 0) when GPUs are visible; ``target.gpu`` names the
    GPU of another host when none visible here matches it: its memory is the catalogue's (pipeline/facts/gpus.py), all
    of it free, and that host's memory is unknown (planned as holding the offloaded layers unless
    ``calibration.max_host_memory_gb`` says how much it may hold)."""
    from ..core.sizing import Room

    cal = cfg.calibration
    setting = str(getattr(cal, "device", "auto")).strip().lower()
    idx = int(setting[5:]) if setting.startswith("cuda:") and setting[5:].isdigit() else 0
    notes: list[str] = []
    gpu_name: str | None = None
    gpu_free: int | None = None
    host: int | None = host_available
    local_named = [i for i, (_, g) in enumerate(local) if named is not None and g.key == named.key]
    if named is not None and not local_named:
        gpu_name, gpu_free, host = named.name, named.memory_bytes, None
        notes.append(
            f"planned for a host with {named.name} (target.gpu; {named.memory_bytes / GiB:.1f} GiB from pipeline/facts/gpus.py, all "
            f"free); that host's memory is unknown: the host figures below are what it needs"
        )
    elif local:
        i = local_named[0] if local_named else min(idx, len(local) - 1)
        gpu_name = str(local[i][0].get("name") or local[i][1].name)
        gpu_free = local_free[i] if i < len(local_free) else local[i][1].memory_bytes
        gpu_name = f"{gpu_name} (GPU {i})"
    cal_dev, eval_dev = _devices(cfg, gpu_name is not None)
    mdm = getattr(cal, "max_device_memory_gb", None)
    mhm = getattr(cal, "max_host_memory_gb", None)
    room = Room(
        gpu_name=gpu_name,
        gpu_free=gpu_free,
        host_free=host,
        disk_free=disk_free,
        max_device=int(float(mdm) * 1e9) if mdm is not None else None,
        max_host=int(float(mhm) * 1e9) if mhm is not None else None,
    )
    if cal_dev == "cuda" and gpu_name is None:
        notes.append("calibration.device asks for CUDA but no GPU is visible or named (target.gpu): GPU memory not planned.")
    return cal_dev, eval_dev, room, notes


def _disk_free(cfg: Any) -> int | None:
    """Free bytes of the disk holding ``store_dir`` (its nearest existing parent), None when unreadable."""
    import shutil
    from pathlib import Path

    p = Path(str(getattr(cfg, "store_dir", ".") or ".")).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return int(shutil.disk_usage(p).free)
    except OSError:
        return None


def _stage_memory(p: Plan, cfg: Any, shape: ModelShape) -> None:
    """``p.stages``: each stage's predicted peak host (and GPU) memory and where it runs (:mod:`pipeline.core.sizing`);
    a refusal in ``p.refusals`` when neither the GPU, the host nor the store's disk can hold the model to calibrate."""
    from ..core.hostinfo import gpu_free_bytes
    from ..core.sizing import DEVICE_BUDGET_FRACTION, as_json, calibration_placement, compute_dtype, stage_memory
    from ..core.targets import resolve_target

    try:
        exp = str(cfg.model.dtype)
    except Exception:  # an unreadable checkpoint: the export stage names it
        exp = "float32"
    named = None
    if getattr(cfg.target, "gpu", None):
        try:
            named = lookup(cfg.target.gpu)
        except KeyError:
            named = None  # plan_device names it
    local = local_gpus()
    mem = host_memory()
    disk = _disk_free(cfg)
    free = gpu_free_bytes() if local else []
    dev, eval_dev, room, notes = plan_room(cfg, named, local, free, mem["available"], disk)
    p.notes.extend(notes)
    p.target["gpus"] = [
        {"name": d.get("name"), "memory_bytes": g.memory_bytes, "free_bytes": free[i] if i < len(free) else None}
        for i, (d, g) in enumerate(local)
    ]
    target = resolve_target(cfg)[0]
    layer = sum(lin.in_features * lin.out_features for lin in shape.linears() if lin.layer == 0) + 2 * shape.hidden_size
    engine = 0
    if target == "onnxruntime_genai" and eval_dev == "cuda" and cfg.quant.recipe in RECIPES:
        engine = weight_bytes(shape, cfg.quant.recipe, hp_dtype=exp if exp in DTYPE_BYTES else "float32").total_bytes
    quantizes = cfg.quant.recipe != "none"
    pred = stage_memory(
        shape.num_parameters,
        shape.vocab_size * shape.hidden_size,
        export_dtype=exp,
        calib_device=dev,
        reference_dtype=str(cfg.eval.reference_dtype),
        target=target,
        calib_activation_bytes=_calibration_batch_bytes(cfg, shape, dev, exp, room) if quantizes else 0,
        layer_parameters=layer,
        room=room,
        eval_device=eval_dev,
        engine_host_bytes=engine,
        eval_activation_bytes=_eval_batch_bytes(cfg, shape, exp, room) if eval_dev == "cuda" else 0,
    )
    p.stages = {"host_total_bytes": host_memory()["total"], "predicted": as_json(pred)}
    gpu_total = (named or (local[0][1] if local else None)).memory_bytes if (named or local) else None  # type: ignore[union-attr]
    ev = pred["evaluate"].gpu_bytes
    if ev and gpu_total and ev > DEVICE_BUDGET_FRACTION * gpu_total:
        p.notes.append(
            f"evaluate loads the reference model whole on the GPU: about {ev / 2**30:.1f} GiB ({pred['evaluate'].formula}) "
            f"exceed {DEVICE_BUDGET_FRACTION:.0%} of the GPU's {gpu_total / 2**30:.1f} GiB. Fix: eval.device=cpu (host memory), eval.reference_dtype=float16 "
            "on a larger GPU, or skip evaluate on this host."
        )
    if not quantizes:
        return
    cd = compute_dtype(dev, exp)
    model_b = shape.num_parameters * DTYPE_BYTES[cd]
    on_gpu = dev == "cuda" and room.gpu_free is not None
    pl = calibration_placement(
        model_b, room.gpu_free if on_gpu else None, room.host_free, room.max_device, room.max_host if on_gpu else None, room.disk_free
    )
    p.stages["calibration_placement"] = {"device": dev, "dtype": cd, "model_bytes": model_b, **dataclasses.asdict(pl)}
    q = p.stages["predicted"]["quantize"]
    if not on_gpu and pl.offload != "none":  # the CPU's own budget: layers beyond it wait on disk (the stage's rule)
        q.update(where=f"cpu, layers offloaded to disk ({cd})", offload="disk")
    if str(getattr(cfg.calibration, "layerwise", "auto")).lower() == "true" and "layer by layer" not in q["where"]:
        q["where"] += ", layer by layer (calibration.layerwise=true)"
    if pl.refused:
        p.refusals.append(
            f"quantize: nothing can hold the model to calibrate it: {pl.reason}. GPU: "
            + (f"{room.gpu_name}, {_gib(room.gpu_free)} free" if on_gpu else "none")
            + f"; host: {_gib(room.host_free)} available; disk of store_dir: {_gib(room.disk_free)} free. Fix: a GPU or host "
            "with more memory, a store_dir on a larger disk, or a smaller model."
        )


def _eval_batch_bytes(cfg: Any, shape: ModelShape, export_dtype: str, room: Any = None) -> int:
    """One evaluate batch on the GPU (:func:`pipeline.core.sizing.eval_activation_bytes`): ``eval.batch_size`` sequences
    of ``build.max_seq_len`` tokens in the GPU's 16-bit dtype; for ``auto`` the most it may choose, the sequences that fit
    :data:`pipeline.core.sizing.ACTIVATION_FRACTION` of the GPU's free memory beside the model
    (pipeline/evaluate/runners.py ``choose_batch``; 16 when the free memory is unknown). An invalid setting counts as
    ``auto`` (validation names it)."""
    from ..core.sizing import ACTIVATION_FRACTION, DEVICE_BUDGET_FRACTION, compute_dtype, eval_activation_bytes

    b = DTYPE_BYTES[compute_dtype("cuda", export_dtype)]
    seq = max(1, int(cfg.build.max_seq_len))

    def per(n: int) -> int:
        return eval_activation_bytes(shape.hidden_size, shape.intermediate_size, shape.vocab_size, shape.kv_bytes_per_token(b), seq, n, b)

    try:
        from ..core.config.calibration import parse_batch_size

        batch = parse_batch_size(cfg.eval.batch_size)
    except ValueError:
        batch = None
    if batch is None:
        free = getattr(room, "gpu_free", None)
        if free is None:
            batch = 16
        else:
            resident = min(shape.num_parameters * b, int(free * DEVICE_BUDGET_FRACTION))
            batch = int(ACTIVATION_FRACTION * max(0, free - resident) // max(1, per(1)))
    return per(max(1, batch))


def _calibration_batch_bytes(cfg: Any, shape: ModelShape, device: str, export_dtype: str, room: Any = None) -> int:
    """One calibration batch's activations on ``device``, bytes (:func:`pipeline.core.sizing.calibration_activation_bytes`
    x the batch): ``calibration.batch_size`` when it is an integer; for ``auto`` the most it may choose: on the CPU
    :data:`pipeline.core.sizing.AUTO_BATCH_MAX_CPU`; on a GPU the samples whose activations fit
    :data:`pipeline.core.sizing.ACTIVATION_FRACTION` of the GPU's free memory beside the model (at most
    ``calib_size``; pipeline/quantize/placement.py ``choose_batch_size``). An invalid setting counts as ``auto``
    (validation names it)."""
    from ..core.sizing import ACTIVATION_FRACTION, AUTO_BATCH_MAX_CPU, DEVICE_BUDGET_FRACTION, calibration_activation_bytes, compute_dtype

    cal = cfg.calibration
    dtype_b = DTYPE_BYTES[compute_dtype(device, export_dtype)]
    per = calibration_activation_bytes(shape.hidden_size, shape.intermediate_size, int(cal.calib_max_seq_length), dtype_b)
    try:
        from ..core.config.calibration import parse_batch_size

        batch = parse_batch_size(cal.batch_size)
    except ValueError:
        batch = None
    if batch is None:
        free = getattr(room, "gpu_free", None) if device == "cuda" else None
        if free is None:
            batch = AUTO_BATCH_MAX_CPU
        else:
            resident = min(shape.num_parameters * dtype_b, int(free * DEVICE_BUDGET_FRACTION))
            batch = int(ACTIVATION_FRACTION * max(0, free - resident) // max(1, per))
    batch = max(1, min(batch, int(cal.calib_size)))
    return batch * per


def _catalogue_keys() -> list[str]:
    from ..facts.gpus import CATALOGUE

    return list(CATALOGUE)


def _gpu_plan(p: Plan, shape: ModelShape, k: _Knobs, gpu: GPU) -> Plan:
    p.target.update(gpu.to_json())
    n = _gpu_numbers(shape, k, gpu)
    w = n["w"]
    p.weights = {
        "total_bytes": w.total_bytes,
        "quantized_bytes": w.quantized_bytes,
        "high_precision_bytes": w.high_precision_bytes,
        "per_rank_bytes": w.max_rank_bytes,
        "per_stage_rank_bytes": w.per_stage_rank_bytes,
        "high_precision_modules": w.high_precision_modules,
        "bits_per_param": round(8 * w.total_bytes / max(1, w.num_parameters), 3),
    }
    p.kv_cache = {
        "dtype": k.kv_cache if k.kv_cache != "none" else k.hp_dtype,
        "bytes_per_element": _kv_elem_bytes(k),
        "bytes_per_token_model": shape.kv_bytes_per_token(_kv_elem_bytes(k)),
        "bytes_per_token_rank": n["kv_tok"],
        "tokens_per_block": k.tokens_per_block,
        "bytes_per_block_rank": n["block"],
        "blocks_per_sequence": n["blocks_per_seq"],
        "bytes_per_sequence_rank": n["blocks_per_seq"] * n["block"],
    }
    p.memory = {
        "gpu_bytes": gpu.memory_bytes,
        "weights_bytes": w.max_rank_bytes,
        "activations_bytes": n["act"],
        "runtime_overhead_bytes": n["overhead"],
        "free_after_load_bytes": n["free"],
        "kv_pool_bytes": n["pool"],
        "unused_bytes": max(0, gpu.memory_bytes - w.max_rank_bytes - n["act"] - n["overhead"] - n["pool"]),
    }
    conc = min(n["seqs"], k.max_batch_size)
    p.capacity = {
        "kv_blocks": n["blocks"],
        "kv_tokens": n["tokens"],
        "max_sequences_at_max_seq_len": n["seqs"],
        "max_batch_size": k.max_batch_size,
        "effective_concurrency": conc,
    }
    bw = gpu.bandwidth_bytes_s
    p.decode = {
        "bandwidth_bytes_s": bw,
        "batch1": _roofline(w.tp_slice_bytes, n["kv_tok_slice"], k.max_seq_len, 1, bw),
        "full": _roofline(w.tp_slice_bytes, n["kv_tok_slice"], k.max_seq_len, conc, bw) if conc >= 1 else None,
        "weights_only_step_s_min": (w.tp_slice_bytes / bw) if bw > 0 else None,
        "assumption": "memory-bound: every weight of a rank and each sequence's whole KV cache (at max_seq_len) read once per step",
    }
    if bw <= 0:
        p.notes.append("bandwidth of this GPU is unknown (not in the catalogue): no decode bound.")
    _gpu_checks(p, shape, k, gpu, n)
    if k.max_num_tokens < k.tokens_per_block:
        p.notes.append("max_num_tokens is below tokens_per_block; TensorRT-LLM may raise it at build time.")
    p.status = "refused" if p.refusals else ("warn" if p.warnings else "ok")
    return p


def _gpu_checks(p: Plan, shape: ModelShape, k: _Knobs, gpu: GPU, n: dict[str, Any]) -> None:
    """:func:`_gpu_plan`'s refusals and warnings: the recipe and KV format on this GPU's compute capability
    (support matrix), then whether weights, one sequence and ``max_batch_size`` sequences fit in memory."""
    w = n["w"]
    # --- support matrix
    if gpu.sm < RECIPE_MIN_SM.get(k.recipe, 0):
        p.refusals.append(
            f"quant.recipe={k.recipe} needs compute capability >= {RECIPE_MIN_SM[k.recipe] / 10:.1f}; "
            f"{gpu.name} is {gpu.compute_capability}. Use one of {gpu.quant_formats}."
        )
    if gpu.sm < KV_MIN_SM.get(k.kv_cache, 0):
        p.refusals.append(
            f"quant.kv_cache_dtype={k.kv_cache} needs compute capability >= {KV_MIN_SM[k.kv_cache] / 10:.1f}; "
            f"{gpu.name} is {gpu.compute_capability}. Use one of {gpu.kv_formats}."
        )
    # --- fit
    g = gpu.memory_bytes
    if w.max_rank_bytes + n["act"] + n["overhead"] >= g:
        fixes = _fit_fixes(shape, k, gpu, need="weights")
        p.refusals.append(
            f"weights alone need {_gib(w.max_rank_bytes)} per rank at tp={k.tp} pp={k.pp} (+ {_gib(n['act'])} activations, "
            f"{_gib(n['overhead'])} runtime) but {gpu.name} has {_gib(g)}." + (f" Fix: {fixes}" if fixes else "")
        )
    elif n["seqs"] < 1:
        fixes = _fit_fixes(shape, k, gpu, need="one")
        one = n["blocks_per_seq"] * n["block"]
        p.refusals.append(
            f"zero sequences fit at max_seq_len={k.max_seq_len}: the KV pool is {_gib(n['pool'])} "
            f"({n['tokens']} tokens) and one sequence needs {n['blocks_per_seq']} blocks x {k.tokens_per_block} tokens = {_gib(one)}."
            + (f" Fix: {fixes}" if fixes else "")
        )
    else:
        if n["seqs"] < FEW_SEQUENCES:
            p.warnings.append(
                f"only {n['seqs']} sequence(s) of max_seq_len={k.max_seq_len} fit in the KV cache "
                f"({n['tokens']} tokens). Fix: {_fit_fixes(shape, k, gpu, need='batch')}"
            )
        elif n["seqs"] < k.max_batch_size:
            p.warnings.append(
                f"the KV cache holds {n['seqs']} sequences of max_seq_len={k.max_seq_len} "
                f"but build.max_batch_size={k.max_batch_size}: concurrency is KV-bound. "
                f"Fix: {_fit_fixes(shape, k, gpu, need='batch')}"
            )


def _fit_fixes(shape: ModelShape, k: _Knobs, gpu: GPU, need: str) -> str:
    """Suggested fixes with their effect: lower max_seq_len, FP8 KV, more TP, a smaller recipe."""
    target = 1 if need in ("one", "weights") else k.max_batch_size
    out: list[str] = []
    if need != "weights":
        n = _gpu_numbers(shape, k, gpu)
        per_seq_tokens = n["tokens"] // max(1, target * k.beam)
        s = per_seq_tokens // k.tokens_per_block * k.tokens_per_block
        if k.max_input_len < s < k.max_seq_len:
            out.append(f"build.max_seq_len={s} ({target} sequence(s) fit)")
        if k.kv_cache == "none" and "fp8" in gpu.kv_formats and _kv_elem_bytes(k) > 1:
            n2 = _gpu_numbers(shape, dataclasses.replace(k, kv_cache="fp8"), gpu)
            out.append(f"quant.kv_cache_dtype=fp8 ({n2['seqs']} sequences fit)")
        elif k.kv_cache == "none" and _kv_elem_bytes(k) > 1:
            n2 = _gpu_numbers(shape, dataclasses.replace(k, kv_cache="int8"), gpu)
            out.append(f"quant.kv_cache_dtype=int8 ({n2['seqs']} sequences fit)")
    for tp in TP_CHOICES:
        if tp <= k.tp or shape.num_heads % tp:
            continue
        n3 = _gpu_numbers(shape, dataclasses.replace(k, tp=tp), gpu)
        if n3["seqs"] >= target:
            out.append(f"parallel.tp_size={tp} ({n3['seqs']} sequences fit per {tp} GPUs)")
            break
    if need == "weights" and k.recipe != "auto" and RECIPES[k.recipe].weight_bits >= 8:  # none, fp8, int8_sq, int8_wo
        for r in ("fp8", "int4_awq"):
            if r == k.recipe or r not in gpu.quant_formats:
                continue
            n4 = _gpu_numbers(shape, dataclasses.replace(k, recipe=r), gpu)
            if n4["seqs"] >= 1:
                out.append(f"quant={r} ({_gib(n4['w'].max_rank_bytes)} weights per rank)")
                break
    return "; or ".join(out) if out else "use a GPU with more memory"


def _cpu_plan(p: Plan, shape: ModelShape, k: _Knobs) -> Plan:
    mem = host_memory()
    bw = host_memory_bandwidth_gbs() * 1e9
    w = weight_bytes(shape, k.recipe, hp_dtype=k.hp_dtype, group_size=k.group_size, exclude=list(k.exclude), sensitive=k.sensitive)
    kv_b = 1 if k.kv_cache in ("fp8", "int8") else DTYPE_BYTES[k.hp_dtype]
    kv_tok = shape.kv_bytes_per_token(kv_b)
    # onnxruntime-genai shares past/present buffers sized batch x max_length (static KV per slot)
    kv_all = kv_tok * k.max_seq_len * k.max_batch_size * k.beam
    act = _activation_bytes(shape, dataclasses.replace(k, tp=1))
    p.target.update(
        {
            "name": "host CPU",
            "memory_bytes": mem["total"],
            "available_bytes": mem["available"],
            "bandwidth_gb_s": round(bw / 1e9, 2),
            "bandwidth_source": "measured: numpy copy of 256 MB (best of 3)",
        }
    )
    p.weights = {
        "total_bytes": w.total_bytes,
        "quantized_bytes": w.quantized_bytes,
        "high_precision_bytes": w.high_precision_bytes,
        "per_rank_bytes": w.total_bytes,
        "high_precision_modules": w.high_precision_modules,
        "bits_per_param": round(8 * w.total_bytes / max(1, w.num_parameters), 3),
    }
    p.kv_cache = {
        "dtype": k.kv_cache if k.kv_cache != "none" else k.hp_dtype,
        "bytes_per_element": kv_b,
        "bytes_per_token_model": kv_tok,
        "bytes_per_token_rank": kv_tok,
        "bytes_per_sequence_rank": kv_tok * k.max_seq_len,
        "bytes_all_slots": kv_all,
    }
    need = w.total_bytes + kv_all + act
    p.memory = {
        "host_bytes": mem["total"],
        "available_bytes": mem["available"],
        "weights_bytes": w.total_bytes,
        "kv_cache_bytes": kv_all,
        "activations_bytes": act,
        "total_needed_bytes": need,
    }
    avail = mem["available"] or 0
    fit_seqs = max(0, (avail - w.total_bytes - act) // max(1, kv_tok * k.max_seq_len)) if avail else None
    p.capacity = {
        "max_sequences_at_max_seq_len": fit_seqs,
        "max_batch_size": k.max_batch_size,
        "effective_concurrency": min(fit_seqs, k.max_batch_size) if fit_seqs is not None else k.max_batch_size,
    }
    conc = max(1, p.capacity["effective_concurrency"] or 1)
    p.decode = {
        "bandwidth_bytes_s": bw,
        "batch1": _roofline(w.total_bytes, kv_tok, k.max_seq_len, 1, bw),
        "full": _roofline(w.total_bytes, kv_tok, k.max_seq_len, conc, bw),
        "weights_only_step_s_min": w.total_bytes / bw,
        "assumption": "memory-bound: weights and each sequence's KV cache (at max_seq_len) read once per step",
    }
    if mem["total"] and w.total_bytes >= mem["total"]:
        p.refusals.append(
            f"weights need {_gib(w.total_bytes)} but the host has {_gib(mem['total'])} RAM. Fix: "
            + _smaller_weights_fix(shape, k, mem["total"])
        )
    elif avail and need > avail:
        p.warnings.append(
            f"weights + KV for {k.max_batch_size} x {k.max_seq_len} tokens + activations need {_gib(need)}; "
            f"{_gib(avail)} is available now. Fix: lower build.max_batch_size or build.max_seq_len."
        )
    from ..core.targets import get_target

    refusal = get_target("onnxruntime_genai").capabilities().recipe_refusal(k.recipe)
    if refusal is not None:
        p.notes.append(
            f"quant.recipe={k.recipe}: target onnxruntime_genai cannot run it ({refusal}); the sizes assume the recipe's packed weights."
        )
    p.status = "refused" if p.refusals else ("warn" if p.warnings else "ok")
    return p


def _gib(b: float | int | None) -> str:
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
