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
import shutil
from pathlib import Path
from typing import Any

#: Hugging Face ``model_type``s whose modelling code windows *every* layer when ``sliding_window`` is set
#: (transformers 5: ``modeling_mistral.py`` / ``modeling_phi3.py`` pass ``config.sliding_window`` to each attention).
WINDOW_ALL_LAYERS = ("mistral", "phi3")

#: model_type -> {"architecture", "trtllm_decoder", "targets": {target: None | "reason. Fix: ..."}, "recipes": {recipe:
#: reason}, "quantized_on": {target: reason}, "no_trtllm_checkpoint": reason}.  ``None`` = supported; a ``recipes`` entry
#: refuses that recipe on every target, a ``quantized_on`` entry every recipe but ``none`` on that target.
#: ``trtllm_decoder`` is ModelOpt's ``decoder_type`` for ``export_tensorrt_llm_checkpoint`` (modelopt/torch/export,
#: 0.47); a family without one has ``no_trtllm_checkpoint``: why ModelOpt writes none (quantize still calibrates and
#: writes the simulated-quant state and the unified HF checkpoint, which onnxruntime_genai and tensorrt_llm_pytorch
#: deploy).
FAMILY_SUPPORT: dict[str, dict[str, Any]] = {
    "llama": {
        "architecture": "LlamaForCausalLM",
        "trtllm_decoder": "llama",
        "targets": {"onnxruntime_genai": None, "tensorrt_llm": None, "tensorrt_llm_pytorch": None},
    },
    "mistral": {
        "architecture": "MistralForCausalLM",
        "trtllm_decoder": "llama",
        "targets": {"onnxruntime_genai": None, "tensorrt_llm": None, "tensorrt_llm_pytorch": None},
    },
    "qwen2": {
        "architecture": "Qwen2ForCausalLM",
        "trtllm_decoder": "qwen",
        "targets": {"onnxruntime_genai": None, "tensorrt_llm": None, "tensorrt_llm_pytorch": None},
    },
    "phi3": {
        "architecture": "Phi3ForCausalLM",
        "trtllm_decoder": None,
        # modelopt/torch/export/tensorrt_llm_utils.py (0.47) raises NotImplementedError for Phi3ForCausalLM
        "no_trtllm_checkpoint": "ModelOpt 0.47 cannot export Phi3ForCausalLM to a TensorRT-LLM checkpoint (its converter "
        "raises NotImplementedError and points to the unified HF checkpoint + the PyTorch backend)",
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


#: HF ``model_type`` -> ModelOpt ``decoder_type`` (from :data:`FAMILY_SUPPORT`).
DECODER_TYPES: dict[str, str] = {mt: f["trtllm_decoder"] for mt, f in FAMILY_SUPPORT.items() if f.get("trtllm_decoder")}

#: model_type -> why ModelOpt writes no TensorRT-LLM checkpoint for it (from :data:`FAMILY_SUPPORT`).
NO_TRTLLM_CHECKPOINT: dict[str, str] = {mt: f["no_trtllm_checkpoint"] for mt, f in FAMILY_SUPPORT.items() if f.get("no_trtllm_checkpoint")}


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


def builder_input(src: Path, dst: Path, max_seq_len: int) -> tuple[Path, list[str]]:
    """The checkpoint folder to hand the onnxruntime-genai model builder: ``src`` itself, or (when
    :func:`builder_config` or :func:`pipeline.facts.rope.builder_rope` changes the config) ``dst`` = symlinks to
    ``src``'s files + that ``config.json``.

    ``src`` is never modified (it may be hard-linked to the export artifact).  Returns (folder, what changed: one
    string per change, ``[]`` when none; ``build_info.json`` ``builder_config_changes``).
    """
    src, dst = Path(src), Path(dst)
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    new, note = builder_config(cfg, max_seq_len)
    from .rope import builder_rope

    roped, rope_note = builder_rope(new or cfg, max_seq_len)
    new = roped if roped is not None else new
    changes = [n for n in (note, rope_note) if n]
    if new is None:
        return src, []
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f.resolve())
    (dst / "config.json").write_text(json.dumps(new, indent=2) + "\n", encoding="utf-8")
    return dst, changes
