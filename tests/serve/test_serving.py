"""CI smoke test with a real Triton server (nvidia-pytriton's tritonserver in .venv-serve) on a packaged repository.

The session's shared server (``served``, tests/serve/conftest.py): the real pipeline (``run_pipeline``, stages up to
``package``) turns a tiny Llama into a real onnxruntime-genai engine, evaluates and packages it; the package's repository
is served on free local ports.
Answers are compared with the engine's direct greedy output (the build target's ``EngineRunner``).
Needs ``make serve-env``; skipped with the reason when .venv-serve is missing.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from cli_serve import start_cli_server

from pipeline.serve.server import ServerError, TritonServer, free_port

pytestmark = pytest.mark.slow

PROMPTS = [
    "Where is my order ORD-12345? It was due on 2024-03-05.",
    "I want a refund for the damaged item.",
    "我的订单 ORD-55555 什么时候到？",
    "请取消订单 ORD-99871 并退款。",
    "Change the shipping address to 12 Main Street.",
]
MAX_TOKENS = 20


def _eval_prompts() -> list[str]:
    """A few prompts of the business eval set (Chinese ones included) when it is present."""
    p = Path(__file__).resolve().parents[2] / "evaluation" / "data" / "support_eval_v2.jsonl"
    if not p.is_file():
        return []
    items = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    zh = [i["prompt"] for i in items if i.get("lang") == "zh"][:2]
    en = [i["prompt"] for i in items if i.get("lang") != "zh"][:2]
    return en + zh


@pytest.fixture(scope="module")
def tokenizer(served):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(served.tokenizer_dir))


@pytest.fixture(scope="module")
def direct(served, tokenizer):
    """prompt -> text of the built engine's own greedy output (the build target's EngineRunner), decoded like the server."""
    from pipeline.core.targets import get_target
    from pipeline.core.targets.base import GenerationRequest
    from pipeline.core.tokenization import encode_prompt

    runner = get_target("onnxruntime_genai").load_runner(served.engine)
    cache: dict[tuple[str, int], str] = {}
    ids: dict[tuple[str, int], list[int]] = {}

    def run(prompt: str, max_tokens: int = MAX_TOKENS) -> str:
        if (prompt, max_tokens) not in cache:
            req = GenerationRequest(
                input_ids=encode_prompt(tokenizer, prompt), max_new_tokens=max_tokens, stop_token_ids=[tokenizer.eos_token_id]
            )
            res = runner.generate([req])[0]
            assert res.error is None, res.error
            ids[(prompt, max_tokens)] = list(res.output_ids)
            cache[(prompt, max_tokens)] = tokenizer.decode(res.output_ids, skip_special_tokens=True)
        return cache[(prompt, max_tokens)]

    run.ids = lambda prompt, max_tokens=MAX_TOKENS: (run(prompt, max_tokens), ids[(prompt, max_tokens)])[1]

    yield run
    runner.close()


@pytest.fixture()
def client(served, tokenizer):
    from pipeline.serve.client import LLMClient

    with LLMClient(served.server.grpc_url, tokenizer=tokenizer, timeout_s=60) as c:
        yield c


def test_ready_metadata_and_decoupled(served, client):
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(served.server.grpc_url)
    assert c.is_server_ready() and all(c.is_model_ready(m) for m in ("ensemble", "preprocessing", "onnxruntime_genai", "postprocessing"))
    assert client.decoupled is True
    assert client.inputs["max_tokens"]["datatype"] == "INT32" and client.inputs["text_input"]["datatype"] == "BYTES"
    c.close()


def test_streamed_and_unary_answers_equal_direct_greedy(client, direct):
    prompts = PROMPTS + _eval_prompts()
    for p in prompts:
        want = direct(p)
        non = client.generate(p, MAX_TOKENS, stream=False)
        st = client.generate(p, MAX_TOKENS, stream=True)
        assert non.text == want, p
        assert st.text == want, p
        assert "".join(st.chunks) == non.text
        # streamed: the responses' token counts add up to the ids generated (tokens that queued up while the server was
        # busy may share a response, package.stream_coalescing), arriving in order
        assert len(st.chunk_tokens) == len(st.chunks) and sum(st.chunk_tokens) == st.n_tokens == non.n_tokens
        assert st.chunk_times_s == sorted(st.chunk_times_s)


def test_sixteen_concurrent_streams(served, tokenizer, direct):
    from pipeline.serve.client import GenerateResult, generate_concurrent

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    res = generate_concurrent(served.server.grpc_url, prompts, concurrency=16, tokenizer=tokenizer, max_tokens=MAX_TOKENS, stream=True)
    assert all(isinstance(r, GenerateResult) for r in res), [r for r in res if not isinstance(r, GenerateResult)]
    assert [r.text for r in res] == [direct(p) for p in prompts]
    # a response may carry several tokens when the server joined queued ones (package.stream_coalescing): the
    # per-response counts still add up to the engine's ids, and only a final response may carry none
    for r, p in zip(res, prompts):
        assert len(r.chunk_tokens) == len(r.chunks) and sum(r.chunk_tokens) == r.n_tokens == len(direct.ids(p)), p
        assert all(k >= 1 for k in r.chunk_tokens[:-1]), r.chunk_tokens


def _raw_request(url: str, inputs: dict) -> str | None:
    """Send a hand-made request to the ensemble over the stream API; the server's error message, or None if it answered."""
    import queue

    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    ins = []
    for name, (arr, dt) in inputs.items():
        i = grpcclient.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        ins.append(i)
    try:
        c.async_stream_infer("ensemble", ins, enable_empty_final_response=True)
        while True:
            r, e = q.get(timeout=30)
            if e is not None:
                return e.message() if hasattr(e, "message") else str(e)
            p = r.get_response().parameters.get("triton_final_response")
            if p is not None and p.bool_param:
                return None
    finally:
        c.stop_stream()
        c.close()


