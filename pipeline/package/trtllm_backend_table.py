"""What the TensorRT-LLM Triton backend templates declare, and what this package does with each name.

Pinned upstream: NVIDIA/TensorRT-LLM ``release/1.2.1`` (the branch the ``triton-inference-server/tensorrtllm_backend``
Dockerfile pins with ``TENSORRTLLM_VER=1.2.1``), files
``triton_backend/all_models/inflight_batcher_llm/<model>/config.pbtxt``. The name lists below were written from
those files as read at the commits in :data:`SOURCES` (the 1.x line: ``min_tokens``/``seed`` request inputs,
``return_num_*_tokens``, ``prompt_embedding_table_data_type``, active ``enable_trt_overlap``).

:data:`UPSTREAM` is data (names only); :data:`TABLE` says, for every upstream name, one of:

* ``set``      - always written by us (``source`` says from which config field / build fact);
* ``cond``     - written when ``when`` holds (a feature the build or ``package.runtime`` turns on), else the backend
  default ``default`` applies;
* ``default``  - never written: the backend default ``default`` is what we want (``why``);
* ``n/a``      - not applicable to this package (``why``); a tensor may still be declared but is unused;
* ``renamed``  - exposed under our own name ``ours`` (``why``).

``tests/package/test_trtllm_backend_table.py`` compares generated repositories with this table, and
``docs/reference/tensorrt_llm_backend_parameters.md`` is rendered from it (:func:`render_markdown`), so a new
upstream name, or a parameter we write but do not document, fails the tests.
"""

from __future__ import annotations

from typing import Any

from ..core.markdown import md_table

UPSTREAM_VERSION = (
    "TensorRT-LLM 1.2.1 (branch release/1.2.1; the triton-inference-server/tensorrtllm_backend Dockerfile builds "
    "it with TENSORRTLLM_VER=1.2.1 on tritonserver:25.12-py3-min)"
)
SOURCES = {
    "tensorrt_llm": "triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt @0c8de69",
    "tensorrt_llm_bls": "triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/config.pbtxt @0193dbd",
    "preprocessing": "triton_backend/all_models/inflight_batcher_llm/preprocessing/config.pbtxt @08dc37e",
    "postprocessing": "triton_backend/all_models/inflight_batcher_llm/postprocessing/config.pbtxt @89fd9b7",
    "ensemble": "triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt @2a9abd9",
}

