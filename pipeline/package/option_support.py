"""Fail-closed runtime options: which options the pinned TensorRT-LLM PyTorch backend is known to honour (one table).

Two callers:

* the package stage, :func:`package_option_problems`: every ``LLM()`` option the package sets (the dict of
  :func:`pipeline.package.llmapi_options.llm_options`) must be known-honoured on the serving image's TensorRT-LLM
  line, else the package is refused (exit 2: field, value, fix);
* a served model or adapter, :func:`refuse_client_options` (contract below): every option a client sends must be
  known-honoured, else the request is refused with the reason, never silently ignored.

This module imports nothing but the standard library, so a Triton Python model can import it from a copy placed next
to its ``model.py`` (as the package does with ``tokenization.py``).

:data:`TABLE` maps ``(scope, option)`` to ``(status, source)``; ``scope`` is ``"llm"`` (an ``LLM()`` key, dotted for
nested ones, ``=value`` where the verdict depends on the value) or ``"request"`` (a per-request sampling option, by
its ``SamplingParams`` / OpenAI name). ``status``: ``honoured`` (a source says the runtime applies it), ``ignored``
(a source says it is accepted and not applied), ``unsupported`` (a source says the backend lacks it). Anything not in
the table counts as not known-honoured (fail closed). The table is for :data:`LINES` (the TensorRT-LLM 1.2 line of the
default serving image ``26.05`` = 1.2.1, pipeline/facts/versions.py); other lines have no verdicts yet, so every
option is refused there until someone records them with sources.
"""

from __future__ import annotations

from typing import Any

LINES = ("1.2",)
"""TensorRT-LLM major.minor lines the verdicts below were recorded for."""

_LLMAPI_HELPERS = "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py @0df60f9a (read into SamplingParams)"
_LLM_ARGS = (
    "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs field, validated by pydantic and used by the PyTorch executor)"
)
_RESPONSE_FORMAT = (
    "trtllm-serve 1.2.1 answers response_format with HTTP 200 and output that ignores it (NVIDIA/TensorRT issue #4855; "
    "NVIDIA/TensorRT-LLM issue #8196 open); json_schema needs guided_decoding_backend + disable_overlap_scheduler "
    "(NVIDIA/TensorRT-LLM PR #6197), not verified for this package"
)

TABLE: dict[tuple[str, str], tuple[str, str]] = {
    # ---- LLM() options the package writes (model.yaml / trtllm-serve YAML)
    **{
        ("llm", k): ("honoured", _LLM_ARGS)
        for k in (
            "backend=pytorch",
            "trust_remote_code=False",
            "max_batch_size",
            "max_num_tokens",
            "max_seq_len",
            "max_input_len",
            "max_beam_width=1",
            "enable_chunked_prefill",
            "kv_cache_config.free_gpu_memory_fraction",
            "kv_cache_config.enable_block_reuse",
            "kv_cache_config.tokens_per_block",
            "kv_cache_config.max_tokens",
            "kv_cache_config.host_cache_size",
            "scheduler_config.capacity_scheduler_policy",
            "cuda_graph_config.batch_sizes",
            "cuda_graph_config.max_batch_size",
            "cuda_graph_config.enable_padding",
            "iter_stats_max_iterations",
            "request_stats_max_iterations",
        )
    },
    ("llm", "kv_cache_config.dtype=fp8"): (
        "honoured",
        _LLM_ARGS + ": TorchLlmArgs.sync_quant_config_with_kv_cache_config_dtype sets FP8 KV",
    ),
    ("llm", "kv_cache_config.dtype=int8"): (
        "unsupported",
        "no INT8 KV on the PyTorch backend (TensorRT-LLM issue #3701; INT8 KV is an open PR)",
    ),
    ("llm", "speculative_config.decoding_type=DraftTarget"): (
        "honoured",
        "TensorRT-LLM docs features/speculative-decoding (PyTorch backend: draft/target)",
    ),
    ("llm", "speculative_config.decoding_type=Eagle"): (
        "honoured",
        "TensorRT-LLM docs features/speculative-decoding (PyTorch backend: EAGLE 3)",
    ),
    ("llm", "speculative_config.decoding_type=Lookahead"): (
        "unsupported",
        "llm_args.py LookaheadDecodingConfig.supports_backend is false for pytorch",
    ),
    ("llm", "speculative_config.max_draft_len"): ("honoured", _LLM_ARGS),
    ("llm", "speculative_config.speculative_model_dir"): ("honoured", _LLM_ARGS),
    ("llm", "guided_decoding_backend"): ("ignored", _RESPONSE_FORMAT),
    # ---- per-request options a client may send (Triton llmapi tensors sampling_param_*; OpenAI fields of trtllm-serve)
    **{
        ("request", k): ("honoured", _LLMAPI_HELPERS)
        for k in (
            "temperature",
            "top_k",
            "top_p",
            "max_tokens",
            "seed",
            "stop",
            "frequency_penalty",
            "presence_penalty",
            "exclude_input_from_output",
            "return_perf_metrics",
            "streaming",
        )
    },
    ("request", "best_of=1"): ("honoured", _LLMAPI_HELPERS + " (default 1)"),
    ("request", "return_cumulative_logprob"): (
        "honoured",
        "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @c8c6df08bd0e (input "
        "return_cumulative_logprob, output cumulative_logprob) and 1/model.py @b35ac1b64368 (CompletionOutput.cumulative_logprob)",
    ),
    ("request", "response_format"): ("ignored", _RESPONSE_FORMAT),
    ("request", "guided_decoding"): ("ignored", _RESPONSE_FORMAT),
    ("request", "beam_width"): ("unsupported", "the package is built with max_beam_width=1 (beam search is not served)"),
    ("request", "min_p"): (
        "unsupported",
        "not read by the llmapi model (helpers.py @0df60f9a); no source that the 1.2 PyTorch sampler applies it",
    ),
    ("request", "repetition_penalty"): ("unsupported", "not read by the llmapi model (helpers.py @0df60f9a)"),
    ("request", "logprobs"): ("unsupported", "the llmapi model returns no per-token logprobs (config.pbtxt @0a710573 outputs)"),
}

