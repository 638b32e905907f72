"""The quantization recipes and KV-cache formats: the one table of their facts.

Every other module reads a recipe's properties from here: the config schema (valid ``quant.recipe`` /
``quant.kv_cache_dtype`` / ``quant.auto.formats`` values, deprecated names), the quantize stage (ModelOpt config,
TensorRT-LLM ``quant_algo``), the TensorRT-LLM target (checkpoint ``quant_algo``, minimum compute capability) and the
planner (minimum compute capability, bytes per weight).  Which *target* runs which recipe is the target's fact
(:mod:`pipeline.core.targets`, ``Capabilities.recipes``).

Sources: ModelOpt 0.47 ``modelopt.torch.quantization.config`` (the ``*_CFG`` constants) and its TensorRT-LLM exporter
(the ``quant_algo`` it writes, TensorRT-LLM ``quantization/mode.py`` ``QuantAlgo``); minimum compute capability:
TensorRT-LLM 1.0 ``docs/source/reference/support-matrix.md`` (summarised in docs/reference/tensorrt_llm.md §4).

This module imports nothing from the package, so every layer may use it.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One ``quant.recipe``: the ModelOpt config it starts from, the TensorRT-LLM names it exports to, where it runs.

    Attributes:
        name: ``quant.recipe`` value.
        modelopt_cfg: name of the ``modelopt.torch.quantization`` config constant (None: no quantization, or the
            per-layer search of ``auto``).
        quant_algo: TensorRT-LLM ``quantization.quant_algo`` ModelOpt 0.47's exporter writes (TensorRT-LLM
            ``quantization/mode.py`` QuantAlgo, docs/reference/tensorrt_llm.md §3; checked after export).
        grouped: weights quantized in groups of ``quant.group_size`` along the input dimension.
        weight_bits: stored bits per weight (the report's size estimate, the planner's weight memory).
        activations: activation format at inference ("fp16" = not quantized).
        description: one line for docs and reports.
        min_sm: minimum compute capability of a TensorRT-LLM engine, major*10+minor (TensorRT-LLM support matrix);
            bfloat16 needs SM 8.0 whatever the recipe (:data:`BF16_MIN_SM`).
        deprecated_for: the recipe to use instead, for a name kept one release as an alias.
        auto_format: ``quant=auto`` may choose it for a layer (``quant.auto.formats``).
        max_drop: default release-gate allowance, the largest accepted drop of the eval score vs the baseline
            (absolute, 0..1; ``eval.gate.max_drop_by_recipe``); every recipe has one (the gate has no fallback of its own).
        max_kld: default ceiling of the mean per-token KL divergence from the baseline (nats;
            ``eval.gate.max_kld_by_recipe``); None: not checked.
        min_top1: default floor of the teacher-forced top-1 agreement with the baseline (0..1;
            ``eval.gate.min_top1_by_recipe``); None: not checked.
        reads: the recipe-specific ``quant`` fields its bytes depend on (``group_size``: grouped weights;
            ``smoothquant_alpha``: SmoothQuant; ``resmooth``: recipes with an AWQ/SmoothQuant pre-quant scale,
            pipeline/quantize/resmooth.py; ``auto``: the search).  A recipe-specific field another recipe reads stays
            out of this one's quantize cache key (:func:`unused_quant_fields`); every other field is always keyed.

    The gate defaults' reasoning and measurements are in :class:`pipeline.core.config.eval.GateConfig` and docs/evaluate.md.
    """

    name: str
    modelopt_cfg: str | None
    quant_algo: str | None
    grouped: bool
    weight_bits: int
    activations: str
    description: str
    min_sm: int = 80
    deprecated_for: str | None = None
    auto_format: bool = False
    max_drop: float | None = None
    max_kld: float | None = None
    min_top1: float | None = None
    reads: tuple[str, ...] = ()


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "none",
            None,
            None,
            False,
            16,
            "fp16",
            "no quantization: the export checkpoint in quant.export_dtype",
            min_sm=75,  # float16 engines from Turing (Volta removed in TensorRT-LLM 0.15/0.16)
            max_drop=0.02,
            max_kld=0.001,
            min_top1=0.99,
        ),
        Recipe(
            "fp8",
            "FP8_DEFAULT_CFG",
            "FP8",
            False,
            8,
            "fp8",
            "FP8 E4M3 weights and activations, per-tensor scales (max calibration)",
            min_sm=89,
            auto_format=True,
            max_drop=0.02,
        ),
        Recipe(
            "int8_sq",
            "INT8_SMOOTHQUANT_CFG",
            "W8A8_SQ_PER_CHANNEL",
            False,
            8,
            "int8",
            "SmoothQuant (Xiao et al. 2023): INT8 per-channel weights, INT8 activations with a calibrated per-tensor scale; "
            "smoothing strength quant.smoothquant_alpha",
            auto_format=True,
            max_drop=0.04,
            reads=("smoothquant_alpha", "resmooth"),
        ),
        Recipe(
            "int8_wo",
            "INT8_WEIGHT_ONLY_CFG",
            "W8A16",
            False,
            8,
            "fp16",
            "INT8 per-channel weight-only",
            auto_format=True,
            max_drop=0.02,
            max_kld=0.01,
            min_top1=0.98,
        ),
        Recipe(
            "int4_rtn",
            "INT4_BLOCKWISE_WEIGHT_ONLY_CFG",
            "W4A16_AWQ",
            True,
            4,
            "fp16",
            "INT4 group-wise weight-only, plain round-to-nearest with max calibration (no AWQ scale search; ModelOpt "
            "exports it to TensorRT-LLM's group-wise W4A16_AWQ kernel path with unit pre-quant scales)",
            auto_format=True,
            max_drop=0.06,
            max_kld=0.05,
            min_top1=0.95,
            reads=("group_size",),
        ),
        Recipe(
            "int4_awq",
            "INT4_AWQ_CFG",
            "W4A16_AWQ",
            True,
            4,
            "fp16",
            "INT4 group-wise weights with AWQ activation-aware scales (Lin et al. 2023; ModelOpt awq_lite)",
            auto_format=True,
            max_drop=0.05,
            max_kld=0.05,
            min_top1=0.95,
            reads=("group_size", "resmooth"),
        ),
        Recipe(
            "w4a8_awq",
            "W4A8_AWQ_BETA_CFG",
            "W4A8_AWQ",
            True,
            4,
            "fp8",
            "INT4 AWQ weights with FP8 activations",
            min_sm=89,
            auto_format=True,
            max_drop=0.06,
            reads=("group_size", "resmooth"),
        ),
        Recipe(
            "auto",
            None,
            "MIXED_PRECISION",
            False,
            16,
            "fp16",
            "per-layer format search under an effective-bits budget (ModelOpt auto_quantize; formats quant.auto.formats "
            "or not quantized); TensorRT-LLM MIXED_PRECISION with per-layer quant_cfg.json, or the one format chosen",
            # SM 8.0 for the search itself; fp8/w4a8_awq candidates need SM 8.9 (checked per chosen format)
            max_drop=0.05,  # between the fp8/int8 allowances and int4's: the search mixes those formats per layer
            reads=("auto", "resmooth"),
        ),
        Recipe(
            "int4_wo",
            "INT4_BLOCKWISE_WEIGHT_ONLY_CFG",
            "W4A16_AWQ",
            True,
            4,
            "fp16",
            "deprecated alias of int4_rtn (same ModelOpt config, same bytes); use quant=int4_rtn",
            deprecated_for="int4_rtn",
            max_drop=0.06,
            max_kld=0.05,
            min_top1=0.95,
            reads=("group_size",),
        ),
    )
}
"""``quant.recipe`` -> :class:`Recipe`; current names first, deprecated aliases last."""

