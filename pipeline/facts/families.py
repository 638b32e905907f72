"""Model families: what each supported architecture needs from the targets, and what is refused at config time.

One place for the family facts the other modules consult (docs/models.md renders them as the family matrix):

* :data:`FAMILY_SUPPORT` - per ``model_type``: the targets and recipes that work, and the reason plus the alternative
  for those that do not.  :func:`config_problems` turns it into config-time refusals (exit 2) from the checkpoint's
  ``config.json``, before any stage runs.
* :func:`windowed_layer_types` / :func:`builder_input` - sliding-window attention on the onnxruntime-genai target.
  Hugging Face Mistral and Phi-3 apply ``sliding_window`` to every layer without listing ``layer_types``; the
  onnxruntime-genai 0.18 model builder windows only layers marked ``"sliding_attention"`` in ``layer_types``
  (``builders/base.py``: ``is_local``) yet still writes a ``sliding_window`` section into ``genai_config.json``, so
  without the list the engine attends to the whole context (wrong once a prompt is longer than the window) and its
  windowed cache fails with ``GroupQueryAttention ... past_sequence_length``.  Given the list, the builder emits
  ``local_window_size`` + a window-sized KV cache, which matches transformers token for token
  (tests/facts/test_families.py).

No heavy imports at module import time.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

#: Hugging Face ``model_type``s whose modelling code windows *every* layer when ``sliding_window`` is set
#: (transformers 5: ``modeling_mistral.py`` / ``modeling_phi3.py`` pass ``config.sliding_window`` to each attention).
WINDOW_ALL_LAYERS = ("mistral", "phi3")

#: model_type -> {"architecture", "targets": {target: None | "reason. Fix: ..."}, "recipes": {recipe: reason},
#: "quantized_on": {target: reason}}.  ``None`` = supported; a ``recipes`` entry refuses that recipe on every target,
#: a ``quantized_on`` entry every recipe but ``none`` on that target.
FAMILY_SUPPORT: dict[str, dict[str, Any]] = {
    "llama": {
        "architecture": "LlamaForCausalLM",
        "targets": {"onnxruntime_genai": None, "tensorrt_llm": None, "tensorrt_llm_pytorch": None},
    },
    "mistral": {
        "architecture": "MistralForCausalLM",
        "targets": {"onnxruntime_genai": None, "tensorrt_llm": None, "tensorrt_llm_pytorch": None},
    },
    "qwen2": {
        "architecture": "Qwen2ForCausalLM",
        "targets": {"onnxruntime_genai": None, "tensorrt_llm": None, "tensorrt_llm_pytorch": None},
    },
    "phi3": {
        "architecture": "Phi3ForCausalLM",
        "targets": {
            "onnxruntime_genai": None,
            "tensorrt_llm_pytorch": None,
            "tensorrt_llm": "ModelOpt 0.47 cannot write a TensorRT-LLM checkpoint for Phi3ForCausalLM (its converter raises "
            "NotImplementedError), so there is nothing for trtllm-build to compile. Fix: target=tensorrt_llm_pytorch "
            "(the PyTorch backend serves the unified HF checkpoint) or target=onnxruntime_genai.",
        },
        "quantized_on": {
            "onnxruntime_genai": "the CPU engine deploys ModelOpt's own integers through a GPTQ-layout checkpoint "
            "(pipeline/build/targets/onnxruntime_genai/quant.py), which handles separate q/k/v and gate/up projections only; "
            "Phi-3's fused qkv_proj and gate_up_proj would be re-quantized, not deployed exactly. "
            "Fix: quant=none on target=onnxruntime_genai, or the quantized recipe on target=tensorrt_llm_pytorch "
            "(GPU host).",
        },
    },
}


def read_model_config(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """``config.json`` of the checkpoint at ``path`` (resolved like ``model.path``), or None when unreadable."""
    if not path:
        return None
    from ..core.config import resolve_path

    try:
        p = resolve_path(str(path))
        cj = p / "config.json" if p is not None else None
        if cj is None or not cj.is_file():
            return None
        doc = json.loads(cj.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the export stage / planner report an unreadable checkpoint with their own message
    return doc if isinstance(doc, dict) else None


def windowed_layer_types(config: dict[str, Any]) -> list[str] | None:
    """``layer_types`` the onnxruntime-genai builder needs to window this model, or None when it needs none.

    Returns ``["sliding_attention"] * num_hidden_layers`` for a :data:`WINDOW_ALL_LAYERS` model with a positive
    ``sliding_window`` and no ``layer_types`` (Qwen2 and newer configs list them themselves).
    """
    sw = config.get("sliding_window")
    if config.get("model_type") not in WINDOW_ALL_LAYERS or config.get("layer_types") is not None:
        return None
    if not isinstance(sw, int) or isinstance(sw, bool) or sw <= 0:
        return None
    return ["sliding_attention"] * int(config["num_hidden_layers"])


def builder_config(config: dict[str, Any], max_seq_len: int) -> tuple[dict[str, Any] | None, str | None]:
    """The ``config.json`` the onnxruntime-genai builder must see for an engine of ``max_seq_len`` positions, or
    ``(None, None)`` when the checkpoint's own config is right.  Returns (config, what changed).

    * window >= ``max_seq_len``: the window never masks anything inside the engine's context (transformers masks
      key ``j`` for query ``i`` only when ``i - j >= sliding_window``), so the engine is built with full attention
      (``sliding_window: null``).  A windowed build would need every request's KV capacity (its ``max_length``)
      to be at least the window, which onnxruntime-genai 0.18 checks at run time and fails.
    * window < ``max_seq_len``: :func:`windowed_layer_types` marks the layers (Mistral, Phi-3); Qwen2 configs
      already list them.
    """
    sw = config.get("sliding_window")
    if not isinstance(sw, int) or isinstance(sw, bool) or sw <= 0:
        return None, None
    if sw >= int(max_seq_len):
        out = {**config, "sliding_window": None}
        if config.get("layer_types") is not None:
            out["layer_types"] = ["full_attention" if t == "sliding_attention" else t for t in config["layer_types"]]
        if "use_sliding_window" in config:
            out["use_sliding_window"] = False
        return out, f"sliding_window={sw} >= build.max_seq_len={max_seq_len}: full attention (identical inside the engine's context)"
    layers = windowed_layer_types(config)
    if layers is None:
        return None, None
    return {**config, "layer_types": layers}, f"sliding_window={sw} < build.max_seq_len={max_seq_len}: {len(layers)} layer(s) windowed"


def builder_input(src: Path, dst: Path, max_seq_len: int) -> tuple[Path, str | None]:
    """The checkpoint folder to hand the onnxruntime-genai model builder: ``src`` itself, or (when
    :func:`builder_config` changes the config) ``dst`` = symlinks to ``src``'s files + that ``config.json``.

    ``src`` is never modified (it may be hard-linked to the export artifact).  Returns (folder, what changed or None).
    """
    src, dst = Path(src), Path(dst)
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    new, note = builder_config(cfg, max_seq_len)
    if new is None:
        return src, None
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f.resolve())
    (dst / "config.json").write_text(json.dumps(new, indent=2) + "\n", encoding="utf-8")
    return dst, note


def config_problems(cfg: Any) -> list[Any]:
    """Config-time refusals for the checkpoint at ``model.path`` (called from ``pipeline.validation.validate``).

    * an architecture this pipeline has no support for (e.g. ``GemmaForCausalLM``), named with the supported list;
    * a target the family cannot be built for (Phi-3 on ``tensorrt_llm``), with the reason and the alternative.

    Only when a stage that exports or builds is requested; shapes-only presets (no ``model.path``) are skipped.
    """
    from ..core.config.common import Problem

    stages = set(getattr(cfg, "stages", ()) or ())
    if not stages & {"export", "quantize", "build", "evaluate", "package", "benchmark"}:
        return []
    mc = read_model_config(getattr(cfg.model, "path", None))
    if mc is None:
        return []
    problems: list[Problem] = []
    archs = mc.get("architectures") or []
    arch = archs[0] if archs else None
    mt = mc.get("model_type")
    fam = FAMILY_SUPPORT.get(mt) if isinstance(mt, str) else None
    if fam is None or (arch is not None and arch != fam["architecture"]):
        supported = sorted(f["architecture"] for f in FAMILY_SUPPORT.values())
        problems.append(
            Problem(
                "model.path",
                cfg.model.path,
                f"architecture {arch!r} (model_type {mt!r}) is not supported by this pipeline (supported: {supported}).",
                "convert the model to one of the supported architectures, or use a checkpoint of a supported "
                "family (docs/models.md lists what works on which target)",
            )
        )
        return problems
    from ..build.targets import needs_build, resolve_target

    if needs_build(cfg):
        try:
            target, _ = resolve_target(cfg)
        except Exception:
            return problems
        why = fam["targets"].get(target)
        if why:
            problems.append(
                Problem(
                    "target.name",
                    target,
                    f"{fam['architecture']}: {why.split(' Fix: ')[0]}",
                    why.split(" Fix: ", 1)[1] if " Fix: " in why else "use another target",
                )
            )
    problems.extend(_window_problems(cfg, mc))
    problems.extend(_head_size_problems(cfg, mc))
    recipe = getattr(cfg.quant, "recipe", None)
    recipe_why = fam.get("recipes", {}).get(recipe)
    if recipe_why is None and recipe != "none" and needs_build(cfg):
        try:
            recipe_why = fam.get("quantized_on", {}).get(resolve_target(cfg)[0])
        except Exception:
            recipe_why = None
    if recipe_why:
        problems.append(
            Problem(
                "quant.recipe",
                cfg.quant.recipe,
                f"{fam['architecture']}: {recipe_why.split(' Fix: ')[0]}",
                recipe_why.split(" Fix: ", 1)[1] if " Fix: " in recipe_why else "use another recipe",
            )
        )
    return problems


def _builds_on_ort(cfg: Any) -> bool:
    """The run builds an engine and its target resolves to onnxruntime_genai (False when it cannot be resolved: the
    target's own checks report that)."""
    from ..build.targets import needs_build, resolve_target

    if not needs_build(cfg):
        return False
    try:
        return resolve_target(cfg)[0] == "onnxruntime_genai"
    except Exception:
        return False


#: onnxruntime's CPU ``GroupQueryAttention`` kernel (the attention op onnxruntime-genai's builder emits) refuses other
#: head sizes at the first step ("head_size shall be a multiple of 16", onnxruntime 1.32 contrib_ops/cpu/bert/
#: group_query_attention_helper.h); found by a fresh-user trial with a hidden-96 / 4-head Mistral (head size 24)
CPU_GQA_HEAD_MULTIPLE = 16


def _head_size_problems(cfg: Any, mc: dict[str, Any]) -> list[Any]:
    """A head size the onnxruntime_genai CPU engine cannot run (:data:`CPU_GQA_HEAD_MULTIPLE`), refused at config
    time instead of after the build (the engine loads and fails at its first step)."""
    from ..core.config.common import Problem

    if not _builds_on_ort(cfg) or getattr(cfg.target, "execution_provider", "cpu") != "cpu":
        return []
    try:
        hidden, heads = int(mc["hidden_size"]), int(mc["num_attention_heads"])
        head = int(mc.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return []
    if head % CPU_GQA_HEAD_MULTIPLE == 0:
        return []
    return [
        Problem(
            "model.path",
            cfg.model.path,
            f"head size {head} (hidden_size {hidden} / num_attention_heads {heads}): onnxruntime's CPU attention kernel "
            f"(GroupQueryAttention) runs only head sizes that are a multiple of {CPU_GQA_HEAD_MULTIPLE}.",
            f"use a model whose head size is a multiple of {CPU_GQA_HEAD_MULTIPLE} for target=onnxruntime_genai on CPU, "
            "or target=tensorrt_llm on an NVIDIA GPU",
        )
    ]


def _window_problems(cfg: Any, mc: dict[str, Any]) -> list[Any]:
    """A sliding window that binds inside the engine's context on onnxruntime_genai needs ``build.max_batch_size=1``.

    onnxruntime-genai 0.18's ``og.Engine`` runs a static batch of prompts of different lengths through the
    window-sized KV cache wrongly (``GroupQueryAttention: seqlens_k[1] = 40 is too small for sequence_length 61``,
    after which the engine refuses every request); one sequence at a time matches transformers.
    """
    from ..core.config.common import Problem

    if not _builds_on_ort(cfg):
        return []
    b = cfg.build
    new, _ = builder_config(mc, int(b.max_seq_len))
    windowed = new is not None and new.get("sliding_window") is not None and "sliding_attention" in (new.get("layer_types") or [])
    if not windowed and mc.get("layer_types") and "sliding_attention" in mc["layer_types"] and new is None:
        windowed = True  # e.g. Qwen2 with use_sliding_window: the config lists its windowed layers itself
    if not windowed:
        return []
    sw = mc.get("sliding_window")
    served = sorted(set(getattr(cfg, "stages", ())) & {"package", "benchmark"})
    if served:
        return [
            Problem(
                "build.max_seq_len",
                b.max_seq_len,
                f"the model's sliding_window={sw} is smaller than build.max_seq_len={b.max_seq_len}: the "
                "onnxruntime_genai engine gets a windowed KV cache, which builds and evaluates correctly one sequence "
                f"at a time, but the served engine (Triton, og.Engine 0.18) fails its requests (ENGINE_EXECUTION_FAILURE, "
                f"measured), so stages {served} cannot ship it.",
                f"build.max_seq_len<={sw} (the window then never binds: full attention), or stop at stages=[evaluate] "
                "with build.max_batch_size=1",
            )
        ]
    if int(b.max_batch_size) <= 1:
        return []
    return [
        Problem(
            "build.max_batch_size",
            b.max_batch_size,
            f"the model's sliding_window={sw} is smaller than build.max_seq_len={b.max_seq_len}, so the "
            "onnxruntime_genai engine is built with a windowed KV cache, and onnxruntime-genai 0.18 runs batches of "
            "prompts of different lengths through it wrongly.",
            f"build.max_batch_size=1 (one sequence at a time, matches transformers), or build.max_seq_len<={sw} "
            "(the window then never binds and the engine uses full attention)",
        )
    ]
