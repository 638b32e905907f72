"""The quant report: per-module precision and bytes, ``quant_report.json`` and its Markdown rendering."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.contracts.quantize import QuantReportNotes
from ..facts.recipes import RECIPES, Recipe
from .calibrate import _Calibration
from .common import KV_CACHE, _linear_modules, _version, log
from .preflight import _Source
from .trtllm_ckpt import _Exported

if TYPE_CHECKING:
    import torch

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def _describe_quantizer(q: Any) -> str | None:
    """'int4/g128', 'int8/channel', 'fp8/tensor' ... for an enabled ModelOpt quantizer, else None."""
    subs = list(q) if hasattr(q, "__iter__") and not hasattr(q, "num_bits") else [q]
    parts = []
    for s in subs:
        if not getattr(s, "is_enabled", False):
            continue
        nb = s.num_bits
        fmt = f"fp{1 + nb[0] + nb[1]}" if isinstance(nb, (tuple, list)) else f"int{nb}"
        bs = getattr(s, "block_sizes", None)
        if bs and bs.get(-1):
            gran = f"g{bs[-1]}"
        elif getattr(s, "axis", None) is not None:
            gran = "channel"
        else:
            gran = "tensor"
        parts.append(f"{fmt}/{gran}")
    return "+".join(parts) or None


def module_precisions(
    model: torch.nn.Module,
    excluded: dict[str, str],
    recipe: Recipe,
    group_size: int,
    source_dtype: str,
    export_dtype: str,
    per_module: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Per Linear module: the weight and activation format it got, parameter count and estimated bytes.

    ``bytes_before`` = params x bytes(source dtype); ``bytes_after`` = params x weight bits / 8 plus the
    scales (group-wise: one fp16 scale per group; per-channel: one fp32 scale per output row; per-tensor:
    one fp32), following the TensorRT-LLM checkpoint layout (``weights_scaling_factor`` tensors); a module
    left in high precision costs params x bytes(quant.export_dtype). ``per_module`` (quant=auto): module name ->
    the recipe the search chose for it (its bits and grouping are used instead of ``recipe``'s).
    """
    out = []
    chosen = recipe
    for name, m in _linear_modules(model).items():
        if per_module is not None:
            chosen = RECIPES.get(per_module.get(name, "none"), recipe)
        n_out, n_in = m.weight.shape
        params = n_out * n_in
        wq = getattr(m, "weight_quantizer", None)
        wfmt = _describe_quantizer(wq) if wq is not None else None
        iq = getattr(m, "input_quantizer", None)
        afmt = _describe_quantizer(iq) if iq is not None else None
        before = params * _DTYPE_BYTES.get(source_dtype, 2)
        if wfmt is None:
            after, precision = params * _DTYPE_BYTES[export_dtype], export_dtype
        else:
            bits = chosen.weight_bits
            if chosen.grouped:
                scales = (params // group_size) * 2
            elif "channel" in wfmt:
                scales = n_out * 4
            else:
                scales = 4
            after = params * bits // 8 + scales
            precision = chosen.quant_algo or wfmt
        out.append(
            {
                "module": name,
                "shape": [int(n_out), int(n_in)],
                "params": int(params),
                "weight": wfmt or export_dtype,
                "activation": afmt or export_dtype,
                "precision": precision,
                "kept_high_precision": excluded.get(name) or (None if wfmt else "ModelOpt default (not quantized by the recipe)"),
                "bytes_before": int(before),
                "bytes_after": int(after),
            }
        )
    return out


def _files_bytes(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern) if p.is_file())


def _quant_report(
    qcfg: Any,
    parallel: Any,
    src: _Source,
    cal: _Calibration,
    exported: _Exported,
    precisions: list[dict[str, Any]],
    quant_algo: str | None,
    hf_notes: list[str],
) -> dict[str, Any]:
    """The ``quant_report.json`` document (schema ``pipeline.quant_report/v1``): what was made, never how long it took
    or how much memory it used (those are the manifest's ``measurements``: the report's bytes enter the content digest)."""
    import torch

    recipe = RECIPES[qcfg.recipe]
    auto = cal.auto
    before = _files_bytes(src.hf, "*.safetensors")
    after = _files_bytes(exported.ckpt, "rank*.safetensors")
    return {
        "schema": "pipeline.quant_report/v1",
        "recipe": qcfg.recipe,
        "description": recipe.description,
        "kv_cache": qcfg.kv_cache_dtype,
        "quant_algo": quant_algo,
        "kv_cache_quant_algo": KV_CACHE[qcfg.kv_cache_dtype][0],
        "group_size": int(qcfg.group_size) if recipe.grouped or (auto and any(RECIPES[f].grouped for f in auto["formats"])) else None,
        "smoothquant_alpha": float(qcfg.smoothquant_alpha) if qcfg.recipe == "int8_sq" else None,
        "export_dtype": qcfg.export_dtype,
        "source_dtype": src.facts["dtype"],
        "tp_size": int(parallel.tp_size),
        "pp_size": int(parallel.pp_size),
        "preflight": src.pre,
        "export_checks": exported.post,
        "excluded_modules": src.excluded,
        "modules": precisions,
        "bytes": {
            "source_safetensors": before,
            "trtllm_rank_files": after,
            "modules_before": sum(p["bytes_before"] for p in precisions),
            "modules_after": sum(p["bytes_after"] for p in precisions),
        },
        "compression": round(before / after, 4) if after else None,
        "auto": {k: v for k, v in auto.items() if k != "per_module"} if auto else None,
        "calibration": cal.stats,
        "resmooth": cal.resmooth,
        "warnings": _deprecation_notes(qcfg.recipe) + cal.warnings + exported.notes + hf_notes,
        "modelopt_version": _version("nvidia-modelopt"),
        "torch_version": torch.__version__,
    }


