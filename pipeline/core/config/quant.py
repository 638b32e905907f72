"""``quant`` config group: the quantization recipe (quantize stage, through NVIDIA ModelOpt)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ...facts import recipes as _recipes
from ...facts.recipes import AUTO_FORMATS
from .common import Problem, choice, deprecated_alias

RECIPES = tuple(_recipes.RECIPES)
"""Valid ``quant.recipe`` names (the table: :data:`pipeline.facts.recipes.RECIPES`)."""
KV_CACHE = tuple(_recipes.KV_CACHE_FORMATS)
"""Valid ``quant.kv_cache_dtype`` values (:data:`pipeline.facts.recipes.KV_CACHE_FORMATS`)."""
SENSITIVE_PRESETS = ("none", "first_last", "attn_out", "first_last_attn_out")
AUTO_METHODS = ("kl_div", "gradient")


@dataclass
class AutoQuantConfig:
    """``quant.auto``: the per-layer format search of ``quant=auto`` (ModelOpt ``mtq.auto_quantize``)."""

    effective_bits: float = 8.0
    """Budget: average stored bits per weight over the searched linear layers (ModelOpt ``constraints.effective_bits``;
    e.g. 4.0 = all int4, 8.0 = all int8, 16.0 = nothing quantized). Layers kept in high precision by
    ``exclude_modules`` count at 16 bits."""
    formats: List[str] = field(default_factory=lambda: ["int4_awq", "int8_wo"])
    """Candidate formats per layer (recipe names); "not quantized" is always a candidate."""
    method: str = "kl_div"
    """Sensitivity score: kl_div (KL divergence of the model's output distribution when only that layer is
    quantized; forward passes only) | gradient (Taylor estimate of the loss change; needs backward passes)."""
    num_score_steps: int = 16
    """Calibration batches used to score sensitivity (ModelOpt ``num_score_steps``; all batches calibrate)."""


@dataclass
class QuantConfig:
    recipe: str = "none"
    """none | fp8 | int8_sq | int8_wo | int4_rtn | int4_awq | w4a8_awq | auto (ModelOpt config, TensorRT-LLM
    quant_algo and minimum compute capability of each: pipeline/facts/recipes.py RECIPES). ``int4_wo`` is a deprecated
    alias of ``int4_rtn``."""
    kv_cache_dtype: str = "none"
    """KV-cache quantization: none | fp8 | int8 (TensorRT-LLM ``kv_cache_quant_algo`` FP8 / INT8; the
    ``kv_cache_config.dtype`` of the TensorRT-LLM LLM API)."""
    kv_cache: Optional[str] = deprecated_alias("kv_cache_dtype")
    """Deprecated alias of ``kv_cache_dtype``, removed in the next release (a value set here is copied into
    ``kv_cache_dtype`` with a warning; both set to different values is a configuration error)."""
    group_size: int = 128
    """AWQ / int4 block size along the input dimension (64 or 128 are the TensorRT-LLM kernels' sizes)."""
    smoothquant_alpha: float = 0.5
    """SmoothQuant migration strength alpha (Xiao et al. 2023, sec. 4)."""
    exclude_modules: List[str] = field(default_factory=lambda: ["lm_head"])
    """fnmatch patterns of module names kept in high precision. Without ``lm_head`` the LM head is quantized too
    (ModelOpt's recipes keep it unquantized otherwise; speed and accuracy on the default model: docs/quantize.md)."""
    sensitive_preset: str = "none"
    """Extra high-precision layers: none | first_last (first and last decoder layers) | attn_out
    (attention output projections) | first_last_attn_out (both)."""
    tp_size: Optional[int] = deprecated_alias("parallel.tp_size")
    """Deprecated alias of ``parallel.tp_size``, removed in the next release."""
    pp_size: Optional[int] = deprecated_alias("parallel.pp_size")
    """Deprecated alias of ``parallel.pp_size``, removed in the next release."""
    vocab_padding: str = "pad"
    """When vocab_size % parallel.tp_size != 0: pad (record original and padded sizes) | reject."""
    export_dtype: str = "${export_dtype_for:${model.dtype}}"
    """dtype of the unquantized tensors in the exported TensorRT-LLM checkpoint. Unless set: follows model.dtype
    (bfloat16/float16 as is, float16 for float32; pipeline/core/config/model.py export_dtype_for)."""
    resmooth: bool = True
    """After AWQ calibration, give linears that read one input (q/k/v; gate/up) one pre-quant scale (their mean,
    weights re-quantized; what ModelOpt's TensorRT-LLM and HF exports do), so engines fold the scale into the
    RMSNorm weight instead of one extra multiply per projection and decode step (pipeline/quantize/resmooth.py). Weight-only recipes only (int4_awq); others have no scale to share or are
    resmoothed by ModelOpt's TensorRT-LLM export. false: keep every layer's calibrated scale."""
    auto: AutoQuantConfig = field(default_factory=AutoQuantConfig)
    """Per-layer format search, read only when recipe=auto."""


def validate(cfg: QuantConfig, prefix: str = "quant") -> list[Problem]:
    problems: list[Problem] = []
    choice(problems, f"{prefix}.recipe", cfg.recipe, RECIPES, "pick one of the presets: quant=<recipe>")
    choice(problems, f"{prefix}.kv_cache_dtype", cfg.kv_cache_dtype, KV_CACHE)
    choice(problems, f"{prefix}.sensitive_preset", cfg.sensitive_preset, SENSITIVE_PRESETS)
    choice(problems, f"{prefix}.vocab_padding", cfg.vocab_padding, ("pad", "reject"))
    choice(problems, f"{prefix}.export_dtype", cfg.export_dtype, ("float16", "bfloat16", "float32"))
    if cfg.group_size not in (32, 64, 128):
        problems.append(Problem(f"{prefix}.group_size", cfg.group_size, "must be 32, 64 or 128.", "use quant.group_size=128 (the default)"))
    if not 0.0 <= cfg.smoothquant_alpha <= 1.0:
        problems.append(Problem(f"{prefix}.smoothquant_alpha", cfg.smoothquant_alpha, "must be in [0, 1].", "use 0.5"))
    if cfg.recipe == "auto":
        a = cfg.auto
        bad = [f for f in a.formats if f not in AUTO_FORMATS]
        if not a.formats or bad:
            problems.append(
                Problem(
                    f"{prefix}.auto.formats",
                    list(a.formats),
                    f"must be a non-empty list of {list(AUTO_FORMATS)}.",
                    "e.g. quant.auto.formats=[int4_awq,int8_wo]",
                )
            )
        if not 4.0 <= float(a.effective_bits) <= 16.0:
            problems.append(
                Problem(
                    f"{prefix}.auto.effective_bits",
                    a.effective_bits,
                    "must be in [4, 16] (bits per weight).",
                    "e.g. quant.auto.effective_bits=6",
                )
            )
        choice(problems, f"{prefix}.auto.method", a.method, AUTO_METHODS)
        if a.num_score_steps < 1:
            problems.append(Problem(f"{prefix}.auto.num_score_steps", a.num_score_steps, "must be >= 1.", "use 16"))
        if cfg.kv_cache_dtype != "none":
            problems.append(
                Problem(
                    f"{prefix}.kv_cache_dtype",
                    cfg.kv_cache_dtype,
                    "quant=auto searches weight formats only; ModelOpt's auto_quantize disables KV-cache quantizers.",
                    "use quant.kv_cache_dtype=none with quant=auto",
                )
            )
    return problems
