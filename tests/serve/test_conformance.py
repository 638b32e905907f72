"""Conformance suite: the served repository driven exactly as clients of NVIDIA's TensorRT-LLM Triton backend drive it.

Written from the backend's documented interface (TensorRT-LLM ``triton_backend/all_models/inflight_batcher_llm``,
v0.19.0 templates; its clients ``inflight_batcher_llm/client/end_to_end_grpc_client.py`` and
``inflight_batcher_llm_client.py``; the C++ backend's response shapes in ``inflight_batcher_llm/src/
model_instance_state.cc``; Triton's ``generate`` extension ``docs/protocol/extension_generate.md``), never from our
own client: every request here is built with plain ``tritonclient`` / HTTP, as those clients build them.

What a backend client relies on (and this suite checks):

* ``text_output`` is a flat BYTES array with one entry per returned sequence: batch 1, beam 1 -> shape ``[1]``, and
  ``result.as_numpy("text_output")[0]`` is ``bytes`` (postprocessing ``OUTPUT`` dims ``[-1]``), unary and streamed;
* per-sequence outputs of the C++ backend: ``cum_log_probs`` ``[1, beams]``, ``output_log_probs`` ``[1, beams, len]``,
  ``batch_index``/``sequence_index`` ``[1, 1]``, perf-metric outputs ``[1, 1]``;
* ``text_input`` ``[n, 1]`` (the ensemble's ``max_batch_size`` > 1): one answer stream per prompt, each tagged with its
  ``batch_index``, each equal to that prompt's single-prompt answer;
* the ensemble and ``tensorrt_llm_bls`` (text in / text out, same inputs) give the same answers;
* every optional input either takes effect or is refused with an error that names it (never silently ignored).

One real Triton server (``.venv-serve``) per module on a package produced by the real pipeline (tiny Llama, fp32
onnxruntime-genai engine).  The TensorRT-LLM package cannot run here: it is checked structurally against the same
reference interface (``test_trtllm_package_*``).

Expected failures are marked ``xfail(strict=True)`` with the mismatch they document; a strict xfail turns into a
failure the moment the server is fixed, so the mark must then be removed.
"""

from __future__ import annotations

import json
import queue
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import serve_tiny
from cli_serve import start_cli_server

from pipeline.core.config.package import PackageConfig
from pipeline.core.contracts.build import BuildInfo
from pipeline.core.contracts.export import ModelInfo

pytestmark = pytest.mark.slow
PROMPTS = [
    "Where is my order ORD-12345? It was due on 2024-03-05.",
    "I want a refund for the damaged item.",
    "我的订单 ORD-55555 什么时候到？",
]
MAX_TOKENS = 12