def test_malformed_requests_get_clean_errors_and_server_keeps_serving(served, client, direct):
    url = served.server.grpc_url
    text = lambda s: (np.array([[s.encode()]], dtype=np.object_), "BYTES")  # noqa: E731
    i32 = lambda v: (np.array([[v]], dtype=np.int32), "INT32")  # noqa: E731
    assert "max_tokens" in (_raw_request(url, {"text_input": text("hi")}) or "")  # missing required input
    err = _raw_request(url, {"text_input": text("hi"), "max_tokens": (np.array([[4.0]], dtype=np.float32), "FP32")})
    assert err and "max_tokens" in err and "FP32" in err  # wrong data type
    assert "empty" in (_raw_request(url, {"text_input": text(""), "max_tokens": i32(4)}) or "")
    long = " ".join(["refund"] * 400)
    err = _raw_request(url, {"text_input": text(long), "max_tokens": i32(4)})
    assert err and "max_input_len 128" in err
    assert "max_tokens" in (_raw_request(url, {"text_input": text("hi"), "max_tokens": i32(0)}) or "")
    assert _raw_request(url, {"text_input": text("hi"), "max_tokens": i32(3)}) is None
    # local errors name the input; nothing is sent
    from pipeline.errors import InputError

    with pytest.raises(InputError, match="'max_tokens'.*INT32"):
        client.generate("hi", 1.5)
    with pytest.raises(InputError, match="not inputs of model"):
        client.generate("hi", 4, no_such_input=1)
    assert client.generate(PROMPTS[0], MAX_TOKENS).text == direct(PROMPTS[0])  # still serving


