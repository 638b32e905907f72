"""Host (and GPU) memory of each pipeline stage, predicted from the model's shape before any work (docs/memory.md), and
the inputs every prediction starts from: the model's shape (:func:`load_shape`), the device planned for
(:func:`plan_device`) and the host's memory (:func:`host_memory`). The planner, quantize and evaluate share these rules.

The model is ``P`` parameters; ``W = 4 P`` bytes is its float32 weights, ``B = 2 P`` its bf16 weights. Each stage's peak
is predicted as the libraries' fixed cost plus what the stage holds at its worst moment, from the memory model in
docs/memory.md:

============  ==========================================================================================================
export        ``LIBS + P x export dtype bytes + 2 x largest tensor`` (transformers loads the model in the export dtype
              once; ``save_pretrained`` writes from it)
quantize      CPU: ``LIBS + W x (1 + QUANT_TRANSIENT) + A`` (one float32 model: calibrated, its state streamed out,
              exported; the transient is AWQ's search and the exporters' output tensors; ``A`` is one calibration batch's
              activations, :func:`calibration_activation_bytes`). GPU, whole (:func:`calibration_placement`): GPU
              ``B x (1 + GPU_QUANT_TRANSIENT) + GPU_QUANT_FIXED + A``, host ``LIBS + B`` (the bf16 state dict the HF
              export gathers); GPU, layers offloaded: GPU ``budget + one layer + A``, host ``LIBS + the offloaded layers
              (bf16) + one layer`` (streamed export)
build         onnxruntime_genai: ``LIBS + W x (1 + BUILD_TRANSIENT)`` for the restored simulated-quant model and its
              converted int4 tensors, then the builder (a separate process, after the model is freed):
              ``BUILDER_LIBS + W x BUILDER_FACTOR``
evaluate      CPU: ``LIBS + reference model (P x eval.reference_dtype bytes) x (1 + EVAL_TRANSIENT)``: runners are loaded
              one at a time. GPU: the same on the GPU in the checkpoint's dtype (layers beyond 80 % of its free memory
              wait in host memory), the host holding ``LIBS`` plus what is offloaded
============  ==========================================================================================================

CPU coefficients are measured (``make bench-scale``, the 2-core 24 GB host, bench/results/scale.json): fits of the peak
RSS of the 80 M, 412 M, 1 B and 2.8 B shapes, with ``LIBS`` the RSS of a process that imported torch 2.13,
transformers 5 and ModelOpt 0.47. GPU coefficients are a fit of two runs on an H200 (see :data:`GPU_QUANT_TRANSIENT`).
A prediction above the host's total memory refuses the run (exit 4) before any work.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from ..errors import InputError, PipelineError
from ..facts.geometry import ModelShape, read_config_json
from ..facts.gpus import GPU, lookup
from .hostinfo import local_gpus

#: RSS of a process that has imported torch, transformers and ModelOpt, bytes (measured: 0.52 GB).
LIBS_BYTES = 550_000_000
#: The builder subprocess's own fixed cost (python + torch + onnx + onnxruntime-genai), bytes.
BUILDER_LIBS_BYTES = 600_000_000
#: quantize on the CPU: peak beyond one float32 model and one calibration batch's activations, as a share of the model
#: (AWQ search, export tensors). Fit of bench/results/scale.json (int4_awq, 32 x 128 calibration tokens, batch 16):
#: quantize peak RSS 2.62 GB (412 M), 5.33 GB (1 B), 14.46 GB (2.8 B) = LIBS + W x 1.20 + A within +6 %, +5 %, +1 %
#: (0.35, the earlier value, over-predicted them by 15 %).
QUANT_TRANSIENT = 0.20
#: quantize on a GPU, the whole model resident: peak ``torch.cuda.max_memory_allocated`` beyond the bf16 weights ``B`` and
#: the activation bound ``A`` is ``GPU_QUANT_FIXED + B x GPU_QUANT_TRANSIENT``. A two-point fit of runs on an H200
#: (torch 2.11+cu130, transformers 5.17, ModelOpt 0.47; random bf16 Llama shapes llama1b and llama3b of
#: pipeline/bench/shapes.py; int4_awq; 32 x 128 calibration tokens at batch 32): 1 B: B 1.96 GB, peak 3.64 GB;
#: 2.8 B: B 5.68 GB, peak 8.04 GB, so 1.36 GB and 1.89 GB beyond B + A. Two rows: the split between the fixed and the
#: proportional part is not established beyond them.
GPU_QUANT_TRANSIENT = 0.145
GPU_QUANT_FIXED_BYTES = 1_074_000_000
#: Share of the device's free memory the model may take before layers are offloaded (pipeline/quantize/placement.py
#: keeps the rest for activations, the calibration batch and ModelOpt's statistics).
DEVICE_BUDGET_FRACTION = 0.8
#: Host memory kept free when offloaded layers wait in host memory (the ``max_memory["cpu"]`` margin
#: pipeline/quantize/placement.py gives accelerate).
HOST_RESERVE_BYTES = 1 << 30
#: quantize on a GPU with layers offloaded: host peak beyond the libraries, as a multiple of the model's bytes in its
#: compute dtype. One point: the 1 B shape on an H200 at a 0.49 GB GPU budget peaked at 5.41 GB of host RSS (1.96 GB of
#: bf16 weights; bench/results/gpu.json, 2026-12-04): the offloaded layers, what ModelOpt's layer-by-layer writeback and
#: accelerate hold beside them during calibration (not itemised), and the TensorRT-LLM export's restore of the whole
#: model on the host (4.70 GB in that step). Until the TensorRT-LLM export streams too, the host holds the model at least once.
OFFLOAD_HOST_FACTOR = 2.48
#: ``calibration.batch_size=auto`` on a GPU: one batch's activations may take this share of the memory left beside the
#: model (pipeline/quantize/placement.py, ``choose_batch_size``).
ACTIVATION_FRACTION = 0.5
#: build (parent): the restored float32 model plus the converted checkpoint, beyond one float32 model.
BUILD_TRANSIENT = 0.35
#: the onnxruntime-genai builder's peak beyond its libraries, as a share of the float32 weights (int4 input).
BUILDER_FACTOR = 0.6
#: activations of one calibration sample at its worst moment, per token, in elements of ``hidden_size`` and of
#: ``intermediate_size``: the residual stream, the normalised input, q/k/v and attention output and ModelOpt's fake-quant
#: copies of a linear's input (about 8 hidden-sized rows), the MLP's gate, up and activated rows plus the down
#: projection's quantized input (about 4 intermediate-sized rows). The logits are not counted: the calibration forward
#: asks for the last position's only (``logits_to_keep=1``, pipeline/data/calibration.py). An upper bound, not a fit: it has
#: not been measured on a GPU (docs/memory.md).
ACT_HIDDEN_ROWS = 8
ACT_INTERMEDIATE_ROWS = 4
#: evaluate: activations, KV caches, the engine and the fidelity logits beyond the reference model, as a share of it
#: (1 B shape: 6.62 GB peak for a 3.93 GB float32 reference, bench/results/scale.json).
EVAL_TRANSIENT = 0.6


def calibration_activation_bytes(hidden_size: int, intermediate_size: int, seq_len: int, dtype_bytes: int) -> int:
    """Peak activation bytes of ONE calibration sample of ``seq_len`` tokens in a ``dtype_bytes``-wide compute dtype:
    ``seq_len x (ACT_HIDDEN_ROWS x hidden + ACT_INTERMEDIATE_ROWS x intermediate) x dtype_bytes`` (constants above).
    A batch of ``b`` samples takes ``b`` times this."""
    return int(seq_len) * (ACT_HIDDEN_ROWS * int(hidden_size) + ACT_INTERMEDIATE_ROWS * int(intermediate_size)) * int(dtype_bytes)


def eval_activation_bytes(
    hidden_size: int, intermediate_size: int, vocab_size: int, kv_bytes_per_token: int, seq_len: int, batch: int, dtype_bytes: int
) -> int:
    """One evaluate batch on the GPU, bytes: ``batch x seq_len`` tokens of activations (the calibration bound,
    :func:`calibration_activation_bytes`), their KV cache (``kv_bytes_per_token`` in the compute dtype) and the teacher-forced
    logits (``batch x seq_len x vocab`` in the compute dtype plus one float32 row copy). An estimate from the shapes, not
    measured on a GPU."""
    act = calibration_activation_bytes(hidden_size, intermediate_size, seq_len, dtype_bytes)
    return (
        int(batch) * (act + int(seq_len) * int(kv_bytes_per_token) + int(seq_len) * int(vocab_size) * int(dtype_bytes))
        + int(seq_len) * int(vocab_size) * 4
    )


#: ``calibration.batch_size=auto`` on the CPU: at most this many samples per forward pass. 16 was the shipped presets'
#: fixed batch before ``auto`` (build_configs/calibration/), so CPU results, the shipped gate's among them, are unchanged
#: wherever the memory allows it; the CPU's GEMMs gain little from larger batches.
AUTO_BATCH_MAX_CPU = 16


def compute_dtype(device: str, checkpoint_dtype: str) -> str:
    """The calibration dtype on ``device`` for a checkpoint stored in ``checkpoint_dtype``: float32 on the CPU, else the
    checkpoint's 16-bit dtype (bfloat16 for a float32 checkpoint; pipeline/quantize/placement.py says why)."""
    if device == "cpu":
        return "float32"
    return checkpoint_dtype if checkpoint_dtype in ("bfloat16", "float16") else "bfloat16"