# --------------------------------------------------------------------------- the reference interface
# (name, Triton data type, dims without the batch dim, optional) of TensorRT-LLM's inflight_batcher_llm ensemble
# (v0.19.0 ensemble/config.pbtxt) and tensorrt_llm_bls (tensorrt_llm_bls/config.pbtxt).
_ENSEMBLE_INPUTS = [
    ("text_input", "TYPE_STRING", [1], False),
    ("decoder_text_input", "TYPE_STRING", [1], True),
    ("max_tokens", "TYPE_INT32", [1], False),
    *[
        (n, "TYPE_INT32", [1], True)
        for n in ("num_return_sequences", "end_id", "pad_id", "top_k", "min_length", "beam_width", "prompt_vocab_size")
    ],
    *[(n, "TYPE_STRING", [-1], True) for n in ("bad_words", "stop_words", "embedding_bias_words")],
    *[
        (n, "TYPE_BOOL", [1], True)
        for n in (
            "exclude_input_in_output",
            "return_log_probs",
            "return_context_logits",
            "return_generation_logits",
            "return_perf_metrics",
            "stream",
        )
    ],
    *[
        (n, "TYPE_FP32", [1], True)
        for n in ("top_p", "temperature", "length_penalty", "repetition_penalty", "presence_penalty", "frequency_penalty")
    ],
    *[(n, "TYPE_UINT64", [1], True) for n in ("random_seed", "prompt_table_extra_id", "lora_task_id")],
    ("prompt_embedding_table", "TYPE_FP16", [-1, -1], True),
    ("embedding_bias_weights", "TYPE_FP32", [-1], True),
    ("lora_weights", "TYPE_FP16", [-1, -1], True),
    ("lora_config", "TYPE_INT32", [-1, 3], True),
    ("guided_decoding_guide_type", "TYPE_STRING", [1], True),
    ("guided_decoding_guide", "TYPE_STRING", [1], True),
]
_OUTPUTS = [
    ("text_output", "TYPE_STRING", [-1]),
    ("cum_log_probs", "TYPE_FP32", [-1]),
    ("output_log_probs", "TYPE_FP32", [-1, -1]),
    ("context_logits", "TYPE_FP32", [-1, -1]),
    ("generation_logits", "TYPE_FP32", [-1, -1, -1]),
    *[
        (n, "TYPE_INT32", [1])
        for n in (
            "batch_index",
            "sequence_index",
            "kv_cache_alloc_new_blocks",
            "kv_cache_reused_blocks",
            "kv_cache_alloc_total_blocks",
            "total_accepted_draft_tokens",
            "total_draft_tokens",
        )
    ],
    *[(n, "TYPE_INT64", [1]) for n in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")],
    ("acceptance_rate", "TYPE_FP32", [1]),
]
_BLS_INPUTS = [
    ("text_input", "TYPE_STRING", [1], False),
    ("max_tokens", "TYPE_INT32", [1], False),
    *[(n, "TYPE_STRING", [-1], True) for n in ("bad_words", "stop_words", "embedding_bias_words")],
    *[
        (n, "TYPE_BOOL", [1], True)
        for n in (
            "exclude_input_in_output",
            "stream",
            "return_log_probs",
            "return_context_logits",
            "return_generation_logits",
            "return_perf_metrics",
        )
    ],
    *[(n, "TYPE_INT32", [1], True) for n in ("end_id", "pad_id", "top_k", "beam_width", "num_return_sequences")],
    *[
        (n, "TYPE_FP32", [1], True)
        for n in ("top_p", "temperature", "length_penalty", "repetition_penalty", "presence_penalty", "frequency_penalty")
    ],
    ("random_seed", "TYPE_UINT64", [1], True),
]
SERVED_MODELS = ("ensemble", "tensorrt_llm_bls")

NEEDS_SERVING_FIX = "the server-side models (helper `serving`) have not merged the fix yet"


def _xfail(reason: str) -> Any:
    return pytest.mark.xfail(strict=True, reason=f"{reason} ({NEEDS_SERVING_FIX})")


# --------------------------------------------------------------------------- fixtures: one server for the module
@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_llama, shared_store):
    """The real pipeline (export -> build -> evaluate -> package) on a tiny Llama, served by a real Triton server: its
    own, not the session's shared one (tests/serve/conftest.py), for its package serves beam width 2."""
    art = serve_tiny.build_package(tiny_llama, shared_store, "package.max_beam_width=2")
    with serve_tiny.serving(art, tmp_path_factory.mktemp("serve-log")) as s:
        yield s


@pytest.fixture(scope="module")
def tok(served):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(served.tokenizer_dir))


@pytest.fixture(scope="module")
def grpc(served):
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(served.url)
    yield c
    c.close()


def _has_model(grpc: Any, name: str) -> bool:
    try:
        return bool(grpc.is_model_ready(name))
    except Exception:
        return False


# --------------------------------------------------------------------------- a backend client, as NVIDIA's examples write it
def _inputs(prompts: list[str], max_tokens: int, **extra: Any) -> list[Any]:
    """``InferInput``s with a leading batch dim, as ``end_to_end_grpc_client.py`` builds them (one row per prompt)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    n = len(prompts)
    arrays: dict[str, np.ndarray] = {
        "text_input": np.array([[p.encode("utf-8")] for p in prompts], dtype=object),
        "max_tokens": np.full((n, 1), max_tokens, dtype=np.int32),
    }
    for k, v in extra.items():
        if isinstance(v, np.ndarray):
            arrays[k] = v
        elif isinstance(v, bool):
            arrays[k] = np.full((n, 1), v, dtype=bool)
        elif isinstance(v, float):
            arrays[k] = np.full((n, 1), v, dtype=np.float32)
        elif isinstance(v, int):
            arrays[k] = np.full((n, 1), v, dtype=np.uint64 if k in ("random_seed",) else np.int32)
        elif isinstance(v, list):  # words lists: [[w1, w2]] per prompt
            arrays[k] = np.array([[w.encode("utf-8") for w in v]] * n, dtype=object)
        else:
            raise TypeError(k)
    out = []
    for k, a in arrays.items():
        i = grpcclient.InferInput(k, list(a.shape), "BYTES" if a.dtype == object else np_to_triton_dtype(a.dtype))
        i.set_data_from_numpy(a)
        out.append(i)
    return out


class Call(SimpleNamespace):
    """What a streaming-API call returned: ``results`` (InferResult per non-empty response), ``error`` (str or None)."""

    def texts(self) -> list[bytes]:
        """The first sequence's text of every response (shape-agnostic: the shape has its own tests)."""
        return [r.as_numpy("text_output").reshape(-1)[0] for r in self.results if r.as_numpy("text_output") is not None]


