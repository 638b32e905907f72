"""OpenAI-compatible endpoint (``pipeline serve --openai``) tested with the official ``openai`` Python SDK as the client.

The session's shared real Triton server (``.venv-serve``; ``served`` and ``sdk``, tests/serve/conftest.py) on a package
made by the real pipeline (tiny Llama, fp32 onnxruntime-genai engine), with the OpenAI front end in front of it.
Answers are compared with the gRPC ensemble's answer for the same rendered prompt (``LLMClient``).
"""

from __future__ import annotations

import json
import re
import signal
import threading

import pytest
from cli_serve import start_cli_server

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")

PROMPTS = ["Where is my order ORD-12345?", "I want a refund for the damaged item.", "我的订单什么时候到？"]


@pytest.fixture(scope="module")
def tok(served):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(served.tokenizer_dir))


@pytest.fixture(scope="module")
def grpc_answer(served, tok):
    """(text as sent, max_tokens) -> the gRPC ensemble's greedy answer (no template applied by the client)."""
    from pipeline.serve.client import LLMClient

    cache: dict = {}

    def get(text: str, max_tokens: int) -> str:
        if (text, max_tokens) not in cache:
            with LLMClient(served.server.grpc_url, tokenizer=tok) as c:
                cache[(text, max_tokens)] = c.generate(text, max_tokens, chat=False).text
        return cache[(text, max_tokens)]

    return get


def test_models_lists_the_served_model(sdk):
    assert [m.id for m in sdk.models.list().data] == ["tiny"]


def test_completion_equals_the_grpc_ensemble_and_counts_tokens(sdk, grpc_answer, tok):
    r = sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert r.choices[0].text == grpc_answer(PROMPTS[0], 12)
    ids = tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    assert r.usage.prompt_tokens == len(ids) + 1  # the served preprocessing prepends BOS to a text without one
    # the generated ids, not the text re-encoded (which need not round-trip: tests/serve/test_fixa_openai.py)
    assert r.usage.completion_tokens == 12 if r.choices[0].finish_reason == "length" else 0 < r.usage.completion_tokens < 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason in ("length", "stop")


def test_streamed_completion_joins_to_the_unary_text_with_usage(sdk, grpc_answer):
    chunks = list(
        sdk.completions.create(
            model="tiny", prompt=PROMPTS[2], max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == grpc_answer(PROMPTS[2], 12)
    # really streamed: text events, then the usage event (one text event may carry several tokens when they queued up
    # while the server was busy, package.stream_coalescing)
    assert len([c for c in chunks if c.choices and c.choices[0].text]) >= 1 and len(chunks) >= 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_chat_applies_the_served_chat_template_server_side(sdk, grpc_answer, tok):
    from pipeline.core.tokenization import render

    rendered = render(tok, PROMPTS[1])
    assert rendered != PROMPTS[1]  # the template does something
    r = sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=12, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == grpc_answer(rendered, 12)
    assert r.usage.prompt_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])
    stream = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == grpc_answer(rendered, 12)


def test_concurrent_requests_each_get_their_own_answer(sdk, grpc_answer):
    prompts = [PROMPTS[i % 3] for i in range(8)]
    out: dict[int, str] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            if i % 2:
                out[i] = sdk.completions.create(model="tiny", prompt=prompts[i], max_tokens=10, temperature=0).choices[0].text
            else:
                out[i] = "".join(
                    c.choices[0].text
                    for c in sdk.completions.create(model="tiny", prompt=prompts[i], max_tokens=10, temperature=0, stream=True)
                    if c.choices
                )
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors, errors
    assert [out[i] for i in range(8)] == [grpc_answer(p, 10) for p in prompts]


def test_stop_cuts_before_the_stop_string(sdk, grpc_answer):
    full = grpc_answer(PROMPTS[0], 16)
    k = next(i for i in range(2, len(full)) if full[i].isalnum() and full.find(full[i : i + 2]) == i)
    stop = full[k : k + 2]
    for stream in (False, True):
        if stream:
            chunks = list(sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[stop], stream=True))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            r = sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=stop)
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert text == full[:k] and reason == "stop", (stream, stop, text)


