"""Issue 24 case 4: metrics that count failures and cancellations, read from a real Triton server's ``/metrics``.

A tiny Llama package made by the real pipeline (CPU target: the ``ensemble`` is the decoupled Python model that runs
the onnxruntime-genai engine), served by the Triton 2.51 binary of the nvidia-pytriton wheel.  Triton counts a request
of a decoupled Python model when ``execute`` returns, before generation: only a refusal raised from ``execute`` is in
``nv_inference_request_failure``.  Our counter (``pipeline/serve/models/request_metrics.py``) counts each request
once when it ends.  Old code: no such counter; a cancelled stream and a failure after the first token were successes.

The failure after the first streamed token uses the model's TEST-ONLY fault injection: no real input makes og.Engine
fail once it streamed a token (its limits are checked before admission), and killing the engine's process (as
tests/serve/test_serve_health.py does) kills the counter with it.  The server of this module is started with
``PIPELINE_TEST_FAULT_AFTER_TOKENS=3`` in its environment (read at model load, off by default, never settable by a
request); only requests whose id starts with ``test-fault-`` fail, at their third token, on the path of a real engine
failure (every request in flight fails, the engine is rebuilt).
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from pipeline.serve.models.genai_scheduling import FAULT_ENV, FAULT_REQUEST_PREFIX
from pipeline.serve.models.request_metrics import REASONS, REQUESTS_ENDED, parse_requests_ended
from pipeline.serve.server import DEFAULT_SERVE_VENV

pytestmark = pytest.mark.slow

PROMPT = "Where is my order?"
LONG = 4000  # tokens a request to be cancelled must generate (min_length): ~0.85 s of work for this tiny model here (measured),
# ~170x the few ms a cancel or a stop sent on an open stream takes to land (900 tokens took 0.12 s: CI lost that race)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")
    import tiny
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.runner import run_pipeline

    ckpt = tiny.make_checkpoint(tmp_path_factory.mktemp("ckpt"), "llama", max_position_embeddings=4096)
    store = tmp_path_factory.mktemp("store")
    cfg = compose(
        [
            f"model.path={ckpt}",
            "model.name=tiny",
            "target=onnxruntime_genai",
            "quant=none",
            "stages=[package]",
            f"store_dir={store}",
            "eval.limit=2",
            "eval.gate.mode=exploratory",
            "package.allow_failed_gate=true",
            "package.parity=false",
            "build.max_input_len=128",  # the eval prompts (evaluate runs before package: its length check applies)
            "build.max_seq_len=4096",
            "progress=false",
        ]
    )
    summary = run_pipeline(cfg, console=Console(quiet=True))
    assert summary.exit_code == 0, summary.error
    return {r.stage: Path(r.path) for r in summary.stages}["package"]


@pytest.fixture(scope="module")
def srv(package):
    from pipeline.serve.server import TritonServer

    old = os.environ.get(FAULT_ENV)
    os.environ[FAULT_ENV] = "3"  # the server process (and its Python-backend stubs) inherit it at start
    try:
        s = TritonServer(package / "model_repository", ready_timeout_s=180).start()
    finally:
        if old is None:
            os.environ.pop(FAULT_ENV, None)
        else:
            os.environ[FAULT_ENV] = old
    try:
        yield s
    finally:
        s.stop()


def _metrics_text(srv) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def _triton(text: str, model: str) -> dict[str, float]:
    """Triton's own request counters of ``model``: ``success`` and ``failure:<reason>``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("nv_inference_request_success", "nv_inference_request_failure"):
            if line.startswith(name + "{") and f'model="{model}"' in line:
                key = "success" if name.endswith("success") else "failure:" + line.split('reason="', 1)[1].split('"', 1)[0]
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


class Counts:
    """Snapshot of both counters of a model; :meth:`delta` waits until ``n`` more requests ended (our counter is
    incremented after the final response was sent, so it can trail the client by a round trip)."""

    def __init__(self, srv, model: str = "ensemble") -> None:
        self.srv, self.model = srv, model
        text = _metrics_text(srv)
        self.ours, self.triton = parse_requests_ended(text, model), _triton(text, model)

    def delta(self, n: int) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
        deadline = time.monotonic() + 30
        while True:
            text = _metrics_text(self.srv)
            ours = {k: v - self.ours.get(k, 0.0) for k, v in parse_requests_ended(text, self.model).items()}
            triton = {k: v - self.triton.get(k, 0.0) for k, v in _triton(text, self.model).items()}
            if sum(ours.values()) >= n or time.monotonic() > deadline:
                return {k: v for k, v in ours.items() if v}, {k: v for k, v in triton.items() if v}
            time.sleep(0.1)