def stream_call(
    url: str,
    model: str,
    prompts: list[str],
    max_tokens: int = MAX_TOKENS,
    *,
    outputs: tuple[str, ...] = ("text_output",),
    request_id: str = "",
    timeout_s: float = 90.0,
    stop_after_first: Any = None,
    **extra: Any,
) -> Call:
    """One request over the gRPC streaming API (``start_stream`` + ``async_stream_infer``), as the backend's clients do
    for every request to a decoupled deployment; waits for the final flag of every batch item."""
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    results, error = [], None
    try:
        c.async_stream_infer(
            model,
            _inputs(prompts, max_tokens, **extra),
            request_id=request_id,
            outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
            enable_empty_final_response=True,
        )
        finals, deadline = 0, time.monotonic() + timeout_s
        while finals < 1:
            r, e = q.get(timeout=max(0.1, deadline - time.monotonic()))
            if e is not None:
                error = e.message() if hasattr(e, "message") else str(e)
                break
            resp = r.get_response()
            if resp.outputs:
                results.append(r)
                if stop_after_first is not None and len(results) == 1:
                    stop_after_first()
            p = resp.parameters.get("triton_final_response")
            if p is not None and p.bool_param:
                finals += 1
    finally:
        c.stop_stream(cancel_requests=error is not None)
        c.close()
    return Call(results=results, error=error)


def unary_text(url: str, prompt: str, model: str = "ensemble", max_tokens: int = MAX_TOKENS, **extra: Any) -> str:
    call = stream_call(url, model, [prompt], max_tokens, stream=False, **extra)
    assert call.error is None, call.error
    assert len(call.results) == 1, f"a non-streamed request must get exactly one response, got {len(call.results)}"
    return b"".join(call.texts()).decode("utf-8")


def streamed_text(url: str, prompt: str, model: str = "ensemble", max_tokens: int = MAX_TOKENS, **extra: Any) -> str:
    call = stream_call(url, model, [prompt], max_tokens, stream=True, **extra)
    assert call.error is None, call.error
    return b"".join(call.texts()).decode("utf-8")


@pytest.fixture(scope="module")
def single(served):
    """prompt -> the ensemble's answer to that prompt alone (greedy, cached)."""
    cache: dict[tuple[str, int], str] = {}

    def get(prompt: str, max_tokens: int = MAX_TOKENS) -> str:
        key = (prompt, max_tokens)
        if key not in cache:
            call = stream_call(served.url, "ensemble", [prompt], max_tokens, stream=False)
            assert call.error is None, call.error
            arr = call.results[0].as_numpy("text_output")
            cache[key] = arr.reshape(-1)[0].decode("utf-8")
        return cache[key]

    return get