def test_sampling_inputs_stop_words_and_exclude_input(client, direct):
    want = direct(PROMPTS[0])
    assert client.generate(PROMPTS[0], MAX_TOKENS, top_k=1, temperature=1.0).text == want  # top_k=1 is greedy
    assert client.generate(PROMPTS[0], MAX_TOKENS, temperature=0.0, top_p=0.9).text == want  # temperature 0 is greedy
    sampled = {client.generate(PROMPTS[0], MAX_TOKENS, top_k=50, temperature=1.5).text for _ in range(3)}
    assert sampled != {want}  # sampling was honoured
    # a stop word = the text of a generated token (TensorRT-LLM semantics: token sequences; the stop word is kept)
    out_ids = direct.ids(PROMPTS[0])
    tok = client.tokenizer
    k = next(
        i
        for i in range(1, len(out_ids))
        if (w := tok.decode([out_ids[i]])).strip()
        and w.isascii()
        and tok(w, add_special_tokens=False)["input_ids"] == [out_ids[i]]
        and out_ids[i] not in out_ids[:i]
    )
    stopped = client.generate(PROMPTS[0], MAX_TOKENS, stop_words=[tok.decode([out_ids[k]])]).text
    assert stopped == tok.decode(out_ids[: k + 1], skip_special_tokens=True) and len(stopped) < len(want)
    # end_id: generation stops before that token (the client sends the tokenizer's eos by default)
    k2 = next(i for i in range(1, len(out_ids)) if out_ids[i] not in out_ids[:i])
    ended = client.generate(PROMPTS[0], MAX_TOKENS, end_id=int(out_ids[k2])).text
    assert ended == tok.decode(out_ids[:k2], skip_special_tokens=True)
    full = client.generate(PROMPTS[0], MAX_TOKENS, exclude_input_in_output=False).text
    assert full.endswith(want) and PROMPTS[0] in full
    from pipeline.serve.client import RequestError

    with pytest.raises(RequestError, match=r"beam_width=2 is outside this deployment's range 1\.\.1"):
        client.generate(PROMPTS[0], 4, beam_width=2)


def test_cancellation_and_timeout(client, direct):
    from pipeline.serve.client import RequestTimeout

    cancel = threading.Event()
    r = client.generate(PROMPTS[0], 150, stream=True, cancel=cancel, on_chunk=lambda s, t: cancel.set())
    assert r.cancelled and sum(r.chunk_tokens) < 150, r.chunk_tokens  # tokens: a response may carry several
    with pytest.raises(RequestTimeout):
        client.generate(PROMPTS[1], 150, stream=True, timeout_s=0.001)
    assert client.generate(PROMPTS[2], MAX_TOKENS, stream=True).text == direct(PROMPTS[2])


@pytest.mark.parametrize("item,name", [('bad_words=["x"]', "bad_words"), ("beam_width=2", "beam_width")])
def test_pipeline_client_input_the_server_refuses_is_exit_2_with_its_reason(served, capsys, item, name):
    """The served model refused the input (INVALID_ARG) and `pipeline client` exited 1 as for a server failure."""
    from pipeline.serve.client_cli import main

    url = served.server.grpc_url
    assert main(["--url", url, "--tokenizer", str(served.tokenizer_dir), "--input", item, PROMPTS[0]]) == 2
    err = capsys.readouterr().err
    assert "the server refused the request" in err and name in err and f"Fix: change or drop --input {item}" in err, err
    assert "Traceback" not in err and "server error" not in err
    assert main(["--url", url, "--tokenizer", str(served.tokenizer_dir), "--max-tokens", "4", PROMPTS[0]]) == 0  # still serving