def _check_relation(ours: dict, triton: dict) -> None:
    """Both count every request once: our total equals Triton's success + failure."""
    assert sum(ours.values()) == sum(triton.values()), (ours, triton)


def test_every_outcome_series_is_on_metrics_from_the_start(srv):
    """The counter is on Triton's /metrics for every served copy of the engine model, each outcome/reason at load."""
    text = _metrics_text(srv)
    assert f"# TYPE {REQUESTS_ENDED} counter" in text, text[:2000]
    for model in ("ensemble", "tensorrt_llm_bls", "onnxruntime_genai"):
        series = parse_requests_ended(text, model)
        assert set(series) == {(o, r) for o, rs in REASONS.items() for r in rs}, (model, series)


def test_a_success_counts_once_as_success(srv):
    from pipeline.serve.client import LLMClient

    c0 = Counts(srv)
    with LLMClient(srv.grpc_url) as c:
        assert c.generate(PROMPT, 4, chat=False).text is not None
        assert c.generate(PROMPT, 4, chat=False, stream=True).chunks
    ours, triton = c0.delta(2)
    assert ours == {("success", "none"): 2}, ours
    assert triton == {"success": 2}, triton
    _check_relation(ours, triton)


def test_a_refused_request_counts_as_failure_here_and_in_triton(srv):
    from pipeline.serve.client import LLMClient, RequestError

    c0 = Counts(srv)
    with LLMClient(srv.grpc_url) as c:
        for stream in (False, True):
            with pytest.raises(RequestError, match="repetition_penalty must be > 0"):
                c.generate(PROMPT, 4, chat=False, stream=stream, repetition_penalty=-1.0)
    ours, triton = c0.delta(2)
    assert ours == {("failure", "refused"): 2}, ours
    assert triton == {"failure:BACKEND": 2}, triton
    _check_relation(ours, triton)


def test_a_client_cancelled_stream_counts_as_cancelled(srv):
    """``LLMClient(cancel=...)`` ends the gRPC stream with ``stop_stream(cancel_requests=True)`` (NVIDIA's
    inflight_batcher_llm_client ``--stop-via-request-cancel``); the model sees ``is_cancelled()`` and ends it.
    Triton itself counts the request as a success (it counted it when ``execute`` returned)."""
    from pipeline.serve.client import LLMClient

    c0 = Counts(srv)
    cancel = threading.Event()
    with LLMClient(srv.grpc_url) as c:
        r = c.generate(PROMPT, LONG, chat=False, stream=True, min_length=LONG, cancel=cancel, on_chunk=lambda s, t: cancel.set())
    assert r.cancelled and sum(r.chunk_tokens) < LONG, r.chunk_tokens
    ours, triton = c0.delta(1)
    assert ours == {("cancelled", "client"): 1}, ours
    assert triton == {"success": 1}, triton  # what Triton 2.51 counts by itself
    _check_relation(ours, triton)


def test_failures_after_generation_started_count_as_failures(srv):
    """Streamed: the client got tokens, then the engine failed the request (``mid_stream``).  Unstreamed: nothing was
    sent before the failure (``engine_error``).  Triton counts both as successes.  The engine is rebuilt after each
    (the real recovery path), so the next request is answered."""
    from pipeline.serve.client import LLMClient, RequestError

    c0 = Counts(srv)
    chunks: list[str] = []
    with LLMClient(srv.grpc_url) as c:
        with pytest.raises(RequestError, match="injected fault") as ei:
            c.generate(
                PROMPT,
                40,
                chat=False,
                stream=True,
                min_length=40,
                request_id=f"{FAULT_REQUEST_PREFIX}{uuid.uuid4().hex[:8]}",
                on_chunk=lambda s, t: chunks.append(s),
            )
        assert "engine error" in str(ei.value), ei.value
        assert chunks, "no token reached the client before the failure: not a mid-stream failure"
        with pytest.raises(RequestError, match="injected fault"):
            c.generate(PROMPT, 40, chat=False, min_length=40, request_id=f"{FAULT_REQUEST_PREFIX}{uuid.uuid4().hex[:8]}")
        assert c.generate(PROMPT, 4, chat=False, stream=True).chunks  # served again (a request id without the prefix)
    ours, triton = c0.delta(3)
    assert ours == {("failure", "mid_stream"): 1, ("failure", "engine_error"): 1, ("success", "none"): 1}, ours
    assert triton == {"success": 3}, triton  # nv_inference_request_failure misses both failures
    _check_relation(ours, triton)