_S = str.split
UPSTREAM: dict[str, dict[str, list[str]]] = {
    "tensorrt_llm": {
        "parameters": _S("""max_beam_width FORCE_CPU_ONLY_INPUT_TENSORS gpt_model_type gpt_model_path encoder_model_path
            max_tokens_in_paged_kv_cache max_attention_window_size sink_token_length batch_scheduler_policy
            kv_cache_free_gpu_mem_fraction cross_kv_cache_fraction kv_cache_host_memory_bytes kv_cache_onboard_blocks
            enable_trt_overlap exclude_input_in_output cancellation_check_period_ms stats_check_period_ms
            iter_stats_max_iterations request_stats_max_iterations enable_kv_cache_reuse normalize_log_probs
            enable_chunked_context gpu_device_ids participant_ids num_nodes lora_cache_optimal_adapter_size
            lora_cache_max_adapter_size lora_cache_gpu_memory_fraction lora_cache_host_memory_bytes lora_prefetch_dir
            decoding_mode executor_worker_path lookahead_window_size lookahead_ngram_size lookahead_verification_set_size
            medusa_choices eagle_choices gpu_weights_percent enable_context_fmha_fp32_acc multi_block_mode cuda_graph_mode
            cuda_graph_cache_size speculative_decoding_fast_logits tokenizer_dir guided_decoding_backend
            xgrammar_tokenizer_info_path"""),
        "inputs": _S("""input_ids encoder_input_features encoder_output_lengths input_lengths request_output_len
            num_return_sequences draft_input_ids decoder_input_ids decoder_input_lengths draft_logits
            draft_acceptance_threshold end_id pad_id stop_words_list bad_words_list embedding_bias beam_width temperature
            runtime_top_k runtime_top_p runtime_top_p_min runtime_top_p_decay runtime_top_p_reset_ids len_penalty
            early_stopping repetition_penalty min_tokens beam_search_diversity_rate presence_penalty frequency_penalty seed
            return_log_probs return_context_logits return_generation_logits return_perf_metrics return_num_input_tokens
            return_num_output_tokens exclude_input_in_output stop streaming prompt_embedding_table prompt_table_extra_ids
            prompt_vocab_size cross_attention_mask mrope_rotary_cos_sin mrope_position_deltas lora_task_id lora_weights
            lora_config context_phase_params skip_cross_attn_blocks retention_token_range_starts retention_token_range_ends
            retention_token_range_priorities retention_token_range_durations_ms retention_decode_priority
            retention_decode_duration_ms guided_decoding_guide_type guided_decoding_guide lookahead_window_size
            lookahead_ngram_size lookahead_verification_set_size"""),
        "outputs": _S("""output_ids sequence_length cum_log_probs output_log_probs context_logits generation_logits batch_index
            sequence_index context_phase_params kv_cache_alloc_new_blocks kv_cache_reused_blocks kv_cache_alloc_total_blocks
            arrival_time_ns first_scheduled_time_ns first_token_time_ns last_token_time_ns acceptance_rate
            total_accepted_draft_tokens total_draft_tokens num_input_tokens num_output_tokens"""),
    },
    "tensorrt_llm_bls": {
        "parameters": _S("accumulate_tokens tensorrt_llm_model_name tensorrt_llm_draft_model_name multimodal_encoders_name"),
        "inputs": _S("""text_input decoder_text_input image_input image_bytes_input image_url_input video_bytes_input max_tokens
            bad_words stop_words exclude_input_in_output end_id pad_id top_k top_p temperature length_penalty
            repetition_penalty min_tokens presence_penalty frequency_penalty seed return_log_probs return_context_logits
            return_generation_logits num_return_sequences beam_width stream prompt_embedding_table prompt_vocab_size
            prompt_table_extra_id embedding_bias_words embedding_bias_weights num_draft_tokens use_draft_logits lora_task_id
            lora_weights lora_config return_perf_metrics return_num_input_tokens return_num_output_tokens
            guided_decoding_guide_type guided_decoding_guide"""),
        "outputs": _S("""text_output cum_log_probs output_log_probs context_logits generation_logits batch_index sequence_index
            kv_cache_alloc_new_blocks kv_cache_reused_blocks kv_cache_alloc_total_blocks arrival_time_ns
            first_scheduled_time_ns first_token_time_ns last_token_time_ns acceptance_rate total_accepted_draft_tokens
            total_draft_tokens num_input_tokens num_output_tokens"""),
    },
    "preprocessing": {
        "parameters": _S("tokenizer_dir add_special_tokens multimodal_model_path gpt_model_path max_num_images hf_model_path"),
        "inputs": _S("""QUERY DECODER_QUERY IMAGE_BYTES IMAGE_URL IMAGES VIDEO_BYTES REQUEST_OUTPUT_LEN BAD_WORDS_DICT
            STOP_WORDS_DICT EMBEDDING_BIAS_WORDS EMBEDDING_BIAS_WEIGHTS END_ID PAD_ID PROMPT_TABLE_EXTRA_ID"""),
        "outputs": _S("""INPUT_ID REQUEST_INPUT_LEN DECODER_INPUT_ID REQUEST_DECODER_INPUT_LEN BAD_WORDS_IDS STOP_WORDS_IDS
            EMBEDDING_BIAS REQUEST_OUTPUT_LEN OUT_END_ID OUT_PAD_ID OUT_PROMPT_TABLE_EXTRA_IDS PIXEL_VALUES ASPECT_RATIO_IDS
            ASPECT_RATIO_MASK CROSS_ATTENTION_MASK IMAGE_SIZES IS_VIDEO_INPUT ATTENTION_MASK IMAGE_GRID_THW VISION_INPUT_ID"""),
    },
    "postprocessing": {
        "parameters": _S("tokenizer_dir skip_special_tokens"),
        "inputs": _S("TOKENS_BATCH SEQUENCE_LENGTH"),
        "outputs": _S("OUTPUT"),
    },
    "ensemble": {
        "parameters": [],
        "inputs": _S("""text_input decoder_text_input max_tokens num_return_sequences bad_words stop_words exclude_input_in_output
            end_id pad_id top_k top_p temperature length_penalty repetition_penalty min_tokens presence_penalty
            frequency_penalty seed return_log_probs return_context_logits return_generation_logits return_perf_metrics
            return_num_input_tokens return_num_output_tokens beam_width stream prompt_embedding_table prompt_table_extra_id
            prompt_vocab_size embedding_bias_words embedding_bias_weights lora_task_id lora_weights lora_config
            guided_decoding_guide_type guided_decoding_guide"""),
        "outputs": _S("""text_output cum_log_probs output_log_probs context_logits generation_logits batch_index sequence_index
            kv_cache_alloc_new_blocks kv_cache_reused_blocks kv_cache_alloc_total_blocks arrival_time_ns
            first_scheduled_time_ns first_token_time_ns last_token_time_ns acceptance_rate total_accepted_draft_tokens
            total_draft_tokens num_input_tokens num_output_tokens"""),
    },
}
"""model -> {"parameters" | "inputs" | "outputs": [upstream names in file order]}."""

