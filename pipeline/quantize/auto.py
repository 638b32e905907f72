"""``quant=auto``: ModelOpt's per-layer format search (``mtq.auto_quantize``) and its report section."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ..facts.recipes import RECIPES
from .common import _quiet
from .modelopt_config import modelopt_config

if TYPE_CHECKING:
    import torch


def auto_min_bits(qcfg: Any, linears: dict[str, tuple[int, int]], excluded: dict[str, str]) -> float:
    """The smallest ``effective_bits`` ``quant=auto`` can reach: every searched Linear in the lowest-bit candidate
    format, every excluded one at 16 bits (ModelOpt's ``auto_quantize`` weight cost model counts all Linear weights)."""
    low = min(RECIPES[f].weight_bits for f in qcfg.auto.formats)
    total = sum(i * o for i, o in linears.values())
    cost = sum(i * o * (16 if n in excluded else low) for n, (i, o) in linears.items())
    return cost / total if total else 16.0


def auto_search(model: torch.nn.Module, qcfg: Any, excluded: dict[str, str], batches: list[list[list[int]]], seed: int) -> dict[str, Any]:
    """Run ModelOpt's per-layer format search (``mtq.auto_quantize``) on ``model`` in place.

    Candidates: the ModelOpt configs of ``quant.auto.formats`` (with ``quant.group_size``), plus "not quantized",
    which ModelOpt always adds. ModelOpt calibrates every candidate on all ``batches``, scores each layer group
    (q/k/v share one format, as do gate/up: TensorRT-LLM fuses them) on the first ``quant.auto.num_score_steps``
    batches, and picks the formats that minimise the summed score under ``constraints.effective_bits``
    (``method=kl_div``: KL divergence of the model's output with only that group quantized, threshold search;
    ``gradient``: Taylor estimate of the causal-LM loss change, linear programming).

    Args:
        batches: token-id batches (each a list of equal-length rows, as :meth:`CalibrationSet.batches`).
    Returns:
        The report section: ``effective_bits`` (budget, achieved, satisfied), ``method``, ``formats``,
        ``layers`` (per group: ``layer``, ``modules``, ``format``, ``scores`` {format: score}, ``bits``
        {format: bits}, ``sensitivity`` = the score of the lowest-bit candidate) and ``per_module``
        {module: format}.
    Raises:
        InputError: the budget is below what the candidate formats can reach.
    """
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.quantization.algorithms import QuantRecipe

    a = qcfg.auto
    cfgs, labels = [], {"NONE": "none"}
    for i, f in enumerate(a.formats):
        c = modelopt_config(qcfg, excluded, f)
        cfgs.append(c)
        labels[QuantRecipe.get_auto_name_for_config(c) or f"CUSTOM_{i}"] = f
    device = next(model.parameters()).device
    data = [torch.tensor(ids, dtype=torch.long, device=device) for ids in batches]

    def forward_step(m: Any, ids: torch.Tensor) -> Any:
        return m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits

    def loss_func(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # causal-LM loss (gradient method)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    torch.manual_seed(seed)
    kw: dict[str, Any] = {"loss_func": loss_func} if a.method == "gradient" else {}
    with _quiet("mtq.auto_quantize"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Received custom quantization formats")
        _, state = mtq.auto_quantize(
            model,
            constraints={"effective_bits": float(a.effective_bits)},
            quantization_formats=cfgs,
            data_loader=data,
            forward_step=forward_step,
            disabled_layers=sorted(excluded) or None,
            num_calib_steps=len(data),
            num_score_steps=min(len(data), int(a.num_score_steps)),
            method=a.method,
            verbose=False,
            **kw,
        )
    layers, per_module = _auto_layers(state, labels)
    best = state["best"]
    return {
        "method": a.method,
        "formats": list(a.formats),
        "num_score_steps": min(len(data), int(a.num_score_steps)),
        "effective_bits": {
            "budget": float(a.effective_bits),
            "achieved": float(best["constraints"].get("effective_bits", float("nan"))),
            "satisfied": bool(best.get("is_satisfied")),
        },
        "layers": layers,
        "per_module": per_module,
    }


def _auto_layers(state: dict[str, Any], labels: dict[str, str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """:func:`auto_search`'s per-layer-group report rows and ``{module: format}`` from ``mtq.auto_quantize``'s state.

    ``labels`` maps ModelOpt's recipe names (``str(recipe)`` up to its first ``(``) to ``quant.recipe`` names.
    """

    def label(r: Any) -> str:
        return labels.get(str(r).split("(")[0], str(r))

    best = state["best"]
    layers, per_module = [], {}
    for key, st in state["candidate_stats"].items():
        fmts = [label(f) for f in st["formats"]]
        chosen = label(best["recipe"].get(key, "NONE"))
        bits = {
            f: float(str(r).split("effective-bits:")[1].rstrip(")").strip()) if "effective-bits:" in str(r) else None
            for f, r in zip(fmts, st["formats"])
        }
        scores = {f: float(x) for f, x in zip(fmts, st["scores"])}
        low = min((f for f in fmts if f != "none"), key=lambda f: bits.get(f) or 16.0, default="none")
        mods = list(st["module_names"])
        layers.append(
            {
                "layer": key.removesuffix(".quant_recipe"),
                "modules": mods,
                "format": chosen,
                "scores": scores,
                "bits": bits,
                "sensitivity": scores.get(low),
            }
        )
        for n in mods:
            per_module[n] = chosen
    return layers, per_module


def auto_quant_algo(per_module: dict[str, str]) -> str | None:
    """TensorRT-LLM ``quant_algo`` ModelOpt writes for a searched model: the one format's, or MIXED_PRECISION
    (``modelopt/torch/export/quant_utils.py``: more than one layer format) with per-layer ``quant_cfg.json``."""
    algos = {RECIPES[f].quant_algo for f in per_module.values() if f != "none"}
    if not algos:
        return None
    return algos.pop() if len(algos) == 1 else "MIXED_PRECISION"