@dataclasses.dataclass(frozen=True)
class CalibrationPlacement:
    """Where a model's layers wait while it is calibrated (:func:`calibration_placement`).

    Attributes:
        offload: ``none`` (loaded whole on the device) | ``cpu`` (layers beyond the budget wait in host memory) |
            ``disk`` (beyond what the host may hold too, on disk).
        budget_bytes: what the device may hold of the model.
        host_bytes: of the model, what waits in host memory (``offload=cpu``/``disk`` from a GPU).
        disk_bytes: of the model, what waits on disk.
        refused: the disk cannot hold ``disk_bytes`` either (``disk_free_bytes``): nothing can calibrate it.
        reason: one sentence with the figures.
    """

    offload: str
    budget_bytes: int
    host_bytes: int
    disk_bytes: int
    refused: bool
    reason: str


def calibration_placement(
    model_bytes: int,
    gpu_free_bytes: int | None,
    host_free_bytes: int | None,
    max_device_bytes: int | None = None,
    max_host_bytes: int | None = None,
    disk_free_bytes: int | None = None,
) -> CalibrationPlacement:
    """Whole or offloaded: the rule of pipeline/quantize/placement.py as a pure function of the figures.

    The model (``model_bytes`` in the compute dtype: bf16 on a GPU, float32 on the CPU) loads whole when it fits the
    device's budget: ``max_device_bytes`` (``calibration.max_device_memory_gb``) or :data:`DEVICE_BUDGET_FRACTION` of
    the device's free memory (``gpu_free_bytes``; ``None`` = the device is the CPU, whose free memory is
    ``host_free_bytes``). Otherwise the layers beyond the budget wait in host memory (from a GPU) when the host may hold
    them (``max_host_bytes``, ``calibration.max_host_memory_gb``, else ``host_free_bytes`` less
    :data:`HOST_RESERVE_BYTES`; ``None`` = unknown, planned as holding them), else on disk (from the CPU always on
    disk). ``refused`` when the disk (``disk_free_bytes``; ``None`` = unknown) cannot hold what is left either."""
    gib = 2**30

    def size(b: float) -> str:  # small models and caps are MiB, not "0.0 GiB"
        return f"{b / gib:.1f} GiB" if b >= gib / 10 else f"{b / 2**20:.1f} MiB"

    on_gpu = gpu_free_bytes is not None
    dev = "the GPU" if on_gpu else "the CPU"
    if max_device_bytes is not None:
        budget, why = int(max_device_bytes), f"calibration.max_device_memory_gb ({size(max_device_bytes)})"
    else:
        free = gpu_free_bytes if on_gpu else host_free_bytes
        if free is None:
            return CalibrationPlacement("none", int(model_bytes), 0, 0, False, f"{dev}'s free memory is unknown: planned whole")
        budget = int(free * DEVICE_BUDGET_FRACTION)
        why = f"{DEVICE_BUDGET_FRACTION:.0%} of the {size(free)} free on {dev}"
    if model_bytes <= budget:
        return CalibrationPlacement("none", budget, 0, 0, False, f"the model ({size(model_bytes)}) fits {why}: whole")
    rest = int(model_bytes) - budget
    host_room: int | None = None
    if on_gpu:
        if max_host_bytes is not None:
            host_room = int(max_host_bytes)
        elif host_free_bytes is not None:
            host_room = max(0, int(host_free_bytes) - HOST_RESERVE_BYTES)
    else:
        host_room = 0  # from the CPU, what is beyond the budget goes to disk
    if host_room is None or rest <= host_room:
        host_b, disk_b = rest, 0
    else:
        host_b, disk_b = host_room, rest - host_room
    offload = "disk" if disk_b else "cpu"
    if disk_free_bytes is not None and disk_b > disk_free_bytes:  # refused: what does not fit where, each figure once
        held = (
            f"of the {size(rest)} beyond it, {size(host_b)} may wait in host memory and the {size(disk_b)} left"
            if host_b
            else f"the {size(disk_b)} beyond it"
        )
        reason = f"the model ({size(model_bytes)}) exceeds {why}, and {held} do not fit the {size(disk_free_bytes)} free on the disk of store_dir"
        return CalibrationPlacement(offload, budget, host_b, disk_b, True, reason)
    where = f"{size(rest)} of layers wait in host memory"
    if disk_b:
        where = (f"{size(host_b)} of layers wait in host memory and " if host_b else "") + f"{size(disk_b)} on disk"
    reason = f"the model ({size(model_bytes)}) exceeds {why}: {where}, onloaded one layer at a time"
    if host_room is None and on_gpu:
        reason += " (the host's memory is unknown: planned as holding them; calibration.max_host_memory_gb plans a smaller host)"
    return CalibrationPlacement(offload, budget, host_b, disk_b, False, reason)