_DEFAULTS: dict[str, Any] = {"best_of": 1, "n": 1, "beam_width": 1, "min_p": 0.0, "repetition_penalty": 1.0, "logprobs": None}
"""Per-request values that mean "not used" (sending them is accepted even where the option is not honoured)."""


def line(version: str | None) -> str | None:
    """``"1.2.1"`` -> ``"1.2"``; None for a missing version."""
    if not version:
        return None
    parts = str(version).split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else None


def verdict(scope: str, option: str, value: Any, version: str | None) -> tuple[bool, str]:
    """``(known_honoured, why)`` for ``option`` = ``value`` in ``scope`` ("llm" | "request") on TensorRT-LLM ``version``."""
    ln = line(version)
    if ln not in LINES:
        return False, (
            f"TensorRT-LLM {version or 'unknown'} has no recorded option verdicts (recorded lines: {list(LINES)}; "
            "pipeline/package/option_support.py)"
        )
    for key in (f"{option}={value}", option):
        if (scope, key) in TABLE:
            status, src = TABLE[(scope, key)]
            return status == "honoured", f"{status} ({src})"
    return False, "not known to be honoured (no source recorded in pipeline/package/option_support.py TABLE)"


def _flatten(doc: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in doc.items():
        if isinstance(v, dict):
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def package_option_problems(options: dict[str, Any], version: str | None) -> list[str]:
    """Every ``LLM()`` option of ``options`` (nested keys dotted) that TensorRT-LLM ``version`` is not known to honour,
    each as "field=value: why. Fix: ..." (empty list = all known-honoured)."""
    out = []
    for key, value in _flatten(options):
        ok, why = verdict("llm", key, value, version)
        if not ok:
            out.append(
                f"LLM option {key}={value!r}: {why}. Fix: remove the setting that produces it (package.runtime / build / "
                "quant), use the legacy engine path target=tensorrt_llm, or record the option with its upstream source."
            )
    return out


class RefusedOption(ValueError):
    """A client option the served TensorRT-LLM is not known to honour; ``str()`` names the option, the value, why."""


def refuse_client_options(request: dict[str, Any], version: str | None) -> None:
    """Refuse a request whose options the pinned TensorRT-LLM is not known to honour. Contract for served models and
    adapters (e.g. an ``ensemble`` adapter in front of the LLM-API model, or an OpenAI front end):

    Args:
        request: option name -> value for every option the client *sent* (omit the ones it did not send); names are
            ``SamplingParams`` / OpenAI names (``temperature``, ``top_k``, ``top_p``, ``max_tokens``, ``seed``,
            ``stop``, ``frequency_penalty``, ``presence_penalty``, ``beam_width``, ``min_p``, ``repetition_penalty``,
            ``logprobs``, ``response_format``, ``guided_decoding``, ...), values as sent (None counts as not sent). A
            value equal to the option's "off" value (``beam_width=1``, ``min_p=0``, ``repetition_penalty=1``) passes.
        version: the serving TensorRT-LLM version (``release_manifest.json`` ``serving.tensorrt_llm``).
    Raises:
        RefusedOption: naming every refused option with its value and the reason (the caller answers the request with
            an error: Triton ``TritonError`` / HTTP 400), so nothing the runtime would ignore is silently accepted.
    """
    bad = []
    for k, v in request.items():
        if v is None or (k in _DEFAULTS and v == _DEFAULTS[k]):
            continue
        ok, why = verdict("request", k, v, version)
        if not ok:
            bad.append(f"{k}={v!r}: {why}")
    if bad:
        raise RefusedOption("refused request option(s) (fail closed): " + "; ".join(bad))
