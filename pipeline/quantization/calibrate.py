"""The calibration loop: ``mtq.quantize`` with the recipe's ModelOpt config, or the ``quant=auto`` search."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .auto import auto_search
from .common import _quiet
from .modelopt_config import modelopt_config
from .placement import with_layerwise
from .preflight import _Source
from .resmooth import resmooth


@dataclasses.dataclass
class _Calibration:
    """What calibration produced (all empty for ``none``)."""

    stats: dict[str, Any] | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)
    modelopt_cfg: dict[str, Any] | None = None
    auto: dict[str, Any] | None = None
    cset: Any = None  # pipeline.calibration.CalibrationSet
    resmooth: dict[str, Any] | None = None  # pipeline.quantization.resmooth.ResmoothResult.as_dict()


def _calibrate(cfg: Any, src: _Source, calib_path: Path | None, progress: Any, seed: int) -> _Calibration:
    """Calibrate ``src.model`` in place: ``mtq.quantize`` with the recipe's config, or the ``auto`` search."""
    import contextlib

    import modelopt.torch.quantization as mtq
    import torch
    import transformers as tf

    from ..calibration import load_calibration

    qcfg = cfg.quant
    batch_size = int(cfg.calibration.batch_size)
    prog = progress or (lambda d, t: contextlib.nullcontext(lambda n=1: None))
    tok = tf.AutoTokenizer.from_pretrained(str(src.hf), trust_remote_code=False)
    cset = load_calibration(cfg.calibration, tok, calib_path)
    cal = _Calibration(stats=cset.stats, warnings=cset.warnings, cset=cset)
    if qcfg.recipe == "auto":
        cal.modelopt_cfg = {"auto_quantize": {f: modelopt_config(qcfg, src.excluded, f) for f in qcfg.auto.formats}}
        with prog("searching per-layer formats (auto_quantize)", 1) as advance:
            cal.auto = auto_search(src.model, qcfg, src.excluded, [ids for _, ids in cset.batches(batch_size)], seed)
            advance(1)
        src.model.eval()
    else:
        cal.modelopt_cfg = with_layerwise(modelopt_config(qcfg, src.excluded), src.placement)
        where = f" layer by layer on {src.placement.device}" if src.placement.layerwise else f" on {src.placement.device}"
        with prog(f"calibrating {qcfg.recipe}{where}", len(cset.samples)) as advance:
            loop = cset.forward_loop(batch_size, device=src.placement.device, progress=advance)
            torch.manual_seed(seed)
            with torch.no_grad(), _quiet("mtq.quantize"):
                mtq.quantize(src.model, cal.modelopt_cfg, loop)
    if bool(qcfg.resmooth):
        with _quiet("resmooth"):
            cal.resmooth = resmooth(src.model, src.placement.device).as_dict()
    else:
        cal.resmooth = {"applied": False, "reason": "quant.resmooth=false"}
    assert cal.stats is not None
    cal.stats["batches"] = len(cset.batches(batch_size))
    cal.stats["tokens_trimmed"] = cset.trimmed_tokens(batch_size)
    return cal