@dataclasses.dataclass(frozen=True)
class Room:
    """The figures a stage's placement is decided from, bytes: the GPU's free memory (``None`` = no GPU: CPU stages),
    its name, the host's available memory and the store's free disk (``None`` = unknown: a GPU named with
    ``target.gpu`` on another host), and the ``calibration`` caps (``None`` = auto)."""

    gpu_name: str | None = None
    gpu_free: int | None = None
    host_free: int | None = None
    disk_free: int | None = None
    max_device: int | None = None
    max_host: int | None = None


@dataclasses.dataclass(frozen=True)
class StageMemory:
    """Predicted peak memory of one stage: ``host_bytes`` (resident set, the largest process of the stage),
    ``gpu_bytes`` (None when the stage uses no GPU), the formula, in words, that gave them, and ``where`` it runs
    (``cpu``; ``cuda <GPU>, whole (bfloat16)``; ``cuda <GPU>, layers offloaded to host``; ``host (onnxruntime-genai)``)."""

    host_bytes: int
    gpu_bytes: int | None
    formula: str
    where: str = ""
    offload: str = "none"


def _gpu_quantize(B: int, layer: int, A: int, room: Room, dtype: str) -> tuple[StageMemory, CalibrationPlacement]:
    """quantize on a GPU (module docstring): whole, or with the layers beyond the budget offloaded."""
    gib = 2**30
    pl = calibration_placement(B, room.gpu_free, room.host_free, room.max_device, room.max_host, room.disk_free)
    gpu = room.gpu_name or "GPU"
    if pl.offload == "none":
        m = StageMemory(
            LIBS_BYTES + B,
            int(B * (1 + GPU_QUANT_TRANSIENT) + GPU_QUANT_FIXED_BYTES + A),
            f"GPU: {dtype} weights x {1 + GPU_QUANT_TRANSIENT:.3f} + {GPU_QUANT_FIXED_BYTES / 1e9:.2f} GB + one calibration "
            f"batch's activations ({A / gib:.2f} GiB); host: libraries + the {dtype} state dict the HF export gathers",
            f"cuda {gpu}, whole ({dtype})",
            "none",
        )
    else:
        to = "host" if pl.offload == "cpu" else "host and disk"
        m = StageMemory(
            int(LIBS_BYTES + OFFLOAD_HOST_FACTOR * B),
            int(pl.budget_bytes + layer + A),
            f"GPU: budget {pl.budget_bytes / gib:.1f} GiB + one layer + one calibration batch's activations "
            f"({A / gib:.2f} GiB); host: libraries + {dtype} weights x {OFFLOAD_HOST_FACTOR} (the offloaded layers "
            f"({pl.host_bytes / gib:.1f} GiB) while calibrating, the whole model restored for the TensorRT-LLM export; one "
            "H200 point, docs/memory.md)" + (f"; disk: {pl.disk_bytes / gib:.1f} GiB" if pl.disk_bytes else ""),
            f"cuda {gpu}, layers offloaded to {to} ({dtype})",
            pl.offload,
        )
    return m, pl


