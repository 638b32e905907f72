"""The ``ensemble`` / ``tensorrt_llm_bls`` adapter of the LLM-API (PyTorch-backend) layout: one table from NVIDIA's
ensemble tensors to the LLM-API ``tensorrt_llm`` model's tensors, and the adapter models' ``config.pbtxt``.

Why: NVIDIA's LLM-API Triton model (TensorRT-LLM ``triton_backend/all_models/llmapi/tensorrt_llm/``) takes
``text_input`` / ``streaming`` / ``sampling_param_*`` and answers ``text_output`` (and, streamed, the *cumulative* text:
its ``model.py`` sends ``CompletionOutput.text``), not the in-flight-batcher ensemble contract that our CPU target and
the engine path serve. So that existing gRPC clients (NVIDIA's ``end_to_end_grpc_client.py``, genai-perf
``--backend tensorrtllm``, our :class:`pipeline.serve.client.LLMClient`, the parity replay) keep working, the LLM-API
package also has ``ensemble`` and ``tensorrt_llm_bls``: one Python (BLS) model,
``pipeline/serve/models/llmapi_adapter_model.py``, that maps each ensemble request onto one LLM-API request per
prompt with :data:`INPUT_MAP` and maps the answers back (:data:`OUTPUT_MAP`; streamed: cumulative -> new text).

Upstream read (names, data types, dims; NVIDIA/TensorRT-LLM, :data:`UPSTREAM`). An ensemble input the LLM-API model
cannot honour is refused by the adapter naming the input, the value and the fix; it is never dropped.

:data:`INPUT_MAP` kinds:

* ``forward``  - sent as the LLM-API input ``to`` (same value, the LLM-API data type);
* ``stop``     - ``stop_words`` -> ``sampling_param_stop`` (strings); the LLM API drops a matched stop string from its
  text (``SamplingParams.include_stop_str_in_output`` defaults to false and the llmapi model has no input for it), the
  ensemble keeps it (backend semantics), so the adapter asks for ``stop_reason`` and appends the matched string;
* ``adapter``  - done by the adapter itself (``exclude_input_in_output=false``: the prompt text is prepended);
* ``fixed``    - accepted only at the package's value (``end_id``/``pad_id``: the LLM API has no input for them; it
  stops at the checkpoint's eos and returns text, so the package's own ids are the only ones honoured);
* ``neutral``  - accepted only at a value that changes nothing (``beam_width`` 1 ...), else refused;
* ``refused``  - refused whenever sent non-empty (no LLM-API input exists for it).

The served model must not import ``pipeline``: the package stage writes this table as ``<model>/1/tensor_map.json``
(:func:`tensor_map`), the one copy the adapter reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

UPSTREAM = {
    "config.pbtxt": "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @c8c6df08bd0e",
    "model.py": "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @b35ac1b64368",
    "helpers.py": "NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py @fab2f90bc62b",
}
"""The upstream files the LLM-API tensor names below were read from (``triton_models/llmapi/config.pbtxt`` mirrors them)."""

ADAPTER_MODELS = ("ensemble", "tensorrt_llm_bls")
"""The adapter is served under both names, as the other layouts expose both (same ``model.py``)."""
LLMAPI_MODEL = "tensorrt_llm"
TENSOR_MAP_FILE = "tensor_map.json"
MODEL_SRC = "llmapi_adapter_model.py"

_NO_INPUT = f"the LLM-API model has no input for it ({UPSTREAM['config.pbtxt']})"
_ENGINE = "or serve the engine package (target=tensorrt_llm), whose C++ backend takes it"


def _fwd(to: str) -> dict[str, Any]:
    return {"kind": "forward", "to": to}


def _neutral(values: list[Any], why: str) -> dict[str, Any]:
    return {"kind": "neutral", "values": values, "why": why}


def _refused(why: str) -> dict[str, Any]:
    return {"kind": "refused", "why": why}


INPUT_MAP: dict[str, dict[str, Any]] = {
    "text_input": _fwd("text_input"),
    "max_tokens": _fwd("sampling_param_max_tokens"),
    "stream": _fwd("streaming"),
    "top_k": _fwd("sampling_param_top_k"),
    "top_p": _fwd("sampling_param_top_p"),
    "temperature": _fwd("sampling_param_temperature"),
    "presence_penalty": _fwd("sampling_param_presence_penalty"),
    "frequency_penalty": _fwd("sampling_param_frequency_penalty"),
    "random_seed": _fwd("sampling_param_seed"),
    "seed": _fwd("sampling_param_seed"),  # tensorrt_llm_bls name (1.x); both given is refused by the adapter
    "return_perf_metrics": _fwd("sampling_param_return_perf_metrics"),
    "return_log_probs": _fwd("return_cumulative_logprob"),
    "stop_words": {"kind": "stop", "to": "sampling_param_stop"},
    "exclude_input_in_output": {"kind": "adapter"},
    "end_id": {"kind": "fixed", "param": "end_id"},
    "pad_id": {"kind": "fixed", "param": "pad_id"},
    "beam_width": _neutral([1], f"beam search: {_NO_INPUT}"),
    "num_return_sequences": _neutral([1], f"several sequences per prompt: {_NO_INPUT}"),
    "length_penalty": _neutral([1.0], f"it only scores beams, and {_NO_INPUT}"),
    "repetition_penalty": _neutral([1.0], _NO_INPUT),
    "min_length": _neutral([0, 1], f"a minimum above one token: {_NO_INPUT}"),
    "min_tokens": _neutral([0, 1], f"a minimum above one token: {_NO_INPUT}"),
    "return_context_logits": _neutral([False], _NO_INPUT),
    "return_generation_logits": _neutral([False], _NO_INPUT),
    "return_num_input_tokens": _neutral([False], _NO_INPUT),
    "return_num_output_tokens": _neutral([False], _NO_INPUT),
    "num_draft_tokens": _neutral(
        [0], f"draft-model speculative decoding by BLS: {_NO_INPUT} (configure speculative decoding in model.yaml)"
    ),
    "use_draft_logits": _neutral([False], _NO_INPUT),
    "decoder_text_input": _refused(f"encoder-decoder input: {_NO_INPUT}"),
    "bad_words": _refused(_NO_INPUT),
    "embedding_bias_words": _refused(_NO_INPUT),
    "embedding_bias_weights": _refused(_NO_INPUT),
    "prompt_embedding_table": _refused(_NO_INPUT),
    "prompt_vocab_size": _refused(_NO_INPUT),
    "prompt_table_extra_id": _refused(_NO_INPUT),
    "lora_task_id": _refused(_NO_INPUT),
    "lora_weights": _refused(_NO_INPUT),
    "lora_config": _refused(_NO_INPUT),
    "guided_decoding_guide_type": _refused(_NO_INPUT),
    "guided_decoding_guide": _refused(_NO_INPUT),
}
"""Ensemble / ``tensorrt_llm_bls`` input -> what the adapter does with it (kinds: module docstring)."""

OUTPUT_MAP: dict[str, dict[str, Any]] = {
    "text_output": {"from": "text_output"},
    "cum_log_probs": {"from": "cumulative_logprob", "when": "return_log_probs"},
    "kv_cache_alloc_new_blocks": {"from": "kv_cache_alloc_new_blocks", "when": "return_perf_metrics"},
    "kv_cache_reused_blocks": {"from": "kv_cache_reused_block", "when": "return_perf_metrics"},
    "kv_cache_alloc_total_blocks": {"from": "kv_cache_alloc_total_blocks", "when": "return_perf_metrics"},
    "arrival_time_ns": {"from": "arrival_time_ns", "when": "return_perf_metrics"},
    "first_scheduled_time_ns": {"from": "first_scheduled_time_ns", "when": "return_perf_metrics"},
    "first_token_time_ns": {"from": "first_token_time_ns", "when": "return_perf_metrics"},
    "last_token_time_ns": {"from": "last_token_time_ns", "when": "return_perf_metrics"},
    "acceptance_rate": {"from": "acceptance_rate", "when": "return_perf_metrics"},
    "total_accepted_draft_tokens": {"from": "total_accepted_draft_tokens", "when": "return_perf_metrics"},
    "total_draft_tokens": {"from": "total_draft_tokens", "when": "return_perf_metrics"},
    "batch_index": {"from": None},  # the adapter's: which prompt of the request
    "sequence_index": {"from": None},  # always 0: one sequence per prompt
}
"""Adapter output -> the LLM-API output it comes from (``when``: the client input that asks for it). The ensemble's
``sequence_length``, ``output_log_probs``, ``context_logits`` and ``generation_logits`` are not declared: the LLM-API
model returns no token ids or per-token values, so a client asking for them gets Triton's "unexpected output" error."""


