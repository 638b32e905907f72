"""RoPE scaling: one normalised form of a checkpoint's ``rope_scaling``, which scaling types each build target
honours (per family), and the config-time refusals of the ones it does not.

* :func:`normalise_rope` - ``rope_scaling`` / ``rope_parameters`` (legacy ``type`` or ``rope_type``) in one form.
* :data:`ROPE_SUPPORT` - target -> ``model_type`` -> the scaling types whose engine matches transformers.
* :func:`rope_refusal` - why (and the fix) a target would build a checkpoint's RoPE wrongly or crash on it; the build
  stage's config checks turn it into an exit-2 refusal before any work.
* :func:`builder_rope` - the ``config.json`` the onnxruntime-genai builder needs for a RoPE it honours (YaRN's
  defaults filled in as transformers fills them; Llama's linear scaling as the builder's ``rope_position_scale``).

Sources (read from the installed packages):

* onnxruntime-genai 0.18 ``models/builders/base.py`` ``Model.make_rope_init``: ``default``, ``linear``
  (``rescale_factors``) and ``yarn`` (``rescale_inv_freq`` with ``ntk_alpha=beta_slow``, ``ntk_beta=beta_fast``,
  0 when absent); any other type raises ``NotImplementedError``.  ``builders/llama.py`` ``LlamaModel.make_rope_init``
  replaces it and handles ``llama3`` only: every other type is built as plain RoPE without a word.
  ``builders/phi.py`` ``Phi3MiniLongRoPEModel`` (chosen by ``builder.py`` whenever a Phi-3's
  ``max_position_embeddings != original_max_position_embeddings``) handles ``longrope`` only and fails without its
  factors (``KeyError: 'multi_cache'``); a Phi-3 with equal lengths is built by the base class.
  ``make_inv_freq_rescaled_with_ntk`` (YaRN) asserts ``0 < low < high < d_half - 1`` on the unrounded correction
  range, divides by ``beta_fast``/``beta_slow`` (ZeroDivisionError when absent) and never rounds it, and it ignores
  ``attention_factor``.
* transformers 5.x ``modeling_rope_utils.py`` ``_compute_yarn_parameters``: ``beta_fast`` defaults to 32,
  ``beta_slow`` to 1, ``factor`` to ``max_position_embeddings / original_max_position_embeddings``, and the
  correction range is floored/ceiled unless ``truncate`` is false.  So onnxruntime-genai's YaRN equals transformers'
  only with ``truncate: false`` (tests/facts/test_rope.py compares both functions).
* TensorRT-LLM ``tensorrt_llm/functional.py`` ``RotaryScalingType``: none, linear, dynamic, longrope, llama3, yarn,
  mrope (the engine path and the PyTorch backend read the same ``rope_scaling``).

No heavy imports at module import time.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ..errors import InputError

#: The RoPE types transformers 5.x computes (``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` and ``default``): a model with
#: any other type fails as it is built (``KeyError`` on the type), after its weights are read; a test holds this to the
#: installed library.
TRANSFORMERS_ROPE_TYPES = ("default", "dynamic", "linear", "llama3", "longrope", "proportional", "yarn")

#: transformers 5.x ``modeling_rope_utils._compute_yarn_parameters``: ``beta_fast or 32``, ``beta_slow or 1``
YARN_BETA_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}

#: transformers 5.x ``Phi3Config.original_max_position_embeddings`` default (configuration_phi3.py)
PHI3_DEFAULT_ORIGINAL_POSITIONS = 4096

_TRTLLM = ("linear", "dynamic", "longrope", "llama3", "yarn")  # RotaryScalingType less none and mrope (vision models)

#: target -> model_type -> the ``rope_type``s (besides plain RoPE) whose engine matches transformers.  Conditions
#: (YaRN's ``truncate``, Phi-3's two lengths) are :func:`rope_refusal`'s.
ROPE_SUPPORT: dict[str, dict[str, tuple[str, ...]]] = {
    "onnxruntime_genai": {
        "llama": ("llama3", "linear"),  # linear through the builder's rope_position_scale (builder_rope)
        "mistral": ("linear", "yarn"),
        "qwen2": ("linear", "yarn"),
        "phi3": ("linear", "yarn", "longrope"),
    },
    "tensorrt_llm": {mt: _TRTLLM for mt in ("llama", "mistral", "qwen2", "phi3")},
    "tensorrt_llm_pytorch": {mt: _TRTLLM for mt in ("llama", "mistral", "qwen2", "phi3")},
}

_OTHER_TARGETS = "target=tensorrt_llm or target=tensorrt_llm_pytorch (NVIDIA GPU host)"


def max_seq_len_at_most(most: int, max_input_len: int | None) -> str:
    """A fix's ``build.max_seq_len <= most``, naming ``build.max_input_len`` too when it is not below ``most`` (it
    must be below ``build.max_seq_len``), so that the fix works when applied alone."""
    too_long = (max_input_len or 0) >= most
    return f"build.max_seq_len <= {most}" + (f" and build.max_input_len below it (now {max_input_len})" if too_long else "")


class RopeRefusal(NamedTuple):
    """Why a target would build a checkpoint's RoPE wrongly or crash on it, and the fix (:func:`rope_refusal`).
    ``names_length``: the refusal is about ``build.max_seq_len`` and its fix names every length limit (dynamic
    scaling past ``max_position_embeddings``), so the build check's own length refusal is left out: one cause, one
    problem."""

    why: str
    fix: str
    names_length: bool = False


def rope_spelling(config: dict[str, Any]) -> tuple[str, str]:
    """How a ``config.json`` dict spells its RoPE scaling, for the messages: the key(s) holding a scaling type other
    than ``default`` (``rope_scaling``, transformers 5's ``rope_parameters``, or ``rope_scaling/rope_parameters``
    when both do, as the export's ``hf/`` writes; without a scaling, the key the config has), and how to make that
    plain RoPE in the same spelling."""
    dicts = [k for k in ("rope_scaling", "rope_parameters") if isinstance(config.get(k), dict)]
    scaled = [k for k in dicts if (config[k].get("rope_type") or config[k].get("type")) not in (None, "default")]
    keys = scaled or dicts[-1:] or ["rope_scaling"]
    undo = {
        "rope_scaling": "remove rope_scaling from config.json",
        "rope_parameters": 'set rope_parameters.rope_type to "default" in config.json (keep its rope_theta)',
    }
    return "/".join(keys), " and ".join(undo[k] for k in keys)


def normalise_rope(config: dict[str, Any], where: str = "config.json") -> tuple[float | None, dict[str, Any] | None]:
    """RoPE base and scaling from a raw ``config.json`` dict, in one normalised form.

    Accepts ``rope_scaling`` with the legacy ``type`` key or the newer ``rope_type`` key, and
    transformers 5's ``rope_parameters`` (which also carries ``rope_theta``).  Returns
    ``(rope_theta, scaling)``; ``scaling`` keeps every field of the source, always has
    ``rope_type``, never contains ``rope_theta``, and is None for plain RoPE (``rope_type``
    ``default`` with no other field).  Raises InputError when the spellings disagree.
    """
    theta = config.get("rope_theta")
    merged: dict[str, Any] = {}
    for key in ("rope_parameters", "rope_scaling"):
        d = config.get(key)
        if d is None:
            continue
        if not isinstance(d, dict):
            raise InputError(
                f"{where}: {key}={d!r} is not an object. Fix: write {key} as "
                '{"rope_type": "...", "factor": ...} or remove it for plain RoPE.'
            )
        legacy, new = d.get("type"), d.get("rope_type")
        if legacy is not None and new is not None and legacy != new:
            raise InputError(
                f"{where}: {key} has type={legacy!r} and rope_type={new!r}, which disagree. "
                f"Fix: keep one spelling (rope_type) with the intended scaling type."
            )
        for k, v in d.items():
            if k in merged and merged[k] != v and k not in ("type", "rope_type"):
                raise InputError(
                    f"{where}: rope_parameters.{k}={merged[k]!r} but rope_scaling.{k}={v!r}. "
                    f"Fix: make them agree or keep only one of rope_parameters/rope_scaling."
                )
            merged[k] = v
        if new is None and legacy is not None:
            merged["rope_type"] = legacy
    if "rope_theta" in merged:
        t = merged.pop("rope_theta")
        if theta is not None and float(theta) != float(t):
            raise InputError(f"{where}: rope_theta={theta!r} but rope_parameters.rope_theta={t!r}. Fix: make them agree.")
        theta = t
    if not merged:
        return (float(theta) if theta is not None else None), None
    if merged.get("rope_type") is None:
        spelled = "/".join(k for k in ("rope_scaling", "rope_parameters") if config.get(k) is not None)
        raise InputError(
            f"{where}: {spelled}={merged!r} names no scaling type. "
            f'Fix: add "rope_type" (e.g. "linear", "dynamic", "yarn", "longrope", "llama3").'
        )
    if merged["rope_type"] not in TRANSFORMERS_ROPE_TYPES:
        spelled = "/".join(k for k in ("rope_scaling", "rope_parameters") if config.get(k) is not None)
        raise InputError(
            f"{where}: {spelled} type {merged['rope_type']!r} is no RoPE type transformers knows "
            f"({', '.join(TRANSFORMERS_ROPE_TYPES)}), so the model cannot be built. Fix: write the scaling type the model "
            f"was trained with (its model card), or remove {spelled} for plain RoPE."
        )
    if merged.get("rope_type") == "default":  # plain RoPE; other keys (e.g. partial_rotary_factor) are not scaling
        return (float(theta) if theta is not None else None), None
    return (float(theta) if theta is not None else None), merged


def _ort_yarn_range(config: dict[str, Any], rope: dict[str, Any], theta: float) -> tuple[float, float, float]:
    """onnxruntime-genai 0.18's unrounded YaRN correction range ``(low, high, d_half)`` for this config, with
    transformers' beta defaults (``builders/base.py`` ``make_inv_freq_rescaled_with_ntk``)."""
    head = int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))
    orig = float(
        config.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings") or config["max_position_embeddings"]
    )
    d_half = head / 2
    fast = float(rope.get("beta_fast") or YARN_BETA_DEFAULTS["beta_fast"])
    slow = float(rope.get("beta_slow") or YARN_BETA_DEFAULTS["beta_slow"])
    low = d_half * math.log(orig / (fast * 2 * math.pi)) / math.log(theta)
    high = d_half * math.log(orig / (slow * 2 * math.pi)) / math.log(theta)
    return low, high, d_half