@pytest.fixture(scope="module")
def generated_ids(served, tok):
    """prompt -> the ids the packaged engine generates for it (greedy; the build target's own runner, in process)."""
    from pipeline.core.targets import get_target
    from pipeline.core.targets.base import GenerationRequest
    from pipeline.core.tokenization import codec_of

    runner = get_target("onnxruntime_genai").load_runner(served.repo / "onnxruntime_genai" / "1" / "engine")

    codec = codec_of(tok)

    def get(prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
        # the served encode rule: the text as is, BOS only where the tokenizer itself adds it
        ids = codec.encode_rendered(prompt)
        if codec.adds_bos and codec.bos_id is not None and (not ids or ids[0] != codec.bos_id):
            ids = [codec.bos_id] + ids
        res = runner.generate([GenerationRequest(input_ids=ids, max_new_tokens=max_tokens, stop_token_ids=[tok.eos_token_id])])[0]
        assert res.error is None, res.error
        return list(res.output_ids)

    yield get
    runner.close()


# --------------------------------------------------------------------------- interface
def test_ensemble_interface_matches_the_backend(grpc):
    """Every input and output of NVIDIA's ensemble exists with its data type, dims and optionality."""
    cfg = grpc.get_model_config("ensemble", as_json=True)["config"]
    ins = {i["name"]: i for i in cfg["input"]}
    for name, dt, dims, optional in _ENSEMBLE_INPUTS:
        assert name in ins, f"ensemble input {name} missing"
        assert ins[name]["data_type"] == dt and [int(d) for d in ins[name]["dims"]] == dims, name
        assert bool(ins[name].get("optional", False)) == optional, name
    outs = {o["name"]: o for o in cfg["output"]}
    for name, dt, dims in _OUTPUTS:
        assert name in outs and outs[name]["data_type"] == dt and [int(d) for d in outs[name]["dims"]] == dims, name
    assert int(cfg["max_batch_size"]) > 1


def test_bls_model_is_served_with_the_backend_interface(grpc):
    assert _has_model(grpc, "tensorrt_llm_bls")
    cfg = grpc.get_model_config("tensorrt_llm_bls", as_json=True)["config"]
    ins = {i["name"]: i for i in cfg["input"]}
    for name, dt, dims, optional in _BLS_INPUTS:
        assert name in ins and ins[name]["data_type"] == dt and [int(d) for d in ins[name]["dims"]] == dims, name
        assert bool(ins[name].get("optional", False)) == optional, name
    outs = {o["name"] for o in cfg["output"]}
    assert {"text_output", "cum_log_probs", "output_log_probs", "batch_index", "sequence_index"} <= outs
    assert cfg.get("model_transaction_policy", {}).get("decoupled") is True  # same as the engine model (docs/reference/triton.md §6)


# --------------------------------------------------------------------------- text_output shape and bytes
def test_unary_text_output_is_flat_and_index0_is_bytes(served, single):
    call = stream_call(served.url, "ensemble", [PROMPTS[0]], stream=False)
    assert call.error is None, call.error
    out = call.results[0].as_numpy("text_output")
    assert out.shape == (1,)
    assert isinstance(out[0], bytes)
    assert out[0].decode("utf-8") == single(PROMPTS[0])


def test_streamed_text_output_is_flat_and_joins_to_the_unary_text(served, single):
    call = stream_call(served.url, "ensemble", [PROMPTS[2]], stream=True)
    assert call.error is None, call.error
    # how many responses depends on load: tokens that queued while the server was busy share one response
    # (package.stream_coalescing; one response per token with it off: tests/serve/test_serving_models.py)
    assert call.results
    for r in call.results:
        out = r.as_numpy("text_output")
        assert out.shape == (1,) and isinstance(out[0], bytes)
    # a client decoding each response as it arrives (Chinese included) must never see a broken character
    assert "".join(x.decode("utf-8") for x in call.texts()) == single(PROMPTS[2])


def test_unary_equals_streamed_text(served, single):
    for p in PROMPTS:
        assert streamed_text(served.url, p) == single(p), p


# --------------------------------------------------------------------------- several prompts in one request
def test_batch_of_three_prompts_gets_three_answers_equal_to_single_answers(served, single):
    for stream in (False, True):
        call = stream_call(served.url, "ensemble", PROMPTS, stream=stream, outputs=("text_output", "batch_index"))
        assert call.error is None, call.error
        got: dict[int, list[bytes]] = {}
        for r in call.results:
            bi = r.as_numpy("batch_index")
            assert bi is not None and bi.shape == (1, 1), "each response names its prompt with batch_index [1, 1]"
            got.setdefault(int(bi[0][0]), []).extend(list(r.as_numpy("text_output").reshape(-1)))
        assert sorted(got) == [0, 1, 2]
        assert [b"".join(got[i]).decode("utf-8") for i in range(3)] == [single(p) for p in PROMPTS], f"stream={stream}"


# --------------------------------------------------------------------------- BLS
def test_bls_answers_equal_the_ensemble_unary_and_streamed(served, single):
    for p in PROMPTS[:2]:
        assert unary_text(served.url, p, model="tensorrt_llm_bls") == single(p)
        assert streamed_text(served.url, p, model="tensorrt_llm_bls") == single(p)


# --------------------------------------------------------------------------- inputs take effect or are refused
def test_exclude_input_in_output(served, single):
    full = unary_text(served.url, PROMPTS[0], exclude_input_in_output=False)
    assert PROMPTS[0] in full and full.endswith(single(PROMPTS[0]))
    assert unary_text(served.url, PROMPTS[0], exclude_input_in_output=True) == single(PROMPTS[0])


def test_stop_words_cut_the_answer(served, single, tok, generated_ids):
    want = single(PROMPTS[0], 24)
    ids = generated_ids(PROMPTS[0], 24)
    # a word whose tokenization is one token that occurs in the answer after its start (backend semantics: token
    # sequences, the stop word itself is kept in the output)
    k = next(
        (
            i
            for i in range(1, len(ids))
            if (w := tok.decode([ids[i]])).strip() and tok(w, add_special_tokens=False)["input_ids"] == [ids[i]] and ids[i] not in ids[:i]
        ),
        None,
    )
    assert k is not None, "the tiny model's answer has no single-token word to stop on"
    stopped = unary_text(served.url, PROMPTS[0], max_tokens=24, stop_words=[tok.decode([ids[k]])])
    assert stopped == tok.decode(ids[: k + 1], skip_special_tokens=True) and len(stopped) < len(want)


def test_bad_words_take_effect_or_are_refused(served, single, tok, generated_ids):
    ids = generated_ids(PROMPTS[1])
    k = next(
        i for i in range(len(ids)) if (w := tok.decode([ids[i]])).strip() and tok(w, add_special_tokens=False)["input_ids"] == [ids[i]]
    )
    call = stream_call(served.url, "ensemble", [PROMPTS[1]], stream=False, bad_words=[tok.decode([ids[k]])])
    if call.error is not None:
        assert "bad_words" in call.error  # refused, naming the input
    else:  # the banned token never appears: the answer leaves the greedy path at the latest where it would have appeared
        assert b"".join(call.texts()).decode("utf-8") != single(PROMPTS[1])


def test_end_id_override_stops_before_that_token(served, single, tok, generated_ids):
    ids = generated_ids(PROMPTS[0])
    assert tok.decode(ids, skip_special_tokens=True) == single(PROMPTS[0])  # the served answer is the engine's
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    assert unary_text(served.url, PROMPTS[0], end_id=int(ids[k])) == tok.decode(ids[:k], skip_special_tokens=True)


def test_pad_id_override_is_accepted_and_changes_no_text(served, single, tok):
    assert unary_text(served.url, PROMPTS[0], pad_id=int(tok.eos_token_id), end_id=int(tok.eos_token_id)) == single(PROMPTS[0])


def test_greedy_equivalents_and_sampling(served, single):
    want = single(PROMPTS[0])
    assert unary_text(served.url, PROMPTS[0], top_k=1, temperature=1.0) == want
    assert unary_text(served.url, PROMPTS[0], top_p=0.9, temperature=0.0) == want
    sampled = {unary_text(served.url, PROMPTS[0], top_k=50, temperature=2.0) for _ in range(3)}
    assert sampled != {want}


def test_random_seed_reproduces_a_sample_or_is_refused(served):
    a = stream_call(served.url, "ensemble", [PROMPTS[0]], stream=False, top_k=50, temperature=2.0, random_seed=1234)
    if a.error is not None:
        assert "random_seed" in a.error
        return
    b = stream_call(served.url, "ensemble", [PROMPTS[0]], stream=False, top_k=50, temperature=2.0, random_seed=1234)
    assert b.error is None and b"".join(a.texts()) == b"".join(b.texts())


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_penalties_take_effect_or_are_refused(served, single, generated_ids, name):
    ids = generated_ids(PROMPTS[0], 24)
    assert len(set(ids)) < len(ids), "precondition: the greedy answer repeats a token, so a penalty must change it"
    call = stream_call(served.url, "ensemble", [PROMPTS[0]], 24, stream=False, **{name: 2.0})
    if call.error is not None:
        assert name in call.error
    else:
        assert b"".join(call.texts()).decode("utf-8") != single(PROMPTS[0], 24)


def test_beam_width_above_the_package_is_refused_naming_it(served):
    call = stream_call(served.url, "ensemble", [PROMPTS[0]], stream=False, beam_width=64)
    assert call.error is not None and "beam" in call.error.lower()


def _log_probs_call(served: Any, **extra: Any) -> Any:
    call = stream_call(
        served.url,
        "ensemble",
        [PROMPTS[0]],
        stream=False,
        return_log_probs=True,
        outputs=("text_output", "cum_log_probs", "output_log_probs"),
        **extra,
    )
    assert call.error is None, call.error
    assert len(call.results) == 1
    return call.results[0]


def test_return_log_probs_shapes_and_values(served, single, generated_ids):
    r = _log_probs_call(served, top_k=1)
    cum, per = r.as_numpy("cum_log_probs"), r.as_numpy("output_log_probs")
    n = len(generated_ids(PROMPTS[0]))  # one log prob per generated token (re-tokenizing the text need not give n)
    assert cum.shape == (1, 1) and per.ndim == 3 and per.shape == (1, 1, n)
    assert np.all(np.isfinite(per)) and np.all(per[0, 0, :n] <= 0) and cum[0, 0] <= 0
    assert abs(float(cum[0, 0]) - float(per[0, 0][per[0, 0] > -1e30].sum())) < 1e-2 * max(1.0, abs(float(cum[0, 0])))
    # the Generator path that computes log probs decodes greedily exactly as the og.Engine path does
    assert r.as_numpy("text_output").reshape(-1)[0].decode("utf-8") == single(PROMPTS[0])


def test_log_probs_match_a_transformers_fp32_reference(served, tok, tiny_llama, generated_ids):
    """quant=none fp32 engine: each token's log prob equals log_softmax of the HF checkpoint's logits (teacher forcing)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.core.tokenization import codec_of

    gen = generated_ids(PROMPTS[0])
    codec = codec_of(tok)
    ids = codec.encode_rendered(PROMPTS[0])
    if codec.adds_bos and codec.bos_id is not None and (not ids or ids[0] != codec.bos_id):
        ids = [codec.bos_id] + ids
    per = _log_probs_call(served).as_numpy("output_log_probs")[0, 0]
    assert per.shape[0] == len(gen)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids + gen])).logits[0].double()
    ref = torch.log_softmax(logits, -1)[len(ids) - 1 : len(ids) - 1 + len(gen)].gather(1, torch.tensor(gen)[:, None])[:, 0]
    np.testing.assert_allclose(per, ref.numpy(), atol=1e-4, rtol=1e-4)  # measured max |diff| 1.3e-6 (og 0.18 CPU fp32)


def test_streamed_log_probs_equal_the_unary_ones(served):
    unary = _log_probs_call(served)
    call = stream_call(
        served.url,
        "ensemble",
        [PROMPTS[0]],
        stream=True,
        return_log_probs=True,
        outputs=("text_output", "cum_log_probs", "output_log_probs"),
    )
    assert call.error is None, call.error
    pieces = [r.as_numpy("output_log_probs") for r in call.results]
    assert all(p.shape[:2] == (1, 1) and p.shape[2] <= 1 for p in pieces)
    streamed = np.concatenate([p[0, 0] for p in pieces])
    np.testing.assert_allclose(streamed, unary.as_numpy("output_log_probs")[0, 0], atol=1e-5)
    np.testing.assert_allclose(call.results[-1].as_numpy("cum_log_probs"), unary.as_numpy("cum_log_probs"), atol=1e-4)


def test_beam_width_2_returns_2_scored_sequences(served, single):
    r = _log_probs_call(served, beam_width=2)
    texts, cum, per = r.as_numpy("text_output"), r.as_numpy("cum_log_probs"), r.as_numpy("output_log_probs")
    assert texts.shape == (2,) and texts[0] != texts[1]
    assert cum.shape == (1, 2) and per.ndim == 3 and per.shape[:2] == (1, 2)
    assert np.all(np.isfinite(per)) and np.all(per <= 0)
    np.testing.assert_allclose(cum[0], per[0].sum(axis=1), rtol=1e-4, atol=1e-4)
    one = _log_probs_call(served, beam_width=2, num_return_sequences=1)
    assert one.as_numpy("text_output").shape == (1,) and one.as_numpy("text_output")[0] == texts[0]


def test_beam_search_options_it_cannot_honour_are_refused_by_name(served):
    call = stream_call(served.url, "ensemble", [PROMPTS[0]], stream=True, beam_width=2)
    assert call.error is not None and "streaming" in call.error and "beam_width" in call.error
    call = stream_call(served.url, "ensemble", [PROMPTS[0]], stream=False, beam_width=2, num_return_sequences=3)
    assert call.error is not None and "num_return_sequences" in call.error


def test_return_perf_metrics(served):
    names = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
    call = stream_call(served.url, "ensemble", [PROMPTS[0]], stream=False, return_perf_metrics=True, outputs=("text_output", *names))
    assert call.error is None, call.error
    r = call.results[-1]
    vals = [r.as_numpy(n) for n in names]
    assert all(v is not None and v.size == 1 for v in vals), [None if v is None else v.shape for v in vals]
    t = [int(v.reshape(-1)[0]) for v in vals]
    assert 0 < t[0] <= t[1] <= t[2] <= t[3]


def test_streamed_perf_metrics_time_each_response(served):
    """Streamed with ``return_perf_metrics``: every response carries the timestamps, ``first_token_time_ns`` stays put
    and ``last_token_time_ns`` names when that response's newest token was generated (it grows along the stream)."""
    names = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
    call = stream_call(
        served.url, "ensemble", [PROMPTS[1]], stream=True, min_length=MAX_TOKENS, return_perf_metrics=True, outputs=("text_output", *names)
    )
    assert call.error is None, call.error
    rows = [[int(r.as_numpy(n).reshape(-1)[0]) for n in names] for r in call.results]
    assert rows
    for arrival, scheduled, first, last in rows:
        assert 0 < arrival <= scheduled <= first <= last
    assert len({r[0] for r in rows}) == len({r[1] for r in rows}) == len({r[2] for r in rows}) == 1
    lasts = [r[3] for r in rows]
    assert lasts == sorted(lasts) and (len(rows) == 1 or lasts[-1] > lasts[0])


def test_client_perf_metrics_share_the_host_clock(served):
    """``LLMClient.generate(return_perf_metrics=True)``: the server's timestamps fall between the client's send and
    the client's receipt of the last response (one host clock), which the benchmark's per-hop timing relies on."""
    from pipeline.serve.client import PERF_TIMES, LLMClient

    with LLMClient(served.url, "ensemble", timeout_s=60) as c:
        res = c.generate(PROMPTS[0], MAX_TOKENS, stream=True, chat=False, return_perf_metrics=True, min_length=MAX_TOKENS)
        plain = c.generate(PROMPTS[0], MAX_TOKENS, stream=True, chat=False)
    assert res.perf is not None and set(res.perf) == set(PERF_TIMES) and res.sent_ns is not None
    received_last = res.sent_ns + int(res.chunk_times_s[-1] * 1e9)
    t = [res.perf[n] for n in PERF_TIMES]
    assert res.sent_ns <= t[0] <= t[1] <= t[2] <= t[3] <= received_last
    assert plain.perf is None and plain.text == res.text


def test_perf_metric_output_shapes(served):
    call = stream_call(
        served.url,
        "ensemble",
        [PROMPTS[0]],
        stream=False,
        return_perf_metrics=True,
        outputs=("text_output", "arrival_time_ns", "last_token_time_ns"),
    )
    assert call.error is None, call.error
    assert call.results[-1].as_numpy("arrival_time_ns").shape == (1, 1)
    assert call.results[-1].as_numpy("last_token_time_ns").shape == (1, 1)


# --------------------------------------------------------------------------- cancellation
def test_request_cancel_stops_a_stream(served):
    """``stop_stream(cancel_requests=True)`` (inflight_batcher_llm_client.py --stop-via-request-cancel)."""
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(served.url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    c.async_stream_infer("ensemble", _inputs([PROMPTS[0]], 150, stream=True), enable_empty_final_response=True)
    r, e = q.get(timeout=60)
    assert e is None
    c.stop_stream(cancel_requests=True)
    c.close()
    # the server is free again: a new request is answered promptly
    assert streamed_text(served.url, PROMPTS[1])


# ``inflight_batcher_llm_client.py --stop-after-ms`` (a ``stop=true`` request with the running request's id ends it) is
# tested in tests/serve/test_request_metrics.py on both engine paths: this module's package has max_seq_len=192, and a
# tiny model's 150 tokens (~30 ms) were not enough room for the stop to win under a loaded CI host (lost 3 of 3 tries).


# --------------------------------------------------------------------------- Triton's HTTP generate extension
def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_generate_and_generate_stream(served, single):
    body = {"text_input": PROMPTS[0], "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": ""}  # the backend README's body
    status, data = _post(f"{served.http}/v2/models/ensemble/generate", body)
    assert status == 200, data
    assert json.loads(data)["text_output"] == single(PROMPTS[0])
    status, data = _post(f"{served.http}/v2/models/ensemble/generate_stream", {**body, "stream": True})
    assert status == 200, data
    events = [json.loads(line[len(b"data:") :]) for line in data.splitlines() if line.startswith(b"data:")]
    assert events and not any("error" in ev for ev in events), events
    assert "".join(ev.get("text_output", "") for ev in events) == single(PROMPTS[0])


# --------------------------------------------------------------------------- the TensorRT-LLM package, structurally
@pytest.fixture(scope="module")
def trt_repo(tmp_path_factory):
    """A TensorRT-LLM repository generated by the package code (a placeholder engine: it cannot be built here)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    import tiny

    from pipeline.package.repository import generate_repository, settings_from_build

    d = tmp_path_factory.mktemp("trt")
    engine = d / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps({"version": "1.1.0"}))
    (engine / "rank0.engine").write_bytes(b"\0")  # a placeholder: never loaded
    tiny.make_tokenizer(d / "tok")
    bi = {
        "target": "tensorrt_llm",
        "backend": "tensorrt",
        "limits": {"max_batch_size": 16, "max_input_len": 256, "max_seq_len": 512},
        "versions": {"tensorrt_llm": "1.1.0"},
    }
    pc = PackageConfig(name="tiny")
    s = settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json({"eos_token_ids": [2], "pad_token_id": 0, "bos_token_id": 1}), pc)
    repo = d / "repo"
    generate_repository(repo, s, engine_dir=engine, tokenizer_dirs=[d / "tok"])
    return repo


def _parse(p: Path) -> Any:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(p.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())


def _dt(cfg_msg: Any, enum_value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(enum_value)


def test_trtllm_package_ensemble_interface_matches_the_backend(trt_repo):
    cfg = _parse(trt_repo / "ensemble" / "config.pbtxt")
    ins = {i.name: i for i in cfg.input}
    for name, dt, dims, optional in _ENSEMBLE_INPUTS:
        assert name in ins and _dt(cfg, ins[name].data_type) == dt and list(ins[name].dims) == dims, name
        assert ins[name].optional == optional, name
    outs = {o.name: o for o in cfg.output}
    for name, dt, dims in _OUTPUTS:
        assert name in outs and _dt(cfg, outs[name].data_type) == dt and list(outs[name].dims) == dims, name
    steps = [s.model_name for s in cfg.ensemble_scheduling.step]
    assert steps == ["preprocessing", "tensorrt_llm", "postprocessing"]
    # postprocessing OUTPUT is the flat per-sequence array text_output [-1] is filled from
    post = _parse(trt_repo / "postprocessing" / "config.pbtxt")
    assert [(o.name, list(o.dims)) for o in post.output] == [("OUTPUT", [-1])]


def test_trtllm_package_has_bls_with_the_backend_interface(trt_repo):
    assert (trt_repo / "tensorrt_llm_bls" / "config.pbtxt").is_file()
    cfg = _parse(trt_repo / "tensorrt_llm_bls" / "config.pbtxt")
    ins = {i.name: i for i in cfg.input}
    for name, dt, dims, _optional in _BLS_INPUTS:
        assert name in ins and _dt(cfg, ins[name].data_type) == dt and list(ins[name].dims) == dims, name
    eng = _parse(trt_repo / "tensorrt_llm" / "config.pbtxt")
    assert cfg.model_transaction_policy.decoupled == eng.model_transaction_policy.decoupled
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params.get("tensorrt_llm_model_name") == "tensorrt_llm"


def test_trtllm_package_engine_model_accepts_stop_and_batch_when_decoupled(trt_repo):
    eng = _parse(trt_repo / "tensorrt_llm" / "config.pbtxt")
    names = {i.name for i in eng.input}
    assert {"stop", "streaming", "input_ids", "input_lengths", "request_output_len", "end_id", "pad_id"} <= names
    assert eng.model_transaction_policy.decoupled  # batch > 1 and streaming need decoupled (docs/reference/triton.md §1)
    assert eng.max_batch_size > 1


# --------------------------------------------------------------------------- our client (LLMClient, `pipeline client`)
def test_llmclient_construction_is_thread_safe_with_a_tokenizer_path(served):
    """8 threads creating an LLMClient with a tokenizer folder at once, in a fresh interpreter (transformers' lazy
    imports not yet resolved, as in a real client process): every one gets a working client."""
    import subprocess
    import sys

    # the tokenizer step of the construction, released at the same instant (the race: transformers' lazy imports)
    step = f"from pipeline.serve.client import _load_tokenizer\nmake = lambda: _load_tokenizer({str(served.tokenizer_dir)!r})"
    # the whole construction
    whole = (
        f"from pipeline.serve.client import LLMClient\nmake = lambda: LLMClient({served.url!r}, tokenizer={str(served.tokenizer_dir)!r})"
    )
    for setup in (step, whole):
        script = (
            setup
            + """
import threading
errors, ok = [], []
start = threading.Barrier(8)
def one():
    start.wait()
    try:
        obj = make()
        tok = getattr(obj, "tokenizer", obj)
        ok.append(tok.eos_token_id is not None)
        getattr(obj, "close", lambda: None)()
    except BaseException as e:
        errors.append(repr(e))
ts = [threading.Thread(target=one) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print(len(ok), errors)
raise SystemExit(0 if len(ok) == 8 and all(ok) and not errors else 1)
"""
        )
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]


def test_pipeline_client_uses_the_served_packages_tokenizer_not_the_newest(served, tmp_path, tok):
    """`pipeline serve` records what it serves; `pipeline client` renders with that package's chat template even when a
    newer package (another chat template) sits in the store, and refuses to guess when nothing is recorded."""
    import re
    import shutil
    import signal
    import subprocess
    import sys

    from pipeline.serve.client import LLMClient

    # a newer, complete package artifact in the store of the working folder, whose chat template differs
    newer = tmp_path / "artifacts" / "package" / "newer"
    shutil.copytree(served.tokenizer_dir, newer / "model_repository" / "preprocessing" / "1" / "tokenizer")
    cfg_p = newer / "model_repository" / "preprocessing" / "1" / "tokenizer" / "tokenizer_config.json"
    tc = json.loads(cfg_p.read_text())
    tc["chat_template"] = "{{ bos_token }}SYSTEM SAYS SOMETHING ELSE\n{% for m in messages %}{{ m['content'] }}{% endfor %}"
    cfg_p.write_text(json.dumps(tc))
    (newer / "model_repository" / "preprocessing" / "1" / "tokenizer" / "chat_template.jinja").unlink(missing_ok=True)
    (newer / "manifest.json").write_text(json.dumps({"complete": True}))

    proc, head = start_cli_server(served.package, tmp_path)
    try:
        m = re.search(r"gRPC (127\.0\.0\.1:\d+)", head)
        assert m, head
        url = m.group(1)
        with LLMClient(url, tokenizer=tok) as c:
            want = c.generate(PROMPTS[1], 8).text  # rendered with the served package's template
        r = subprocess.run(
            [sys.executable, "-m", "pipeline", "client", "--url", url, "--max-tokens", "8", "--json", PROMPTS[1]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.splitlines()[-1])["text"] == want
        # elsewhere (no record of what that server serves), the client refuses to guess and says how to fix it
        elsewhere = tmp_path / "elsewhere"
        shutil.copytree(tmp_path / "artifacts", elsewhere / "artifacts")
        r2 = subprocess.run(
            [sys.executable, "-m", "pipeline", "client", "--url", url, "--max-tokens", "8", PROMPTS[1]],
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r2.returncode == 2 and "--tokenizer" in r2.stderr and "cannot tell which package" in r2.stderr, r2.stderr
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert not (tmp_path / "runs" / "serving" / f"{url.replace(':', '_')}.json").exists()  # the record goes with the server
    finally:
        if proc.poll() is None:
            proc.kill()
