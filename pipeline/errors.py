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

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_GATE, EXIT_PREFLIGHT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

#: The longest line (bytes, UTF-8) a line-oriented data file may hold: eval sets, JSONL / text calibration sets.
#: 1 MiB is hundreds of times any prompt the engines take (``build.max_input_len`` tokens of a few bytes each); a
#: longer line is refused before it is parsed or tokenized (a 100 MB line otherwise drives the tokenizer past 10 GB).
MAX_LINE_BYTES = 1 << 20

#: How many problems of one data file a message lists (every one is still counted): eval and calibration sets.
MAX_REPORTED_PROBLEMS = 20


def listed_problems(head: str, problems: list[str]) -> str:
    """``HEAD: N problem(s):`` then the first :data:`MAX_REPORTED_PROBLEMS`, one per line, and ``... and K more``."""
    more = f"\n  ... and {len(problems) - MAX_REPORTED_PROBLEMS} more" if len(problems) > MAX_REPORTED_PROBLEMS else ""
    return f"{head}: {len(problems)} problem(s):\n  - " + "\n  - ".join(problems[:MAX_REPORTED_PROBLEMS]) + more


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


def caused_by_interrupt(e: BaseException) -> bool:
    """Whether ``e`` was caused by a KeyboardInterrupt (followed through ``__cause__`` / ``__context__``): Python wraps
    an interrupt raised while a class body runs, and transformers' lazy import re-raises what an import raised as
    ``ModuleNotFoundError``, so a Ctrl-C at that moment reached the runner as an ordinary exception (exit 1)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False