def test_n_and_sampling(sdk, grpc_answer):
    r = sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1] and {c.text for c in r.choices} == {grpc_answer(PROMPTS[0], 8)}
    sampled = {
        sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=1.5, top_p=1.0).choices[0].text for _ in range(3)
    }
    assert sampled != {grpc_answer(PROMPTS[0], 8)}  # temperature > 0 samples


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"logprobs": 2}, "logprobs"),
        ({"n": 17}, "n"),
        ({"echo": True}, "echo"),
        ({"temperature": 3.0}, "temperature"),
        ({"extra_body": {"unknown_field": 1}}, "unknown_field"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
    ],
)
def test_unsupported_or_invalid_fields_are_refused_naming_them(sdk, kwargs, param):
    with pytest.raises(openai.BadRequestError) as ei:
        sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, **kwargs)
    assert ei.value.body["param"] == param and param in ei.value.body["message"]


def test_every_logprobs_request_is_refused_naming_the_field(sdk):
    """Issue 36: ``logprobs: 0`` on completions answered 200 with ``logprobs: null`` (OpenAI returns the sampled tokens'
    log probs) and chat ``top_logprobs: 0`` was accepted; every value OpenAI answers with log probs is now a 400."""
    with pytest.raises(openai.BadRequestError) as ei:
        sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, logprobs=0)
    assert ei.value.body["param"] == "logprobs" and "logprobs=0" in ei.value.body["message"], ei.value.body
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    for kwargs, param in (
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 0}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ):
        with pytest.raises(openai.BadRequestError) as ei:
            sdk.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, **kwargs)
        assert ei.value.body["param"] == param and "Fix: remove" in ei.value.body["message"], (kwargs, ei.value.body)
    off = sdk.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, logprobs=False, temperature=0)
    assert off.choices[0].logprobs is None  # logprobs=false asks for none: answered


@pytest.mark.parametrize(
    "kind, body, param",
    [
        ("completions", {"logprobs": 0}, "logprobs"),
        ("completions", {"logprobs": 5}, "logprobs"),
        ("completions", {"logprobs": False}, "logprobs"),
        ("chat", {"logprobs": True}, "logprobs"),
        ("chat", {"top_logprobs": 0}, "top_logprobs"),
        ("chat", {"logprobs": False, "top_logprobs": 1}, "top_logprobs"),
    ],
)
def test_parse_common_refuses_every_logprobs_value(kind, body, param):
    from pipeline.serve.openai_schema import APIError, parse_common

    with pytest.raises(APIError) as ei:
        parse_common({"model": "m", **body}, kind)
    assert ei.value.param == param and f"{param}=" in ei.value.message, ei.value.message
    parse_common({"model": "m", "logprobs": None, "top_logprobs": None}, kind)  # unset: accepted
    if kind == "chat":
        parse_common({"model": "m", "logprobs": False}, kind)


def test_unknown_model_is_404(sdk):
    with pytest.raises(openai.NotFoundError, match="tiny"):
        sdk.completions.create(model="gpt-4o", prompt="hi", max_tokens=4)


def test_pipeline_serve_openai_binds_localhost_and_answers(served, tmp_path):
    proc, head = start_cli_server(served.package, tmp_path, "--openai", "package.openai_port=0", until="Ctrl-C")
    try:
        m = re.search(r"OpenAI-compatible endpoint: (http://127\.0\.0\.1:\d+/v1)", head)
        assert m, head
        c = openai.OpenAI(base_url=m.group(1), api_key="unused", max_retries=0)
        assert (
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
            .choices[0]
            .message.content
            is not None
        )
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out  # Ctrl-C: interrupted (docs/cli.md exit codes), after a clean stop
    finally:
        if proc.poll() is None:
            proc.kill()


def test_models_route_is_plain_json(served):
    import urllib.request

    with urllib.request.urlopen(f"{served.oai.url}/models", timeout=30) as r:
        assert json.loads(r.read())["object"] == "list"


def test_unknown_field_message_lists_what_is_honoured_apart_from_what_is_refused():
    """The refusal of an unknown field listed logprobs, tools, ... as honoured: they are refused unless unset."""
    from pipeline.serve.openai_schema import APIError, parse_common

    with pytest.raises(APIError) as ei:
        parse_common({"model": "m", "messages": [], "foo": 1}, "chat")
    msg = ei.value.message
    honoured = msg.split("honours ", 1)[1].split(" (and accepts", 1)[0]
    assert "'temperature'" in honoured and "'seed'" in honoured
    assert not any(f"'{f}'" in honoured for f in ("logprobs", "tools", "logit_bias", "best_of", "response_format"))
    assert "'tools'" in msg.split("(and accepts", 1)[1] and ei.value.param == "foo"