def test_pipeline_client_model_the_server_does_not_serve_is_exit_2_naming_the_served_ones(served, capsys, direct):
    """``--model nosuch`` was exit 4 ("not ready ... check the server log"), as for a server fault; the name is the
    user's input: exit 2 naming it, the models the server's repository index lists, and ``--model <one of them>``."""
    from pipeline.serve.client import LLMClient, UnknownModel
    from pipeline.serve.client_cli import main

    url = served.server.grpc_url
    assert main(["--url", url, "--raw", "--model", "nosuch", PROMPTS[0]]) == 2
    err = capsys.readouterr().err
    assert f"--model nosuch: not a model the server at {url} serves (it serves ensemble, " in err, err
    assert "preprocessing" in err and "of these, ensemble, tensorrt_llm_bls take a prompt" in err, err
    assert "Fix: --model <one of them>, e.g. --model ensemble." in err and "model=" not in err, err
    with pytest.raises(UnknownModel, match=r"model 'nosuch': .*Fix: pass model=<one of them>, e.g. model='ensemble'") as e:
        LLMClient(url, "nosuch")
    assert e.value.exit_code == 2 and {"ensemble", "preprocessing", "postprocessing"} <= set(e.value.served)
    # a served model that takes no prompt, and an input no model has: each names the fix
    assert main(["--url", url, "--raw", "--model", "preprocessing", PROMPTS[0]]) == 2
    err = capsys.readouterr().err
    assert "are not inputs of model 'preprocessing'" in err and "Fix: send prompts to model ensemble" in err, err
    assert main(["--url", url, "--raw", "--input", "no_such_input=1", PROMPTS[0]]) == 2
    err = capsys.readouterr().err
    assert "['no_such_input'] are not inputs of model 'ensemble'" in err and "Fix: drop them" in err, err
    # a served model is still served, and an --input whose flag is left at its default is honoured
    tok = str(served.tokenizer_dir)
    assert main(["--url", url, "--tokenizer", tok, "--model", "tensorrt_llm_bls", "--input", "max_tokens=3", PROMPTS[0]]) == 0
    assert capsys.readouterr().out == direct(PROMPTS[0], 3) + "\n"


def test_pipeline_client_timeout_names_the_flag(served, capsys):
    """An expired --timeout said "Fix: raise timeout_s" (LLMClient's parameter) to a command-line user."""
    from pipeline.serve.client_cli import main

    rc = main(["--url", served.server.grpc_url, "--raw", "--stream", "--timeout", "0.0001", "--max-tokens", "150", PROMPTS[1]])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "no complete answer" in err and "Fix: raise --timeout (now 0.0001 s) or lower --max-tokens" in err, err
    assert "timeout_s" not in err


def test_pipeline_serve_cli_serves_the_package_and_stops_on_sigint(served, tmp_path):
    import re
    import signal

    from pipeline.serve.client import LLMClient

    # `make serve` runs exactly this command; the package artifact folder is given as the path argument
    proc, head = start_cli_server(served.package, tmp_path, timeout_s=120)
    try:
        m = re.search(r"gRPC (127\.0\.0\.1:\d+)", head)
        assert m, head
        with LLMClient(m.group(1), tokenizer=str(served.tokenizer_dir)) as c:
            assert c.generate(PROMPTS[2], 8, stream=True).text
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "tritonserver stopped (exit code 0)" in out  # Ctrl-C: interrupted, stopped cleanly
    finally:
        if proc.poll() is None:
            proc.kill()


def test_server_down_and_port_in_use_are_clear_errors(served):
    from pipeline.errors import InputError
    from pipeline.serve.client import LLMClient, ServerUnavailable

    with pytest.raises(ServerUnavailable, match="pipeline serve"):
        LLMClient(f"127.0.0.1:{free_port()}")
    with pytest.raises(InputError, match=f"grpc_port={served.server.grpc_port}"):
        TritonServer(served.server.repo_dir, grpc_port=served.server.grpc_port).start()


