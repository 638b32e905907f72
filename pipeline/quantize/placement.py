"""Where the quantize stage calibrates: the device, the compute dtype, and whether the model is onloaded layer by layer.

Decisions (each recorded in the quant report under ``placement``):

* **device** (``calibration.device``): ``auto`` = ``cuda`` when torch sees a GPU, else ``cpu``; ``cpu``, ``cuda`` or
  ``cuda:N`` as given (``cuda`` on a host without one is refused, exit 2).
* **dtype**: on CUDA the checkpoint's own 16-bit dtype (bfloat16 for a float32 checkpoint: ModelOpt's PTQ example
  loads in the checkpoint's dtype, ``examples/llm_ptq/hf_ptq.py``); on the CPU float32, because torch's CPU kernels
  for 16-bit GEMMs are slow on most hosts and the shipped gate results were measured with a float32 calibration.
* **placement**: the model's bytes in that dtype (parameter count x element size; the count from the export's
  ``model_info.json``, else its safetensors headers) against the device's budget (the planner's rule,
  :func:`pipeline.core.sizing.calibration_placement`: a share of the free memory, ``torch.cuda.mem_get_info`` /
  ``MemAvailable`` of /proc/meminfo, or ``calibration.max_device_memory_gb`` when set). A model within budget is loaded whole onto the device; a larger
  one is loaded with an accelerate ``device_map`` that keeps what fits on the device and offloads the remaining
  decoder layers (to host memory from a GPU, to disk from the CPU), and ModelOpt calibrates it layer by layer
  (``algorithm.layerwise.enable``, modelopt/torch/quantization/model_calib.py ``layerwise_calibrate``, 0.47): each
  layer is onloaded once and replays the cached activations of the layer before it, as llm-compressor's
  sequential pipeline does. ``calibration.layerwise=true`` asks for layer-by-layer calibration without offload.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..core.hostinfo import resolve_torch_device
from ..core.sizing import AUTO_BATCH_MAX_CPU, compute_dtype
from ..errors import InputError


@dataclasses.dataclass(frozen=True)
class Placement:
    """The resolved calibration placement (recorded in the quant report).

    Attributes:
        device: ``cpu`` | ``cuda:N``.
        dtype: compute dtype of the calibrated model (``float32`` | ``bfloat16`` | ``float16``).
        model_bytes: the model's weights in ``dtype``, bytes.
        budget_bytes: what the device may hold of them, bytes.
        offload: ``none`` | ``cpu`` | ``disk`` (where layers beyond the budget wait).
        layerwise: ModelOpt calibrates one decoder layer at a time.
        reason: one sentence for the log and the report.
        host_budget_bytes: what host memory may hold of the offloaded layers from a GPU, bytes (0 on the CPU).
    """

    device: str
    dtype: str
    model_bytes: int
    budget_bytes: int
    offload: str
    layerwise: bool
    reason: str
    host_budget_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_device(setting: str) -> str:
    """``calibration.device`` -> ``cpu`` | ``cuda:N`` (:func:`pipeline.core.hostinfo.resolve_torch_device`)."""
    return resolve_torch_device(setting, "calibration.device")


def free_bytes(device: str) -> int:
    """Free memory of ``device`` now, bytes: ``torch.cuda.mem_get_info`` for CUDA; for the CPU the planner's
    :func:`pipeline.core.sizing.host_memory` (``MemAvailable`` of /proc/meminfo; 0 when unreadable)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(int(device.split(":")[1]))[0])
    from ..core.sizing import host_memory

    return int(host_memory()["available"] or 0)


