"""Peak memory of a piece of work: host RSS of this process, of its child processes, and GPU memory.

Linux facts used (proc(5), getrusage(2)):

* ``VmHWM`` in ``/proc/self/status`` is the process's peak resident set size; writing ``5`` to
  ``/proc/self/clear_refs`` resets it to the current RSS (Linux >= 4.0), so one process can measure the peak of
  each stage it runs in turn.
* ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` is the largest peak RSS of any waited-for child (KiB). It cannot be
  reset, so a stage's child peak is known only when it exceeds every earlier child's (``None`` otherwise).
* GPU: ``torch.cuda.max_memory_allocated`` per device, reset at the start (only when torch is already imported
  and CUDA is initialised: measuring never imports torch or creates a CUDA context).

Every figure is in bytes. Where the platform offers none of these (not Linux), the fields are ``None``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str, status: Path = _STATUS) -> int | None:
    try:
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes() -> int | None:
    """Current resident set size of this process (``VmRSS``), bytes; None off Linux."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_rss_bytes() -> int | None:
    """Peak resident set size of this process since start or the last :func:`reset_peak_rss` (``VmHWM``), bytes."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


#: peaks seen by enclosing :func:`measure` blocks, carried over each reset (so nested measurements stay exact).
_ACTIVE: list[PeakMemory] = []


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (``echo 5 > /proc/self/clear_refs``); False where that is not allowed.

    The peak reached so far is first carried into every enclosing :func:`measure` record."""
    now = peak_rss_bytes()
    for rec in _ACTIVE:
        rec._carried = max(rec._carried, now or 0)
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def children_peak_rss_bytes() -> int:
    """Largest peak RSS of any child process waited for so far (``RUSAGE_CHILDREN.ru_maxrss``, KiB on Linux), bytes."""
    return int(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024


def _cuda() -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


@dataclasses.dataclass
class PeakMemory:
    """What :func:`measure` found. ``process_peak_rss_bytes`` is exact when ``reset`` is True (else an upper bound:
    the process's peak since it started); ``child_peak_rss_bytes`` is None when no child of this stage exceeded the
    earlier children's peak; ``gpu_peak_bytes`` maps ``cuda:N`` to ``max_memory_allocated``."""

    process_peak_rss_bytes: int | None = None
    start_rss_bytes: int | None = None
    child_peak_rss_bytes: int | None = None
    gpu_peak_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    reset: bool = False
    _carried: int = dataclasses.field(default=0, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if not k.startswith("_")}


@contextlib.contextmanager
def measure() -> Iterator[PeakMemory]:
    """Measure the peak memory of the ``with`` body; the yielded record is filled in when the body ends (also on error).

    Nests: an inner measurement resets the kernel's peak counter, and carries what it saw into the enclosing ones."""
    rec = PeakMemory(start_rss_bytes=rss_bytes(), reset=reset_peak_rss())
    children_before = children_peak_rss_bytes()
    cuda = _cuda()
    if cuda is not None and not _ACTIVE:  # nested: the enclosing block's GPU peak is kept (this one is an upper bound)
        for d in range(cuda.device_count()):
            cuda.reset_peak_memory_stats(d)
    _ACTIVE.append(rec)
    try:
        yield rec
    finally:
        _ACTIVE.remove(rec)
        now = peak_rss_bytes()
        rec.process_peak_rss_bytes = None if now is None else max(now, rec._carried)
        for outer in _ACTIVE:
            outer._carried = max(outer._carried, rec.process_peak_rss_bytes or 0)
        after = children_peak_rss_bytes()
        rec.child_peak_rss_bytes = after if after > children_before else None
        cuda = _cuda()
        if cuda is not None:
            rec.gpu_peak_bytes = {f"cuda:{d}": int(cuda.max_memory_allocated(d)) for d in range(cuda.device_count())}


def run_sampled(cmd: list[str], *, interval_s: float = 0.1, **popen_kw: Any) -> tuple[int, int | None]:
    """Run ``cmd`` to completion (``subprocess.Popen``), sampling the child's ``VmHWM`` every ``interval_s``.

    ``getrusage`` cannot give a child's own peak: a child created by fork carries its parent's resident pages into
    ``ru_maxrss`` until it execs. ``VmHWM`` of ``/proc/<pid>/status`` is the exec'd program's own peak and only grows,
    so its last sample is the peak up to at most ``interval_s`` before exit.

    Returns:
        ``(exit code, peak RSS bytes or None when it could not be read)``.
    """
    import subprocess
    import time

    proc = subprocess.Popen(cmd, **popen_kw)
    status = Path(f"/proc/{proc.pid}/status")
    peak: int | None = None
    try:
        while proc.poll() is None:
            kib = _status_kib("VmHWM", status)
            if kib is not None:
                peak = max(peak or 0, kib * 1024)
            time.sleep(interval_s)
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP (KeyboardInterrupt): the child (a model builder) must not outlive us
        proc.kill()
        proc.wait()
        raise
    return int(proc.returncode), peak


#: glibc ``mallopt`` parameters (malloc.h): M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Allocations from this size up get their own mapping, returned to the OS when freed (bytes).
MMAP_THRESHOLD = 1 << 20


def tune_allocator() -> bool:
    """Make freed tensor memory go back to the OS (glibc only; a no-op elsewhere). Returns whether it was applied.

    glibc raises its mmap threshold each time a mapped block is freed, up to 32 MiB on 64-bit hosts (mallopt(3),
    "M_MMAP_THRESHOLD"), so after the first large free every weight-sized tensor below 32 MiB lands on the heap, where
    freed blocks stay resident. Loading, calibrating and exporting a model one tensor at a time then leaves the
    process holding far more than it uses (measured: the 80 M shape's quantize stage peaked at 1.68 GB RSS with the
    dynamic threshold and at 1.13 GB with a fixed one, docs/memory.md). Setting the threshold fixes it at
    :data:`MMAP_THRESHOLD` and turns the dynamic adjustment off; the trim threshold is set to the same size.
    ``MALLOC_MMAP_THRESHOLD_`` in the environment wins (glibc reads it at start; this call is skipped).
    """
    import ctypes
    import ctypes.util
    import os

    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, MMAP_THRESHOLD))
    return ok