def rope_refusal(
    config: dict[str, Any], target: str, max_seq_len: int | None = None, positions: int | None = None, max_input_len: int | None = None
) -> RopeRefusal | None:
    """Why and the fix when ``target`` would build the checkpoint's RoPE (``config.json`` dict) differently from
    transformers or crash on it; None when it honours it (or the config is unreadable: export reports that).

    ``max_seq_len`` (tokens, ``build.max_seq_len``): the longest sequence the engine serves.  A ``dynamic`` scaling
    with ``max_seq_len <= max_position_embeddings`` is plain RoPE (:func:`dynamic_is_plain`), which every target
    builds; past it transformers rescales the frequencies with the length, so a target that builds it as plain RoPE
    is refused whatever ``allow_unsafe_lengths`` says (that flag accepts untested lengths, not an engine that differs
    from transformers).  ``positions``: the most ``build.max_seq_len`` may be for the model's position encoding (the
    build check's length limit, :func:`pipeline.facts.geometry.position_limit` less draft tokens); when
    ``max_seq_len`` is past it too, that refusal's fix names it (``names_length``).  ``max_input_len``
    (``build.max_input_len``, below ``max_seq_len``): a fix that lowers ``build.max_seq_len`` names it too when it would
    not be below the new limit (:func:`max_seq_len_at_most`), so each fix works alone."""
    try:
        theta, rope = normalise_rope(config)
    except InputError:
        return None  # the export stage names the malformed rope_scaling
    mt, arch = config.get("model_type"), (config.get("architectures") or [None])[0]
    rtype = rope["rope_type"] if rope else None
    honoured = ROPE_SUPPORT.get(target, {}).get(mt) if isinstance(mt, str) else None
    if honoured is None:
        return None  # a family or target without RoPE facts: the family check refuses it
    spelled, undo = rope_spelling(config)
    drop = (
        f"or {undo} if the model was not trained with it (it then runs with plain RoPE "
        f"up to max_position_embeddings={config.get('max_position_embeddings')})"
    )
    if target == "onnxruntime_genai" and mt == "phi3":
        p = _phi3_lengths(config, rtype, spelled)
        if p is not None:
            return p
    if rtype is None or dynamic_is_plain(config, rope, max_seq_len):
        return None
    if rtype not in honoured:
        how = (
            "its Llama builder applies only llama3 scaling (builders/llama.py) and builds any other type as plain RoPE "
            f"without a word, so the engine's outputs would differ from transformers' (honoured for Llama: {list(honoured)}, "
            "linear through the builder's rope_position_scale)"
            if target == "onnxruntime_genai" and mt == "llama"
            else f"its builder handles {list(honoured)} for {arch} and stops with NotImplementedError on any other type"
            if target == "onnxruntime_genai"
            else f"it handles {list(honoured)}"
        )
        others = [t for t, fams in ROPE_SUPPORT.items() if t != target and rtype in fams.get(str(mt), ())]
        fix = f"target={others[0]}" + (f" or target={others[1]}" if len(others) > 1 else "") if others else "another target"
        why = f"{spelled} type {rtype!r} is not honoured by target {target}: {how}"
        if rtype == "dynamic" and max_seq_len and isinstance(config.get("max_position_embeddings"), int):
            # only fixes that work alone: removing the scaling leaves plain RoPE, whose limit (max_position_embeddings)
            # this max_seq_len is past too, so it is not offered; allow_unsafe_lengths does not lift this refusal, so
            # it is offered only for a target that honours dynamic
            mpe = config["max_position_embeddings"]
            past = positions is not None and max_seq_len > positions
            there = (
                f" (there also {max_seq_len_at_most(positions, max_input_len)}, the model's positions, or allow_unsafe_lengths=true)"
                if past and positions is not None
                else ""
            )
            return RopeRefusal(
                f"{why} (dynamic NTK scaling equals plain RoPE up to max_position_embeddings={mpe}, below "
                f"build.max_seq_len={max_seq_len}; past it transformers rescales, so allow_unsafe_lengths=true cannot accept it).",
                f"set {max_seq_len_at_most(mpe, max_input_len)}, or {fix}{there}",
                past,
            )
        return RopeRefusal(f"{why}.", f"{fix}, {drop}")
    if target == "onnxruntime_genai" and rtype == "yarn":
        return _ort_yarn_problem(config, rope or {}, float(theta or 10000.0), spelled, drop)
    return None