def stage_memory(
    num_parameters: int,
    largest_tensor: int,
    *,
    export_dtype: str,
    calib_device: str,
    reference_dtype: str,
    target: str,
    calib_activation_bytes: int = 0,
    layer_parameters: int = 0,
    room: Room | None = None,
    eval_device: str = "cpu",
    engine_host_bytes: int = 0,
    eval_activation_bytes: int = 0,
) -> dict[str, StageMemory]:
    """Per-stage peak memory of a run (module docstring).

    Args:
        num_parameters: the model's parameter count (``P``).
        largest_tensor: elements of its largest tensor (vocab x hidden for most LLMs).
        export_dtype: the export checkpoint's dtype.
        calib_device: ``cpu`` or ``cuda`` (the resolved ``calibration.device``).
        reference_dtype: the evaluate baseline's dtype (``eval.reference_dtype``; ``checkpoint`` = the export dtype;
            ``auto`` = float32 on the CPU, the checkpoint's 16-bit dtype on a GPU).
        target: the build target (``onnxruntime_genai`` builds on the host; TensorRT-LLM builds are planned by the GPU
            plan and counted here as holding the checkpoint's shards only).
        calib_activation_bytes: one calibration batch's activations (:func:`calibration_activation_bytes` x batch).
        layer_parameters: parameters of one decoder layer (what an offloaded calibration onloads at a time).
        room: the GPU, host and disk figures the GPU stages are placed from (:func:`calibration_placement`).
        eval_device: ``cpu`` or ``cuda`` (where the baseline and simulated runners run).
        engine_host_bytes: the built engine's weights when its runner runs on the host (onnxruntime-genai on the CPU).
        eval_activation_bytes: one evaluate batch's activations, KV cache and logits on the GPU
            (:func:`eval_activation_bytes`).
    Returns:
        ``{stage: StageMemory}`` for export, quantize, build and evaluate.
    """
    from ..facts.geometry import DTYPE_BYTES

    room = room or Room()
    P, W = int(num_parameters), 4 * int(num_parameters)
    exp_b = DTYPE_BYTES.get(export_dtype, 2)
    out: dict[str, StageMemory] = {
        "export": StageMemory(
            LIBS_BYTES + P * exp_b + 2 * largest_tensor * 4,
            None,
            f"libraries + P x {exp_b} B ({export_dtype}) + 2 largest tensors",
            "cpu",
        )
    }
    if calib_device == "cpu":
        q = StageMemory(
            int(LIBS_BYTES + W * (1 + QUANT_TRANSIENT) + calib_activation_bytes),
            None,
            f"libraries + float32 weights x {1 + QUANT_TRANSIENT:.2f} + one calibration batch's activations "
            f"({calib_activation_bytes / 2**30:.2f} GiB) (CPU calibration)",
            "cpu, whole (float32)",
        )
    else:
        cd = compute_dtype("cuda", export_dtype)
        q, _ = _gpu_quantize(P * DTYPE_BYTES[cd], layer_parameters * DTYPE_BYTES[cd], calib_activation_bytes, room, cd)
    out["quantize"] = q
    out["build"] = _build_memory(W, largest_tensor, target)
    out["evaluate"] = _evaluate_memory(P, export_dtype, reference_dtype, eval_device, room, engine_host_bytes, eval_activation_bytes)
    return out


