"""``pipeline client``: the command line of :class:`pipeline.serve.client.LLMClient` (one prompt or many, streamed or
not, ``--input name=value`` for any ensemble input) and its ``--parity`` mode, which replays a package's evaluated
answers against a served deployment (:func:`pipeline.serve.parity.check_against_server`).

Kept apart from the client so that the client (used by the parity check) does not import the parity check back.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError, PipelineError
from .client import (
    DEFAULT_URL,
    LLMClient,
    RequestRefused,
    RequestTimeout,
    UnknownModel,
    grpc_address,
    require_server,
    served_tokenizer,
)


def _parity_main(package: Path, url: str) -> int:
    from ..core.contracts.package import ParityExpectedMeta
    from ..errors import EXIT_GATE
    from .parity import check_against_server, side_by_side

    try:
        res = check_against_server(package, url)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    meta = ParityExpectedMeta.from_json(res)
    print(
        f"served == evaluated: {res['matched']}/{res['total']} (grpc ensemble at {url}, {' + '.join(meta.modes or [])}; "
        f"{meta.sample} of {meta.of} evaluated items, seed {meta.seed})"
    )
    if res["status"] != "passed":
        print("first difference, " + side_by_side(res["first_mismatch"]), file=sys.stderr)
        return EXIT_GATE
    return 0


def _parser() -> argparse.ArgumentParser:
    """The ``pipeline client`` argument parser."""
    ap = argparse.ArgumentParser(prog="pipeline client", description="Send prompts to the served ensemble over gRPC.")
    ap.add_argument("prompts", nargs="*", help="prompts (default: read one per line from stdin)")
    ap.add_argument("--url", default=DEFAULT_URL, help="gRPC host:port, no scheme; grpc://host:port accepted (default %(default)s)")
    ap.add_argument("--model", default="ensemble")
    # default None: a flag the user gave is told apart from its default (an --input of the same tensor conflicts with
    # the first only, _flag_conflicts); _request_inputs applies the defaults
    ap.add_argument("--max-tokens", type=int, default=None, help=f"tokens to generate at most (default {DEFAULT_MAX_TOKENS})")
    ap.add_argument("--stream", action="store_true", default=None, help="stream the answer (decoupled deployments)")
    ap.add_argument("--raw", action="store_true", help="send the text as is (no chat template)")
    ap.add_argument(
        "--tokenizer", default=None, help="tokenizer folder (default: the served package's, recorded by `pipeline serve` for --url)"
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra input (VALUE as JSON, else text), e.g. --input temperature=0.7",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object per answer")
    ap.add_argument(
        "--parity",
        metavar="PACKAGE",
        default=None,
        help="serving parity check: replay the package's parity_expected.jsonl (a package artifact or an unpacked "
        "release folder) against the server at --url; exit 3 when a served answer differs from the evaluated one",
    )
    return ap


#: ``--max-tokens`` when it is not given
DEFAULT_MAX_TOKENS = 64

#: ensemble inputs a dedicated flag sets -> that flag (the prompt, ``text_input``/``messages``, is refused as an
#: ``--input`` in :func:`_request_inputs`)
FLAG_INPUTS = {"max_tokens": "--max-tokens", "stream": "--stream"}


def _parse_inputs(items: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``--input NAME=VALUE`` items as ``({name: value}, {name: the item as typed})`` (VALUE decoded as JSON when it
    parses, else kept as text).  Raises :class:`InputError` for an item without ``NAME=`` and for a name given twice (one of them would be dropped)."""
    extra: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        k = k.strip()
        if not sep or not k:
            named = f"--input {k}=<value>, " if k and not sep else ""
            raise InputError(
                f"--input {item!r}: expected NAME=VALUE (an ensemble input's name, '=', its value as JSON or text). "
                f"Fix: {named}e.g. --input temperature=0.7 or --input 'stop_words=[\"Thanks\"]'."
            )
        if k in given:
            raise InputError(
                f"--input {given[k]} and --input {item}: both set the {k} input, and only one value can be sent. "
                f"Fix: give --input {k}=... once."
            )
        given[k] = item
        try:
            extra[k] = json.loads(v)
        except ValueError:
            extra[k] = v
    return extra, given


