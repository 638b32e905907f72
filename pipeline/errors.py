"""Exceptions with the exit code a CI job can act on.

| code | meaning |
|------|---------|
| 0    | success |
| 1    | a stage failed unexpectedly (a bug or an environment fault; see the log) |
| 2    | bad configuration or bad input (checkpoint, calibration set, eval set): fix the input |
| 3    | the evaluation gate failed: the candidate is not good enough to ship |
| 4    | preflight failed: this machine cannot run the request (missing TensorRT-LLM, GPU, ...) |
| 130  | interrupted (SIGINT, SIGTERM, SIGHUP) |
"""

from __future__ import annotations

import re
from collections.abc import Sequence

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_GATE, EXIT_PREFLIGHT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

#: The longest line (bytes, UTF-8) a line-oriented data file may hold: eval sets, JSONL / text calibration sets.
#: 1 MiB is hundreds of times any prompt the engines take (``build.max_input_len`` tokens of a few bytes each); a
#: longer line is refused before it is parsed or tokenized (a 100 MB line otherwise drives the tokenizer past 10 GB).
MAX_LINE_BYTES = 1 << 20

#: How many problems of one data file a message lists (every one is still counted): eval and calibration sets.
MAX_REPORTED_PROBLEMS = 20


def listed_problems(head: str, problems: list[str]) -> str:
    """``HEAD: N problem(s):`` then the first :data:`MAX_REPORTED_PROBLEMS` of them :func:`grouped` (a mistake made on
    100 lines is one entry), one per line, and ``... and K more`` (entries)."""
    shown = grouped(problems)
    more = f"\n  ... and {len(shown) - MAX_REPORTED_PROBLEMS} more" if len(shown) > MAX_REPORTED_PROBLEMS else ""
    return f"{head}: {len(problems)} problem(s):\n  - " + "\n  - ".join(shown[:MAX_REPORTED_PROBLEMS]) + more


_LOCATED = re.compile(r"(?P<src>.+?)(?::(?P<line>\d+)|\[(?P<unit>row|item) (?P<n>\d+)\]): (?P<rest>.+)", re.S)


def grouped(texts: Sequence[str]) -> list[str]:
    """``texts`` to print, those that differ only in the line (``file:N: ...``) or row / item (``source[row N]: ...``)
    they name printed once, where the first of them was: ``file lines 1-3, 5 (4 lines): ...`` (a data file's 8 lines
    with the same mistake printed the same message 8 times). A text no other shares is printed as it is."""
    groups: dict[tuple[str, str, str], tuple[str, list[int]]] = {}
    order: list[tuple[str, str, str] | str] = []
    for t in texts:
        m = _LOCATED.fullmatch(t)
        if m is None:
            order.append(t)
            continue
        key = (m["src"], m["unit"] or "line", m["rest"])
        if key not in groups:
            groups[key] = (t, [])
            order.append(key)
        groups[key][1].append(int(m["line"] or m["n"]))
    out = []
    for k in order:
        if isinstance(k, str):
            out.append(k)
            continue
        first, nums = groups[k]
        out.append(first if len(nums) == 1 else f"{k[0]} {k[1]}s {_ranges(nums)} ({len(nums)} {k[1]}s): {k[2]}")
    return out


def _ranges(nums: list[int]) -> str:
    """``1-3, 5, 7-9`` of ``[1, 2, 3, 5, 7, 8, 9]``; past 12 spans the first 10, ``...`` and the last (every third
    line of a 3,000-line file listed 1,000 numbers: a recheck)."""
    spans: list[list[int]] = []
    for n in sorted(set(nums)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    return ", ".join(shown if len(shown) <= 12 else [*shown[:10], "...", shown[-1]])


class PipelineError(RuntimeError):
    """Base class: an error whose message is meant for the user (no traceback needed)."""

    exit_code = EXIT_FAILED


class InputError(PipelineError, ValueError):
    """Bad input (checkpoint, data file, config value). The message names the field/file, the value and the fix."""

    exit_code = EXIT_INPUT


class SelfCheckError(PipelineError):
    """A self-check of the pipeline's own output failed (e.g. a restored model does not reproduce the calibrated one on
    the same kind of device): a product fault, not the user's input (exit 1). The message holds the diagnosis."""

    exit_code = EXIT_FAILED


class GateFailed(PipelineError):
    """The evaluation gate failed, or a later stage refused an artifact whose gate failed."""

    exit_code = EXIT_GATE


class PreflightError(PipelineError):
    """The environment cannot run the request; the message says how to fix it (install, container, GPU)."""

    exit_code = EXIT_PREFLIGHT


def line_too_long(where: str, nbytes: int, fix: str) -> InputError:
    """The InputError for a line over :data:`MAX_LINE_BYTES` (``where`` is ``file:line``)."""
    return InputError(f"{where}: the line holds {nbytes:,} bytes, over the limit of {MAX_LINE_BYTES:,} bytes per line. Fix: {fix}.")


INTERRUPT = {"received": False}
"""Set by the ``pipeline`` command's signal handler (``pipeline.cli._interrupt_once``) when a Ctrl-C, SIGTERM or SIGHUP
stops a run; it stays set, so a sweep runs no further job."""


def caused_by_interrupt(e: BaseException) -> bool:
    """Whether ``e`` was caused by a KeyboardInterrupt (followed through ``__cause__`` / ``__context__``), or came after
    one the command's handler received (:data:`INTERRUPT`): Python wraps an interrupt raised while a class body runs,
    transformers' lazy import re-raises what an import raised as ``ModuleNotFoundError``, and safetensors'
    ``get_tensor`` turned one into a ValueError with no context (a recheck), so a Ctrl-C at that moment reached the
    runner as an ordinary exception (exit 1)."""
    if INTERRUPT["received"]:
        return True
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False