def _build_memory(W: int, largest_tensor: int, target: str) -> StageMemory:
    """build (module docstring): the onnxruntime-genai build on the host, or a GPU engine build."""
    if target == "onnxruntime_genai":
        parent = int(LIBS_BYTES + W * (1 + BUILD_TRANSIENT))
        child = int(BUILDER_LIBS_BYTES + W * BUILDER_FACTOR)
        return StageMemory(
            max(parent, child),
            None,
            f"max(libraries + float32 weights x {1 + BUILD_TRANSIENT:.2f}; builder: its libraries + float32 weights x {BUILDER_FACTOR})",
            "host (onnxruntime-genai)",
        )
    return StageMemory(LIBS_BYTES + 2 * largest_tensor * 4, None, "libraries + 2 largest tensors (the engine build runs on the GPU)", "GPU")


def _evaluate_memory(
    P: int, export_dtype: str, reference_dtype: str, eval_device: str, room: Room, engine_host_bytes: int, eval_activation_bytes: int
) -> StageMemory:
    """evaluate (module docstring): runners one at a time; on a GPU the reference model is loaded whole
    (pipeline/evaluate/runners.py: evaluate does not offload)."""
    from ..facts.geometry import DTYPE_BYTES

    ref = export_dtype if reference_dtype == "checkpoint" else "float32" if reference_dtype == "auto" else reference_dtype
    if eval_device == "cpu":
        ref_b = DTYPE_BYTES.get(ref, 4)
        return StageMemory(
            int(LIBS_BYTES + P * ref_b * (1 + EVAL_TRANSIENT)),
            None,
            f"libraries + reference model (P x {ref_b} B) x {1 + EVAL_TRANSIENT:.2f}; runners load one at a time",
            f"cpu ({ref})",
        )
    ed = compute_dtype("cuda", export_dtype) if reference_dtype == "auto" else ref
    model_b = P * DTYPE_BYTES.get(ed, 2)
    engine = int(engine_host_bytes * (1 + EVAL_TRANSIENT))
    return StageMemory(
        int(LIBS_BYTES + engine),
        int(model_b + eval_activation_bytes),
        f"GPU: reference model whole (P x {DTYPE_BYTES.get(ed, 2)} B, {ed}) + one batch's activations, KV cache and logits "
        f"({eval_activation_bytes / 2**30:.2f} GiB); host: libraries"
        + (f"; the engine on the host: its weights x {1 + EVAL_TRANSIENT:.2f}" if engine else "")
        + "; runners load one at a time",
        f"cuda {room.gpu_name or 'GPU'}, whole ({ed})",
        "none",
    )


