"""TensorRT-LLM facts two stages share: what the PyTorch backend refuses (build checks it, ``pipeline migrate``
explains it) and how the LLM-API Triton layout is served (package writes its notice, ``pipeline serve`` prints the
command). Sources are given per item."""

from __future__ import annotations

import dataclasses
from typing import Any

PYTORCH_REFUSED_RECIPES: dict[str, str] = {
    "int8_sq": "the TensorRT-LLM PyTorch backend has no INT8 SmoothQuant (W8A8) kernels (TensorRT-LLM issue #3701)",
    "int8_wo": "the TensorRT-LLM PyTorch backend has no INT8 weight-only (W8A16) kernels (TensorRT-LLM issue #3701)",
}


PYTORCH_ALTERNATIVE = (
    "quant=fp8 (SM 8.9+) or quant=int4_awq (W4A16, SM 8.0+) on target=tensorrt_llm_pytorch, or keep quant={recipe} on the "
    "legacy engine path target=tensorrt_llm (TensorRT-LLM 1.2.x)"
)
"""Recipes the PyTorch backend (``tensorrt_llm_pytorch``) refuses, with the alternative. Source: TensorRT-LLM
``docs/source/features/quantization.md`` (the PyTorch backend's quantization support matrix, 1.2/1.3rc) and
NVIDIA/TensorRT-LLM issue #3701 (INT8 SmoothQuant / W8A16 not supported by the PyTorch backend); summarised in
docs/reference/tensorrt_llm.md. Every other recipe of :data:`pipeline.facts.recipes.RECIPES` runs on both backends."""


PYTORCH_KV_CACHE_DTYPES = ("none", "fp8")
"""KV-cache dtypes of the PyTorch backend: FP8 KV only; INT8 KV is not supported (same sources as
:data:`PYTORCH_REFUSED_RECIPES`; INT8 KV is an open upstream pull request, not a release)."""


LLMAPI_CONTAINER_DIR = "/app/all_models/llmapi/tensorrt_llm/1"
"""Where NVIDIA's Triton + TensorRT-LLM container ships the LLM-API Python model (TensorRT-LLM
``triton_backend/all_models/llmapi/tensorrt_llm/1/``)."""


LLMAPI_FILES = ("model.py", "helpers.py")
"""The files of that folder the package does not contain (NVIDIA's code, not redistributed here): ``model.py``
imports ``helpers``; both must sit in ``tensorrt_llm/1/`` next to ``model.yaml``."""


def llmapi_command(repo_dir: str, image: str, *, grpc_port: int = 8001, http_port: int = 8000, metrics_port: int = 8002) -> str:
    """``docker run`` command for the LLM-API layout: copies :data:`LLMAPI_FILES` from the container into the mounted
    repository's ``tensorrt_llm/1/`` (writes into ``repo_dir``), then starts Triton on ``/models``."""
    cp = " ".join(f"{LLMAPI_CONTAINER_DIR}/{f}" for f in LLMAPI_FILES)
    ports = f"-p {grpc_port}:{grpc_port} -p {http_port}:{http_port} -p {metrics_port}:{metrics_port}"
    return (
        f"docker run --rm -it --gpus all --shm-size=2g --ulimit memlock=-1 --ulimit stack=67108864 {ports} -v {repo_dir}:/models "
        f"{image} bash -c 'cp {cp} /models/tensorrt_llm/1/ && tritonserver --model-repository=/models "
        f"--grpc-port={grpc_port} --http-port={http_port} --metrics-port={metrics_port}'"
    )


