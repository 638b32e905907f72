"""Checks before calibration: the source model's facts, the modules kept in high precision, and the recipe /
group size / tensor- and pipeline-parallel / target-GPU problems (one InputError listing them all)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..facts.families import DECODER_TYPES, NO_TRTLLM_CHECKPOINT
from ..facts.recipes import KV_MIN_SM, RECIPE_MIN_SM, RECIPES
from .auto import auto_min_bits
from .common import KV_CACHE, _hf_dir, _linear_modules, _version, log
from .placement import Placement, load_for_calibration, plan_placement

if TYPE_CHECKING:
    from ..core.config.common import Problem

#: Module-name patterns of attention output projections (``sensitive_preset`` attn_out).
ATTN_OUT_PATTERNS = ("*.self_attn.o_proj", "*.self_attention.dense", "*.attention.dense", "*.attn.out_proj")


def _gpu_facts(name: str) -> tuple[int, dict[str, int], dict[str, int], str]:
    """(SM, recipe min-SM table, KV min-SM table, source) for a target GPU name; InputError if unknown."""
    from ..facts import gpus as catalogue

    try:
        g = catalogue.lookup(name)
    except KeyError as e:
        raise InputError(f"target.gpu={name!r}: {e.args[0]}") from e
    return g.sm, dict(RECIPE_MIN_SM), dict(KV_MIN_SM), "pipeline.facts.gpus + pipeline.facts.recipes"


def source_facts(hf_dir: Path) -> dict[str, Any]:
    """Architecture-critical facts of the export checkpoint (``hf/config.json``).

    Returns a dict with model_type, architecture, num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, head_dim, vocab_size, max_position_embeddings, rope_theta (float; 10000.0 when
    the config gives none, the transformers LLaMA default), rope_scaling (dict or None, ``rope_type``
    spelling), norm_epsilon (``rms_norm_eps``), dtype.
    """
    from ..facts.rope import normalise_rope

    where = str(hf_dir / "config.json")
    try:
        c = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{where}: cannot read ({e}). Re-run the export stage.") from e
    theta, scaling = normalise_rope(c, where)
    heads = int(c["num_attention_heads"])
    return {
        "model_type": c.get("model_type"),
        "architecture": (c.get("architectures") or [None])[0],
        "num_hidden_layers": int(c["num_hidden_layers"]),
        "hidden_size": int(c["hidden_size"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(c.get("num_key_value_heads") or heads),
        "head_dim": int(c.get("head_dim") or c["hidden_size"] // heads),
        "vocab_size": int(c["vocab_size"]),
        "max_position_embeddings": int(c["max_position_embeddings"]),
        "rope_theta": float(theta) if theta is not None else 10000.0,
        "rope_scaling": scaling,
        "norm_epsilon": float(c.get("rms_norm_eps", c.get("layer_norm_eps", 1e-5))),
        "dtype": c.get("dtype") or c.get("torch_dtype") or "float16",
    }


def excluded_modules(qcfg: Any, linear_names: list[str], num_layers: int) -> dict[str, str]:
    """Linear modules kept in high precision and why: ``{module name: reason}``.

    ``quant.exclude_modules`` entries are fnmatch patterns of module names (``lm_head``,
    ``model.layers.0.*``; a bare name also matches as ``*.<name>``); ``quant.sensitive_preset`` adds
    the first and last decoder layers (``first_last``) and/or every attention output projection
    (``attn_out``).
    """
    import fnmatch
    import re

    out: dict[str, str] = {}
    for name in linear_names:
        for pat in qcfg.exclude_modules:
            if _matches(name, pat):
                out[name] = f"quant.exclude_modules: {pat}"
                break
    preset = qcfg.sensitive_preset
    if preset in ("first_last", "first_last_attn_out"):
        edge = {0, num_layers - 1}
        for name in linear_names:
            m = re.search(r"\.layers\.(\d+)\.", f".{name}.")
            if m and int(m.group(1)) in edge and name not in out:
                out[name] = f"sensitive_preset: first/last decoder layer {m.group(1)}"
    if preset in ("attn_out", "first_last_attn_out"):
        for name in linear_names:
            if name not in out and any(fnmatch.fnmatchcase(name, p) for p in ATTN_OUT_PATTERNS):
                out[name] = "sensitive_preset: attention output projection"
    return out


def preflight(
    qcfg: Any,
    facts: dict[str, Any],
    linears: dict[str, tuple[int, int]],
    excluded: dict[str, str],
    target_gpu: str | None,
    parallel: Any,
) -> dict[str, Any]:
    """Checks that must pass before any calibration; returns the facts they establish.

    Collects every problem and raises one :class:`InputError` listing them all (field, value, fix).

    * grouped recipes: for every quantized Linear, ``in_features / tp_size`` is an integer multiple of
      ``quant.group_size`` (the INT4 kernels quantize whole groups per TP shard); lists offending
      modules/dims, the group sizes and the TP sizes that would work;
    * ``num_attention_heads % tp_size == 0``; KV heads divisible by tp_size, or tp_size a multiple of
      them (then each KV head is replicated ``tp_size / kv_heads`` times, recorded); lists valid TP sizes;
    * ``vocab_size % tp_size``: padded to the next multiple (``quant.vocab_padding=pad``, original and
      padded sizes recorded; TensorRT-LLM pads the same way) or rejected (``reject``);
    * ``pp_size <= num_hidden_layers``;
    * ``target.gpu`` set: the recipe and KV format must run on its compute capability (TensorRT-LLM support
      matrix, docs/reference/tensorrt_llm.md §4: FP8 and W4A8 need SM 8.9+).

    Args:
        linears: ``{module name: (in_features, out_features)}`` of the model's Linear layers.
        parallel: the ``parallel`` config group (``tp_size``, ``pp_size``).
    """
    tp, pp = int(parallel.tp_size), int(parallel.pp_size)
    out: dict[str, Any] = {"tp_size": tp, "pp_size": pp}
    problems = linear_problems(qcfg, linears, excluded, tp)
    problems += _parallel_problems(qcfg, facts, tp, pp, out)
    problems += _gpu_problems(qcfg, target_gpu, out)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise InputError(f"quantize: {len(problems)} problem(s) found before calibration:\n{lines}")
    return out


def linear_problems(qcfg: Any, linears: dict[str, tuple[int, int]], excluded: dict[str, str], tp: int) -> list[Problem]:
    """The problems of the recipe on these linear layers (``{module name: (in_features, out_features)}``; the modules
    kept in high precision, :func:`excluded_modules`): a recipe left with nothing to quantize or a quantized KV cache
    without calibration, a q/k/v group split across formats, group sizes that do not divide the per-rank input
    dimensions. Run at config time from the shape (``pipeline/quantize/checks.py``, ``ModelShape.linears``) and again
    on the loaded model before calibration (:func:`preflight`)."""
    quantized = {n: d for n, d in linears.items() if n not in excluded and qcfg.recipe != "none"}
    return (
        _unmatched_exclude_problems(qcfg, list(linears))
        + _recipe_problems(qcfg, quantized, excluded)
        + _fused_group_problems(qcfg, linears, excluded)
        + _group_size_problems(qcfg, quantized, tp)
    )


def _matches(name: str, pat: str) -> bool:
    """``quant.exclude_modules`` matching: the fnmatch pattern, a bare name as ``*.<name>``, a prefix as ``<pat>.*``."""
    import fnmatch

    return fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(name, f"*.{pat}") or fnmatch.fnmatchcase(name, f"{pat}.*")


def _unmatched_exclude_problems(qcfg: Any, linear_names: list[str]) -> list[Problem]:
    """A ``quant.exclude_modules`` pattern that matches no linear layer keeps nothing in high precision: a typo
    (``lm_haed``) would silently quantize the module it meant to keep, so it is refused, with the closest names."""
    import difflib

    from ..core.config.common import Problem

    if qcfg.recipe == "none" or not linear_names:
        return []
    unmatched = [str(p) for p in qcfg.exclude_modules if not any(_matches(n, str(p)) for n in linear_names)]
    if not unmatched:
        return []
    short = sorted({n.rsplit(".", 1)[-1] for n in linear_names})
    near = sorted({c for p in unmatched for c in difflib.get_close_matches(p.rsplit(".", 1)[-1].lstrip("*"), short, n=2, cutoff=0.6)})
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    return [
        Problem(
            "quant.exclude_modules",
            list(qcfg.exclude_modules),
            f"{unmatched} match no linear layer of the model{hint}, so they keep nothing in high precision"
            + (
                ""
                if any(_matches("lm_head", str(p)) for p in qcfg.exclude_modules)
                else "; the list replaces the default [lm_head], so the LM head would be quantized"
            )
            + ".",
            f"use module names or fnmatch patterns of the model's linear layers ({', '.join(short)}; e.g. "
            f"quant.exclude_modules=[lm_head,model.layers.0.*])",
        )
    ]


def _recipe_problems(qcfg: Any, quantized: dict[str, tuple[int, int]], excluded: dict[str, str]) -> list[Problem]:
    """:func:`preflight`: a quantized KV cache without calibration; a recipe left with nothing to quantize."""
    from ..core.config.common import Problem

    problems: list[Problem] = []
    if qcfg.recipe == "none" and qcfg.kv_cache_dtype != "none":
        # the example keeps the user's KV format only when it is one (an unknown one is reported by the config check)
        kv = qcfg.kv_cache_dtype if qcfg.kv_cache_dtype in KV_MIN_SM else "int8"
        problems.append(
            Problem(
                "quant.kv_cache_dtype",
                qcfg.kv_cache_dtype,
                "a quantized KV cache needs calibrated K/V scales, and recipe 'none' calibrates nothing.",
                f"use quant.kv_cache_dtype=none, or a quantized recipe, e.g. quant=int8_sq quant.kv_cache_dtype={kv}",
            )
        )
    if qcfg.recipe != "none" and not [n for n in quantized if not n.endswith("lm_head")]:
        problems.append(
            Problem(
                "quant.exclude_modules",
                list(qcfg.exclude_modules),
                f"with sensitive_preset={qcfg.sensitive_preset!r} every linear layer of the model is kept in high precision "
                f"({len(excluded)} excluded), so recipe {qcfg.recipe!r} would quantize nothing.",
                "exclude fewer modules, use quant.sensitive_preset=none, or quant=none",
            )
        )
    return problems


#: Linears that ModelOpt's TensorRT-LLM checkpoint export fuses into one tensor (TensorRT-LLM's one qkv GEMM), so they
#: need one format. gate/up are not here: the export keeps them apart, and a split gate/up quantizes fine (the quantized
#: one keeps its own AWQ scale).
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"),)


def _fused_group_problems(qcfg: Any, linears: dict[str, tuple[int, int]], excluded: dict[str, str]) -> list[Problem]:
    """:func:`preflight`: ``quant.exclude_modules`` / ``sensitive_preset`` must keep each layer's q/k/v whole: all of
    it in high precision or none. ModelOpt's TensorRT-LLM export fuses them and asserts one quantization format
    (``layer_utils.build_qkv`` -> ``quant_utils.preprocess_linear_fusion``, 0.47), which would fail after calibration."""
    from ..core.config.common import Problem

    if qcfg.recipe == "none":
        return []
    split: list[str] = []
    for members in FUSED_GROUPS:
        parents = {n.rsplit(".", 1)[0] for n in linears if n.rsplit(".", 1)[-1] == members[0]}
        for parent in sorted(parents):
            names = [f"{parent}.{m}" for m in members if f"{parent}.{m}" in linears]
            kept = [n.rsplit(".", 1)[-1] for n in names if n in excluded]
            if kept and len(kept) != len(names):
                split.append(
                    f"{parent}: {'/'.join(kept)} kept, {'/'.join(n.rsplit('.', 1)[-1] for n in names if n not in excluded)} quantized"
                )
    if not split:
        return []
    return [
        Problem(
            "quant.exclude_modules",
            list(qcfg.exclude_modules),
            f"splits the q/k/v of {len(split)} layer(s) ({'; '.join(split[:3])}{' ...' if len(split) > 3 else ''}): "
            "TensorRT-LLM runs q/k/v as one GEMM in one format, and ModelOpt's checkpoint export refuses mixed formats.",
            "keep all three or none, e.g. quant.exclude_modules=[lm_head,*q_proj,*k_proj,*v_proj]",
        )
    ]


def _group_size_problems(qcfg: Any, quantized: dict[str, tuple[int, int]], tp: int) -> list[Problem]:
    """:func:`preflight`: grouped recipes need every quantized ``in_features / tp_size`` to be a multiple of the group size."""
    from ..core.config.common import Problem

    recipe = RECIPES[qcfg.recipe]
    grouped = recipe.grouped or (qcfg.recipe == "auto" and any(RECIPES[f].grouped for f in qcfg.auto.formats))
    if not (grouped and quantized):
        return []
    g = int(qcfg.group_size)
    if g < 1:
        return []  # the quant field check names it (pipeline.core.config.quant)

    def fits(dims: list[int], t: int, gs: int) -> bool:
        return all(d % t == 0 and (d // t) % gs == 0 for d in dims)

    dims = sorted({d[0] for d in quantized.values()})
    bad = [d for d in dims if not fits([d], tp, g)]
    if not bad:
        return []
    mods = [n for n, d in quantized.items() if d[0] in bad]
    ok_g = [x for x in (128, 64, 32) if fits(dims, tp, x)]
    ok_tp = [t for t in range(1, 17) if fits(dims, t, g)]
    fixes = [f"set quant.group_size={ok_g[0]} (the group sizes that fit at parallel.tp_size={tp}: {ok_g})"] if ok_g else []
    if ok_tp:
        fixes.append(f"set parallel.tp_size to one of {ok_tp} (the TP sizes that fit quant.group_size={g})")
    fixes.append(f"keep those layers in high precision with quant.exclude_modules (e.g. {mods[0]})")
    return [
        Problem(
            "quant.group_size",
            g,
            f"with parallel.tp_size={tp}, the input dimension(s) {bad} of {len(mods)} quantized linear layer(s) "
            f"(e.g. {mods[:3]}) give per-rank sizes {[d // tp if d % tp == 0 else d / tp for d in bad]} that are "
            "not multiples of the group size.",
            "; or ".join(fixes),
        )
    ]


def _parallel_problems(qcfg: Any, facts: dict[str, Any], tp: int, pp: int, out: dict[str, Any]) -> list[Problem]:
    """:func:`preflight`: attention/KV heads, vocabulary and layers split over ``tp_size``/``pp_size``.

    Records ``kv_heads_replicated`` and ``vocab_padding`` in ``out``.
    """
    from ..core.config.common import Problem

    problems: list[Problem] = []
    heads, kv, vocab = facts["num_attention_heads"], facts["num_key_value_heads"], facts["vocab_size"]
    valid_tp = [t for t in range(1, heads + 1) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]
    if heads % tp:
        problems.append(
            Problem("parallel.tp_size", tp, f"does not divide num_attention_heads={heads}.", f"use parallel.tp_size in {valid_tp}")
        )
    elif kv % tp and tp % kv:
        problems.append(
            Problem(
                "parallel.tp_size",
                tp,
                f"neither divides num_key_value_heads={kv} nor is a multiple of it (KV heads cannot be split or replicated evenly).",
                f"use parallel.tp_size in {valid_tp}",
            )
        )
    elif tp > kv:
        out["kv_heads_replicated"] = tp // kv
    if vocab % tp:
        padded = -(-vocab // tp) * tp
        if qcfg.vocab_padding == "reject":
            ok = [t for t in range(1, 17) if vocab % t == 0 and t in valid_tp]
            problems.append(
                Problem(
                    "quant.vocab_padding",
                    "reject",
                    f"vocab_size={vocab} is not divisible by tp_size={tp}.",
                    f"set quant.vocab_padding=pad (pads to {padded}) or parallel.tp_size in {ok}",
                )
            )
        else:
            out["vocab_padding"] = {"original": vocab, "padded": padded}
    if pp > facts["num_hidden_layers"]:
        problems.append(
            Problem(
                "parallel.pp_size",
                pp,
                f"exceeds num_hidden_layers={facts['num_hidden_layers']}.",
                f"use parallel.pp_size <= {facts['num_hidden_layers']}",
            )
        )
    return problems


def _gpu_problems(qcfg: Any, target_gpu: str | None, out: dict[str, Any]) -> list[Problem]:
    """:func:`preflight`: the recipe and KV format must run on ``target.gpu``'s compute capability (records ``target_gpu``)."""
    from ..core.config.common import Problem

    if not target_gpu:
        return []
    try:
        sm, rmin, kmin, src = _gpu_facts(target_gpu)
    except InputError as e:
        return [Problem("target.gpu", target_gpu, str(e).split(": ", 1)[-1], "use a GPU name from the planner catalogue")]
    out["target_gpu"] = {"name": target_gpu, "sm": sm, "source": src}
    problems: list[Problem] = []
    for field, value, minimum, choices, fix in (
        ("recipe", qcfg.recipe, rmin, RECIPES, "use one of {ok} (e.g. int4_awq or int8_sq), or a newer GPU (Ada/Hopper)"),
        ("kv_cache_dtype", qcfg.kv_cache_dtype, kmin, KV_CACHE, "use quant.kv_cache_dtype in {ok}"),
    ):
        if sm < minimum.get(value, 0):
            ok = [c for c in choices if sm >= minimum.get(c, 0)]
            problems.append(
                Problem(
                    f"quant.{field}",
                    value,
                    f"needs compute capability >= {minimum[value] / 10:.1f}; target.gpu={target_gpu} is SM {sm / 10:.1f}.",
                    fix.format(ok=ok),
                )
            )
    return problems