STRUCTURAL = {
    "triton_max_batch_size": ("set", "package.max_batch_size, else the engine's build.max_batch_size (never above it)"),
    "decoupled_mode": ("set", "package.decoupled (true: streaming and batch > 1 requests)"),
    "max_queue_delay_microseconds": ("set", "0 (no extra batching delay: in-flight batching already merges requests)"),
    "max_queue_size": ("set", "0 (unbounded Triton queue; the TensorRT-LLM scheduler bounds real concurrency)"),
    "triton_backend": ("set", "tensorrtllm (the C++ backend; the Python executor variant is not used)"),
    "logits_datatype": ("set", "TYPE_FP32 (engines are built with float32 logits unless build.logits_dtype says otherwise)"),
    "encoder_input_features_data_type": ("set", "package.runtime.encoder_input_features_data_type (default TYPE_FP16)"),
    "prompt_embedding_table_data_type": ("set", "TYPE_FP16 (matches the ensemble's prompt_embedding_table input)"),
    "preprocessing_instance_count": ("set", "package.instance_count"),
    "postprocessing_instance_count": ("set", "1 (keeps each stream's text deltas in order)"),
    "bls_instance_count": ("set", "package.instance_count"),
}
"""Template placeholders outside ``parameters`` (structural fields)."""


def _e(kind: str, **kw: Any) -> dict[str, Any]:
    return {"kind": kind, **kw}


_RT = "package.runtime."


def _rt(default: str) -> dict[str, Any]:
    """A parameter set from ``package.runtime.<its own name>`` when given, else upstream's ``default`` (the source is
    filled in below the table, from the name)."""
    return _e("cond", when="runtime", source=None, default=default)


_MM = "multimodal models only; this package serves text-only decoder models"
_ENCDEC = "encoder-decoder engines only"

