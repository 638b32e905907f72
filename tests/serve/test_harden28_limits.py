"""Issue 28 M-2: request limits that fail fast, on a real Triton server and the real OpenAI front end.

Before: a 10 MB ``text_input`` was tokenized whole before the length check (22-35 s, and a normal request sent
meanwhile waited as long); a 50 MB OpenAI body was read and parsed; 500 prompts x n=16 were accepted; 10^5 nested
``[`` gave an HTTP 500 (RecursionError).  Now the served model and the front end refuse by bytes before anything is
tokenized, bound prompts x n, and bound JSON depth, each answer naming the limit.

The session's shared real Triton server (``.venv-serve``; ``served``, tests/serve/conftest.py) on a package the real
pipeline made (tiny Llama, onnxruntime-genai), with the OpenAI front end on it.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from pipeline.core.tokenization import MAX_REQUEST_GENERATIONS, MIN_PROMPT_BYTES, prompt_byte_limit

pytestmark = pytest.mark.slow
HUGE = "word " * (2 << 20)  # 10 MiB of text


def _small_answer(served, out: dict) -> None:
    from pipeline.serve.client import LLMClient

    t0 = time.perf_counter()
    with LLMClient(served.server.grpc_url) as c:
        out["text"] = c.generate("Where is my order?", 4, chat=False).text
    out["s"] = time.perf_counter() - t0


def test_the_served_model_derives_the_byte_limit_and_the_package_records_the_setting(served):
    cfg = (served.repo / "ensemble" / "config.pbtxt").read_text()
    assert 'key: "max_prompt_bytes"' in cfg  # package.max_prompt_bytes (0: derived by the model)
    assert prompt_byte_limit(128, 10) == MIN_PROMPT_BYTES and prompt_byte_limit(4096, 64) == 4096 * 64 * 4
    assert prompt_byte_limit(128, 10, configured=5000) == 5000


def test_grpc_refuses_an_oversized_prompt_by_bytes_and_a_concurrent_small_request_is_answered(served):
    from pipeline.serve.client import LLMClient

    small: dict = {}
    errors: list[str] = []

    def huge() -> None:
        try:
            with LLMClient(served.server.grpc_url) as c:
                c.generate(HUGE, 4, chat=False)
        except Exception as e:  # the refusal
            errors.append(str(e))

    t = threading.Thread(target=huge)
    t0 = time.perf_counter()
    t.start()
    time.sleep(0.2)  # the huge request is on its way (not an assertion: ordering only)
    _small_answer(served, small)
    t.join(timeout=120)
    print(f"huge refused after {time.perf_counter() - t0:.2f} s; small answered in {small['s']:.3f} s")
    assert errors and "over this deployment's limit of" in errors[0] and "bytes per prompt" in errors[0], errors
    assert "max_prompt_bytes" in errors[0]
    assert small["text"], small
    with LLMClient(served.server.grpc_url) as c:  # the same small prompt alone: the same answer
        assert c.generate("Where is my order?", 4, chat=False).text == small["text"]


def _post(served, route: str, body: bytes | dict, timeout: float = 120) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{served.oai.url}/{route}", data=data, headers={"content-type": "application/json"}, timeout=timeout)


def test_openai_refuses_oversized_bodies_and_prompts_naming_the_limit(served):
    big = _post(served, "completions", {"model": "tiny", "prompt": HUGE, "max_tokens": 2})
    assert big.status_code == 400 and big.json()["error"]["code"] == "request_too_large", big.text
    assert "over this endpoint's limit of" in big.json()["error"]["message"]
    one = _post(served, "completions", {"model": "tiny", "prompt": "x" * (MIN_PROMPT_BYTES + 1), "max_tokens": 2})
    err = one.json()["error"]
    assert one.status_code == 400 and err["param"] == "prompt" and "max_prompt_bytes" in err["message"], one.text
    chat = _post(served, "chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "y" * (MIN_PROMPT_BYTES + 1)}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages", chat.text


def test_openai_bounds_prompts_times_n(served):
    r = _post(served, "completions", {"model": "tiny", "prompt": ["hi"] * 500, "n": 16, "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt", r.text
    assert f"500 prompt(s) x n=16 = 8000 generations in one request, over the limit of {MAX_REQUEST_GENERATIONS}" in err["message"]


def test_openai_deeply_nested_json_is_a_400_not_a_500(served):
    r = _post(served, "completions", b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400 and "nests 100000 levels deep, over the limit of 64" in r.json()["error"]["message"], r.text
    ok = _post(served, "completions", {"model": "tiny", "prompt": "Where is my order?", "max_tokens": 2, "user": "[[[{{{"})
    assert ok.status_code == 200, ok.text  # brackets inside strings do not count


def test_openai_oversized_request_does_not_hold_up_a_concurrent_one(served):
    out: dict = {}

    def huge() -> None:
        out["huge"] = _post(served, "completions", {"model": "tiny", "prompt": "z" * (3 << 20), "max_tokens": 2})

    t = threading.Thread(target=huge)
    t.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    small = _post(served, "completions", {"model": "tiny", "prompt": "Where is my order?", "max_tokens": 2})
    print(f"small completion answered in {time.perf_counter() - t0:.3f} s next to a 3 MiB prompt")
    t.join(timeout=120)
    assert small.status_code == 200 and small.json()["choices"][0]["text"] is not None, small.text
    assert out["huge"].status_code == 400 and out["huge"].json()["error"]["param"] == "prompt", out["huge"].text