def _ort_yarn_problem(config: dict[str, Any], rope: dict[str, Any], theta: float, spelled: str, drop: str) -> RopeRefusal | None:
    why: list[str] = []
    if rope.get("truncate", True) is not False:
        why.append(
            "transformers rounds YaRN's correction range (floor/ceil, truncate defaults to true) and onnxruntime-genai "
            "0.18's builder does not, so the engine's rotary frequencies differ from the model's"
        )
    if rope.get("attention_factor") is not None:
        why.append(f"the builder ignores attention_factor={rope['attention_factor']!r}")
    try:
        low, high, d_half = _ort_yarn_range(config, rope, theta)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None  # missing shape fields: the export stage names them
    if not 0 < low < high < d_half - 1:
        orig = config.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
        why.append(
            f"the builder asserts 0 < low < high < d_half - 1 and this config gives low={low:.2f}, high={high:.2f}, "
            f"d_half - 1={d_half - 1:g} (original_max_position_embeddings={orig}, beta_fast="
            f"{rope.get('beta_fast') or YARN_BETA_DEFAULTS['beta_fast']:g}, beta_slow="
            f"{rope.get('beta_slow') or YARN_BETA_DEFAULTS['beta_slow']:g}), so the build would fail"
        )
    if not why:
        return None
    return RopeRefusal(f"{spelled} type 'yarn' on target onnxruntime_genai: " + "; ".join(why) + ".", f"{_OTHER_TARGETS}, {drop}")