TABLE: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    "tensorrt_llm": {
        "parameters": {
            "max_beam_width": _e("set", source="build.max_beam_width (package.max_beam_width may lower it)"),
            "FORCE_CPU_ONLY_INPUT_TENSORS": _e("set", source='"no" (as upstream: inputs may live on GPU)'),
            "gpt_model_type": _e("set", source='"inflight_fused_batching" (static V1 batching is deprecated)'),
            "gpt_model_path": _e("set", source="/models/tensorrt_llm/1/engine (the build's engine, copied into the package)"),
            "encoder_model_path": _rt("empty (decoder-only)"),
            "max_tokens_in_paged_kv_cache": _rt("no token cap (the memory fraction decides)"),
            "max_attention_window_size": _e(
                "cond",
                when="window",
                source=_RT + "max_attention_window_size, else the model's sliding_window when it is smaller than build.max_seq_len",
                default="max_seq_len (full attention)",
            ),
            "sink_token_length": _rt("0"),
            "batch_scheduler_policy": _e("set", source="build.batch_scheduler_policy"),
            "kv_cache_free_gpu_mem_fraction": _e(
                "set", source=_RT + "kv_cache_free_gpu_mem_fraction, else build.kv_cache_free_gpu_mem_fraction"
            ),
            "cross_kv_cache_fraction": _e("cond", when="runtime", source=_RT + "cross_kv_cache_fraction (" + _ENCDEC + ")", default="0.5"),
            "kv_cache_host_memory_bytes": _rt("0 (no host offload)"),
            "kv_cache_onboard_blocks": _rt("true"),
            "enable_trt_overlap": _rt("false"),
            "exclude_input_in_output": _e("set", source="package.exclude_input_in_output"),
            "cancellation_check_period_ms": _rt("100"),
            "stats_check_period_ms": _rt("100"),
            "iter_stats_max_iterations": _rt("executor default (1000)"),
            "request_stats_max_iterations": _rt("executor default (0)"),
            "enable_kv_cache_reuse": _e("set", source="build.enable_kv_cache_reuse"),
            "normalize_log_probs": _e("set", source=_RT + "normalize_log_probs"),
            "enable_chunked_context": _e("set", source="build.enable_chunked_context"),
            "gpu_device_ids": _rt("all visible GPUs"),
            "participant_ids": _rt("none (leader mode)"),
            "num_nodes": _rt("1"),
            "lora_cache_optimal_adapter_size": _rt("8"),
            "lora_cache_max_adapter_size": _rt("64"),
            "lora_cache_gpu_memory_fraction": _rt("0.05"),
            "lora_cache_host_memory_bytes": _rt("1 GiB"),
            "lora_prefetch_dir": _rt("none"),
            "decoding_mode": _e(
                "cond",
                when="speculative",
                source="build.speculative.mode (medusa | eagle | lookahead), or " + _RT + "decoding_mode",
                default="top_k_top_p (beam width 1) / beam_search; draft-model engines: the engine's external-draft-tokens mode",
            ),
            "executor_worker_path": _e("set", source="/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker (as upstream)"),
            "lookahead_window_size": _e("cond", when="lookahead", source=_RT + "lookahead_window_size", default="none"),
            "lookahead_ngram_size": _e("cond", when="lookahead", source=_RT + "lookahead_ngram_size", default="none"),
            "lookahead_verification_set_size": _e("cond", when="lookahead", source=_RT + "lookahead_verification_set_size", default="none"),
            "medusa_choices": _e(
                "cond",
                when="medusa",
                source=_RT + "medusa_choices (required for a Medusa engine)",
                default="a built-in tree for one specific model; refused here",
            ),
            "eagle_choices": _e("cond", when="eagle", source=_RT + "eagle_choices", default="the engine's dynamic tree"),
            "gpu_weights_percent": _rt("1.0"),
            "enable_context_fmha_fp32_acc": _rt("false"),
            "multi_block_mode": _rt("true"),
            "cuda_graph_mode": _e("set", source="build.cuda_graph_mode"),
            "cuda_graph_cache_size": _e("set", source="build.cuda_graph_cache_size"),
            "speculative_decoding_fast_logits": _rt("false"),
            "tokenizer_dir": _e("set", source="/models/preprocessing/1/tokenizer (the packaged tokenizer)"),
            "guided_decoding_backend": _rt("off"),
            "xgrammar_tokenizer_info_path": _rt("derived from tokenizer_dir"),
        },
        # every upstream tensor is declared with the upstream name, type and shape (triton_models/tensorrt_llm)
        "inputs": {},
        "outputs": {},
    },
    "tensorrt_llm_bls": {
        "parameters": {
            "accumulate_tokens": _e("set", source='"false" (each streamed text_output decodes the new ids only, as the ensemble)'),
            "tensorrt_llm_model_name": _e("set", source='"tensorrt_llm"'),
            "tensorrt_llm_draft_model_name": _e(
                "cond",
                when="draft",
                source='"tensorrt_llm_draft" (build.speculative.mode='
                "draft_tokens_external: the draft engine packaged as its own model; our BLS runs draft/verify rounds for requests "
                "with num_draft_tokens > 0)",
                default="none (num_draft_tokens > 0 refused by name)",
            ),
            "multimodal_encoders_name": _e("n/a", why=_MM),
        },
        "inputs": {n: _e("n/a", why=_MM) for n in ("image_input", "image_bytes_input", "image_url_input", "video_bytes_input")},
        "outputs": {},
    },
    "preprocessing": {
        "parameters": {
            "tokenizer_dir": _e("set", source="tokenizer (the export's tokenizer, copied next to model.py)"),
            "add_special_tokens": _e(
                "n/a",
                why="our preprocessing has no such switch: it encodes the rendered prompt and adds BOS "
                "only where the tokenizer itself does (pipeline/core/tokenization.py TextCodec), exactly as "
                "evaluation encodes prompts; the chat template supplies the other special tokens",
            ),
            "multimodal_model_path": _e("n/a", why=_MM),
            "gpt_model_path": _e("n/a", why="read by upstream preprocessing only for multimodal prompt tables"),
            "max_num_images": _e("n/a", why=_MM),
            "hf_model_path": _e("n/a", why=_MM),
        },
        "inputs": {n: _e("n/a", why=_MM) for n in ("IMAGE_BYTES", "IMAGE_URL", "IMAGES", "VIDEO_BYTES")},
        "outputs": {
            n: _e("n/a", why=_MM)
            for n in (
                "PIXEL_VALUES",
                "ASPECT_RATIO_IDS",
                "ASPECT_RATIO_MASK",
                "CROSS_ATTENTION_MASK",
                "IMAGE_SIZES",
                "IS_VIDEO_INPUT",
                "ATTENTION_MASK",
                "IMAGE_GRID_THW",
                "VISION_INPUT_ID",
            )
        },
    },
    "postprocessing": {
        "parameters": {
            "tokenizer_dir": _e("set", source="tokenizer (the export's tokenizer, copied next to model.py)"),
            "skip_special_tokens": _e("set", source='"true" (as evaluation decodes)'),
        },
        "inputs": {},
        "outputs": {},
    },
    "ensemble": {
        "parameters": {},
        "inputs": {
            "min_tokens": _e(
                "renamed",
                ours="min_length",
                why="the client-facing name of the pre-1.0 templates, kept for existing "
                "clients and shared with the onnxruntime_genai engine model; step 2 maps it to the engine's min_tokens",
            ),
            "seed": _e("renamed", ours="random_seed", why="as min_tokens; step 2 maps it to the engine's seed"),
            "return_num_input_tokens": _e(
                "n/a",
                why="not exposed: the engine-agnostic ensemble (shared with onnxruntime_genai) "
                "returns text; call tensorrt_llm directly for token counts",
            ),
            "return_num_output_tokens": _e("n/a", why="as return_num_input_tokens"),
        },
        "outputs": {
            "num_input_tokens": _e("n/a", why="as return_num_input_tokens"),
            "num_output_tokens": _e("n/a", why="as return_num_input_tokens"),
        },
    },
}
"""model -> section -> name -> disposition; a tensor missing here is ``set`` (declared under the upstream name)."""
for _section in (entries for model in TABLE.values() for entries in model.values()):
    for _name, _d in _section.items():
        if _d.get("when") == "runtime" and _d.get("source") is None:  # an _rt entry
            _d["source"] = _RT + _name