# --------------------------------------------------------------------------- TensorRT-LLM backend conformance (server side)
def _stream_request(
    url: str, inputs: dict, model: str = "ensemble", outputs: tuple[str, ...] = ("text_output",), request_id: str = ""
) -> tuple[list, str | None]:
    """One request over the stream API, as NVIDIA's end_to_end_grpc_client sends it: (responses as {name: array}, error)."""
    import queue

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    ins = []
    for name, arr in inputs.items():
        i = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        i.set_data_from_numpy(arr)
        ins.append(i)
    got: list = []
    try:
        c.async_stream_infer(
            model,
            ins,
            outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
            request_id=request_id,
            enable_empty_final_response=True,
        )
        while True:
            r, e = q.get(timeout=60)
            if e is not None:
                return got, e.message() if hasattr(e, "message") else str(e)
            d = {o: r.as_numpy(o) for o in outputs}
            if any(v is not None for v in d.values()):
                got.append(d)
            p = r.get_response().parameters.get("triton_final_response")
            if p is not None and p.bool_param:
                return got, None
    finally:
        c.stop_stream()
        c.close()


def _texts(*s: str) -> np.ndarray:
    return np.array([[x.encode()] for x in s], dtype=np.object_)


def _col(dtype, *v) -> np.ndarray:
    return np.array([[x] for x in v], dtype=dtype)


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_output_shapes_are_the_tensorrt_llm_backends(served, tokenizer, direct, model):
    # NVIDIA's end_to_end_grpc_client reads text_output[0] as bytes and batch_index/perf metrics as [0][0]
    # (tensorrtllm_backend inflight_batcher_llm/client/end_to_end_grpc_client.py; C++ backend fillTritonResponse)
    from pipeline.core.tokenization import render

    prompt = render(tokenizer, PROMPTS[0])
    want = direct(PROMPTS[0])
    perf = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "kv_cache_alloc_new_blocks")
    outs = ("text_output", "batch_index", "sequence_index") + perf
    for stream in (False, True):
        got, err = _stream_request(
            served.server.grpc_url,
            {
                "text_input": _texts(prompt),
                "max_tokens": _col(np.int32, MAX_TOKENS),
                "stream": _col(bool, stream),
                "return_perf_metrics": _col(bool, True),
            },
            model=model,
            outputs=outs,
        )
        assert err is None, err
        assert all(r["text_output"].shape == (1,) and isinstance(r["text_output"][0], bytes) for r in got), [r["text_output"] for r in got]
        assert "".join(r["text_output"][0].decode("utf-8") for r in got) == want
        for r in got:
            assert r["batch_index"].shape == (1, 1) and r["batch_index"][0][0] == 0
            assert all(r[m].shape == (1, 1) for m in perf), {m: r[m].shape for m in perf}
            assert r["arrival_time_ns"][0][0] <= r["first_token_time_ns"][0][0] <= r["last_token_time_ns"][0][0]
        assert stream or len(got) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_three_prompts_in_one_request_get_three_answers(served, tokenizer, direct, stream):
    from pipeline.core.tokenization import render

    prompts = PROMPTS[:3]
    got, err = _stream_request(
        served.server.grpc_url,
        {
            "text_input": _texts(*[render(tokenizer, p) for p in prompts]),
            "max_tokens": _col(np.int32, *[MAX_TOKENS] * 3),
            "stream": _col(bool, *[stream] * 3),
        },
        outputs=("text_output", "batch_index"),
    )
    assert err is None, err
    texts = ["", "", ""]
    for r in got:
        texts[int(r["batch_index"][0][0])] += r["text_output"][0].decode("utf-8")
    assert texts == [direct(p) for p in prompts]
    # a per-row input whose row count is not the number of prompts is refused with the input's name
    _, err = _stream_request(served.server.grpc_url, {"text_input": _texts("a", "b", "c"), "max_tokens": _col(np.int32, 4, 4)})
    assert err and "batch size does not match" in err  # Triton refuses it before the model runs


@pytest.mark.parametrize(
    "name,value,dtype",
    [
        ("presence_penalty", 0.5, np.float32),
        ("frequency_penalty", 0.3, np.float32),
        ("beam_width", 2, np.int32),
        ("num_return_sequences", 2, np.int32),
        ("embedding_bias_words", b"x", np.object_),
    ],
)
def test_inputs_the_cpu_engine_cannot_honour_are_refused_by_name(served, name, value, dtype):
    got, err = _stream_request(
        served.server.grpc_url, {"text_input": _texts("hello"), "max_tokens": _col(np.int32, 4), name: _col(dtype, value)}
    )
    assert err and name in err and not got, (got, err)