DEPRECATED_RECIPES: dict[str, str] = {r.name: r.deprecated_for for r in RECIPES.values() if r.deprecated_for}
"""Deprecated recipe name -> the name to use (still accepted for one release; the quant report warns)."""
AUTO_FORMATS: tuple[str, ...] = tuple(r.name for r in RECIPES.values() if r.auto_format)
"""Formats ``quant=auto`` may pick per layer (besides "not quantized", which ModelOpt always adds)."""


def unused_quant_fields(recipe: str, auto_formats: Any = ()) -> frozenset[str]:
    """The recipe-specific ``quant`` fields (some recipe's ``reads``) that ``recipe`` does not read (``auto``: nor any
    of ``quant.auto.formats``).  The quantize cache key leaves them out, so e.g. ``quant.group_size`` on ``fp8`` or
    ``quant.smoothquant_alpha`` on ``int4_awq`` never changes it; a field no recipe lists is always keyed, and an
    unknown name (refused by the config checks) leaves nothing out."""
    r = RECIPES.get(recipe)
    if r is None:
        return frozenset()
    formats = [RECIPES[f] for f in auto_formats if f in RECIPES] if recipe == "auto" else []
    return frozenset().union(*(x.reads for x in RECIPES.values())) - frozenset(r.reads).union(*(f.reads for f in formats))


RECIPE_MIN_SM: dict[str, int] = {r.name: r.min_sm for r in RECIPES.values()}
"""``quant.recipe`` -> minimum compute capability (major*10+minor) of a TensorRT-LLM engine."""


@dataclasses.dataclass(frozen=True)
class KVCacheFormat:
    """One ``quant.kv_cache_dtype``.

    Attributes:
        name: ``quant.kv_cache_dtype`` value.
        kv_cache_quant_algo: TensorRT-LLM ``quantization.kv_cache_quant_algo`` (None: the export dtype).
        quantizers: ModelOpt quantizer-config entries for the K/V bmm quantizers (appended to the recipe's config).
        min_sm: minimum compute capability (major*10+minor; TensorRT-LLM support matrix).
    """

    name: str
    kv_cache_quant_algo: str | None
    quantizers: tuple[dict[str, Any], ...]
    min_sm: int


KV_CACHE_FORMATS: dict[str, KVCacheFormat] = {
    k.name: k
    for k in (
        KVCacheFormat("none", None, (), 75),
        KVCacheFormat(
            "fp8", "FP8", ({"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}, "enable": True},), 89
        ),
        KVCacheFormat(
            "int8", "INT8", ({"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}, "enable": True},), 80
        ),
    )
}
"""``quant.kv_cache_dtype`` -> :class:`KVCacheFormat`."""
KV_MIN_SM: dict[str, int] = {k.name: k.min_sm for k in KV_CACHE_FORMATS.values()}
"""``quant.kv_cache_dtype`` -> minimum compute capability (major*10+minor)."""
BF16_MIN_SM = 80
"""bfloat16 weights/activations need SM 8.0 whatever the recipe (TensorRT-LLM support matrix)."""

__all__ = [
    "AUTO_FORMATS",
    "BF16_MIN_SM",
    "DEPRECATED_RECIPES",
    "KVCacheFormat",
    "KV_CACHE_FORMATS",
    "KV_MIN_SM",
    "RECIPES",
    "RECIPE_MIN_SM",
    "Recipe",
    "unused_quant_fields",
]
