"""``package.publish=mlflow`` against a real MLflow server (issue 27, item 4).

The test starts ``mlflow server`` (SQLite backend store, proxied artifact store, 127.0.0.1, a free port) from the
separate environment ``.venv-mlflow`` (full ``mlflow``, whose pins would change the main environment's pyarrow; see
docs/package.md "Model registry") or the executable ``$PIPELINE_MLFLOW_SERVER`` names, and stops it afterwards. The
pipeline side uses the MLflow client (``mlflow-skinny``, the ``mlflow`` extra). A real chain on a tiny Llama packages a
passed release, which becomes version 1 of the registered model; a release whose gate failed (packaged with
``package.allow_failed_gate=true``) is refused (exit 3, nothing registered) and registered only with the explicit
override, tagged as such.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import REPO_ROOT, compose
from pipeline.errors import EXIT_GATE, EXIT_OK
from pipeline.runner import run_pipeline

pytest.importorskip("mlflow.tracking", reason="the MLflow client is not installed: pip install 'pipeline[mlflow]' (mlflow-skinny)")


def _server_exe() -> str | None:
    for c in (os.environ.get("PIPELINE_MLFLOW_SERVER"), str(REPO_ROOT / ".venv-mlflow" / "bin" / "mlflow")):
        if c and Path(c).is_file():
            return c
    return None


pytestmark = pytest.mark.skipif(
    _server_exe() is None,
    reason="no MLflow server environment: python -m venv .venv-mlflow && .venv-mlflow/bin/pip install mlflow "
    "(or set PIPELINE_MLFLOW_SERVER to an `mlflow` executable)",
)
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    env = {**os.environ, **QUIET}
    cmd = [_server_exe(), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination"]
    cmd += [str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Overrides of a fast real chain on a tiny Llama (the parity check has its own tests)."""
    import tiny

    root = tmp_path_factory.mktemp("publish")
    ckpt = tiny.make_checkpoint(root / "llama", "llama")
    rows = [
        {"id": f"o{i}", "prompt": f"Where is my order ORD-1234{i}?", "reference": f"ORD-1234{i}", "metric": "exact_match", "slice": "order"}
        for i in range(4)
    ]
    es = root / "eval.jsonl"
    es.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return [
        "stages=[package]",
        f"store_dir={root / 'store'}",
        "progress=false",
        f"model.path={ckpt}",
        "model.name=tiny-support",
        "model.dtype=float32",
        "quant=none",
        f"eval.eval_set={es}",
        "eval.max_new_tokens=6",
        "eval.gate.max_drop=1.0",
        "eval.gate.slice_max_drop=1.0",
        "build.max_input_len=128",
        "build.max_seq_len=160",
        "package.parity=false",
    ]


def _run(overrides):
    buf = io.StringIO()
    s = run_pipeline(compose(overrides), console=Console(file=buf, width=200))
    return s, buf.getvalue()


def test_passed_release_is_registered_and_a_failed_one_is_refused(mlflow_uri, chain, monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    for k, v in QUIET.items():
        monkeypatch.setenv(k, v)
    pub = [*chain, "package.publish=mlflow", f"package.mlflow_tracking_uri={mlflow_uri}"]
    s, out = _run(pub)
    assert s.exit_code == EXIT_OK, (s.error, out)
    rec = s.gate["publish"]
    assert rec["model"] == "tiny-support" and rec["version"] == "1" and rec["gate_override"] is False
    assert "publish   tiny-support version 1" in out

    c = MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    mv = c.get_model_version("tiny-support", "1")
    pkg = Path(next(r for r in s.stages if r.stage == "package").path)
    assert mv.tags["pipeline.key.package"] == pkg.name and mv.tags["pipeline.gate"] == "pass"
    assert mv.tags["pipeline.gate_override"] == "false" and mv.tags["pipeline.signature"] == "unsigned"
    assert {"pipeline.key.evaluate", "pipeline.key.build", "pipeline.key.export"} <= set(mv.tags)
    run = c.get_run(mv.run_id)
    assert run.data.params["recipe"] == "none" and run.data.params["target"] == "onnxruntime_genai"
    rep = json.loads(next((pkg.parent.parent / "evaluate").glob("*/eval_report.json")).read_text())
    assert run.data.metrics["score"] == pytest.approx(rep["runners"][rep["candidate"]]["score"])
    assert {"baseline", "drop", "drop_upper", "allowed_drop", "slice.order.score", "slice.order.drop_upper"} <= set(run.data.metrics)
    # the version's artifact is the release itself: download it and compare the archive byte for byte
    (archive,) = (pkg / "release").glob("*.tar.gz")
    assert mv.tags["pipeline.archive_sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    got = Path(c.download_artifacts(mv.run_id, f"release/{archive.name}", str(tmp_path)))
    assert hashlib.sha256(got.read_bytes()).hexdigest() == mv.tags["pipeline.archive_sha256"]

    # a failed gate, packaged with the package-stage override: publishing refuses it, and registers nothing
    failed = [*pub, "eval.gate.min_score=1.0", "package.allow_failed_gate=true"]  # a random-weight model scores 0
    s, out = _run(failed)
    assert s.exit_code == EXIT_GATE and "refusing to register" in (s.error or ""), (s.error, out)
    assert [v.version for v in c.search_model_versions("name = 'tiny-support'")] == ["1"]
    # the explicit publish override registers it, and says so (the run still exits 3: its gate failed)
    s, out = _run([*failed, "package.publish_allow_failed_gate=true"])
    assert s.exit_code == EXIT_GATE and s.gate["publish"]["gate_override"] is True, (s.error, out)
    assert "(gate override)" in out
    mv2 = c.get_model_version("tiny-support", s.gate["publish"]["version"])
    assert mv2.version == "2" and mv2.tags["pipeline.gate_override"] == "true" and mv2.tags["pipeline.gate"] == "fail"
    assert mv2.description.startswith("GATE OVERRIDE")


def test_unreachable_registry_is_a_preflight_error(chain, monkeypatch):
    """No server at the URI: exit 4 naming the field, after the release was packaged (it stays in the store)."""
    for k, v in QUIET.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    s, out = _run([*chain, "package.publish=mlflow", f"package.mlflow_tracking_uri=http://127.0.0.1:{_free_port()}"])
    assert s.exit_code == 4 and "package.mlflow_tracking_uri" in (s.error or ""), (s.error, out)
    assert next(r for r in s.stages if r.stage == "package").status in ("ran", "cached")  # packaged; kept in the store