def plan_placement(
    cal: Any,
    num_parameters: int,
    checkpoint_dtype: str,
    *,
    free: int | None = None,
    device: str | None = None,
    host_free: int | None = None,
    disk_free: int | None = None,
) -> Placement:
    """Decide device, dtype, offload and layerwise calibration for a model of ``num_parameters`` weights, by the
    planner's rule (:func:`pipeline.core.sizing.calibration_placement`: the plan shows the same decision before any
    work). A model within the device budget loads whole; a larger one keeps what fits on the device, and from a GPU
    the remaining layers wait in host memory up to ``calibration.max_host_memory_gb`` (default: the available memory
    less a reserve) and on disk beyond it; from the CPU they wait on disk.

    Args:
        cal: the ``calibration`` config (``device``, ``layerwise``, ``max_device_memory_gb``, ``max_host_memory_gb``).
        num_parameters: the model's parameter count.
        checkpoint_dtype: the export checkpoint's dtype.
        free: the device's free bytes (default: measured now, :func:`free_bytes`).
        device: the resolved device (default: :func:`resolve_device` of ``cal.device``).
        host_free: the host's available bytes (default: measured now).
        disk_free: free bytes where offloaded layers are written (None: not checked).
    Raises:
        InputError: an unknown device; ``calibration.layerwise=false`` for a model beyond the budget.
        PreflightError: neither the device, the host nor the disk can hold the model (exit 4).
    """
    from ..core.sizing import HOST_RESERVE_BYTES, calibration_placement
    from ..errors import PreflightError
    from ..facts.geometry import DTYPE_BYTES

    dev = device or resolve_device(cal.device)
    dtype = compute_dtype(dev, checkpoint_dtype)
    on_gpu = dev.startswith("cuda")
    model_bytes = int(num_parameters) * DTYPE_BYTES[dtype]
    cap, host_cap = getattr(cal, "max_device_memory_gb", None), getattr(cal, "max_host_memory_gb", None)
    gpu_free: int | None = None  # None: the device is the CPU (calibration_placement's convention)
    if on_gpu:
        gpu_free = int(free) if free is not None else (free_bytes(dev) if cap is None else 0)
        hostf: int | None = host_free if host_free is not None else free_bytes("cpu")
    else:
        hostf = int(free) if free is not None else (host_free if host_free is not None else free_bytes("cpu"))
    cp = calibration_placement(
        model_bytes,
        gpu_free,
        hostf,
        max_device_bytes=int(float(cap) * 1e9) if cap is not None else None,
        max_host_bytes=int(float(host_cap) * 1e9) if host_cap is not None else None,
        disk_free_bytes=disk_free,
    )
    fits = cp.offload == "none"
    want = str(getattr(cal, "layerwise", "auto")).lower()
    if not fits and want == "false":
        raise InputError(
            f"calibration.layerwise=false: {cp.reason}. Fix: calibration.layerwise=auto (onload one layer at a time), a "
            "larger calibration.max_device_memory_gb, or a device with more memory."
        )
    if cp.refused:
        raise PreflightError(f"quantize: {cp.reason}. Fix: free disk space under store_dir, a host with more memory, or a larger GPU.")
    host_budget = 0
    if on_gpu and not fits:
        host_budget = int(float(host_cap) * 1e9) if host_cap is not None else max(0, int(hostf or 0) - HOST_RESERVE_BYTES)
    layerwise = (not fits) or want == "true"
    reason = f"{cp.reason} (on {dev} in {dtype})" + (
        "; calibration.layerwise=true: calibrated layer by layer" if layerwise and fits else ""
    )
    return Placement(dev, dtype, model_bytes, cp.budget_bytes, cp.offload, layerwise, reason, host_budget)


def load_for_calibration(hf: Path, placement: Placement, offload_dir: Path) -> Any:
    """Load the export checkpoint per ``placement``: whole, one tensor at a time onto the device
    (:func:`pipeline.core.modelio.load_causal_lm`); offloaded, with transformers' ``from_pretrained`` and a ``device_map`` +
    ``max_memory`` + ``offload_folder`` (accelerate's dispatch: the device's budget, then the host's for a GPU, then
    disk). Returns the model in eval mode."""
    import torch
    import transformers as tf

    if placement.offload == "none":
        from ..core.modelio import load_causal_lm

        return load_causal_lm(hf, getattr(torch, placement.dtype), placement.device)
    offload_dir.mkdir(parents=True, exist_ok=True)
    mem: dict[Any, Any] = {}
    if placement.device.startswith("cuda"):
        mem[int(placement.device.split(":")[1])] = placement.budget_bytes
        mem["cpu"] = max(placement.host_budget_bytes, 1)
    else:
        mem["cpu"] = placement.budget_bytes
    model = tf.AutoModelForCausalLM.from_pretrained(
        str(hf),
        dtype=getattr(torch, placement.dtype),
        trust_remote_code=False,
        device_map=_device_map(hf, placement, mem),
        max_memory=mem,
        offload_folder=str(offload_dir),
    )
    model.eval()
    return model