def _flag_conflicts(a: argparse.Namespace, given: dict[str, str]) -> None:
    """Raise :class:`InputError` when an ``--input`` (``given``: name -> the item as typed) sets a tensor that a flag
    the user gave also sets (:data:`FLAG_INPUTS`; a flag left at its default does not conflict)."""
    for name, flag in FLAG_INPUTS.items():
        value = getattr(a, flag.lstrip("-").replace("-", "_"))
        if name in given and value is not None:
            typed = flag if isinstance(value, bool) else f"{flag} {value}"
            raise InputError(
                f"--input {given[name]} and {typed}: both set the {name} input, and only one value can be sent. "
                f"Fix: use one of them ({typed}, or --input {given[name]} without {flag})."
            )


def _request_inputs(a: argparse.Namespace) -> tuple[dict[str, Any], int, bool]:
    """``(extra inputs, max_tokens, stream)`` from the parsed flags (``--input NAME=VALUE`` values decoded as JSON when
    they parse, else kept as text; :func:`_parse_inputs`).  Raises :class:`InputError` for a malformed or repeated
    ``--input``, an ``--input`` of a tensor a flag given also sets (:func:`_flag_conflicts`), ``max_tokens`` < 1, a
    ``stream`` that is not true/false, a ``--timeout`` that is not a positive number, or a prompt passed as an input."""
    extra, given = _parse_inputs(a.input)
    _flag_conflicts(a, given)
    flag = f"--input {given['max_tokens']}" if "max_tokens" in extra else f"--max-tokens={a.max_tokens}"
    max_tokens = extra.pop("max_tokens", DEFAULT_MAX_TOKENS if a.max_tokens is None else a.max_tokens)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"{flag}: must be an integer >= 1 (tokens to generate). Fix: e.g. --max-tokens 64.")
    if not (math.isfinite(a.timeout) and a.timeout > 0):
        raise InputError(
            f"--timeout {a.timeout:g}: must be a positive number of seconds per request. Fix: e.g. --timeout 120 (the default)."
        )
    stream = extra.pop("stream", bool(a.stream))
    if not isinstance(stream, bool):
        raise InputError(f"--input {given['stream']}: stream is true or false. Fix: --stream (or --input stream=true).")
    for k in ("text_input", "messages"):
        if k in extra:
            raise InputError(
                f"--input {given[k]}: the prompt arguments (or stdin, one prompt a line) set {k}. "
                f'Fix: pass the prompt as an argument instead, e.g. pipeline client "Where is my order?".'
            )
    return extra, max_tokens, stream


def _refusal_fix(a: argparse.Namespace, reason: str) -> str:
    """The fix of a request the server refused: the flags that sent what its ``reason`` names."""
    named = [f"--input {item}" for item in a.input if item.partition("=")[0] and item.partition("=")[0] in reason]
    if "max_tokens" in reason and not any(item.startswith("max_tokens=") for item in a.input):
        named.append(f"--max-tokens {DEFAULT_MAX_TOKENS if a.max_tokens is None else a.max_tokens}")
    if named:
        return f"change or drop {', '.join(named)}"
    return "change the request as the reason says (an --input value, --max-tokens, the prompt)"