@pytest.mark.parametrize("log_probs", [False, True], ids=["engine", "generator-log-probs"])
def test_a_request_ended_by_the_stop_input_counts_as_cancelled(srv, log_probs):
    """TensorRT-LLM's ``stop`` input on the token-id model (``onnxruntime_genai``; NVIDIA's inflight_batcher_llm_client
    ``--stop-after-ms``): a ``stop=true`` request with the running request's id ends it, on both engine paths (og.Engine,
    and og.Generator for ``return_log_probs``).  The running request counts as cancelled/stop, the stop request itself
    as a success; a ``stop=true`` without a request id is refused, here and in Triton's failure counter."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    def tensors(**kv: np.ndarray) -> list:
        out = []
        for k, a in kv.items():
            i = grpcclient.InferInput(k, list(a.shape), {np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL"}[a.dtype])
            i.set_data_from_numpy(a)
            out.append(i)
        return out

    ids = np.array([[1, 40, 41, 42, 43]], dtype=np.int32)
    common = {"input_ids": ids, "input_lengths": np.array([[ids.shape[1]]], np.int32)}
    c0 = Counts(srv, "onnxruntime_genai")
    rid = uuid.uuid4().hex[:12]
    c, stopper = grpcclient.InferenceServerClient(srv.grpc_url), grpcclient.InferenceServerClient(srv.grpc_url)
    stop = tensors(**common, request_output_len=np.array([[1]], np.int32), stop=np.array([[True]]))
    sq: queue.Queue = queue.Queue()
    stopper.start_stream(callback=lambda result, error: sq.put((result, error)))  # open before the request starts
    q: queue.Queue = queue.Queue()
    sent = threading.Event()

    def on_response(result, error) -> None:
        q.put((result, error))
        if not sent.is_set():  # the first streamed token: stop it now, from the callback, with no setup in between
            sent.set()
            stopper.async_stream_infer("onnxruntime_genai", stop, request_id=rid, enable_empty_final_response=True)

    c.start_stream(callback=on_response)
    c.async_stream_infer(
        "onnxruntime_genai",
        tensors(
            **common,
            request_output_len=np.array([[LONG]], np.int32),
            min_length=np.array([[LONG]], np.int32),
            streaming=np.array([[True]]),
            **({"return_log_probs": np.array([[True]])} if log_probs else {}),
        ),
        request_id=rid,
        enable_empty_final_response=True,
    )
    n, final = 0, False  # every generated token, the first response's included
    while not final:
        r, e = q.get(timeout=60)
        assert e is None, e
        seq = r.as_numpy("sequence_length")
        n += 0 if seq is None else int(seq.reshape(-1)[0])
        p = r.get_response().parameters.get("triton_final_response")
        final = p is not None and p.bool_param
    assert sq.get(timeout=60)[1] is None
    stopper.async_stream_infer("onnxruntime_genai", stop, enable_empty_final_response=True)
    refused = sq.get(timeout=60)[1]
    assert refused is not None and "stop=true needs the request id" in str(refused), refused
    c.stop_stream()
    stopper.stop_stream()
    c.close()
    stopper.close()
    assert n < LONG, n  # ended by the stop, not by its budget
    ours, triton = c0.delta(3)
    assert ours == {("cancelled", "stop"): 1, ("success", "none"): 1, ("failure", "refused"): 1}, ours
    assert triton == {"success": 2, "failure:BACKEND": 1}, triton
    _check_relation(ours, triton)
