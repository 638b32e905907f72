"""Issue 28 M-1: no orphaned Triton stubs after a CI cancel.

A CI runner cancels a job with SIGKILL to its process group.  Before: when that happened while the package stage's
parity server loaded its models, Triton's Python-backend stubs were re-parented to init and ran on for hours (they
ignore SIGTERM), each holding a ``/dev/shm`` region.  Now every server runs under ``pipeline/serve/reaper.py``: a
child subreaper with a parent-death signal that stops the server, SIGKILLs the stubs and removes their regions.

The real CLI runs the real chain (tiny Llama, onnxruntime-genai) up to the package stage in a process group of its
own; the group is SIGKILLed as soon as the parity server's first stub exists.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_hardening import PIPELINE, _env

from pipeline.serve.server import DEFAULT_SERVE_VENV

pytestmark = pytest.mark.slow
STUB = b"triton_python_backend_stub"


def _procs() -> dict[int, tuple[int, bytes, str]]:
    """pid -> (ppid, cmdline, state) of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(d.name)] = (int(fields[1]), cmd, fields[0])
    return out


def _descendants(root: int, procs: dict[int, tuple[int, bytes, str]]) -> set[int]:
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, (pp, _, _) in procs.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def _stub_regions(stubs: set[int]) -> set[str]:
    """Names of the ``/dev/shm`` regions the stubs have mapped (their ``/proc/<pid>/maps``)."""
    names = set()
    for pid in stubs:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    names.add(line.split("/dev/shm/", 1)[1].split(" ")[0])
    return names


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigkill_of_the_run_mid_parity_leaves_no_stub_and_no_shm_region(tiny_llama, tmp_path):
    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")
    store = tmp_path / "store"
    common = [
        f"model.path={tiny_llama}",
        "model.name=tiny",
        "quant=none",
        "target=onnxruntime_genai",
        f"store_dir={store}",
        "eval.limit=2",
        "eval.gate.mode=exploratory",
        "package.allow_failed_gate=true",
        "build.max_seq_len=192",
        "build.max_input_len=128",
        "build.max_batch_size=4",
        "progress=false",
    ]
    pre = subprocess.run(
        [PIPELINE, *common, "stages=[evaluate]", f"hydra.run.dir={tmp_path / 'pre'}"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert pre.returncode in (0, 3), pre.stdout[-3000:] + pre.stderr[-3000:]
    log = open(tmp_path / "run.txt", "w")
    run = subprocess.Popen(
        [PIPELINE, *common, "stages=[package]", f"hydra.run.dir={tmp_path / 'run'}"],
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a CI job
    )
    stubs: set[int] = set()
    try:
        deadline = time.monotonic() + 600
        while not stubs and time.monotonic() < deadline and run.poll() is None:
            procs = _procs()
            stubs = {p for p in _descendants(run.pid, procs) if STUB in procs[p][1]}
            time.sleep(0.05)
        assert stubs, "the package stage's parity server started no stub: " + (tmp_path / "run.txt").read_text()[-3000:]
        shm_new: set[str] = set()
        deadline = time.monotonic() + 90
        while not shm_new and time.monotonic() < deadline and run.poll() is None:  # the stub maps its region once it runs
            time.sleep(0.2)
            procs = _procs()  # on a loaded host the first stubs may still be starting: look at every stub of the run
            stubs |= {p for p in _descendants(run.pid, procs) if STUB in procs[p][1]}
            shm_new = _stub_regions(stubs)
        assert shm_new, "the stubs map no /dev/shm region"
        os.killpg(run.pid, signal.SIGKILL)  # what a CI runner does on cancel
        run.wait(timeout=30)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(_alive(p) for p in stubs):
            time.sleep(0.5)
        left = sorted(p for p in stubs if _alive(p))
        assert left == [], f"stub(s) {left} outlived the run they belonged to"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (set(os.listdir("/dev/shm")) & shm_new):
            time.sleep(0.5)
        assert not set(os.listdir("/dev/shm")) & shm_new, f"shm regions left: {sorted(set(os.listdir('/dev/shm')) & shm_new)}"
    finally:
        if run.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
        # a failing run leaves nothing behind: every stub of this test's store (also one started after the check)
        mine = {p for p, (_, cmd, _) in _procs().items() if STUB in cmd and str(tmp_path).encode() in cmd}
        regions = _stub_regions(mine)
        for pid in mine:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for name in regions:
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")
        log.close()
