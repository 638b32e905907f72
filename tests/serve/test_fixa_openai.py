"""OpenAI front end: errors name the OpenAI field the client sent (``seed``), not the backend input it maps to.

The session's shared server (tests/serve/conftest.py: a real Triton server on a real tiny fp32 onnxruntime-genai
package, CPU: its engine has no ``engine.dynamic_batching``, so a seeded sampling request is refused by the deployment).
"""

from __future__ import annotations

import pytest
from test_openai import PROMPTS, openai

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_seed_with_sampling_refusal_names_seed(sdk, route):
    with pytest.raises(openai.BadRequestError) as ei:
        if route == "completions":
            sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, seed=1)  # default temperature 1
        else:
            sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=4, seed=1)
    body = ei.value.body
    assert body["param"] == "seed"
    assert "seed=1" in body["message"] and "random_seed" not in body["message"]
    assert "temperature=0" in body["message"]  # the fix, in the client's terms


def test_seed_with_greedy_is_accepted(sdk):
    r = sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0, seed=1)
    assert r.choices[0].text == sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0).choices[0].text


def _check_counts(choices, usage, max_tokens: int) -> None:
    # every choice that ran to the limit generated exactly max_tokens ids; one that stopped early generated fewer
    n_len = sum(c.finish_reason == "length" for c in choices)
    if n_len == len(choices):
        assert usage.completion_tokens == max_tokens * len(choices)
    else:
        assert max_tokens * n_len <= usage.completion_tokens < max_tokens * len(choices)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_sampled_completion_tokens_count_generated_ids(sdk):
    # sampled ids need not round-trip through their text (byte pieces cut mid-character give U+FFFD -> 3 ids on
    # re-encoding, unmerged pieces re-encode to fewer): the count must be the ids the engine generated
    r = sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=2.0, n=16)
    _check_counts(r.choices, r.usage, 8)
    one = sdk.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once, not once per choice (OpenAI)
    c = sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[2]}], max_tokens=8, temperature=2.0, n=16)
    _check_counts(c.choices, c.usage, 8)


def test_streamed_sampled_completion_tokens_count_generated_ids(sdk):
    chunks = list(
        sdk.completions.create(
            model="tiny", prompt=PROMPTS[2], max_tokens=8, temperature=2.0, n=8, stream=True, stream_options={"include_usage": True}
        )
    )
    finals = {}
    for ch in chunks:
        for c in ch.choices:
            if c.finish_reason:
                finals[c.index] = c
    assert len(finals) == 8 and chunks[-1].usage is not None
    _check_counts(list(finals.values()), chunks[-1].usage, 8)
