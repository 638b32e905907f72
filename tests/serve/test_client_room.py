"""``pipeline client`` and the served model's room: the served model lowers a ``max_tokens`` over the room its
``max_seq_len`` leaves after the prompt without a word (fresh-user trial: ``--json --max-tokens 100000 hi`` exited 0
with a short answer and no note), while the OpenAI endpoint refuses it with a 400 naming the room.  The client now
decides as the endpoint does: an explicit ``--max-tokens`` over the room is exit 2 naming the room; the default is
lowered to it and said (stderr, and ``max_tokens_lowered`` in ``--json``)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from pipeline.errors import InputError
from pipeline.serve import client_cli
from pipeline.serve.client_cli import main


def test_max_tokens_over_the_room_is_refused_as_the_openai_endpoint_does(served, capsys):
    import urllib.error
    import urllib.request

    tok = str(served.tokenizer_dir)
    rc = main(["--url", served.url, "--tokenizer", tok, "--json", "--max-tokens", "100000", "hi"])
    cap = capsys.readouterr()
    assert rc == 2, cap.err
    assert cap.out == ""  # nothing sent, nothing answered
    m = re.search(
        r"--max-tokens 100000 exceeds the room left: .* maximum context length is 192 tokens and the prompt has (\d+), leaving (\d+)\. Fix: --max-tokens (\d+)",
        cap.err,
    )
    assert m and int(m.group(1)) + int(m.group(2)) == 192 and m.group(2) == m.group(3), cap.err
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}
    req = urllib.request.Request(
        f"{served.oai.url}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    text = e.value.read().decode()
    assert e.value.code == 400 and f"leaving {m.group(2)}." in text, text  # the same room, counted the same way


def test_json_answer_carries_the_served_token_count_and_nothing_invented(served, capsys):
    rc = main(["--url", served.url, "--tokenizer", str(served.tokenizer_dir), "--json", "--max-tokens", "4", "hi"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    obj = json.loads(cap.out)
    assert 1 <= obj["output_tokens"] <= 4  # the ensemble's sequence_length
    assert "max_tokens_lowered" not in obj and "finish_reason" not in obj  # the ensemble returns no finish reason
    assert "note:" not in cap.err


def _args(*argv: str):
    return client_cli._parser().parse_args([*argv, "hi"])


def _client(n_prompt: int, max_seq_len: int = 192, max_input_len: int | None = None):
    return SimpleNamespace(
        max_seq_len=max_seq_len, max_input_len=max_input_len, room=lambda prompt, chat: (n_prompt, max_seq_len - n_prompt)
    )


@pytest.mark.parametrize("argv", [[], ["--max-tokens", "4"]])
def test_a_prompt_over_max_input_len_is_refused_naming_it(argv, capsys):
    """A recheck: a prompt over the served max_input_len (128) but under max_seq_len (192) got "max_tokens lowered"
    and was then refused by the server; it is refused first, as the OpenAI endpoint refuses it, whatever max_tokens."""
    with pytest.raises(InputError, match="the prompt has 150 tokens, over the served model's max_input_len of 128 tokens"):
        client_cli._fit_budget(_args(*argv), _client(150, max_input_len=128), "hi", 4 if argv else client_cli.DEFAULT_MAX_TOKENS)
    assert "note:" not in capsys.readouterr().err


def test_the_default_is_lowered_to_the_room_and_said(capsys):
    budget, lowered = client_cli._fit_budget(_args(), _client(150), "hi", client_cli.DEFAULT_MAX_TOKENS)
    assert budget == 42 and lowered == {"asked": 64, "sent": 42}
    assert "max_tokens lowered from the default 64 to 42 (by 22)" in capsys.readouterr().err
    obj = client_cli._json_answer(
        "hi", SimpleNamespace(text="x", chunks=["x"], chunk_times_s=[0.1], total_s=0.1, request_id="r", n_tokens=None), lowered
    )
    assert obj["max_tokens_lowered"] == {"asked": 64, "sent": 42} and "output_tokens" not in obj


@pytest.mark.parametrize(
    "argv,flag", [(["--max-tokens", "50"], "--max-tokens 50"), (["--input", "max_tokens=50"], "--input max_tokens=50")]
)
def test_an_explicit_budget_over_the_room_is_refused_naming_the_flag(argv, flag):
    with pytest.raises(InputError, match=f"{flag} exceeds the room left: .* leaving 42. Fix: --max-tokens 42"):
        client_cli._fit_budget(_args(*argv), _client(150), "hi", 50)


def test_unknown_room_sends_the_budget_as_given():
    assert client_cli._fit_budget(_args("--raw", "--max-tokens", "100000"), SimpleNamespace(room=lambda p, chat: None), "hi", 100000) == (
        100000,
        None,
    )