def test_random_seed_is_honoured_or_refused(served, client, direct):
    import json as _json

    engine_cfg = _json.loads((served.package / "model_repository" / "onnxruntime_genai" / "1" / "engine" / "genai_config.json").read_text())
    seeded = lambda s: client.generate(PROMPTS[0], MAX_TOKENS, top_k=50, temperature=1.5, random_seed=s).text  # noqa: E731
    if "dynamic_batching" in engine_cfg.get("engine", {}):
        assert seeded(7) == seeded(7)
    else:
        from pipeline.serve.client import RequestError

        with pytest.raises(RequestError, match="random_seed"):
            seeded(7)
    assert client.generate(PROMPTS[0], MAX_TOKENS, random_seed=7).text == direct(PROMPTS[0])  # greedy: the seed changes nothing


def test_out_of_vocabulary_ids_get_a_clear_error_and_the_engine_keeps_serving(served, client, direct):
    # issue 16 item 2: ids >= vocab sent straight to the engine model used to leave og.Engine unhealthy for every later request
    url = served.server.grpc_url
    for bad in (10**6, -5):
        got, err = _stream_request(
            url,
            {"input_ids": np.array([[5, bad, 7]], np.int32), "input_lengths": _col(np.int32, 3), "request_output_len": _col(np.int32, 4)},
            model="onnxruntime_genai",
            outputs=("output_ids",),
        )
        assert err and "vocabulary" in err and str(bad) in err
    ids = client.tokenizer(PROMPTS[1], add_special_tokens=False)["input_ids"]
    got, err = _stream_request(
        url,
        {"input_ids": np.array([ids], np.int32), "input_lengths": _col(np.int32, len(ids)), "request_output_len": _col(np.int32, 4)},
        model="onnxruntime_genai",
        outputs=("output_ids", "sequence_length"),
    )
    assert err is None and got[-1]["output_ids"].shape[:2] == (1, 1) and got[-1]["sequence_length"].shape == (1, 1)
    for p in PROMPTS[:2]:
        assert client.generate(p, MAX_TOKENS, stream=True).text == direct(p)


_VICTIM = r"""
import os, sys
import numpy as np
import tritonclient.grpc as g
c = g.InferenceServerClient(sys.argv[1])
n = int(sys.argv[3])
running = set()
def on_response(result, error):  # the process dies once every request has produced a token (all are running)
    if result is not None:
        running.add(result.get_response().id)
    if len(running) == n:
        os._exit(0)
c.start_stream(callback=on_response)
def inp(name, arr, dt):
    i = g.InferInput(name, list(arr.shape), dt); i.set_data_from_numpy(arr); return i
for k in range(n):
    c.async_stream_infer(sys.argv[2], [inp("text_input", np.array([[b"Where is my order?"]], dtype=object), "BYTES"),
                                       inp("max_tokens", np.array([[170]], np.int32), "INT32"),
                                       inp("min_length", np.array([[170]], np.int32), "INT32"),
                                       inp("stream", np.array([[True]]), "BOOL")], request_id=f"{sys.argv[4]}{k}")
import time
time.sleep(60)
os._exit(1)
"""


