"""Sweeps on a real Ray cluster (issue 27, item 5): ``pipeline -m hydra/launcher=ray_cluster`` against a local
``ray start --head`` (a real cluster of one node) started and stopped by the test, and the same sweep with Hydra's
joblib launcher gives the same comparison table.

The sweep is a two-variant recipe sweep (``quant=none,int8_wo``) of export -> quantize -> evaluate on a tiny Llama
(baseline vs ModelOpt's simulated model), sharing one store: the joblib sweep after it is all cache hits and must
report the same rows. The Ray head gets this checkout on ``PYTHONPATH`` so its workers import the code under test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.core.config import REPO_ROOT

pytest.importorskip("ray", reason="Ray is not installed: pip install 'pipeline[ray]' && pip install --no-deps hydra-ray-launcher==1.2.2")
pytest.importorskip(
    "hydra_plugins.hydra_ray_launcher", reason="hydra-ray-launcher is not installed: pip install --no-deps hydra-ray-launcher==1.2.2"
)
RAY = Path(sys.executable).with_name("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_head():
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [str(RAY), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2"]
    cmd += ["--include-dashboard=false", "--disable-usage-stats", "--object-store-memory=100000000", f"--temp-dir={tmp}"]
    log = open(Path(tmp) / "head.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([str(RAY), "status", f"--address={address}"], capture_output=True, env=env).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray head did not start: {(Path(tmp) / 'head.log').read_text(errors='replace')[-3000:]}")
            time.sleep(1)
        yield address
    finally:  # the head and every Ray process it started share its session (process group)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _sweep(root: Path, sweep_dir: Path, ckpt: Path, eval_set: Path, *launcher: str, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "pipeline.cli", "-m", *launcher, f"hydra.sweep.dir={sweep_dir}", "quant=none,int8_wo"]
    cmd += ["stages=[evaluate]", "eval.runners=[baseline,simulated]", f"model.path={ckpt}", "model.dtype=float32"]
    cmd += [f"eval.eval_set={eval_set}", "eval.max_new_tokens=6", "eval.gate.max_drop=1.0", "eval.gate.slice_max_drop=1.0"]
    cmd += ["eval.gate.min_top1=0", "eval.gate.max_kld=100", "build.max_input_len=128", "build.max_seq_len=160"]
    cmd += ["calibration.calib_size=16", "calibration.min_samples=8", f"store_dir={root / 'store'}", "progress=false"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=900)
    assert p.returncode == 0, (p.stdout[-4000:], p.stderr[-4000:])
    doc = json.loads((sweep_dir / "comparison.json").read_text())
    return {"doc": doc, "out": p.stdout + p.stderr}


def test_two_variant_sweep_on_ray_matches_joblib(ray_head, tmp_path):
    import tiny

    ckpt = tiny.make_checkpoint(tmp_path / "llama", "llama")
    rows = [
        {"id": f"o{i}", "prompt": f"Where is my order ORD-1234{i}?", "reference": f"ORD-1234{i}", "metric": "exact_match", "slice": "order"}
        for i in range(4)
    ]
    es = tmp_path / "eval.jsonl"
    es.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_ADDRESS": ray_head, "RAY_USAGE_STATS_ENABLED": "0"}

    ray = _sweep(tmp_path, tmp_path / "sweep_ray", ckpt, es, "hydra/launcher=ray_cluster", env=env)
    assert "Ray Launcher is launching 2 jobs" in ray["out"]
    assert "Connecting to existing Ray cluster" in ray["out"] and ray_head in ray["out"], ray["out"][:3000]
    assert "(_run_job pid=" in ray["out"]  # the jobs' output came back from Ray worker processes
    rows_ray = ray["doc"]["rows"]
    assert sorted(r["quantize.recipe"] for r in rows_ray) == ["int8_wo", "none"]
    assert all(r["exit_code"] == 0 for r in rows_ray) and ray["doc"]["exit_code"] == 0

    joblib = _sweep(tmp_path, tmp_path / "sweep_joblib", ckpt, es, "hydra/launcher=joblib", "hydra.launcher.n_jobs=1", env=env)
    key = lambda r: r["overrides"]  # noqa: E731
    assert sorted(joblib["doc"]["rows"], key=key) == sorted(rows_ray, key=key)
    assert joblib["doc"]["columns"] == ray["doc"]["columns"]
