"""What the onnxruntime_genai target needs from the model itself (called by its ``check_config``): a head size its
CPU attention kernel runs, and a batch size or sequence length its windowed KV cache handles.  Never imports torch.
"""

from __future__ import annotations

from typing import Any

from ....core.modelio import read_model_config
from ....facts.families import builder_config


def model_problems(cfg: Any) -> list[Any]:
    """The model's problems on this target (``[]`` when ``model.path`` has no readable ``config.json``). Part of the
    target's ``check_config``, which :func:`pipeline.build.targets.config_problems` calls only for a run that builds
    on this target."""
    mc = read_model_config(getattr(cfg.model, "path", None))
    if mc is None:
        return []
    return _window_problems(cfg, mc) + _head_size_problems(cfg, mc)


#: onnxruntime's CPU ``GroupQueryAttention`` kernel (the attention op onnxruntime-genai's builder emits) refuses other
#: head sizes at the first step ("head_size shall be a multiple of 16", onnxruntime 1.32 contrib_ops/cpu/bert/
#: group_query_attention_helper.h); found by a fresh-user trial with a hidden-96 / 4-head Mistral (head size 24)
CPU_GQA_HEAD_MULTIPLE = 16


def _head_size_problems(cfg: Any, mc: dict[str, Any]) -> list[Any]:
    """A head size the onnxruntime_genai CPU engine cannot run (:data:`CPU_GQA_HEAD_MULTIPLE`), refused at config
    time instead of after the build (the engine loads and fails at its first step)."""
    from ....core.config.common import Problem

    if getattr(cfg.target, "execution_provider", "cpu") != "cpu":
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
    from ....core.config.common import Problem

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
