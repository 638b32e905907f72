"""The ModelOpt ``mtq.quantize`` config of a recipe, adapted to the ``quant`` group."""

from __future__ import annotations

import copy
from typing import Any

from ..facts.recipes import RECIPES
from .common import KV_CACHE

#: the output projection's module name in Hugging Face causal LMs (``model.lm_head``)
LM_HEAD = "lm_head"


def lm_head_excluded(excluded: dict[str, str]) -> bool:
    """Whether the LM head is among the modules kept in high precision (``excluded``: ``pipeline.quantize.preflight.excluded_modules``)."""
    return any(n == LM_HEAD or n.endswith(f".{LM_HEAD}") for n in excluded)


def modelopt_config(qcfg: Any, excluded: dict[str, str], recipe_name: str | None = None) -> dict[str, Any]:
    """The ModelOpt ``mtq.quantize`` config for ``quant`` (a deep copy of the recipe's ModelOpt constant).

    Changes applied: ``block_sizes[-1] = quant.group_size`` for grouped recipes; SmoothQuant
    ``alpha = quant.smoothquant_alpha``; the KV-cache quantizer entries of ``quant.kv_cache_dtype``; one
    ``enable: False`` entry per excluded module (``<module>.*``), last so that it wins.  ModelOpt's own
    ``*lm_head*: enable False`` entry (in every recipe constant, modelopt/torch/quantization/config.py) is dropped
    when ``lm_head`` is not among the excluded modules, so ``quant.exclude_modules=[]`` really quantizes the LM head
    like the other projections (before, that setting was silently overruled).
    ``recipe_name`` overrides ``quant.recipe`` (the candidate formats of ``quant=auto``).
    """
    import modelopt.torch.quantization as mtq

    name = recipe_name or qcfg.recipe
    recipe = RECIPES[name]
    assert recipe.modelopt_cfg is not None, f"recipe {name!r} has no ModelOpt config (callers skip none and auto)"
    cfg = copy.deepcopy(getattr(mtq, recipe.modelopt_cfg))
    entries = cfg["quant_cfg"]
    if recipe.grouped:
        for e in entries:
            qc = e.get("cfg")
            for c in qc if isinstance(qc, list) else [qc]:
                if isinstance(c, dict) and isinstance(c.get("block_sizes"), dict) and -1 in c["block_sizes"]:
                    c["block_sizes"][-1] = int(qcfg.group_size)
    if name == "int8_sq":
        algo = cfg.get("algorithm")
        cfg["algorithm"] = {**(algo if isinstance(algo, dict) else {"method": "smoothquant"}), "alpha": float(qcfg.smoothquant_alpha)}
    if not lm_head_excluded(excluded):
        entries[:] = [e for e in entries if not (e.get("quantizer_name") == f"*{LM_HEAD}*" and e.get("enable") is False)]
    entries.extend(copy.deepcopy(KV_CACHE[qcfg.kv_cache_dtype][1]))
    for name in sorted(excluded):
        entries.append({"quantizer_name": f"{name}.*", "enable": False})
    return cfg
