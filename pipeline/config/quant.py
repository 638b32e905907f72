"""``quant`` config group: the quantization recipe (quantize stage, through NVIDIA ModelOpt)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from .common import Problem, choice

RECIPES = ("none", "fp8", "int8_sq", "int8_wo", "int4_rtn", "int4_awq", "w4a8_awq", "int4_wo")
#: deprecated recipe names -> the name to use (still accepted for one release; the quant report warns)
DEPRECATED_RECIPES = {"int4_wo": "int4_rtn"}
KV_CACHE = ("none", "fp8", "int8")
SENSITIVE_PRESETS = ("none", "first_last", "attn_out", "first_last_attn_out")


@dataclass
class QuantConfig:
    recipe: str = "none"
    """none | fp8 | int8_sq | int8_wo | int4_rtn | int4_awq | w4a8_awq (TensorRT-LLM quant_algo names in
    pipeline/quantize.py RECIPES). ``int4_wo`` is a deprecated alias of ``int4_rtn``."""
    kv_cache: str = "none"
    """KV-cache quantization: none | fp8 | int8 (TensorRT-LLM kv_cache_quant_algo FP8 / INT8)."""
    group_size: int = 128
    """AWQ / int4 block size along the input dimension (64 or 128 are the TensorRT-LLM kernels' sizes)."""
    smoothquant_alpha: float = 0.5
    """SmoothQuant migration strength alpha (Xiao et al. 2023, sec. 4)."""
    exclude_modules: List[str] = field(default_factory=lambda: ["lm_head"])
    """fnmatch patterns of module names kept in high precision."""
    sensitive_preset: str = "none"
    """Extra high-precision layers: none | first_last (first and last decoder layers) | attn_out
    (attention output projections) | first_last_attn_out (both)."""
    tp_size: int = 1
    """Tensor-parallel ranks of the exported TensorRT-LLM checkpoint (rank{N}.safetensors)."""
    pp_size: int = 1
    """Pipeline-parallel ranks."""
    vocab_padding: str = "pad"
    """When vocab_size % tp_size != 0: pad (record original and padded sizes) | reject."""
    export_dtype: str = "float16"
    """dtype of the unquantized tensors in the exported TensorRT-LLM checkpoint."""


def validate(cfg: QuantConfig, prefix: str = "quant") -> list[Problem]:
    problems: list[Problem] = []
    choice(problems, f"{prefix}.recipe", cfg.recipe, RECIPES, "pick one of the presets: quant=<recipe>")
    choice(problems, f"{prefix}.kv_cache", cfg.kv_cache, KV_CACHE)
    choice(problems, f"{prefix}.sensitive_preset", cfg.sensitive_preset, SENSITIVE_PRESETS)
    choice(problems, f"{prefix}.vocab_padding", cfg.vocab_padding, ("pad", "reject"))
    choice(problems, f"{prefix}.export_dtype", cfg.export_dtype, ("float16", "bfloat16", "float32"))
    if cfg.group_size not in (32, 64, 128):
        problems.append(Problem(f"{prefix}.group_size", cfg.group_size, "must be 32, 64 or 128.", "use quant.group_size=128 (the default)"))
    if not 0.0 <= cfg.smoothquant_alpha <= 1.0:
        problems.append(Problem(f"{prefix}.smoothquant_alpha", cfg.smoothquant_alpha, "must be in [0, 1].", "use 0.5"))
    for f in ("tp_size", "pp_size"):
        if getattr(cfg, f) < 1:
            problems.append(Problem(f"{prefix}.{f}", getattr(cfg, f), "must be >= 1.", f"set {prefix}.{f}=1"))
    return problems
