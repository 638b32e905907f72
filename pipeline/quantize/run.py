"""The stage-facing entry point: :func:`quantize` runs load + preflight, calibration, the quant state, the
TensorRT-LLM and HF exports and the report, in that order."""

from __future__ import annotations

import contextlib
import gc
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.contracts.quantize import QuantizeArtifact
from ..core.memory import measure
from ..core.quant_state import export_digest, load_simulated_model
from ..facts.recipes import RECIPES
from .auto import auto_quant_algo
from .calibrate import _calibrate, _Calibration
from .common import KV_CACHE
from .hf_ckpt import _export_hf
from .placement import Placement
from .preflight import _load_source
from .report import _quant_report, module_precisions, render_report_md
from .state import _write_state
from .trtllm_ckpt import _export_trtllm, _Exported


def quantize(
    cfg: Any, export_dir: Path, calib_path: Path | None, out: Path, *, progress: Any = None, resume_dir: Path | None = None
) -> dict[str, Any]:
    """Quantize the export artifact with ModelOpt and write the quantize artifact into ``out``.

    Steps: source facts -> placement (:mod:`.placement`: device, dtype, offload) and one load of the export checkpoint
    -> checks before calibration (:func:`preflight`) -> calibration set (:func:`pipeline.data.calibration.load_calibration`)
    -> ``mtq.quantize`` (layer by layer when offloaded) -> ``quant_state.*`` (streamed from the model's own tensors)
    -> TensorRT-LLM checkpoint (``export_tensorrt_llm_checkpoint`` of the calibrated model itself, tp/pp ranks) ->
    checks after export (:func:`check_trtllm_checkpoint`) -> unified HF checkpoint (``export_hf_checkpoint`` of the
    model restored from the quant state; for ``none`` the export's files, hard-linked) -> ``quant_report.json``/``.md``.
    At most one model is in memory at any time (docs/memory.md).

    Args:
        cfg: the whole :class:`pipeline.core.config.PipelineConfig` (reads ``quant``, ``calibration``, ``target.gpu``).
        export_dir: the export artifact folder (``hf/``, ``model_info.json``).
        calib_path: the resolved calibration file (None for ``none`` or ``format: hf``).
        out: the folder to write into.
        progress: optional ``progress(description, total)`` context manager factory (``StageContext.progress``).
        resume_dir: a folder that survives a killed run of the same key (``StageContext.resume_dir``): layer-by-layer
            calibration checkpoints every finished layer there and resumes from it (:func:`pipeline.quantize.calibrate._calibrate`).
    Returns:
        The stage result (``headline``: recipe, kv_cache, compression, calib_samples; ``measurements``: the wall time
        ``timings_s`` and peak RSS ``peak_rss_bytes`` of each step, the placement's ``budget_bytes`` and ``reason``, the calibration's
        ``batch_size_reason``,
        which the stage moves into the manifest).
    Raises:
        InputError: failed checks, bad calibration input.
    """

    import torch

    threads_before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(getattr(cfg.calibration, "threads", 1))))
    try:
        return _quantize(cfg, export_dir, calib_path, out, progress, resume_dir)
    finally:
        torch.set_num_threads(threads_before)


def _free() -> None:
    """Return freed model memory now (reference cycles in transformers/ModelOpt modules; CUDA's caching allocator)."""
    gc.collect()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _export_device(placement: Placement) -> str:
    """Where the model restored from the quant state runs for the TensorRT-LLM export: the calibration device when the
    whole model fitted there, else the CPU (ModelOpt's TensorRT-LLM exporter needs every weight resident)."""
    return placement.device if placement.offload == "none" else "cpu"


