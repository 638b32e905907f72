"""Run ``tritonserver`` so that neither it nor a Python-backend stub outlives the process that started it.

    python -I reaper.py PARENT_PID PDEATH SHM_PREFIX -- tritonserver ARGS...

Standalone on purpose (standard library only, started with ``python -I`` by :class:`pipeline.serve.server.TritonServer`
before any ``pipeline`` import could fail). It is the session leader of the server's process group and:

* asks the kernel for ``SIGTERM`` when its parent dies (``PDEATH`` = 1: Linux ``prctl(PR_SET_PDEATHSIG)``, see
  prctl(2); the signal follows the parent *thread*, so the caller sets it only from its main thread), and exits at once
  when the parent is already gone (``PARENT_PID`` differs from ``getppid()``);
* is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, prctl(2)): a stub whose server exited is re-parented to
  this process, never to init - Triton 2.51's stubs ignore SIGTERM and, once orphaned, ran on for hours;
* forwards SIGTERM / SIGINT to the server, waits for it to exit, then SIGKILLs every process still re-parented to it
  (the orphaned stubs), reaps them, and removes the server's ``/dev/shm/SHM_PREFIX*`` regions (the Python backend's
  ``shm-region-prefix-name``, so only this server's regions match);
* exits with the server's exit code (128 + signal number when a signal ended it).

A SIGKILL of this process itself (an OOM kill) leaves what it could not clean: :func:`sweep_stale_shm` removes the
regions of a server whose owner is gone when the next server starts.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SHM_DIR = "/dev/shm"
#: seconds the server gets after SIGTERM before it is killed (Triton's ``--exit-timeout-secs`` is 15)
STOP_GRACE_S = 25.0


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """PIDs whose parent is this process (from ``/proc/<pid>/stat``, field 4)."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me:
            out.append(int(name))
    return out


def kill_orphans() -> None:
    """SIGKILL and reap every process still re-parented to this one, until none is left."""
    for _ in range(50):
        kids = _children()
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.02)


def remove_shm(prefix: str) -> None:
    if not prefix:
        return
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass


def sweep_stale_shm(family: str) -> None:
    """Remove ``/dev/shm/<family><pid>_*`` regions whose owner ``pid`` no longer runs (a server whose owner was
    SIGKILLed before it could clean up)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if not name.startswith(family):
            continue
        pid = name[len(family) :].split("_", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its owner still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass


def main(argv: list[str]) -> int:
    parent, pdeath, prefix = int(argv[0]), argv[1] == "1", argv[2]
    command = argv[argv.index("--") + 1 :]
    stopping = {"sig": 0}

    def on_signal(sig: int, _frame: object) -> None:
        stopping["sig"] = sig

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if pdeath:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        return 0
    server = subprocess.Popen(command)  # stdout/stderr: inherited (the server log)
    sent_at: float | None = None
    rc: int | None = None
    while rc is None:
        if stopping["sig"] and sent_at is None:
            sent_at = time.monotonic()
            try:
                server.send_signal(signal.SIGTERM)  # Triton's graceful shutdown
            except ProcessLookupError:
                pass
        if sent_at is not None and time.monotonic() - sent_at > STOP_GRACE_S:
            server.kill()
        try:
            rc = server.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
    kill_orphans()
    remove_shm(prefix)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
