"""Quantize stage: ModelOpt calibration + TensorRT-LLM / unified-HF export (see pipeline/quantize/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.config import key_fields
from ..core.contracts.quantize import QuantizeResult
from ..core.stage import Stage, StageContext
from .checks import checks


def _run(ctx: StageContext) -> QuantizeResult:
    from .run import quantize

    assert ctx.out is not None
    result = quantize(
        ctx.cfg, ctx.inputs["export"].path, ctx.external_path("calibration"), ctx.out, progress=ctx.progress, resume_dir=ctx.resume_dir
    )
    ctx.manifest["measurements"] = result.pop("measurements")  # wall times and peak memory: not in the content digest
    return QuantizeResult.from_json(result)  # quantize() returns the result's JSON (tests read it as such)


def _external(cfg: Any) -> dict[str, Path]:
    c = cfg.calibration
    if cfg.quant.recipe == "none" or c.format == "hf" or not c.path:
        return {}
    return {"calibration": Path(c.path)}


def _extras(cfg: Any, inputs: dict) -> dict[str, Any]:
    # the calibration settings change the bytes only when something is calibrated; the target GPU
    # only decides whether the recipe is refused, but keying on it makes that check run on a cache hit.
    cal = key_fields(cfg.calibration) if cfg.quant.recipe != "none" else None
    if cal is not None and cfg.calibration.format != "hf":
        cal.pop("hf_dataset", None)
        cal.pop("hf_split", None)
    return {"calibration": cal, "target_gpu": getattr(cfg.target, "gpu", None)}


def _key_config(cfg: Any) -> dict[str, Any]:
    """The keyed config: ``quant`` without the fields the recipe does not read (:func:`pipeline.quantize.common.unused_fields`), and ``parallel``."""
    from .common import unused_fields

    unused = unused_fields(cfg.quant)
    return {"quant": {k: v for k, v in key_fields(cfg.quant).items() if k not in unused}, "parallel": key_fields(cfg.parallel)}


def _dry_run(ctx: StageContext) -> dict[str, Any]:
    q = ctx.cfg.quant
    from ..facts.recipes import KV_CACHE_FORMATS, RECIPES

    r = RECIPES[q.recipe]
    return {
        "headline": {
            "recipe": q.recipe,
            "quant_algo": r.quant_algo,
            "kv_cache": KV_CACHE_FORMATS[q.kv_cache_dtype].kv_cache_quant_algo,
            "tp_size": ctx.cfg.parallel.tp_size,
            "pp_size": ctx.cfg.parallel.pp_size,
            "calib_samples": 0 if q.recipe == "none" else ctx.cfg.calibration.calib_size,
        }
    }


STAGE = Stage(
    name="quantize",
    checks=checks,
    deps=("export",),
    config_groups=("quant", "parallel"),
    libraries=("nvidia-modelopt", "torch", "transformers", "safetensors"),
    run=_run,
    version="2",  # 2: hf/config.json keeps the spellings transformers 4.x reads (rope_theta, torch_dtype; issue 34)
    external_inputs=_external,
    key_extras=_extras,
    key_config=_key_config,
    dry_run=_dry_run,
    # the placement budget: an offloaded, layer-by-layer calibration gives the same statistics
    # (tests/quantize/test_scale_memory.py::test_offloaded_layerwise_calibration_equals_the_whole_model)
    runtime_reads=("calibration.max_device_memory_gb", "calibration.max_host_memory_gb"),
)
