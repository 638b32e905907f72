"""Each pipeline stage's predicted peak memory on this host (or the GPU named by ``target.gpu``) and where it runs.

Rule: the plan's ``stages`` section: which device calibration and evaluate use, the room they have (GPU, host, the
store's disk) and the per-stage peaks of :func:`pipeline.core.sizing.stage_memory`; a refusal when nothing can hold
the model to calibrate. The memory formulas themselves are :mod:`pipeline.core.sizing` (shared with the stages).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.hostinfo import local_gpus
from ..core.sizing import host_memory
from ..facts.geometry import DTYPE_BYTES, ModelShape
from ..facts.gpus import GPU, lookup
from ..facts.recipes import RECIPES
from .base import GiB, Plan, PlannedCalibration, PlanStages, VisibleGpu, gib
from .weights import weight_bytes


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


def plan_stages(p: Plan, cfg: Any, shape: ModelShape) -> None:
    """``p.stages``: each stage's predicted peak host (and GPU) memory and where it runs (:mod:`pipeline.core.sizing`);
    a refusal in ``p.refusals`` when neither the GPU, the host nor the store's disk can hold the model to calibrate."""
    from ..core.hostinfo import gpu_free_bytes
    from ..core.sizing import calibration_placement, compute_dtype, stage_memory
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
    gpus = tuple(VisibleGpu(d.get("name"), g.memory_bytes, free[i] if i < len(free) else None) for i, (d, g) in enumerate(local))
    p.target = dataclasses.replace(p.target, gpus=gpus)
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
    p.stages = st = PlanStages(host_memory()["total"], pred)
    gpu_total = (named or (local[0][1] if local else None)).memory_bytes if (named or local) else None  # type: ignore[union-attr]
    p.notes.extend(_evaluate_gpu_note(cfg, exp, pred["evaluate"], gpu_total))
    if not quantizes:
        return
    cd = compute_dtype(dev, exp)
    model_b = shape.num_parameters * DTYPE_BYTES[cd]
    on_gpu = dev == "cuda" and room.gpu_free is not None
    pl = calibration_placement(
        model_b, room.gpu_free if on_gpu else None, room.host_free, room.max_device, room.max_host if on_gpu else None, room.disk_free
    )
    q = pred["quantize"]
    if not on_gpu and pl.offload != "none":  # the CPU's own budget: layers beyond it wait on disk (the stage's rule)
        # ... while calibrating; the exports then restore the whole model on the host (pipeline/quantize/run.py _exports)
        restored = f"; layers wait on disk while calibrating, then the exports restore the whole {cd} model on the host: the offload does not lower this peak"
        q = dataclasses.replace(q, where=f"cpu, layers offloaded to disk ({cd})", offload="disk", formula=q.formula + restored)
    if str(getattr(cfg.calibration, "layerwise", "auto")).lower() == "true" and "layer by layer" not in q.where:
        q = dataclasses.replace(q, where=q.where + ", layer by layer (calibration.layerwise=true)")
    placed = PlannedCalibration(**dataclasses.asdict(pl), device=dev, dtype=cd, model_bytes=model_b)
    p.stages = dataclasses.replace(st, predicted={**pred, "quantize": q}, calibration_placement=placed)
    if pl.refused:
        p.refusals.append(  # the reason names the device's and the disk's free bytes; the GPU and host only where not
            f"quantize: nothing can hold the model to calibrate it: {pl.reason} (GPU: "
            + (f"{room.gpu_name}, {gib(room.gpu_free)} free; host: {gib(room.host_free)} available" if on_gpu else "none")
            + "). Fix: a GPU or host with more memory, a store_dir on a larger disk, or a smaller model."
        )


def _evaluate_gpu_note(cfg: Any, exp: str, ev: Any, gpu_total: int | None) -> list[str]:
    """A note when evaluate's reference model, loaded whole on the GPU (``ev``: its :class:`~pipeline.core.sizing.StageMemory`),
    exceeds :data:`~pipeline.core.sizing.DEVICE_BUDGET_FRACTION` of it. The fix offers a 16-bit ``eval.reference_dtype``
    (the checkpoint's, as evaluate loads it on a GPU) only when the figure is in a wider dtype: a bfloat16 figure once
    came with ``eval.reference_dtype=float16``, the same 2 bytes a parameter."""
    from ..core.sizing import DEVICE_BUDGET_FRACTION, compute_dtype

    if not ev.gpu_bytes or not gpu_total or ev.gpu_bytes <= DEVICE_BUDGET_FRACTION * gpu_total:
        return []
    ref, half = str(cfg.eval.reference_dtype), compute_dtype("cuda", exp)
    est = exp if ref == "checkpoint" else half if ref == "auto" else ref  # the dtype the figure is in (stage_memory's rule)
    smaller = f"eval.reference_dtype={half} (half of it), " if DTYPE_BYTES.get(est, 2) > DTYPE_BYTES[half] else ""
    return [
        f"evaluate loads the reference model whole on the GPU: about {ev.gpu_bytes / 2**30:.1f} GiB ({ev.formula}) exceed "
        f"{DEVICE_BUDGET_FRACTION:.0%} of the GPU's {gpu_total / 2**30:.1f} GiB. Fix: eval.device=cpu (host memory), "
        f"{smaller}a GPU with more memory, or skip evaluate on this host."
    ]


