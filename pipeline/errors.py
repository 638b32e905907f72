"""Exceptions with the exit code a CI job can act on.

| code | meaning |
|------|---------|
| 0    | success |
| 1    | a stage failed unexpectedly (a bug or an environment fault; see the log) |
| 2    | bad configuration or bad input (checkpoint, calibration set, eval set): fix the input |
| 3    | the evaluation gate failed: the candidate is not good enough to ship |
| 4    | preflight failed: this machine cannot run the request (missing TensorRT-LLM, GPU, ...) |
| 130  | interrupted (SIGINT) |
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_GATE, EXIT_PREFLIGHT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130


class PipelineError(RuntimeError):
    """Base class: an error whose message is meant for the user (no traceback needed)."""

    exit_code = EXIT_FAILED


class InputError(PipelineError, ValueError):
    """Bad input (checkpoint, data file, config value). The message names the field/file, the value and the fix."""

    exit_code = EXIT_INPUT


class GateFailed(PipelineError):
    """The evaluation gate failed, or a later stage refused an artifact whose gate failed."""

    exit_code = EXIT_GATE


class PreflightError(PipelineError):
    """The environment cannot run the request; the message says how to fix it (install, container, GPU)."""

    exit_code = EXIT_PREFLIGHT