TENSORRT_LLM_EXTRAS: dict[str, str] = {}
"""Parameters our tensorrt_llm model writes that upstream does not declare (none: every key is an upstream key)."""


EXTENSION_INPUTS: dict[str, dict[str, Any]] = {
    "messages": {
        "models": ("ensemble", "tensorrt_llm_bls"),
        "target": "onnxruntime_genai",
        "type": "TYPE_STRING",
        "dims": [1],
        "why": "optional: a JSON list of {role, content}; the server renders it with the package's chat template "
        "and encodes message contents as text (a user's `</s>` or `<|im_end|>` never becomes a control id). "
        "`text_input` must then be empty (both non-empty: refused). Clients that omit it (NVIDIA's) are "
        "unaffected: their `text_input` is encoded as before, control tokens parsed.",
    },
}
"""Inputs we declare that upstream does not (``extension``): name -> models, target, data type, dims, why."""


def disposition(model: str, section: str, name: str) -> dict[str, Any]:
    """The table entry for an upstream name (``set`` for tensors that need no note)."""
    ent = TABLE[model][section].get(name)
    if ent is not None:
        return ent
    if section == "parameters":
        raise KeyError(f"{model} parameter {name!r} has no entry in pipeline/package/trtllm_backend_table.py TABLE")
    return _e("set", source="declared with the upstream name, type and shape")


def missing_entries() -> list[str]:
    """Upstream parameters without a table entry, and table entries that upstream does not declare (both must be empty)."""
    out = []
    for model, secs in UPSTREAM.items():
        for sec, names in secs.items():
            if sec == "parameters":
                out += [f"{model}.parameters.{n}: no entry" for n in names if n not in TABLE[model]["parameters"]]
            out += [f"{model}.{sec}.{n}: not an upstream name" for n in TABLE[model][sec] if n not in names]
    return out


