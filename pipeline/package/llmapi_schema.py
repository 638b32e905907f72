"""Machine-checkable key sets of the upstream files the PyTorch-backend (LLM API) package mirrors; the one place.

Every file the package stage writes for the TensorRT-LLM PyTorch backend is checked against these sets at package
time (:mod:`pipeline.package.llmapi_options`) and again by :func:`pipeline.package.validate.validate_repository`.
What was read, in our own words: docs/reference/llmapi.md. Sources (repository, path, the stored commit read):

* :data:`SOURCES` ``model.yaml`` / ``config.pbtxt`` / ``model.py`` / ``helpers.py``: NVIDIA/TensorRT-LLM
  ``triton_backend/all_models/llmapi/tensorrt_llm/`` (the Triton LLM-API model; tensorrtllm_backend @0b9d7d5 only
  links it as a submodule, its docs/llmapi.md says to copy that folder).
* :data:`LLM_ARGS` and the nested sets: NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py`` (``BaseLlmArgs`` +
  ``TorchLlmArgs``, ``KvCacheConfig``, ``CudaGraphConfig``, ``SchedulerConfig``, ``DecodingBaseConfig``; pydantic with
  ``extra="forbid"``, so an unknown key makes ``LLM()`` raise). Only the keys this project writes or documents are
  listed: a key upstream has but that is not listed is refused too (fail closed), naming this module as the fix.
* :data:`TRTLLM_SERVE_FLAGS`: ``tensorrt_llm/commands/serve.py`` (click options of ``trtllm-serve``).
* :data:`TRTLLM_BENCH_FLAGS`: ``tensorrt_llm/commands/bench.py`` + ``bench/benchmark/throughput.py``.
* :data:`AIPERF_FLAGS`: TensorRT-LLM 1.2.1 ``examples/serve/aiperf_client.sh`` @376f7e1b (``aiperf profile``).

Types are Python types: ``int`` never accepts a bool, ``float`` accepts an int, ``(T, None)`` means the upstream
field is ``Optional``. A nested ``dict`` value is a nested pydantic model (its own key set).
"""

from __future__ import annotations

from typing import Any

SOURCES: dict[str, str] = {
    "model.yaml": "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml @0ebb1536ac12",
    "config.pbtxt": "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @0a71057313ec",
    "model.py": "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @044a90d209e3",
    "helpers.py": "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py @0df60f9ad779",
    "llm_args.py": "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (1.x TorchLlmArgs; main @000439672005 read for drift)",
    "serve.py": "NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py (trtllm-serve click options)",
    "bench": "NVIDIA/TensorRT-LLM tensorrt_llm/commands/bench.py + tensorrt_llm/bench/benchmark/throughput.py",
    "aiperf": "NVIDIA/TensorRT-LLM v1.2.1 examples/serve/aiperf_client.sh @376f7e1bd8ed",
}

Spec = Any  # a type, a tuple of types, or a nested {key: Spec} dict

KV_CACHE_CONFIG: dict[str, Spec] = {
    "enable_block_reuse": bool,
    "max_tokens": (int, None),
    "max_attention_window": (list, None),
    "sink_token_length": (int, None),
    "free_gpu_memory_fraction": (float, None),
    "host_cache_size": (int, None),
    "onboard_blocks": bool,
    "cross_kv_cache_fraction": (float, None),
    "enable_partial_reuse": bool,
    "copy_on_partial_reuse": bool,
    "max_gpu_total_bytes": int,
    "dtype": str,  # PyTorch backend only ("auto" | "fp8")
    "tokens_per_block": int,
}
CUDA_GRAPH_CONFIG: dict[str, Spec] = {"batch_sizes": (list, None), "max_batch_size": int, "enable_padding": bool}
SCHEDULER_CONFIG: dict[str, Spec] = {"capacity_scheduler_policy": str, "context_chunking_policy": (str, None)}
CAPACITY_SCHEDULER_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH")
SPECULATIVE_CONFIG: dict[str, Spec] = {
    "decoding_type": str,
    "max_draft_len": (int, None),
    "speculative_model_dir": (str, None),  # 1.2; main also accepts ``speculative_model`` (validation alias)
    "speculative_model": (str, None),
}