def llmapi_input_types(llmapi_config: str) -> dict[str, str]:
    """``{input name: TYPE_*}`` of the packaged LLM-API model (its ``config.pbtxt`` text, ``triton_models/llmapi``)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = text_format.Parse(llmapi_config, mc.ModelConfig())
    return {i.name: mc.DataType.Name(i.data_type) for i in cfg.input}


def request_option(llmapi_input: str) -> str | None:
    """The per-request option an LLM-API input carries, by its ``SamplingParams`` name (the key of
    :data:`pipeline.package.option_support.TABLE` scope ``request``): ``sampling_param_top_k`` -> ``top_k``,
    ``streaming`` -> ``streaming``, ``return_cumulative_logprob`` -> itself; None for the prompt (``text_input``)."""
    if llmapi_input == "text_input":
        return None
    return llmapi_input.removeprefix("sampling_param_")


def fail_closed_inputs(trtllm_version: str | None) -> dict[str, dict[str, Any]]:
    """:data:`INPUT_MAP` for a package served by TensorRT-LLM ``trtllm_version``: every ``forward`` / ``stop`` input
    whose option that version is not known to honour (:func:`pipeline.package.option_support.verdict`) becomes
    ``refused`` with the verdict as the reason, so the adapter never forwards an option the runtime may ignore."""
    from .option_support import verdict

    out: dict[str, dict[str, Any]] = {}
    for name, entry in INPUT_MAP.items():
        opt = request_option(entry["to"]) if "to" in entry else None
        if opt is not None:
            ok, why = verdict("request", opt, None, trtllm_version)
            if not ok:
                out[name] = _refused(f"TensorRT-LLM {trtllm_version or 'unknown'}: {opt} is {why}")
                continue
        out[name] = entry
    return out


def tensor_map(settings: Any, llmapi_config: str, trtllm_version: str | None = None) -> dict[str, Any]:
    """The JSON the adapter reads (``<model>/1/tensor_map.json``): the two tables (inputs fail-closed for
    ``trtllm_version``, :func:`fail_closed_inputs`), the LLM-API model's input data types (from its packaged
    ``config.pbtxt``), the package's ``end_id``/``pad_id`` (int token ids) and the LLM-API model name.

    Raises:
        ValueError: a ``forward``/``stop`` target of :data:`INPUT_MAP` is not an input of the LLM-API model.
    """
    types = llmapi_input_types(llmapi_config)
    missing = sorted({e["to"] for e in INPUT_MAP.values() if "to" in e} - set(types))
    if missing:
        raise ValueError(f"LLM-API model config lacks the inputs {missing} that INPUT_MAP maps onto")
    return {
        "llmapi_inputs": types,
        "source": "pipeline/package/llmapi_adapter.py",
        "upstream": UPSTREAM,
        "trtllm_version": trtllm_version,
        "inputs": fail_closed_inputs(trtllm_version),
        "outputs": OUTPUT_MAP,
        "llmapi_model": LLMAPI_MODEL,
        "end_id": int(settings.end_id),
        "pad_id": int(settings.pad_id),
    }


def adapter_config(ensemble_config: str, name: str, settings: Any) -> str:
    """``config.pbtxt`` of the adapter model ``name`` (``ensemble`` or ``tensorrt_llm_bls``).

    Args:
        ensemble_config: the filled ``triton_models/ensemble/config.pbtxt`` (the client interface: one definition).
        name: the model name.
        settings: repository ``Settings`` (``decoupled``, ``instance_count``).
    Returns:
        Protobuf text: every ensemble input (``tensorrt_llm_bls`` also the BLS-only inputs of
        ``trtllm_config.BLS_EXTRA_INPUTS``), the outputs of :data:`OUTPUT_MAP`, Python backend, ``decoupled`` =
        ``package.decoupled`` (the LLM-API model's too), ``max_batch_size`` = the ensemble's (prompts per request).
    """
    from google.protobuf import text_format

    from .model_config import python_model_from_ensemble
    from .trtllm_config import BLS_EXTRA_INPUTS

    extra = BLS_EXTRA_INPUTS if name == "tensorrt_llm_bls" else ()
    cfg = python_model_from_ensemble(
        ensemble_config, name, settings.decoupled, settings.instance_count, {"llmapi_model_name": LLMAPI_MODEL}, extra
    )
    keep = [o for o in cfg.output if o.name in OUTPUT_MAP]
    del cfg.output[:]
    cfg.output.extend(keep)
    head = (
        f"# {name}: NVIDIA's in-flight-batcher ensemble tensors in front of the LLM-API `tensorrt_llm` model (TensorRT-LLM\n"
        f"# PyTorch backend): a Python (BLS) model that maps each request onto text_input / sampling_param_* and the answer\n"
        f"# back (pipeline/package/llmapi_adapter.py; tensor_map.json next to model.py). Inputs it cannot honour are refused.\n"
    )
    return head + text_format.MessageToString(cfg)


def write_adapter_models(
    repo: Path, settings: Any, ensemble_config: str, models_src: Path, *, trtllm_version: str | None = None
) -> list[str]:
    """Write ``ensemble/`` and ``tensorrt_llm_bls/`` (config, ``1/model.py``, ``1/tensor_map.json``) into ``repo``
    (its ``tensorrt_llm/config.pbtxt`` must already be written); returns the model names. ``trtllm_version``: the
    serving TensorRT-LLM, whose option verdicts decide what the adapter forwards (:func:`fail_closed_inputs`)."""
    from .model_config import copy_served_model

    out = []
    llm_cfg = (repo / LLMAPI_MODEL / "config.pbtxt").read_text(encoding="utf-8")
    table = json.dumps(tensor_map(settings, llm_cfg, trtllm_version), indent=2, sort_keys=True) + "\n"
    for name in ADAPTER_MODELS:
        d = repo / name
        (d / "1").mkdir(parents=True, exist_ok=True)
        (d / "config.pbtxt").write_text(adapter_config(ensemble_config, name, settings), encoding="utf-8")
        copy_served_model(models_src, MODEL_SRC, d / "1")
        (d / "1" / TENSOR_MAP_FILE).write_text(table, encoding="utf-8")
        out.append(name)
    return out