def _fit_budget(a: argparse.Namespace, c: LLMClient, prompt: str, max_tokens: int) -> tuple[int, dict[str, int] | None]:
    """``(max_tokens to send, what was lowered or None)`` for one prompt, as the OpenAI endpoint decides it
    (``openai_frontend.budget``): over the room the served ``max_seq_len`` leaves after the prompt, an explicit
    ``--max-tokens`` (or ``--input max_tokens=``) is refused (exit 2, naming the room) and the default is lowered to
    the room, said on stderr; the served model would lower either silently.  Unknown room (no tokenizer, e.g.
    ``--raw``; no ``max_seq_len`` in the model's config): sent as given."""
    fit = c.room(prompt, chat=not a.raw)
    if fit is None or (max_tokens <= fit[1] and not (c.max_input_len and fit[0] > c.max_input_len)):
        return max_tokens, None
    n_prompt, room = fit
    if c.max_input_len and n_prompt > c.max_input_len:  # the served model refuses it whatever max_tokens (a recheck)
        raise InputError(
            f"the prompt has {n_prompt} tokens, over the served model's max_input_len of {c.max_input_len} tokens (the "
            f"longest prompt its engine takes). Fix: shorten the prompt to at most {c.max_input_len} tokens."
        )
    if room < 1:
        raise InputError(
            f"the prompt has {n_prompt} tokens, leaving no room to generate under the served model's maximum context "
            f"length of {c.max_seq_len} tokens. Fix: shorten the prompt to at most {(c.max_seq_len or 1) - 1} tokens."
        )
    explicit = a.max_tokens is not None or any(item.partition("=")[0].strip() == "max_tokens" for item in a.input)
    if explicit:
        flag = f"--max-tokens {max_tokens}" if a.max_tokens is not None else f"--input max_tokens={max_tokens}"
        raise InputError(
            f"{flag} exceeds the room left: the served model's maximum context length is {c.max_seq_len} tokens and the "
            f"prompt has {n_prompt}, leaving {room}. Fix: --max-tokens {room} (or less), or shorten the prompt."
        )
    print(
        f"note: max_tokens lowered from the default {max_tokens} to {room} (by {max_tokens - room}): the served model's "
        f"maximum context length is {c.max_seq_len} tokens and the prompt has {n_prompt}.",
        file=sys.stderr,
    )
    return room, {"asked": max_tokens, "sent": room}


def _json_answer(prompt: str, r: Any, lowered: dict[str, int] | None) -> dict[str, Any]:
    """The ``--json`` object of one answer: ``max_tokens_lowered`` when :func:`_fit_budget` lowered the budget, and
    ``output_tokens`` only when the served response carried a count (``sequence_length``; the ensemble returns no
    finish reason, so none is given)."""
    out: dict[str, Any] = {
        "prompt": prompt,
        "text": r.text,
        "chunks": len(r.chunks),
        "ttft_s": r.chunk_times_s[0] if r.chunk_times_s else None,
        "total_s": round(r.total_s, 4),
        "request_id": r.request_id,
    }
    if r.n_tokens is not None:
        out["output_tokens"] = r.n_tokens
    if lowered is not None:
        out["max_tokens_lowered"] = lowered
    return out


def main(argv: list[str] | None = None) -> int:
    """``pipeline client [PROMPT ...] [--url ...] [--stream] [--max-tokens N] [--input name=value ...]``."""
    from ..errors import EXIT_FAILED, EXIT_INPUT

    ap = _parser()
    a = ap.parse_args(argv)
    try:
        a.url = grpc_address(a.url)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT
    if a.parity:
        return _parity_main(Path(a.parity), a.url)
    prompts = a.prompts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    try:
        extra, max_tokens, stream = _request_inputs(a)
        require_server(a.url)  # before anything else: "no server" is one message and one exit code (4), --raw or not
        tok = a.tokenizer
        if tok is None and not a.raw:
            tok = str(served_tokenizer(a.url))

        def echo(chunk: str, _t: float) -> None:
            sys.stdout.write(chunk)
            sys.stdout.flush()

        with LLMClient(a.url, a.model, tokenizer=tok, timeout_s=a.timeout) as c:
            for p in prompts:
                budget, lowered = _fit_budget(a, c, p, max_tokens)
                if stream and not a.json:
                    r = c.generate(p, budget, stream=True, chat=not a.raw, on_chunk=echo, **extra)
                    sys.stdout.write("\n")
                else:
                    r = c.generate(p, budget, stream=stream, chat=not a.raw, **extra)
                    if a.json:
                        print(json.dumps(_json_answer(p, r, lowered), ensure_ascii=False))
                    else:
                        print(r.text)
    except UnknownModel as e:  # LLMClient's fix names its parameter; here the flag
        print(f"error: --model {e.model}: {e.reason}. Fix: --model <one of them>, e.g. --model {e.example}.", file=sys.stderr)
        return EXIT_INPUT
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except RequestRefused as e:
        print(f"error: {e}. Fix: {_refusal_fix(a, str(e))}.", file=sys.stderr)
        return EXIT_INPUT
    except RequestTimeout as e:  # LLMClient's fix names its parameters; here the flags
        print(f"error: {e.reason}. Fix: raise --timeout (now {a.timeout:g} s) or lower --max-tokens.", file=sys.stderr)
        return e.exit_code
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code if e.exit_code else EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
