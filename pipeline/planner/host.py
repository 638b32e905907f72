"""Host (and GPU) memory of each pipeline stage, predicted from the model's shape before any work (docs/memory.md).

The model is ``P`` parameters; ``W = 4 P`` bytes is its float32 weights. Each stage's peak resident set is predicted as
the libraries' fixed cost plus what the stage holds at its worst moment, from the memory model in docs/memory.md:

============  ==========================================================================================================
export        ``LIBS + P x export dtype bytes + 2 x largest tensor`` (transformers loads the model in the export dtype
              once; ``save_pretrained`` writes from it)
quantize      CPU: ``LIBS + W x (1 + QUANT_TRANSIENT) + A`` (one float32 model: calibrated, its state streamed out,
              exported; the transient is AWQ's search and the exporters' output tensors; ``A`` is one calibration batch's
              activations, :func:`calibration_activation_bytes`); CUDA: the host holds ``LIBS`` plus one tensor while the
              GPU holds ``P x 2`` (bf16) plus ``A``; offloaded layers wait in host memory
build         onnxruntime_genai: ``LIBS + W x (1 + BUILD_TRANSIENT)`` for the restored simulated-quant model and its
              converted int4 tensors, then the builder (a separate process, after the model is freed):
              ``BUILDER_LIBS + W x BUILDER_FACTOR``
evaluate      ``LIBS + reference model (P x eval.reference_dtype bytes) + transient``: runners are loaded one at a time
============  ==========================================================================================================

Coefficients are measured (``make bench-scale``, the 2-core 24 GB host, bench/results/scale.json): they are fits of
the peak RSS of the 80 M, 412 M and 1 B shapes, with ``LIBS`` the RSS of a process that imported torch 2.13,
transformers 5 and ModelOpt 0.47. A prediction above the host's total memory refuses the run (exit 4) before any work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: RSS of a process that has imported torch, transformers and ModelOpt, bytes (measured: 0.52 GB).
LIBS_BYTES = 550_000_000
#: The builder subprocess's own fixed cost (python + torch + onnx + onnxruntime-genai), bytes.
BUILDER_LIBS_BYTES = 600_000_000
#: quantize on the CPU: peak beyond one float32 model, as a share of it (activations, AWQ search, export tensors).
QUANT_TRANSIENT = 0.35
#: build (parent): the restored float32 model plus the converted checkpoint, beyond one float32 model.
BUILD_TRANSIENT = 0.35
#: the onnxruntime-genai builder's peak beyond its libraries, as a share of the float32 weights (int4 input).
BUILDER_FACTOR = 0.6
#: activations of one calibration sample at its worst moment, per token, in elements of ``hidden_size`` and of
#: ``intermediate_size``: the residual stream, the normalised input, q/k/v and attention output and ModelOpt's fake-quant
#: copies of a linear's input (about 8 hidden-sized rows), the MLP's gate, up and activated rows plus the down
#: projection's quantized input (about 4 intermediate-sized rows). The logits are not counted: the calibration forward
#: asks for the last position's only (``logits_to_keep=1``, pipeline/quantize/calibration_set.py). An upper bound, not a fit: it has
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
class StageMemory:
    """Predicted peak memory of one stage: ``host_bytes`` (resident set, the largest process of the stage),
    ``gpu_bytes`` (None when the stage uses no GPU) and the formula, in words, that gave them."""

    host_bytes: int
    gpu_bytes: int | None
    formula: str


def stage_memory(
    num_parameters: int,
    largest_tensor: int,
    *,
    export_dtype: str,
    calib_device: str,
    reference_dtype: str,
    target: str,
    calib_activation_bytes: int = 0,
) -> dict[str, StageMemory]:
    """Per-stage peak memory of a run (module docstring).

    Args:
        num_parameters: the model's parameter count (``P``).
        largest_tensor: elements of its largest tensor (vocab x hidden for most LLMs).
        export_dtype: the export checkpoint's dtype.
        calib_device: ``cpu`` or ``cuda`` (the resolved ``calibration.device``).
        reference_dtype: the evaluate baseline's dtype (``eval.reference_dtype``; ``checkpoint`` = the export dtype).
        target: the build target (``onnxruntime_genai`` builds on the host; TensorRT-LLM builds are planned by the GPU
            plan and counted here as holding the checkpoint's shards only).
    Returns:
        ``{stage: StageMemory}`` for export, quantize, build and evaluate.
    """
    from ..facts.geometry import DTYPE_BYTES

    P, W = int(num_parameters), 4 * int(num_parameters)
    exp_b = DTYPE_BYTES.get(export_dtype, 2)
    out: dict[str, StageMemory] = {
        "export": StageMemory(
            LIBS_BYTES + P * exp_b + 2 * largest_tensor * 4, None, f"libraries + P x {exp_b} B ({export_dtype}) + 2 largest tensors"
        )
    }
    if calib_device == "cpu":
        q = StageMemory(
            int(LIBS_BYTES + W * (1 + QUANT_TRANSIENT) + calib_activation_bytes),
            None,
            f"libraries + float32 weights x {1 + QUANT_TRANSIENT:.2f} + one calibration batch's activations "
            f"({calib_activation_bytes / 2**30:.2f} GiB) (CPU calibration)",
        )
    else:
        q = StageMemory(
            LIBS_BYTES + 2 * largest_tensor * 4,
            int(2 * P * (1 + QUANT_TRANSIENT) + calib_activation_bytes),
            f"host: libraries + 2 largest tensors; GPU: bf16 weights x {1 + QUANT_TRANSIENT:.2f} + one calibration batch's "
            f"activations ({calib_activation_bytes / 2**30:.2f} GiB) (beyond the GPU: layers offloaded)",
        )
    out["quantize"] = q
    if target == "onnxruntime_genai":
        parent = int(LIBS_BYTES + W * (1 + BUILD_TRANSIENT))
        child = int(BUILDER_LIBS_BYTES + W * BUILDER_FACTOR)
        out["build"] = StageMemory(
            max(parent, child),
            None,
            f"max(libraries + float32 weights x {1 + BUILD_TRANSIENT:.2f}; builder: its libraries + float32 weights x {BUILDER_FACTOR})",
        )
    else:
        out["build"] = StageMemory(
            LIBS_BYTES + 2 * largest_tensor * 4, None, "libraries + 2 largest tensors (the engine build runs on the GPU)"
        )
    ref_b = DTYPE_BYTES.get(export_dtype if reference_dtype == "checkpoint" else reference_dtype, 4)
    out["evaluate"] = StageMemory(
        int(LIBS_BYTES + P * ref_b * (1 + EVAL_TRANSIENT)),
        None,
        f"libraries + reference model (P x {ref_b} B) x {1 + EVAL_TRANSIENT:.2f}; runners load one at a time",
    )
    return out


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


def plan_refusals(stages_doc: dict[str, Any], stages: list[str]) -> list[str]:
    """:func:`stage_refusals` for a plan's ``stages`` section (``{"host_total_bytes", "predicted"}``, :func:`as_json`)."""
    pred = {k: StageMemory(**v) for k, v in stages_doc["predicted"].items()}
    return stage_refusals(pred, stages, stages_doc.get("host_total_bytes"))


def as_json(pred: dict[str, StageMemory]) -> dict[str, Any]:
    return {k: dataclasses.asdict(v) for k, v in pred.items()}