LLM_ARGS: dict[str, Spec] = {
    # BaseLlmArgs
    "model": str,
    "tokenizer": (str, None),
    "backend": (str, None),
    "trust_remote_code": bool,
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "dtype": str,
    "kv_cache_config": KV_CACHE_CONFIG,
    "enable_chunked_prefill": bool,
    "guided_decoding_backend": (str, None),
    "iter_stats_max_iterations": (int, None),
    "request_stats_max_iterations": (int, None),
    "scheduler_config": SCHEDULER_CONFIG,
    "speculative_config": (SPECULATIVE_CONFIG, None),
    "max_batch_size": (int, None),
    "max_input_len": (int, None),
    "max_seq_len": (int, None),
    "max_beam_width": (int, None),
    "max_num_tokens": (int, None),
    "gather_generation_logits": bool,
    "return_perf_metrics": bool,
    # TorchLlmArgs
    "cuda_graph_config": (CUDA_GRAPH_CONFIG, None),
    "disable_overlap_scheduler": bool,
    "attn_backend": str,
    "enable_iter_perf_stats": bool,
    "print_iter_log": bool,
    "stream_interval": int,
}
"""``LLM()`` keyword arguments (``TorchLlmArgs``) this project may write, with their upstream types."""
LLM_ARGS_REQUIRED = ("model",)

TRITON_CONFIG: dict[str, Spec] = {"max_batch_size": int, "decoupled": bool, "cancellation_check_period_ms": int}
"""``model.yaml`` ``triton_config``: what NVIDIA's llmapi ``model.py`` reads (``auto_complete_config`` and
``initialize``: ``decoupled`` and ``max_batch_size`` unconditionally, ``cancellation_check_period_ms`` if present);
every other top-level key of ``model.yaml`` is passed to ``LLM()``."""
TRITON_CONFIG_REQUIRED = ("max_batch_size", "decoupled")
TRITON_MAX_BATCH_SIZE = 0
"""The llmapi ``model.py`` serves one prompt per request (``_convert_request`` refuses a ``text_input`` that is not 1-D;
upstream ``model.yaml``: ``max_batch_size: 0``, batching tracked as JIRA-4496). ``LLM()`` batches in flight itself
(``max_batch_size`` among the LLM arguments)."""

LLMAPI_INPUTS: dict[str, tuple[str, list[int]]] = {
    "text_input": ("TYPE_STRING", [-1]),
    "image_url": ("TYPE_STRING", [-1]),
    "streaming": ("TYPE_BOOL", [1]),
    "sampling_param_best_of": ("TYPE_INT32", [1]),
    "sampling_param_temperature": ("TYPE_FP32", [1]),
    "sampling_param_top_k": ("TYPE_INT32", [1]),
    "sampling_param_top_p": ("TYPE_FP32", [1]),
    "sampling_param_frequency_penalty": ("TYPE_FP32", [1]),
    "sampling_param_presence_penalty": ("TYPE_FP32", [1]),
    "sampling_param_max_tokens": ("TYPE_INT32", [1]),
    "sampling_param_stop": ("TYPE_STRING", [-1]),
    "sampling_param_seed": ("TYPE_UINT64", [1]),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", [1]),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", [1]),
    "return_finish_reason": ("TYPE_BOOL", [1]),
    "return_stop_reason": ("TYPE_BOOL", [1]),
    "return_cumulative_logprob": ("TYPE_BOOL", [1]),
    "stop": ("TYPE_BOOL", [1]),
    "lora_id": ("TYPE_UINT64", [1]),
    "lora_name": ("TYPE_STRING", [1]),
    "lora_path": ("TYPE_STRING", [1]),
    "lora_ckpt_source": ("TYPE_STRING", [1]),
}
"""Inputs of the upstream llmapi ``config.pbtxt`` (name -> data type, dims); ``helpers.py`` reads exactly these
names, so any other input name would be accepted by Triton and never read."""
LLMAPI_REQUIRED_INPUTS = ("text_input",)
LLMAPI_OUTPUTS: dict[str, str] = {
    "text_output": "TYPE_STRING",
    "finish_reason": "TYPE_STRING",
    "stop_reason": "TYPE_STRING",
    "cumulative_logprob": "TYPE_FP32",
    "kv_cache_reused_block": "TYPE_INT32",
    "kv_cache_missed_block": "TYPE_INT32",
    "kv_cache_alloc_new_blocks": "TYPE_INT32",
    "kv_cache_alloc_total_blocks": "TYPE_INT32",
    "kv_cache_hit_rate": "TYPE_FP32",
    "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64",
    "first_token_time_ns": "TYPE_INT64",
    "last_token_time_ns": "TYPE_INT64",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
}
LLMAPI_REQUIRED_OUTPUTS = ("text_output",)  # model.py looks its data type up and sends it in every response