@dataclasses.dataclass
class _Source:
    """The export checkpoint loaded for calibration, with the checks that need only its shapes done."""

    hf: Path
    facts: dict[str, Any]
    model: Any  # torch.nn.Module (eval mode; placement.dtype on placement.device, offloaded layers on meta)
    linears: dict[str, tuple[int, int]]
    excluded: dict[str, str]
    pre: dict[str, Any]
    placement: Placement


def _num_parameters(export_dir: Path, hf: Path) -> int:
    """The export's parameter count (``model_info.json``), else the element count of its safetensors headers."""
    from ..core.contracts.export import ExportArtifact

    try:
        n_info = ExportArtifact(Path(export_dir)).model_info().num_parameters
    except InputError:
        n_info = None
    if n_info is not None:
        return int(n_info)
    from ..core.tensorio import read_header

    n = 0
    for f in hf.glob("*.safetensors"):
        for shape, _ in read_header(f)[0].values():
            k = 1
            for d in shape:
                k *= int(d)
            n += k
    return n


def _load_source(cfg: Any, export_dir: Path, offload_dir: Path | None = None) -> _Source:
    """Place (:mod:`.placement`) and load the export checkpoint, and run the checks before calibration (:func:`preflight`).

    Raises:
        InputError: an architecture ModelOpt cannot export, failed preflight checks, or (``auto``) an
            effective-bits budget below what the formats can reach.
    """
    qcfg = cfg.quant
    hf = _hf_dir(export_dir)
    facts = source_facts(hf)
    if facts["model_type"] not in DECODER_TYPES and facts["model_type"] not in NO_TRTLLM_CHECKPOINT:
        raise InputError(
            f"model_type={facts['model_type']!r}: ModelOpt {_version('nvidia-modelopt')} cannot write a TensorRT-LLM checkpoint "
            f"for this architecture (supported here: {sorted(DECODER_TYPES)}). Fix: skip the quantize stage for this model "
            "(build from the export artifact) or use a supported architecture."
        )
    placement = plan_placement(cfg.calibration, _num_parameters(export_dir, hf), str(facts["dtype"]))
    if placement.layerwise and qcfg.recipe == "auto":
        raise InputError(
            f"quant=auto: the per-layer format search needs the whole model on the device, but {placement.reason}. "
            "Fix: a device with more memory, a larger calibration.max_device_memory_gb, or a fixed recipe (e.g. quant=int4_awq)."
        )
    log.info("calibration placement: %s", placement.reason)
    model = load_for_calibration(hf, placement, offload_dir or Path(export_dir) / ".offload")
    linears = {n: (int(m.in_features), int(m.out_features)) for n, m in _linear_modules(model).items()}
    excluded = excluded_modules(qcfg, list(linears), facts["num_hidden_layers"]) if qcfg.recipe != "none" else {}
    pre = preflight(qcfg, facts, linears, excluded, getattr(cfg.target, "gpu", None), cfg.parallel)
    if qcfg.recipe == "auto":
        floor = auto_min_bits(qcfg, linears, excluded)
        if float(qcfg.auto.effective_bits) < floor - 1e-6:
            raise InputError(
                f"quant.auto.effective_bits={qcfg.auto.effective_bits}: below the {floor:.2f} bits per weight this model can "
                f"reach with formats {list(qcfg.auto.formats)} ({len(excluded)} Linear layer(s) kept at 16 bits: "
                f"{sorted(excluded)[:4]}). Fix: quant.auto.effective_bits >= {floor:.2f}, or exclude fewer modules."
            )
    return _Source(hf, facts, model, linears, excluded, pre, placement)
