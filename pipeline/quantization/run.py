"""The stage-facing entry point: :func:`quantize` runs load + preflight, calibration, the quant state, the
TensorRT-LLM and HF exports and the report, in that order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..artifacts import QuantizeArtifact
from ..recipes import RECIPES
from .auto import auto_quant_algo
from .calibrate import _calibrate, _Calibration
from .common import KV_CACHE
from .hf_export import _export_hf
from .preflight import _load_source
from .report import _quant_report, module_precisions, render_report_md
from .state import _write_state
from .trtllm import _export_trtllm


def quantize(cfg: Any, export_dir: Path, calib_path: Path | None, out: Path, *, progress: Any = None) -> dict[str, Any]:
    """Quantize the export artifact with ModelOpt and write the quantize artifact into ``out``.

    Steps: source facts -> load the export checkpoint in float32 (CPU calibration) -> checks before
    calibration (:func:`preflight`) -> calibration set (:func:`pipeline.calibration.load_calibration`)
    -> ``mtq.quantize`` -> ``quant_state.*`` -> TensorRT-LLM checkpoint
    (``export_tensorrt_llm_checkpoint``, tp/pp ranks) -> checks after export
    (:func:`check_trtllm_checkpoint`) -> unified HF checkpoint (``export_hf_checkpoint``; for
    ``none`` the export's files, hard-linked) -> ``quant_report.json``/``.md``.

    Args:
        cfg: the whole :class:`pipeline.config.PipelineConfig` (reads ``quant``, ``calibration``, ``target.gpu``).
        export_dir: the export artifact folder (``hf/``, ``model_info.json``).
        calib_path: the resolved calibration file (None for ``none`` or ``format: hf``).
        out: the folder to write into.
        progress: optional ``progress(description, total)`` context manager factory (``StageContext.progress``).
    Returns:
        The stage result (``headline``: recipe, kv_cache, compression, calib_samples).
    Raises:
        InputError: failed checks, bad calibration input.
    """

    import torch

    threads_before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(getattr(cfg.calibration, "threads", 1))))
    try:
        return _quantize(cfg, export_dir, calib_path, out, progress)
    finally:
        torch.set_num_threads(threads_before)


def _quantize(cfg: Any, export_dir: Path, calib_path: Path | None, out: Path, progress: Any) -> dict[str, Any]:
    import time

    import torch

    qcfg, parallel = cfg.quant, cfg.parallel
    t0 = time.time()
    timings: dict[str, float] = {}
    recipe = RECIPES[qcfg.recipe]
    out = Path(out)
    seed = int(cfg.calibration.seed)
    torch.manual_seed(seed)
    src = _load_source(cfg, export_dir)
    timings["load_s"] = time.time() - t0
    base = {k: v.detach().clone() for k, v in src.model.state_dict().items()}
    cal = _Calibration()
    if qcfg.recipe != "none":
        t1 = time.time()
        cal = _calibrate(cfg, src, calib_path, progress, seed)
        timings["calibration_s"] = time.time() - t1
    precisions = module_precisions(
        src.model,
        src.excluded,
        recipe,
        int(qcfg.group_size),
        str(src.facts["dtype"]),
        qcfg.export_dtype,
        per_module=cal.auto["per_module"] if cal.auto else None,
    )
    quant_algo = auto_quant_algo(cal.auto["per_module"]) if cal.auto else recipe.quant_algo
    _write_state(out, qcfg, src.model, base, cal, quant_algo)
    del base
    t2 = time.time()
    torch.manual_seed(seed)
    exported = _export_trtllm(out, qcfg, parallel, src, quant_algo if cal.auto else None)
    timings["export_trtllm_s"] = time.time() - t2
    t3 = time.time()
    hf_notes = _export_hf(out, qcfg, src)
    timings["export_hf_s"] = time.time() - t3
    timings["total_s"] = time.time() - t0
    report = _quant_report(qcfg, parallel, src, cal, exported, precisions, quant_algo, hf_notes, timings)
    from ..store import write_json_atomic

    write_json_atomic(out / QuantizeArtifact.REPORT_JSON, report)
    (out / QuantizeArtifact.REPORT_MD).write_text(render_report_md(report), encoding="utf-8")
    return {
        "headline": {
            "recipe": qcfg.recipe,
            "kv_cache": qcfg.kv_cache_dtype,
            "compression": report["compression"],
            "calib_samples": cal.stats["used"] if cal.stats else 0,
        },
        "quant_algo": quant_algo,
        "kv_cache_quant_algo": KV_CACHE[qcfg.kv_cache_dtype][0],
        "tp_size": int(parallel.tp_size),
        "pp_size": int(parallel.pp_size),
        "calibration_s": round(timings.get("calibration_s", 0.0), 3),
        "warnings": report["warnings"],
    }