class _Steps:
    """Wall time (``timings[<step>_s]``) and peak host RSS (``peaks[<step>]``, bytes, :func:`pipeline.core.memory.measure`)
    of each quantize step, for the report and docs/memory.md."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.peaks: dict[str, int | None] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.time()
        with measure() as m:
            yield
        self.timings[f"{name}_s"] = time.time() - t
        self.peaks[name] = m.process_peak_rss_bytes


def _quantize(cfg: Any, export_dir: Path, calib_path: Path | None, out: Path, progress: Any, resume_dir: Path | None) -> dict[str, Any]:
    import torch

    qcfg, parallel = cfg.quant, cfg.parallel
    t0 = time.time()
    step = _Steps()
    recipe = RECIPES[qcfg.recipe]
    out = Path(out)
    seed = int(cfg.calibration.seed)
    torch.manual_seed(seed)
    offload_dir = out / ".offload"
    with step("load"):
        src = _load_source(cfg, export_dir, offload_dir)
    cal, calibration_s = _Calibration(), 0.0
    if qcfg.recipe != "none":
        with step("calibration"):
            cal = _calibrate(cfg, src, calib_path, progress, seed, resume_dir)
        calibration_s = step.timings["calibration_s"]
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
    with step("write_state"):
        _write_state(out, qcfg, src.model, src.hf, cal, quant_algo, src.placement, export_digest(export_dir))

    exported, hf_notes = _exports(out, export_dir, qcfg, parallel, src, step, seed, quant_algo if cal.auto else None)
    shutil.rmtree(offload_dir, ignore_errors=True)
    timings = {**step.timings, "total_s": time.time() - t0}
    report = _quant_report(qcfg, parallel, src, cal, exported, precisions, quant_algo, hf_notes)
    measured = _measurements(report, cal.stats, src.placement, step, timings)
    report["placement"]["resumed_at_layer"] = cal.resumed_at[0] if cal.resumed_at else None
    from ..core.store import write_json_atomic

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
        "calibration_s": round(calibration_s, 3),
        "placement": report["placement"],
        "cuda_extension": cal.cuda_extension,
        "warnings": report["warnings"],
        "measurements": measured,
    }


def _exports(
    out: Path, export_dir: Path, qcfg: Any, parallel: Any, src: Any, step: _Steps, seed: int, auto_algo: str | None
) -> tuple[_Exported, list[str]]:
    """The TensorRT-LLM and unified HF checkpoints of the calibrated ``src.model`` (consumed: freed when done).

    One model in memory at a time, never a copy: the TensorRT-LLM export consumes the calibrated model when it was
    loaded whole; an offloaded one is freed and the exporter gets the model restored from the quant state on the host
    (ModelOpt's TensorRT-LLM exporter needs every weight resident). The HF export always runs on a model restored from
    the state: ModelOpt 0.47's streaming HF writer for offloaded models loses the pre-quant scales it folds into the
    layer norms of layers offloaded to disk (its accelerate writeback to disk is a TODO: on the 80 M shape every
    disk-offloaded layer's ``input_layernorm`` stayed 1.0, bench/results/gpu-cpu.json, 2026-12-04)."""
    import torch

    def restore() -> Any:
        _free()
        return load_simulated_model(out, export_dir, device=_export_device(src.placement))

    model, src.model = src.model, None
    if src.placement.offload != "none":
        model = None  # offloaded: freed; the exporter gets the restored model
    _free()
    shutil.rmtree(out / ".offload", ignore_errors=True)
    with step("export_trtllm"):
        torch.manual_seed(seed)
        exported = _export_trtllm(out, qcfg, parallel, src, model if model is not None else restore(), auto_algo)
        model = None
        _free()
    with step("export_hf"):
        hf_notes = _export_hf(out, qcfg, src, restore)
        _free()
    return exported, hf_notes


def _measurements(
    report: dict[str, Any], stats: dict[str, Any] | None, placement: Placement, step: _Steps, timings: dict[str, float]
) -> dict[str, Any]:
    """What the run measured, moved out of ``report`` (whose bytes make the artifact's content digest: a rerun from the
    same inputs has the same digest) for the manifest: wall times, peak RSS, and the texts that name the free memory
    (the placement's ``budget_bytes`` / ``reason``, the calibration's ``batch_size_reason``, out of its ``stats``)."""
    where = placement.as_dict()
    measured = {k: where.pop(k) for k in ("budget_bytes", "reason")}
    report["placement"] = where
    return {
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "peak_rss_bytes": step.peaks,
        "placement": measured,
        "batch_size_reason": (stats or {}).pop("batch_size_reason", None),
    }