def render_markdown() -> str:
    """``docs/reference/tensorrt_llm_backend_parameters.md`` (checked in; a test keeps it equal to this output)."""
    L = [
        "# TensorRT-LLM Triton backend: every template parameter and tensor, and what this package does with it",
        "",
        f"Pinned upstream: **{UPSTREAM_VERSION}**. Files (NVIDIA/TensorRT-LLM):",
        "",
    ]
    L += [f"- `{m}`: `{s}`" for m, s in SOURCES.items()]
    L += [
        "",
        "The commits are the file versions these lists were written from (1.x content: `min_tokens`/`seed`, "
        "`return_num_*_tokens`, `prompt_embedding_table_data_type`, active `enable_trt_overlap`, lookahead inputs). That "
        "they equal the `v1.2.1` tag was not checked file by file; when bumping TensorRT-LLM, diff "
        "`triton_backend/all_models/inflight_batcher_llm` between the tags and update `UPSTREAM`/`TABLE` (the tests then "
        "name every new or removed name).",
    ]
    L += [
        "",
        "Generated from `pipeline/package/trtllm_backend_table.py` (`render_markdown`); "
        "`tests/package/test_trtllm_backend_table.py` fails when a generated repository disagrees with this table, when upstream "
        "declares a parameter without an entry here, or when this page is stale.",
        "",
        "Kinds: **set** = always written (from the named field); **cond** = written when the feature is on, else the backend "
        "default applies; **default** = left to the backend default; **n/a** = not applicable (a tensor may be declared but "
        "is unused); **renamed** = exposed under our name.",
        "",
        "Runtime knobs are configured with `package.runtime.<name>` (`pipeline/core/config/serving.py`); `null` keeps the "
        "build's value or the backend default.",
        "",
        "## Template placeholders outside `parameters`",
        "",
    ]
    L += md_table(("placeholder", "kind", "value"), ((f"`{k}`", *v) for k, v in STRUCTURAL.items()))
    for model, secs in UPSTREAM.items():
        L += _md_model_section(model, secs)
    L += ["## Extensions (declared by us, not upstream)", ""]
    L += md_table(
        ("input", "models", "target", "type, dims", "why"),
        ((f"`{n}`", ", ".join(e["models"]), e["target"], f"{e['type']} {e['dims']}", e["why"]) for n, e in EXTENSION_INPUTS.items()),
    )
    L += [
        "",
        "## Conditions of `cond` entries",
        "",
        "- `runtime`: the matching `package.runtime.<name>` is set (not null).",
        "- `window`: `package.runtime.max_attention_window_size` is set, or the model's `sliding_window` is smaller than "
        "`build.max_seq_len` (a larger window than `max_seq_len` is refused at config time).",
        "- `speculative`: `build.speculative.mode` is medusa, eagle or lookahead_decoding (or `package.runtime.decoding_mode` is set).",
        "- `medusa` / `eagle` / `lookahead`: that speculative mode (a Medusa engine without `medusa_choices`, or a lookahead "
        "engine without all three lookahead sizes, is refused at config time).",
        "- `draft`: `build.speculative.mode=draft_tokens_external`; the draft engine is packaged as the model "
        "`tensorrt_llm_draft` and the BLS calls it for requests with `num_draft_tokens` > 0 (docs/package.md).",
        "",
    ]
    L += _md_llmapi_section()
    return "\n".join(L)


def _md_model_section(model: str, secs: dict[str, Any]) -> list[str]:
    """:func:`render_markdown`: one upstream model's parameters, inputs and outputs with their disposition."""
    L = ["", f"## {model}", ""]
    for sec in ("parameters", "inputs", "outputs"):
        names = secs[sec]
        if not names:
            L += [f"{sec}: none declared upstream.", ""]
            continue
        L += [f"### {sec} ({len(names)})", "", "| name | kind | from / default | why |", "|---|---|---|---|"]
        for n in names:
            d = disposition(model, sec, n)
            if d["kind"] == "set":
                L.append(f"| `{n}` | set | {d.get('source', '')} | |")
            elif d["kind"] == "cond":
                L.append(f"| `{n}` | cond ({d['when']}) | {d['source']}; else backend default: {d['default']} | |")
            elif d["kind"] == "renamed":
                L.append(f"| `{n}` | renamed | ours: `{d['ours']}` | {d['why']} |")
            else:
                L.append(f"| `{n}` | {d['kind']} | {d.get('default', '')} | {d['why']} |")
        L.append("")
    return L


def _md_llmapi_section() -> list[str]:
    """:func:`render_markdown`: the ``package.runtime`` fields the PyTorch-backend (LLM API) layout maps."""
    from ..facts.trtllm import LLMAPI_MAP

    L = [
        "## PyTorch backend (LLM API layout)",
        "",
        "`target.backend=pytorch` packages `tensorrt_llm/config.pbtxt` + `1/model.yaml` (the `LLM()` arguments) for NVIDIA's "
        "llmapi `model.py`. These `package.runtime` fields map into `model.yaml`; any other field that is set is refused "
        "(exit 2), since that layout has no place for it:",
        "",
    ]
    L += md_table(("package.runtime field", "model.yaml key"), ((f"`{k}`", f"`{'.'.join(v)}`") for k, v in LLMAPI_MAP.items()))
    L.append("")
    return L