def _deprecation_notes(recipe: str) -> list[str]:
    """Warnings for a deprecated ``quant.recipe`` name (:data:`pipeline.facts.recipes.DEPRECATED_RECIPES`); also logged."""
    from ..facts.recipes import DEPRECATED_RECIPES

    if recipe not in DEPRECATED_RECIPES:
        return []
    note = (
        f"quant.recipe={recipe!r} is a deprecated alias of {DEPRECATED_RECIPES[recipe]!r} (same ModelOpt config, same result); "
        f"use quant={DEPRECATED_RECIPES[recipe]}"
    )
    log.warning(note)
    return [note]


def render_report_md(r: dict[str, Any]) -> str:
    """The Markdown quant report (same facts as quant_report.json)."""
    mb = 1 << 20
    lines = [
        f"# Quantization report: {r['recipe']}",
        "",
        f"{r['description']}",
        "",
        "| field | value |",
        "|---|---|",
        f"| recipe | {r['recipe']} |",
        f"| quant_algo | {r['quant_algo']} |",
        f"| kv_cache | {r['kv_cache']} ({r['kv_cache_quant_algo']}) |",
        f"| group_size | {r['group_size']} |",
        f"| tp_size x pp_size | {r['tp_size']} x {r['pp_size']} |",
        f"| export dtype | {r['export_dtype']} |",
        f"| source weights | {r['bytes']['source_safetensors'] / mb:.2f} MiB |",
        f"| TensorRT-LLM rank files | {r['bytes']['trtllm_rank_files'] / mb:.2f} MiB |",
        f"| compression (source / rank files) | {r['compression']} |",
    ]
    notes = QuantReportNotes.from_json(r)
    cal = notes.calibration
    if cal:
        lines += [
            f"| calibration samples | {cal['used']} used of {cal['requested']} requested ({cal['available']} read, "
            f"{cal['blank_dropped']} blank dropped, {cal['short']} short, {cal['truncated']} truncated) |",
            f"| calibration tokens / batches | {cal['tokens']} ({cal['tokens_trimmed']} trimmed to keep batches padding-free) / {cal['batches']} |",
            f"| pad token | {cal['pad_token']!r}{' (set by the pipeline)' if cal['pad_token_set'] else ''} |",
        ]
    lines.append("")
    for k in ("vocab_padding", "kv_heads_replicated", "target_gpu"):
        if k in notes.preflight:
            lines.append(f"- {k}: {notes.preflight[k]}")
    if notes.patched:
        lines.append(f"- config.json fields written from the source model (exporter omitted them): {notes.patched}")
    for w in notes.warnings:
        lines.append(f"- warning: {w}")
    auto = notes.auto
    if auto:
        eb = auto["effective_bits"]
        lines += [
            "",
            "## Per-layer format search (quant=auto, ModelOpt auto_quantize)",
            "",
            f"Budget {eb['budget']} effective bits, achieved {eb['achieved']:.3f} ({'satisfied' if eb['satisfied'] else 'NOT satisfied'}); "
            f"method {auto['method']} on {auto['num_score_steps']} batches; candidates {auto['formats']} + none. "
            "Sensitivity = the score of the lowest-bit candidate (higher = more sensitive).",
            "",
            "| layer | modules | format | sensitivity | scores |",
            "|---|---|---|---|---|",
        ]
        for g in auto["layers"]:
            sc = ", ".join(f"{k} {v:.4g}" for k, v in g["scores"].items())
            sens = f"{g['sensitivity']:.4g}" if g["sensitivity"] is not None else ""
            lines.append(f"| {g['layer']} | {len(g['modules'])} | {g['format']} | {sens} | {sc} |")
    lines += [
        "",
        "## Per-module precision",
        "",
        "| module | shape | weight | activation | precision | kept high precision | bytes before | bytes after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in r["modules"]:
        lines.append(
            f"| {m['module']} | {m['shape'][0]}x{m['shape'][1]} | {m['weight']} | {m['activation']} | {m['precision']} | "
            f"{m['kept_high_precision'] or ''} | {m['bytes_before']} | {m['bytes_after']} |"
        )
    return "\n".join(lines) + "\n"