def llmapi_notice(image: str) -> str:
    """What the PyTorch-backend (LLM API) package needs to be served; written as ``tensorrt_llm/README.md`` and printed
    by ``pipeline serve``."""
    files = ", ".join(f"`{f}`" for f in LLMAPI_FILES)
    return (
        f"# Serving this TensorRT-LLM PyTorch-backend (LLM API) model\n\n"
        f"This model folder holds `config.pbtxt`, `1/model.yaml` (the `LLM()` arguments), `1/checkpoint/` and `1/tokenizer/`. "
        f"It does **not** hold the Python model code: {files} come from NVIDIA's container and must be copied into "
        f"`tensorrt_llm/1/` before Triton loads the repository.\n\n"
        f"- container: `{image}` (TensorRT-LLM >= 1.2 with the PyTorch backend)\n"
        f"- files: `{LLMAPI_CONTAINER_DIR}/model.py` and `{LLMAPI_CONTAINER_DIR}/helpers.py` -> `tensorrt_llm/1/`\n"
        f"- GPU: an NVIDIA GPU supported by that TensorRT-LLM release\n\n"
        f"One command (mounts the repository at `/models`, copies the two files into it, starts Triton):\n\n"
        f"    {llmapi_command('<model_repository>', image)}\n"
    )


LLMAPI_MAP: dict[str, tuple[str, ...]] = {
    "max_tokens_in_paged_kv_cache": ("kv_cache_config", "max_tokens"),
    "kv_cache_free_gpu_mem_fraction": ("kv_cache_config", "free_gpu_memory_fraction"),
    "kv_cache_host_memory_bytes": ("kv_cache_config", "host_cache_size"),
    "kv_cache_onboard_blocks": ("kv_cache_config", "onboard_blocks"),
    "max_attention_window_size": ("kv_cache_config", "max_attention_window"),
    "sink_token_length": ("kv_cache_config", "sink_token_length"),
    "cross_kv_cache_fraction": ("kv_cache_config", "cross_kv_cache_fraction"),
    "iter_stats_max_iterations": ("iter_stats_max_iterations",),
    "request_stats_max_iterations": ("request_stats_max_iterations",),
    "guided_decoding_backend": ("guided_decoding_backend",),
    "cancellation_check_period_ms": ("triton_config", "cancellation_check_period_ms"),
}
"""package.runtime field -> key path in the PyTorch-backend ``model.yaml`` (``LLM()`` arguments, TensorRT-LLM 1.2
``llmapi/llm_args.py`` ``KvCacheConfig``; ``triton_config`` is read by NVIDIA's llmapi ``model.py``)."""


LLMAPI_DEFAULTS = {"normalize_log_probs": True, "encoder_input_features_data_type": "TYPE_FP16"}
"""package.runtime fields with a non-null default: refused for the PyTorch backend only when changed."""


def llmapi_unsupported(rt: Any) -> list[str]:
    """package.runtime fields that are set but have no PyTorch-backend (LLM API layout) equivalent."""
    out = []
    # the schema dataclass, or the OmegaConf node of it the config checks see (iterating a DictConfig gives its keys)
    names = [f.name for f in dataclasses.fields(rt)] if dataclasses.is_dataclass(rt) else [str(k) for k in rt]
    for name in names:
        v = getattr(rt, name)
        if name in LLMAPI_MAP or v is None or (name in LLMAPI_DEFAULTS and v == LLMAPI_DEFAULTS[name]):
            continue
        out.append(name)
    return out


def llmapi_overrides(rt: Any) -> dict[str, Any]:
    """The ``model.yaml`` keys the set package.runtime fields map to (:data:`LLMAPI_MAP`)."""
    out: dict[str, Any] = {}
    for f, path in LLMAPI_MAP.items():
        v = getattr(rt, f)
        if v is None:
            continue
        if f == "max_attention_window_size":
            v = [int(v)]
        d = out
        for k in path[:-1]:
            d = d.setdefault(k, {})
        d[path[-1]] = v
    return out


SPECULATIVE_RUNTIME_FIELDS: dict[str, str] = {
    "medusa_choices": "medusa",
    "eagle_choices": "eagle",
    "lookahead_window_size": "lookahead_decoding",
    "lookahead_ngram_size": "lookahead_decoding",
    "lookahead_verification_set_size": "lookahead_decoding",
}
"""package.runtime field -> the ``build.speculative.mode`` it belongs to (TensorRT-LLM's Triton backend
``tensorrt_llm/config.pbtxt`` parameters of each speculative mode); checked at config time (build) and when the
repository is written (package)."""
