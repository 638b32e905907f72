"""An onnxruntime-genai engine folder's runtime limits and its model builder run as a logged child process, shared by
the ``onnxruntime_genai`` build target and the benchmark's reference engine (``builder_int4``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from ..errors import PipelineError


def run_logged(cmd: list[str], logf: Path, title: str, env: dict[str, str] | None = None) -> int | None:
    """Run ``cmd``, appending its stdout+stderr to ``logf``; raise PipelineError with the log tail on failure.

    Returns the child's peak RSS in bytes (:func:`pipeline.core.memory.run_sampled`; None when unreadable)."""
    from .memory import run_sampled

    with open(logf, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(map(str, cmd))}\n")
        fh.flush()
        code, peak = run_sampled([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        tail = "".join(Path(logf).read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-25:])
        raise PipelineError(f"{title} failed (exit {code}); last lines of {logf}:\n{tail}")
    return peak


def set_runtime_limits(engine: Path, *, max_batch_size: int, max_seq_len: int) -> dict[str, Any]:
    """Write the batch and length limits into ``engine/genai_config.json`` (in place); return the config.

    * ``search.max_length = max_seq_len``: the runtime refuses a prompt that leaves no room before it;
    * ``engine.static_batching.max_batch_size = max_batch_size``: og.Engine schedules a static batch on a
      non-paged model (paged attention, ``engine.dynamic_batching``, is CUDA-only in onnxruntime-genai 0.18); without
      this key 0.18 caps it at 4 sequences (``Engine.get_capabilities().configured_max_batch_size``).
    """
    gc_path = Path(engine) / "genai_config.json"
    gc = json.loads(gc_path.read_text(encoding="utf-8"))
    gc.setdefault("search", {})["max_length"] = int(max_seq_len)
    eng = gc.setdefault("engine", {})
    if "dynamic_batching" not in eng:
        eng.setdefault("static_batching", {})["max_batch_size"] = int(max_batch_size)
    gc_path.write_text(json.dumps(gc, indent=4) + "\n", encoding="utf-8")
    return gc