def _phi3_lengths(config: dict[str, Any], rtype: str | None, spelled: str) -> RopeRefusal | None:
    """onnxruntime-genai's builder picks Phi-3's LongRoPE model by ``max_position_embeddings !=
    original_max_position_embeddings`` (``builder.py``), not by ``rope_scaling``; ``spelled``: :func:`rope_spelling`."""
    given = config.get("original_max_position_embeddings")
    orig = given if given is not None else PHI3_DEFAULT_ORIGINAL_POSITIONS
    mpe = config.get("max_position_embeddings")
    if not isinstance(mpe, int) or not isinstance(orig, int):
        return None
    if mpe != orig and rtype != "longrope":
        return RopeRefusal(
            f"Phi-3 config.json has max_position_embeddings={mpe} but original_max_position_embeddings={orig}"
            f"{'' if given is not None else ' (the transformers default)'} and no LongRoPE {spelled}: "
            "onnxruntime-genai's builder takes every Phi-3 whose two lengths differ for the LongRoPE model and fails "
            "without its short_factor/long_factor.",
            f"set original_max_position_embeddings={mpe} in config.json (a model without long-context scaling), or "
            f"give {spelled} rope_type longrope with its short_factor and long_factor; or use target=tensorrt_llm_pytorch",
        )
    if mpe == orig and rtype == "longrope":
        return RopeRefusal(
            f"Phi-3 config.json has {spelled} type 'longrope' but max_position_embeddings == "
            f"original_max_position_embeddings == {mpe}: onnxruntime-genai's builder then takes the short-context model "
            "and stops with NotImplementedError on longrope.",
            "set original_max_position_embeddings to the pre-training length (4096 for Phi-3-mini-128k), or target=tensorrt_llm_pytorch",
        )
    return None