def _device_map(hf: Path, placement: Placement, mem: dict[Any, Any]) -> dict[str, Any]:
    """accelerate's device map for ``mem`` (``infer_auto_device_map`` over the model built on the meta device, whole
    decoder layers never split), with every module outside the decoder layers (embeddings, final norm, LM head) kept
    on the calibration device: ModelOpt's exporters feed a dummy input to ``model.device`` (the first parameter's
    device), which must not be the meta device of an offloaded embedding (unified_export_hf.py ``llm_dummy_forward``,
    0.47), and only decoder layers are calibrated one at a time."""
    import re

    import torch
    import transformers as tf
    from accelerate import init_empty_weights
    from accelerate.utils import infer_auto_device_map

    config = tf.AutoConfig.from_pretrained(str(hf), trust_remote_code=False)
    with init_empty_weights():
        meta = tf.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    dm = infer_auto_device_map(
        meta,
        max_memory=mem,
        no_split_module_classes=list(getattr(meta, "_no_split_modules", None) or []),
        dtype=getattr(torch, placement.dtype),
    )
    main = next(iter(mem))
    return {k: (v if re.search(r"(^|\.)layers(\.|$)", k) else main) for k, v in dm.items()}


def with_layerwise(modelopt_cfg: dict[str, Any], placement: Placement, checkpoint_dir: Path | None = None) -> dict[str, Any]:
    """``modelopt_cfg`` with ModelOpt's layer-by-layer calibration switched on when ``placement`` asks for it; with a
    ``checkpoint_dir``, ModelOpt saves each finished layer there and a later run resumes after the last saved one
    (``layerwise.checkpoint_dir``, modelopt/torch/quantization/utils/layerwise_calib.py ``_CheckpointState``, 0.47)."""
    if not placement.layerwise:
        return modelopt_cfg
    algo = modelopt_cfg.get("algorithm")
    algo = dict(algo) if isinstance(algo, dict) else {"method": algo if algo is not None else "max"}
    algo["layerwise"] = {"enable": True, **({"checkpoint_dir": str(checkpoint_dir)} if checkpoint_dir is not None else {})}
    return {**modelopt_cfg, "algorithm": algo}


#: Share of the free memory left beside the model that one calibration batch's activations may take (``auto``).
ACTIVATION_FRACTION = 0.5


def parse_batch_size(setting: Any) -> int | None:
    """``calibration.batch_size`` -> the integer given, or None for ``auto``.

    Raises:
        InputError: anything else (:func:`pipeline.core.config.calibration.parse_batch_size`).
    """
    from ..core.config.calibration import parse_batch_size as parse

    try:
        return parse(setting)
    except ValueError as e:
        raise InputError(f"calibration.batch_size={setting!r} {e}. Fix: a positive integer, or auto.") from None


def choose_batch_size(setting: Any, *, device: str, per_sample_bytes: int, free: int, n_samples: int, probe: Any = None) -> tuple[int, str]:
    """The calibration batch (samples per forward pass) and one sentence saying why.

    Args:
        setting: ``calibration.batch_size``: an integer is used as given; ``auto`` picks the largest batch whose
            activations fit :data:`ACTIVATION_FRACTION` of ``free``, at most :data:`AUTO_BATCH_MAX_CPU` on the CPU.
        device: ``cpu`` | ``cuda:N``.
        per_sample_bytes: one sample's activations (:func:`pipeline.core.sizing.calibration_activation_bytes`), bytes.
        free: the device's free memory now, beside the loaded model, bytes.
        n_samples: calibration samples (no batch is larger).
        probe: optional ``() -> int``: on CUDA with the whole model resident, ModelOpt's own probe
            (``modelopt.torch.utils.dataset_utils.get_max_batch_size``, 0.47: one forward pass at batch 1 measures the
            memory per sample, then the target batch is tried) replaces the formula.
    Raises:
        InputError: an invalid ``setting`` (:func:`parse_batch_size`).
    """
    n = parse_batch_size(setting)
    if n is not None:
        return n, f"calibration.batch_size={n}"
    cap = AUTO_BATCH_MAX_CPU if device == "cpu" else max(1, n_samples)
    if probe is not None:
        b, how = int(probe()), "ModelOpt's get_max_batch_size probe"
    else:
        b = int(ACTIVATION_FRACTION * max(0, free) // max(1, per_sample_bytes))
        how = (
            f"{ACTIVATION_FRACTION:.0%} of the {free / 1e9:.1f} GB free on {device} at "
            f"{per_sample_bytes / 1e6:.1f} MB of activations per sample"
        )
    chosen = max(1, min(b, cap, max(1, n_samples)))
    limit = f", at most {AUTO_BATCH_MAX_CPU} on the CPU" if device == "cpu" else ""
    return chosen, f"calibration.batch_size=auto: {chosen} ({how} allow {b}{limit}; {n_samples} samples)"