@pytest.fixture(scope="module")
def own_server(served, tmp_path_factory):
    """A server of its own on the shared package, for the tests that kill clients mid-stream: on a loaded host a
    vanished client once left the shared server answering nothing (60 s), failing every later test on it."""
    with TritonServer(served.server.repo_dir, ready_timeout_s=180, log_dir=tmp_path_factory.mktemp("vanished-log")) as s:
        yield s


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_a_vanished_streaming_client_stops_its_generation(own_server, tokenizer, direct, tmp_path, model):
    import re
    import subprocess
    import sys
    import time

    from pipeline.serve.client import LLMClient

    script = tmp_path / "victim.py"
    script.write_text(_VICTIM)
    # one request, as in issue 13 (a dead client's request ran to the end). With several requests on one dead stream,
    # Triton 2.51 flags only some of them as cancelled (measured 3 of 16 and 16 of 16 in two runs): those stop, the rest
    # run to their end - a Triton limitation documented in docs/package.md. The tiny engine generates the 170 tokens in
    # ~0.1-0.2 s, so the disconnect can lose the race on a loaded host: up to six victims, one must be stopped early
    # (three lost in a row once under the 2-worker suite on a slow host, six in a row with one request per victim:
    # each victim now sends four, any one of them stopped early counts).
    stopped: list[int] = []
    for attempt in range(6):
        tag = f"vanished-{model}-{attempt}-"
        subprocess.run([sys.executable, str(script), own_server.grpc_url, model, "4", tag], check=True, timeout=120)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not stopped:
            lines = [ln for ln in own_server.log_tail(200000).splitlines() if tag in ln and "cancelled by the client" in ln]
            stopped = [int(re.search(r"after (\d+) generated", ln).group(1)) for ln in lines]
            time.sleep(0.25)
        if stopped:
            break
    assert stopped and stopped[0] < 170, stopped  # without cancellation the request runs its 170 tokens (min_length)
    with LLMClient(own_server.grpc_url, tokenizer=tokenizer, timeout_s=60) as client:
        assert client.generate(PROMPTS[0], MAX_TOKENS, stream=True).text == direct(PROMPTS[0])


def test_shutdown_is_clean(served, tokenizer, tmp_path):
    # a second server on the same repository: start, answer, stop with exit code 0; a broken repository keeps its log.
    # The shared server is never stopped here: the second one gets the kinds of requests the shared one gets (answered,
    # cancelled, refused, timed out) before it stops (the shared one is checked the same way at the session's end).
    from pipeline.serve.client import LLMClient, RequestError, RequestTimeout

    with TritonServer(served.server.repo_dir, ready_timeout_s=120, log_dir=tmp_path / "a") as s2:
        with LLMClient(s2.grpc_url) as c:
            assert c.generate("hello", 3, chat=False).request_id
        with LLMClient(s2.grpc_url, tokenizer=tokenizer, timeout_s=60) as c:
            cancel = threading.Event()
            assert c.generate(PROMPTS[0], 150, stream=True, cancel=cancel, on_chunk=lambda s, t: cancel.set()).cancelled
            with pytest.raises(RequestTimeout):
                c.generate(PROMPTS[1], 150, stream=True, timeout_s=0.001)
            with pytest.raises(RequestError, match="beam_width"):
                c.generate(PROMPTS[0], 4, beam_width=2)
        assert "max_tokens" in (_raw_request(s2.grpc_url, {"text_input": (np.array([[b"hi"]], dtype=np.object_), "BYTES")}) or "")
    assert s2.returncode == 0 and not s2.is_running()
    bad = tmp_path / "bad"
    (bad / "m" / "1").mkdir(parents=True)
    (bad / "m" / "config.pbtxt").write_text("max_batch_size: ${oops}\n")
    with pytest.raises(ServerError, match="tritonserver") as ei:
        TritonServer(bad, ready_timeout_s=60, log_dir=tmp_path / "b").start()
    assert (tmp_path / "b" / "tritonserver.log").is_file() and str(tmp_path / "b" / "tritonserver.log") in str(ei.value)
    # last: the server, after every request above (cancelled and failed ones included), exited cleanly:
    # no request left in flight (Triton would wait for its exit timeout and exit 1)
    assert s2.returncode == 0
    assert "in-flight inferences" not in s2.log_tail(20000).split("Signal (15) received.")[-1].replace(
        "Found 0 model versions that have in-flight inferences", ""
    )