TRTLLM_SERVE_FLAGS: dict[str, Spec] = {
    "--tokenizer": str,
    "--host": str,
    "--port": int,
    "--log_level": str,
    "--backend": str,
    "--max_beam_width": int,
    "--max_batch_size": int,
    "--max_num_tokens": int,
    "--max_seq_len": int,
    "--tp_size": int,
    "--pp_size": int,
    "--ep_size": int,
    "--gpus_per_node": int,
    "--kv_cache_free_gpu_memory_fraction": float,
    "--num_postprocess_workers": int,
    "--trust_remote_code": bool,  # a flag: no value
    "--extra_llm_api_options": str,
}
"""``trtllm-serve <model>`` options (the YAML given to ``--extra_llm_api_options`` overwrites the flags' values;
1.3 adds ``--config`` as its alias, not used here so the command runs on 1.2.x too)."""
TRTLLM_BENCH_FLAGS: dict[str, Spec] = {
    "--model": str,
    "--model_path": str,
    "throughput": bool,
    "--backend": str,
    "--dataset": str,
    "--extra_llm_api_options": str,
    "--max_batch_size": int,
    "--max_num_tokens": int,
    "--max_seq_len": int,
    "--concurrency": int,
    "--num_requests": int,
    "--streaming": bool,
    "--tp": int,
    "--pp": int,
}
AIPERF_FLAGS: dict[str, Spec] = {
    "profile": bool,
    "-m": str,
    "--tokenizer": str,
    "--endpoint-type": str,
    "--random-seed": int,
    "--synthetic-input-tokens-mean": int,
    "--synthetic-input-tokens-stddev": int,
    "--output-tokens-mean": int,
    "--output-tokens-stddev": int,
    "--request-count": int,
    "--request-rate": float,
    "--concurrency": int,
    "--profile-export-file": str,
    "--url": str,
    "--streaming": bool,
}


def _type_name(spec: Spec) -> str:
    if isinstance(spec, dict):
        return "mapping"
    if isinstance(spec, tuple):
        return " | ".join("null" if t is None else _type_name(t) for t in spec)
    return {int: "int", float: "float", bool: "bool", str: "str", list: "list", dict: "mapping"}.get(spec, str(spec))


def _type_ok(value: Any, spec: Spec) -> bool:
    if isinstance(spec, tuple):
        return any(value is None if t is None else _type_ok(value, t) for t in spec)
    if isinstance(spec, dict):
        return isinstance(value, dict)
    if spec is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if spec is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, spec)


def _nested(spec: Spec) -> dict[str, Spec] | None:
    if isinstance(spec, dict):
        return spec
    if isinstance(spec, tuple):
        return next((t for t in spec if isinstance(t, dict)), None)
    return None


def check_mapping(doc: Any, schema: dict[str, Spec], *, where: str, source: str, prefix: str = "") -> list[str]:
    """Problems of ``doc`` against ``schema``: each unknown key and each wrong type, named with ``where`` (the file) and
    ``source`` (the upstream file the key set comes from). Empty list = structurally valid."""
    if not isinstance(doc, dict):
        return [f"{where}: {prefix.rstrip('.') or 'the document'} is {type(doc).__name__}, a mapping is required ({source})."]
    out: list[str] = []
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if k not in schema:
            out.append(
                f"{where}: unknown key {key!r}: not a field this package may set per {source} "
                f"(known: {sorted(schema)}; a newer upstream field must be added to pipeline/package/llmapi_schema.py with its source)."
            )
            continue
        spec = schema[k]
        if not _type_ok(v, spec):
            out.append(f"{where}: key {key!r} is {type(v).__name__} ({v!r}), {source} wants {_type_name(spec)}.")
            continue
        sub = _nested(spec)
        if sub is not None and isinstance(v, dict):
            out += check_mapping(v, sub, where=where, source=source, prefix=f"{key}.")
    return out


def check_llm_args(doc: Any, *, where: str, require_model: bool = True) -> list[str]:
    """``LLM()`` options (``model.yaml`` without ``triton_config``, or a ``--extra_llm_api_options`` YAML) against
    :data:`LLM_ARGS` (``llm_args.py``), plus the value rules the package relies on (scheduler policy names)."""
    src = SOURCES["llm_args.py"]
    out = check_mapping(doc, LLM_ARGS, where=where, source=src)
    if isinstance(doc, dict):
        if require_model:
            out += [f"{where}: required key {k!r} is missing ({src})." for k in LLM_ARGS_REQUIRED if k not in doc]
        pol = (
            (doc.get("scheduler_config") or {}).get("capacity_scheduler_policy") if isinstance(doc.get("scheduler_config"), dict) else None
        )
        if isinstance(pol, str) and pol not in CAPACITY_SCHEDULER_POLICIES:
            out.append(
                f"{where}: scheduler_config.capacity_scheduler_policy={pol!r} is not one of {list(CAPACITY_SCHEDULER_POLICIES)} ({src})."
            )
    return out