def _eval_batch_bytes(cfg: Any, shape: ModelShape, export_dtype: str, room: Any = None) -> int:
    """One evaluate batch on the GPU (:func:`pipeline.core.sizing.eval_activation_bytes`): ``eval.batch_size`` sequences
    of ``build.max_seq_len`` tokens in the GPU's 16-bit dtype; for ``auto`` the most it may choose, the sequences that fit
    :data:`pipeline.core.sizing.ACTIVATION_FRACTION` of the GPU's free memory beside the model
    (pipeline/evaluate/runners.py ``choose_batch``; 16 when the free memory is unknown). An invalid setting counts as
    ``auto`` (validation names it)."""
    from ..core.sizing import compute_dtype, eval_activation_bytes

    b = DTYPE_BYTES[compute_dtype("cuda", export_dtype)]
    seq = max(1, int(cfg.build.max_seq_len))

    def per(n: int) -> int:
        return eval_activation_bytes(shape.hidden_size, shape.intermediate_size, shape.vocab_size, shape.kv_bytes_per_token(b), seq, n, b)

    batch = _batch(cfg.eval.batch_size, getattr(room, "gpu_free", None), shape.num_parameters * b, per(1), 16)
    return per(max(1, batch))


def _calibration_batch_bytes(cfg: Any, shape: ModelShape, device: str, export_dtype: str, room: Any = None) -> int:
    """One calibration batch's activations on ``device``, bytes (:func:`pipeline.core.sizing.calibration_activation_bytes`
    x the batch): ``calibration.batch_size`` when it is an integer; for ``auto`` the most it may choose: on the CPU
    :data:`pipeline.core.sizing.AUTO_BATCH_MAX_CPU`; on a GPU the samples whose activations fit
    :data:`pipeline.core.sizing.ACTIVATION_FRACTION` of the GPU's free memory beside the model (at most
    ``calib_size``; pipeline/quantize/placement.py ``choose_batch_size``). An invalid setting counts as ``auto``
    (validation names it)."""
    from ..core.sizing import AUTO_BATCH_MAX_CPU, calibration_activation_bytes, compute_dtype

    cal = cfg.calibration
    dtype_b = DTYPE_BYTES[compute_dtype(device, export_dtype)]
    per = calibration_activation_bytes(shape.hidden_size, shape.intermediate_size, int(cal.calib_max_seq_length), dtype_b)
    free = getattr(room, "gpu_free", None) if device == "cuda" else None
    batch = _batch(cal.batch_size, free, shape.num_parameters * dtype_b, per, AUTO_BATCH_MAX_CPU)
    batch = max(1, min(batch, int(cal.calib_size)))
    return batch * per


def _batch(setting: Any, gpu_free: int | None, model_bytes: int, per_sample: int, default: int) -> int:
    """The batch an ``auto`` (or invalid: validation names it) ``batch_size`` setting may choose at most: the samples
    whose activations (``per_sample`` bytes each) fit :data:`pipeline.core.sizing.ACTIVATION_FRACTION` of the GPU's
    free memory beside the model (at most :data:`pipeline.core.sizing.DEVICE_BUDGET_FRACTION` of it resident), or
    ``default`` when the free GPU memory is unknown; an integer setting as is."""
    from ..core.config.calibration import parse_batch_size
    from ..core.sizing import ACTIVATION_FRACTION, DEVICE_BUDGET_FRACTION

    try:
        batch = parse_batch_size(setting)
    except ValueError:
        batch = None
    if batch is not None:
        return batch
    if gpu_free is None:
        return default
    resident = min(model_bytes, int(gpu_free * DEVICE_BUDGET_FRACTION))
    return int(ACTIVATION_FRACTION * max(0, gpu_free - resident) // max(1, per_sample))
