"""``pipeline client``: the command line of :class:`pipeline.serve.client.LLMClient` (one prompt or many, streamed or
not, ``--input name=value`` for any ensemble input) and its ``--parity`` mode, which replays a package's evaluated
answers against a served deployment (:func:`pipeline.package.parity.check_against_server`).

Kept apart from the client so that the client (used by the parity check) does not import the parity check back.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from ..core.errors import InputError, PipelineError
from .client import DEFAULT_URL, LLMClient, RequestRefused, RequestTimeout, grpc_address, require_server, served_tokenizer


def _parity_main(package: Path, url: str) -> int:
    from ..core.errors import EXIT_GATE
    from ..package.parity import check_against_server, side_by_side

    try:
        res = check_against_server(package, url)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(
        f"served == evaluated: {res['matched']}/{res['total']} (grpc ensemble at {url}, {' + '.join(res.get('modes') or [])}; "
        f"{res.get('sample')} of {res.get('of')} evaluated items, seed {res.get('seed')})"
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
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stream", action="store_true", help="stream the answer (decoupled deployments)")
    ap.add_argument("--raw", action="store_true", help="send the text as is (no chat template)")
    ap.add_argument(
        "--tokenizer", default=None, help="tokenizer folder (default: the served package's, recorded by `pipeline serve` for --url)"
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=JSON", help="extra input, e.g. --input temperature=0.7")
    ap.add_argument("--json", action="store_true", help="print one JSON object per answer")
    ap.add_argument(
        "--parity",
        metavar="PACKAGE",
        default=None,
        help="serving parity check: replay the package's parity_expected.jsonl (a package artifact or an unpacked "
        "release folder) against the server at --url; exit 3 when a served answer differs from the evaluated one",
    )
    return ap


def _request_inputs(a: argparse.Namespace) -> tuple[dict[str, Any], int, bool]:
    """``(extra inputs, max_tokens, stream)`` from the parsed flags (``--input NAME=JSON`` values decoded as JSON when
    they parse, else kept as text).  Raises :class:`InputError` for ``max_tokens`` < 1, a ``--timeout`` that is not a
    positive number, or a prompt passed as an input."""
    extra: dict[str, Any] = {}
    for item in a.input:
        k, _, v = item.partition("=")
        try:
            extra[k] = json.loads(v)
        except ValueError:
            extra[k] = v
    flag = "--input max_tokens" if "max_tokens" in extra else "--max-tokens"
    max_tokens = extra.pop("max_tokens", a.max_tokens)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"{flag}={max_tokens!r}: must be an integer >= 1 (tokens to generate). Fix: e.g. --max-tokens 64.")
    if not (math.isfinite(a.timeout) and a.timeout > 0):
        raise InputError(
            f"--timeout {a.timeout:g}: must be a positive number of seconds per request. Fix: e.g. --timeout 120 (the default)."
        )
    stream = bool(extra.pop("stream", a.stream))
    for k in ("text_input", "messages"):
        if k in extra:
            raise InputError(f"--input {k}=... : pass the prompt as an argument instead.")
    return extra, max_tokens, stream


def _refusal_fix(a: argparse.Namespace, reason: str) -> str:
    """The fix of a request the server refused: the flags that sent what its ``reason`` names."""
    named = [f"--input {item}" for item in a.input if item.partition("=")[0] and item.partition("=")[0] in reason]
    if "max_tokens" in reason and not any(item.startswith("max_tokens=") for item in a.input):
        named.append(f"--max-tokens {a.max_tokens}")
    if named:
        return f"change or drop {', '.join(named)}"
    return "change the request as the reason says (an --input value, --max-tokens, the prompt)"


def main(argv: list[str] | None = None) -> int:
    """``pipeline client [PROMPT ...] [--url ...] [--stream] [--max-tokens N] [--input name=value ...]``."""
    from ..core.errors import EXIT_FAILED, EXIT_INPUT

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
                if stream and not a.json:
                    r = c.generate(p, max_tokens, stream=True, chat=not a.raw, on_chunk=echo, **extra)
                    sys.stdout.write("\n")
                else:
                    r = c.generate(p, max_tokens, stream=stream, chat=not a.raw, **extra)
                    if a.json:
                        print(
                            json.dumps(
                                {
                                    "prompt": p,
                                    "text": r.text,
                                    "chunks": len(r.chunks),
                                    "ttft_s": r.chunk_times_s[0] if r.chunk_times_s else None,
                                    "total_s": round(r.total_s, 4),
                                    "request_id": r.request_id,
                                },
                                ensure_ascii=False,
                            )
                        )
                    else:
                        print(r.text)
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