def stage_refusals(pred: dict[str, StageMemory], stages: list[str], host_total: int | None) -> list[str]:
    """A refusal (with the figure and the fix) for every stage in ``stages`` predicted above ``host_total`` bytes."""
    if not host_total:
        return []
    fixes = {
        "export": "export on a host with more memory, or from a checkpoint already in a 16-bit dtype (model.dtype=bfloat16)",
        "quantize": "calibrate on a GPU host (calibration.device=auto picks CUDA when visible; bf16, layers onloaded one at a "
        "time when the model does not fit the GPU), a smaller calibration batch (calibration.batch_size=auto, or a "
        "lower integer), or a host with more memory",
        "build": "build on a host with more memory, or target=tensorrt_llm_pytorch (no host-side engine build)",
        "evaluate": "eval.reference_dtype=bfloat16 (half the baseline's memory), or a host with more memory",
    }
    out = []
    for s in stages:
        m = pred.get(s)
        if m is not None and m.host_bytes > host_total:
            out.append(
                f"{s} needs about {m.host_bytes / 2**30:.1f} GiB of host memory ({m.formula}) but the host has "
                f"{host_total / 2**30:.1f} GiB. Fix: {fixes[s]}."
            )
    return out


def shape_or_none(cfg: Any) -> ModelShape | None:
    """:func:`load_shape`'s shape, or None when the checkpoint cannot be read (the export stage and ``pipeline plan``
    report an unreadable checkpoint with their own message; config checks then skip what needs the shape)."""
    try:
        return load_shape(cfg)[0]
    except PipelineError:
        return None


