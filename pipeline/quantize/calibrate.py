"""The calibration loop: ``mtq.quantize`` with the recipe's ModelOpt config, or the ``quant=auto`` search."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from .auto import auto_search
from .common import _quiet, unused_fields
from .modelopt_config import lm_head_excluded, modelopt_config
from .placement import choose_batch_size, free_bytes, with_layerwise
from .preflight import _Source
from .resmooth import ResmoothResult, resmooth

log = logging.getLogger(__name__)
#: ModelOpt's probe measures a plain forward pass (no quantizers inserted yet); calibration adds fake-quant copies of the
#: linears' inputs, about as large again (:data:`pipeline.core.sizing.ACT_HIDDEN_ROWS`). Not measured on a GPU.
FAKE_QUANT_ACTIVATION_RATIO = 2.0


@dataclasses.dataclass
class _Calibration:
    """What calibration produced (all empty for ``none``)."""

    stats: dict[str, Any] | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    modelopt_cfg: dict[str, Any] | None = None
    auto: dict[str, Any] | None = None
    cset: Any = None  # pipeline.data.calibration.CalibrationSet
    resmooth: dict[str, Any] | None = None  # pipeline.quantize.resmooth.ResmoothResult.as_dict()
    cuda_extension: dict[str, Any] | None = None  # cuda_extension(): load time of ModelOpt's CUDA extension (not hashed)
    resumed_at: tuple[int, int] | None = None  # (first layer calibrated by this run, layers) when it resumed a killed run


def resume_point(checkpoint_dir: Path) -> tuple[int, int] | None:
    """``(layer, layers)`` where ModelOpt's layer-by-layer calibration would resume from ``checkpoint_dir``, or None
    (empty, complete or unreadable: it starts over) (``detect_resume_point``, modelopt/torch/quantization/utils/
    layerwise_calib.py, 0.47)."""
    from modelopt.torch.quantization.utils.layerwise_calib import detect_resume_point

    info = detect_resume_point(str(checkpoint_dir)) if checkpoint_dir.is_dir() else None
    return (int(info[0]), int(info[1]["num_layers"])) if info else None


def cuda_extension(device: str) -> dict[str, Any] | None:
    """Load ModelOpt's CUDA fake-quant extension before calibration, timed; None on the CPU.

    ModelOpt compiles it on first use with ``torch.utils.cpp_extension.load`` (``modelopt_cuda_ext``,
    modelopt/torch/quantization/extensions.py, 0.47) into ``TORCH_EXTENSIONS_DIR``: about 50 s on a fresh H200 machine
    (the first quantize there took 64 s of calibration for the 1 B shape, later ones 12-15 s, 2026-12-04), then
    milliseconds. The runner points ``TORCH_EXTENSIONS_DIR`` next to the artifact store when it is unset
    (``pipeline.preflight.open_store``), so a CI job that caches its store keeps the build too.
    Returns ``{"seconds", "dir", "built"}`` (built: the load took over 5 s, i.e. it compiled)."""
    import os
    import time

    if not device.startswith("cuda"):
        return None
    from modelopt.torch.quantization.extensions import get_cuda_ext

    where = os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")
    t = time.time()
    log.info("loading ModelOpt's CUDA extension (compiled on first use into %s: about 50 s)", where)
    get_cuda_ext()
    secs = round(time.time() - t, 2)
    if secs > 5:
        log.warning("ModelOpt's CUDA extension was compiled in %.0f s (first use of %s); later runs reuse it", secs, where)
    return {"seconds": secs, "dir": where, "built": secs > 5}


def _calibrate(cfg: Any, src: _Source, calib_path: Path | None, progress: Any, seed: int, resume_dir: Path | None = None) -> _Calibration:
    """Calibrate ``src.model`` in place: ``mtq.quantize`` with the recipe's config, or the ``auto`` search.

    Layer by layer with a ``resume_dir`` (the store's folder for this key that survives a killed run), ModelOpt keeps a
    checkpoint of every finished layer in ``resume_dir/layerwise`` and a run of the same key resumes after the last one
    (:func:`resume_point`); the statistics and bytes equal an uninterrupted run's
    (tests/quantize/test_resume.py)."""
    import contextlib

    import modelopt.torch.quantization as mtq
    import torch
    import transformers as tf

    from ..data.calibration import load_calibration

    qcfg = cfg.quant
    prog = progress or (lambda d, t: contextlib.nullcontext(lambda n=1: None))
    cuda_ext = cuda_extension(src.placement.device)
    tok = tf.AutoTokenizer.from_pretrained(str(src.hf), trust_remote_code=False)
    cset = load_calibration(cfg.calibration, tok, calib_path)
    cal = _Calibration(stats=cset.stats, warnings=cset.warnings, cset=cset)
    cal.cuda_extension = cuda_ext
    batch_size, why = _batch_size(cfg.calibration.batch_size, src, cset)
    cset.stats["batch_size"], cset.stats["batch_size_reason"] = batch_size, why
    log.info("calibration batch: %s", why)
    if qcfg.recipe == "auto":
        cal.modelopt_cfg = {"auto_quantize": {f: modelopt_config(qcfg, src.excluded, f) for f in qcfg.auto.formats}}
        with prog("searching per-layer formats (auto_quantize)", 1) as advance:
            cal.auto = auto_search(src.model, qcfg, src.excluded, [ids for _, ids in cset.batches(batch_size)], seed)
            advance(1)
        src.model.eval()
    else:
        cal.modelopt_cfg = with_layerwise(modelopt_config(qcfg, src.excluded), src.placement)
        ckpt = resume_dir / "layerwise" if resume_dir is not None and src.placement.layerwise else None
        run_cfg = with_layerwise(modelopt_config(qcfg, src.excluded), src.placement, ckpt)
        where = f" layer by layer on {src.placement.device}" if src.placement.layerwise else f" on {src.placement.device}"
        if ckpt is not None:
            cal.resumed_at = resume_point(ckpt)
            if cal.resumed_at:
                where += f", resuming at layer {cal.resumed_at[0]} of {cal.resumed_at[1]}"
                log.warning(
                    "calibration: resuming layer-by-layer calibration at layer %d of %d from the checkpoint of a killed run of "
                    "the same key (%s)",
                    *cal.resumed_at,
                    ckpt,
                )
        with prog(f"calibrating {qcfg.recipe}{where}", len(cset.samples)) as advance:
            loop = cset.forward_loop(
                batch_size, device=src.placement.device, progress=advance, last_logits_only=lm_head_excluded(src.excluded)
            )
            torch.manual_seed(seed)
            with torch.no_grad(), _quiet("mtq.quantize"):
                mtq.quantize(src.model, run_cfg, loop)
    if "resmooth" in unused_fields(qcfg):  # not keyed for it: never read
        cal.resmooth = ResmoothResult(reason=f"quant={qcfg.recipe} has no AWQ/SmoothQuant pre-quant scale").as_dict()
    elif bool(qcfg.resmooth):
        with _quiet("resmooth"):
            cal.resmooth = resmooth(src.model, src.placement.device).as_dict()
    else:
        cal.resmooth = {"applied": False, "reason": "quant.resmooth=false"}
    assert cal.stats is not None
    cal.stats["batches"] = len(cset.batches(batch_size))
    cal.stats["tokens_trimmed"] = cset.trimmed_tokens(batch_size)
    return cal


def _batch_size(setting: Any, src: _Source, cset: Any) -> tuple[int, str]:
    """``calibration.batch_size`` resolved against the device's free memory beside the loaded model
    (:func:`pipeline.quantize.placement.choose_batch_size`); on CUDA with the whole model resident, ModelOpt's own
    probe (``get_max_batch_size``, with :data:`FAKE_QUANT_ACTIVATION_RATIO`)."""
    from ..core.sizing import calibration_activation_bytes
    from ..facts.geometry import DTYPE_BYTES, ModelShape

    pl = src.placement
    shape = ModelShape.from_hf_config(src.model.config.to_dict(), source=str(src.hf / "config.json"))
    seq = max((len(s) for s in cset.samples), default=1)
    per_sample = calibration_activation_bytes(shape.hidden_size, shape.intermediate_size, seq, DTYPE_BYTES[pl.dtype])
    probe = None
    if pl.device.startswith("cuda") and pl.offload == "none":
        from modelopt.torch.utils.dataset_utils import get_max_batch_size

        def probe() -> int:
            return int(get_max_batch_size(src.model, max_sample_length=seq, sample_memory_usage_ratio=FAKE_QUANT_ACTIVATION_RATIO))

    return choose_batch_size(
        setting, device=pl.device, per_sample_bytes=per_sample, free=free_bytes(pl.device), n_samples=len(cset.samples), probe=probe
    )
