"""Run the ``pipeline`` command as a user would, in a subprocess, for the tests that check its exit codes and messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_pipeline_cli(*args: str, cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline *args`` in ``cwd`` with this checkout on ``PYTHONPATH`` and pytest's variables removed
    (``env`` adds or replaces variables); stdout and stderr captured as text."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    e.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
