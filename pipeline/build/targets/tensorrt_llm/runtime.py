"""What a ``tensorrt_llm`` engine runs with: the model's positions and attention window, the runtime knobs the package
stage deploys, and the PyTorch backend's LLM-API options.

Rule: settings that are not ``trtllm-build`` flags but are decided at build time and recorded for serving
(``build_info.json`` ``runtime``, ``engine/llm_api_options.yaml``) are computed here, from the config alone.

Facts (TensorRT-LLM 1.2.x; docs/reference/tensorrt_llm.md): ``max_seq_len`` default = ``max_position_embeddings`` x
rope factor (``builder.py``); speculative decoding adds ``max_draft_len`` to it. CUDA Graphs are a runtime setting
for engines (``llmapi/llm_args.py`` ExtendedRuntimePerfKnobConfig, Triton ``cuda_graph_mode``/``cuda_graph_cache_size``),
recorded in ``build_info.json`` for the package stage; the PyTorch backend takes ``cuda_graph_config``.
"""

from __future__ import annotations

import json
from typing import Any

SCHEDULER_POLICY = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}
SPECULATIVE_DECODING_TYPE = {
    "draft_tokens_external": "DraftTarget",
    "eagle": "Eagle",
    "medusa": "Medusa",
    "lookahead_decoding": "Lookahead",
}
"""build.speculative.mode -> the LLM API ``speculative_config.decoding_type`` (tensorrt_llm/llmapi/llm_args.py)."""


def model_hf_config(cfg: Any) -> dict[str, Any] | None:
    """The model's config.json (``model.path``) or inline ``model.hf_config``; None when unreadable."""
    if cfg.model.hf_config:
        return dict(cfg.model.hf_config)
    if cfg.model.path:
        from ....core.config import resolve_path

        p = resolve_path(cfg.model.path)
        for f in (p / "config.json", p / "hf" / "config.json") if p else ():
            if f.is_file():
                try:
                    return json.loads(f.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    return None
    return None


def max_positions(hf: dict[str, Any]) -> tuple[int | None, str]:
    """``(limit, explanation)``: max_position_embeddings x rope factor (:func:`pipeline.facts.geometry.position_limit`;
    the scaling in any spelling, :func:`pipeline.facts.geometry.rope_scale`)."""
    from ....facts.geometry import position_limit, rope_scale

    mpe = hf.get("max_position_embeddings")
    if not mpe:
        return None, "max_position_embeddings unknown"
    rtype, factor = rope_scale(hf)
    limit = position_limit(int(mpe), rtype, factor)
    return limit, f"max_position_embeddings {mpe} x rope factor {limit / int(mpe):g}"


def sliding_window(hf: dict[str, Any] | None) -> int | None:
    """The model's attention window in tokens (``sliding_window`` of Mistral-style configs), or None.

    Qwen2-style configs carry ``sliding_window`` with ``use_sliding_window: false`` (full attention): None then.
    """
    if not hf:
        return None
    w = hf.get("sliding_window")
    if w in (None, 0) or hf.get("use_sliding_window") is False:
        return None
    try:
        return int(w)
    except (TypeError, ValueError):
        return None


def attention_window(cfg: Any) -> int | None:
    """The ``max_attention_window_size`` the build decides: ``package.runtime.max_attention_window_size`` when set,
    else the model's sliding window when it is smaller than ``build.max_seq_len`` (a window >= max_seq_len is full
    attention for every sequence the engine accepts, so nothing is passed)."""
    rt = getattr(getattr(cfg, "package", None), "runtime", None)
    if rt is not None and rt.max_attention_window_size is not None:
        return int(rt.max_attention_window_size)
    w = sliding_window(model_hf_config(cfg))
    return w if w is not None and w < cfg.build.max_seq_len else None


def runtime_knobs(cfg: Any) -> dict[str, Any]:
    """Runtime settings for the package stage (Triton tensorrt_llm config.pbtxt / ExtendedRuntimePerfKnobConfig; tensorrtllm_backend docs/model_config.md):
    the build's KV/scheduler/CUDA-graph knobs, the attention window and the speculative-decoding setup."""
    b, sp = cfg.build, cfg.build.speculative
    out = {
        "cuda_graph_mode": b.cuda_graph_mode,
        "cuda_graph_cache_size": b.cuda_graph_cache_size,
        "kv_cache_free_gpu_mem_fraction": b.kv_cache_free_gpu_mem_fraction,
        "enable_kv_cache_reuse": b.enable_kv_cache_reuse,
        "batch_scheduler_policy": b.batch_scheduler_policy,
        "enable_chunked_context": b.enable_chunked_context,
        "batching_strategy": "inflight_fused_batching",
        "max_beam_width": b.max_beam_width,
        "speculative": {
            "mode": sp.mode,
            "max_draft_len": sp.max_draft_len if sp.mode != "none" else 0,
            "draft_model_path": sp.draft_model_path if sp.mode != "none" else None,
        },
    }
    w = attention_window(cfg)
    if w is not None:
        out["max_attention_window_size"] = w
    return out


def llm_api_options(cfg: Any) -> dict[str, Any]:
    """``llm_api_options.yaml`` for the PyTorch backend (``trtllm-serve``/``trtllm-bench`` ``--extra_llm_api_options``).

    Keys are ``LLM()`` arguments (tensorrt_llm/llmapi/llm_args.py): ``cuda_graph_config`` (batch sizes), ``kv_cache_config``,
    ``scheduler_config``, limits, chunked prefill, speculative decoding.
    """
    b = cfg.build
    doc: dict[str, Any] = {
        "max_batch_size": b.max_batch_size,
        "max_num_tokens": b.max_num_tokens,
        "max_seq_len": b.max_seq_len,
        "max_input_len": b.max_input_len,
        "max_beam_width": b.max_beam_width,
        "enable_chunked_prefill": b.enable_chunked_context,
        "cuda_graph_config": (
            {
                "batch_sizes": sorted(set(int(x) for x in b.cuda_graph_batch_sizes if 1 <= int(x) <= b.max_batch_size)),
                "enable_padding": True,
            }
            if b.cuda_graph_mode
            else None
        ),
        "kv_cache_config": {
            "free_gpu_memory_fraction": b.kv_cache_free_gpu_mem_fraction,
            "enable_block_reuse": b.enable_kv_cache_reuse,
            "tokens_per_block": b.tokens_per_block,
        },
        "scheduler_config": {"capacity_scheduler_policy": SCHEDULER_POLICY[b.batch_scheduler_policy]},
    }
    if cfg.quant.kv_cache_dtype != "none":
        doc["kv_cache_config"]["dtype"] = cfg.quant.kv_cache_dtype
    sp = b.speculative
    decoding_type = SPECULATIVE_DECODING_TYPE.get(sp.mode)
    if decoding_type is not None:
        doc["speculative_config"] = {"decoding_type": decoding_type, "max_draft_len": sp.max_draft_len}
        if sp.mode != "lookahead_decoding":  # lookahead drafts from the target model itself: no draft checkpoint
            doc["speculative_config"]["speculative_model_dir"] = sp.draft_model_path
    return {k: v for k, v in doc.items() if v is not None}
