"""Start ``pipeline serve`` as a user (or ``make serve``) does, for the tests that drive the CLI server."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def start_cli_server(package: Path, cwd: Path, *extra: str, until: str = "ready:", timeout_s: float = 180) -> tuple[subprocess.Popen, str]:
    """Run ``python -m pipeline serve PACKAGE`` on free ports (``package.*_port=0``) plus ``extra`` arguments, and read
    its output up to the line starting with ``until`` (or its end). Returns the process (still running; the caller
    stops it) and the output read so far."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "serve",
            str(package),
            "package.grpc_port=0",
            "package.http_port=0",
            "package.metrics_port=0",
            *extra,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline() if proc.stdout else ""
        lines.append(line)
        if line.startswith(until) or not line:
            break
    return proc, "".join(lines)