def check_model_yaml(doc: Any, *, where: str) -> list[str]:
    """The Triton LLM-API ``model.yaml``: ``triton_config`` as NVIDIA's ``model.py`` reads it, every other key an
    ``LLM()`` argument (:func:`check_llm_args`)."""
    if not isinstance(doc, dict):
        return [f"{where}: is {type(doc).__name__}, a mapping is required ({SOURCES['model.yaml']})."]
    src = SOURCES["model.py"]
    out: list[str] = []
    tc = doc.get("triton_config")
    if tc is None:
        out.append(f"{where}: required key 'triton_config' is missing ({src} reads triton_config.max_batch_size and .decoupled).")
    else:
        out += check_mapping(tc, TRITON_CONFIG, where=where, source=src, prefix="triton_config.")
        if isinstance(tc, dict):
            out += [f"{where}: required key 'triton_config.{k}' is missing ({src})." for k in TRITON_CONFIG_REQUIRED if k not in tc]
            bs = tc.get("max_batch_size")
            if isinstance(bs, int) and not isinstance(bs, bool) and bs != TRITON_MAX_BATCH_SIZE:
                out.append(
                    f"{where}: triton_config.max_batch_size={bs}: the llmapi model.py takes one 1-D text_input per request "
                    f"and refuses a batched one ({src}; upstream model.yaml sets 0). Fix: 0 (LLM() max_batch_size batches in flight)."
                )
    out += check_llm_args({k: v for k, v in doc.items() if k != "triton_config"}, where=where)
    return out


def check_model_config(cfg: Any, *, where: str) -> list[str]:
    """The llmapi ``config.pbtxt`` (a parsed Triton ``ModelConfig``): backend python, every input and output a tensor of
    the upstream config with its data type, the required tensors present, ``max_batch_size`` 0."""
    from tritonclient.grpc import model_config_pb2

    src = SOURCES["config.pbtxt"]
    out: list[str] = []
    if cfg.backend != "python":
        out.append(f"{where}: backend {cfg.backend!r}, the llmapi model is a python-backend model ({src}).")
    if cfg.max_batch_size != TRITON_MAX_BATCH_SIZE:
        out.append(
            f"{where}: max_batch_size {cfg.max_batch_size}: the llmapi model.py refuses a batched (2-D) text_input "
            f"({SOURCES['model.py']}). Fix: max_batch_size: 0."
        )
    names = {t.name: t for t in cfg.input}
    for n, t in names.items():
        if n not in LLMAPI_INPUTS:
            out.append(f"{where}: unknown input {n!r}: not read by the llmapi model ({SOURCES['helpers.py']}, {src}).")
            continue
        dt = model_config_pb2.DataType.Name(t.data_type)
        if dt != LLMAPI_INPUTS[n][0]:
            out.append(f"{where}: input {n!r} is {dt}, {src} declares {LLMAPI_INPUTS[n][0]}.")
    out += [f"{where}: required input {n!r} is missing ({src})." for n in LLMAPI_REQUIRED_INPUTS if n not in names]
    onames = {t.name: t for t in cfg.output}
    for n, t in onames.items():
        if n not in LLMAPI_OUTPUTS:
            out.append(f"{where}: unknown output {n!r}: the llmapi model never sends it ({src}).")
        elif model_config_pb2.DataType.Name(t.data_type) != LLMAPI_OUTPUTS[n]:
            out.append(f"{where}: output {n!r} is {model_config_pb2.DataType.Name(t.data_type)}, {src} declares {LLMAPI_OUTPUTS[n]}.")
    out += [f"{where}: required output {n!r} is missing ({src})." for n in LLMAPI_REQUIRED_OUTPUTS if n not in onames]
    return out


def check_command(argv: list[str], flags: dict[str, Spec], *, where: str, source: str, positionals: int = 0) -> list[str]:
    """A command line (after the executable and ``positionals`` positional arguments) against its flag table: unknown
    flag, missing or mistyped value (``bool`` = a flag or sub-command without value)."""
    out: list[str] = []
    i = positionals
    while i < len(argv):
        a = argv[i]
        if a not in flags:
            out.append(f"{where}: unknown option {a!r} ({source}; known: {sorted(flags)}).")
            i += 1
            continue
        spec = flags[a]
        if spec is bool:
            i += 1
            continue
        if i + 1 >= len(argv):
            out.append(f"{where}: option {a!r} needs a value ({_type_name(spec)}, {source}).")
            break
        v = argv[i + 1]
        try:
            if spec is int:
                int(v)
            elif spec is float:
                float(v)
        except ValueError:
            out.append(f"{where}: option {a!r} value {v!r} is not {_type_name(spec)} ({source}).")
        i += 2
    return out