def dynamic_is_plain(config: dict[str, Any], rope: dict[str, Any] | None, max_seq_len: int | None) -> bool:
    """True when ``rope`` (normalised) is ``dynamic`` and no sequence of ``max_seq_len`` tokens goes past
    ``max_position_embeddings``: transformers 5.x ``_compute_dynamic_ntk_parameters`` scales the base by
    ``(factor * seq_len / max_position_embeddings - (factor - 1)) ** (dim / (dim - 2))`` with ``seq_len`` at least
    ``max_position_embeddings`` (a factor of 1 there), and ``dynamic_rope_update`` recomputes only past it."""
    mpe = config.get("max_position_embeddings")
    return bool(rope and rope["rope_type"] == "dynamic" and max_seq_len and isinstance(mpe, int) and max_seq_len <= mpe)


def builder_rope(config: dict[str, Any], max_seq_len: int | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """The ``config.json`` onnxruntime-genai's builder must see for a RoPE scaling it honours (after
    :func:`rope_refusal` let it through), or ``(None, None)`` when the checkpoint's own is right.

    * YaRN: ``beta_fast``/``beta_slow``/``factor`` filled in as transformers fills them (the builder reads 0 for an
      absent one and divides by it).
    * Llama + linear: the Llama builder ignores ``linear``; its base class scales positions by
      ``rope_position_scale`` (``t * scale`` in ``make_rotary_embedding_caches_from_scratch``), which equals
      transformers' ``inv_freq / factor`` (``_compute_linear_scaling_rope_parameters``).
    * dynamic within ``max_position_embeddings`` (:func:`dynamic_is_plain`, ``max_seq_len`` in tokens): plain RoPE,
      so the scaling is left out (the builders other than Llama's raise NotImplementedError on ``dynamic``).
    """
    try:
        _, rope = normalise_rope(config)
    except InputError:
        return None, None
    if rope is None:
        return None, None
    key = "rope_parameters" if isinstance(config.get("rope_parameters"), dict) else "rope_scaling"
    if dynamic_is_plain(config, rope, max_seq_len):
        kept = {k: v for k, v in (config.get(key) or {}).items() if k in ("rope_theta", "partial_rotary_factor")}
        plain = {k: v for k, v in config.items() if k != "rope_scaling"}
        if key == "rope_parameters":
            plain[key] = {**kept, "rope_type": "default"}
        mpe = config["max_position_embeddings"]
        return (
            plain,
            f"dynamic RoPE scaling built as plain RoPE (equal up to max_position_embeddings={mpe} >= build.max_seq_len={max_seq_len})",
        )
    if rope["rope_type"] == "yarn":
        fill = dict(YARN_BETA_DEFAULTS)
        orig = rope.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
        if orig:
            fill["factor"] = float(config["max_position_embeddings"]) / float(orig)
        added = {k: v for k, v in fill.items() if rope.get(k) is None}
        if not added:
            return None, None
        # into every spelling the config holds: transformers 5 lets a legacy rope_scaling override rope_parameters
        # (a trial: the betas filled into rope_parameters alone were dropped, and the builder divided by zero)
        keys = [k for k in ("rope_parameters", "rope_scaling") if isinstance(config.get(k), dict)]
        return {**config, **{k: {**config[k], **added} for k in keys}}, f"YaRN defaults filled in as transformers does: {added}"
    if rope["rope_type"] == "linear" and config.get("model_type") == "llama":
        factor = float(rope["factor"])
        return {**config, "rope_position_scale": 1.0 / factor}, f"linear RoPE scaling x{factor:g} as rope_position_scale={1.0 / factor:g}"
    return None, None