def load_shape(cfg: Any) -> tuple[ModelShape, str]:
    """The model shape and where it came from: the checkpoint's ``config.json`` at ``model.path``,
    else ``model.hf_config`` (shapes-only presets).  Raises :class:`InputError` when neither exists."""
    from ..core.config import resolve_path

    m = cfg.model
    if m.path:
        try:
            p = resolve_path(m.path)
            cj = (p / "config.json") if p is not None else None
            found = cj is not None and cj.is_file()
        except (OSError, ValueError) as e:  # e.g. an embedded NUL byte
            raise InputError(f"model.path={m.path!r}: not a usable path ({e}).") from None
        if found and cj is not None:  # found implies cj is set; the check narrows the type
            return ModelShape.from_hf_config(read_config_json(cj), str(cj)), str(cj)
        if not m.hf_config:
            raise InputError(
                f"model.path={m.path!r}: no config.json at {cj}. Point model.path at a Hugging Face checkpoint "
                f"folder, or use a shapes-only preset (model=llama31_8b)."
            )
    if m.hf_config:
        hc = dict(m.hf_config)
        return ModelShape.from_hf_config(hc, "model.hf_config"), "model.hf_config"
    raise InputError(
        "model: neither model.path nor model.hf_config is set. Pass model.path=/path/to/checkpoint or a preset (model=llama31_8b)."
    )


def plan_device(cfg: Any) -> tuple[str, GPU | None, str]:
    """(kind, gpu, why) of the hardware to plan for: kind is ``gpu`` or ``cpu`` (the device of the target that
    :func:`pipeline.core.targets.resolve_target` picks, so the plan and the build agree); ``gpu`` is the named
    (``target.gpu``) or local GPU, ``None`` when none is named or visible.

    Raises :class:`InputError` for an unknown ``target.gpu`` name (listing the catalogue) or ``target.name``."""
    from ..core.targets import get_target, resolve_target

    t = cfg.target
    named = None
    if t.gpu:
        try:
            named = lookup(t.gpu)
        except KeyError as e:
            raise InputError(f"target.gpu={t.gpu!r}: {e.args[0]}. Fix: target.gpu=<one of them>") from None
    name, reason = resolve_target(cfg)
    if name == "onnxruntime_genai" and t.execution_provider == "cpu":
        why = "target onnxruntime_genai on the CPU" if t.name != "auto" else f"{reason}"
        return "cpu", None, why
    if named is not None:
        return "gpu", named, f"target.gpu={t.gpu}"
    local = local_gpus()
    if local:
        return "gpu", local[0][1], f"local GPU 0 ({local[0][0].get('name')})"
    chosen = get_target(name).capabilities(cfg).name  # as the user named it: tensorrt_llm_pytorch, not its registry name
    return "gpu", None, f"target {chosen} needs a GPU, none is named (target.gpu) or visible"


@functools.lru_cache(maxsize=1)
def host_memory_bandwidth_gbs(size_mb: int = 256, repeats: int = 3) -> float:
    """Measured host memory bandwidth in GB/s (1e9 bytes/s), cached for the process.

    Copies a ``size_mb`` MB float64 numpy array ``repeats`` times after one warm-up copy (which
    faults the destination pages in) and counts read + write bytes (2 x size) over the fastest
    copy.  Takes about 0.1-0.3 s.  The STREAM "copy" kernel measures the same quantity."""
    import time

    import numpy as np

    n = size_mb * 10**6 // 8
    a = np.ones(n)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best / 1e9


def host_memory() -> dict[str, int | None]:
    """Total and available host RAM in bytes (``/proc/meminfo``; total via sysconf as fallback)."""
    total = avail = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                k, v = line.split(":", 1)
                if k == "MemTotal":
                    total = int(v.split()[0]) * 1024
                elif k == "MemAvailable":
                    avail = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    return {"total": total, "available": avail if avail is not None else total}
