"""Serving parity as a release-gate check (issue 11 item 3): the package stage serves the packaged repository on the
real Triton server and replays a seeded sample of eval items through the gRPC ensemble (unary and streamed); every
served answer must equal the evaluate stage's candidate answer byte for byte, else exit 3.

Real pipeline runs on a tiny Llama (real ModelOpt / onnxruntime-genai / Triton); needs ``make serve-env``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pipeline.serve.server import DEFAULT_SERVE_VENV, TritonServer

pytestmark = pytest.mark.slow

BASE = [
    "model.name=tiny",
    "model.dtype=float32",
    "target=onnxruntime_genai",
    "stages=[package]",
    "build.max_batch_size=8",
    "build.max_input_len=128",
    "build.max_seq_len=192",
    "progress=false",
    # a 6-item eval set cannot show non-inferiority (gate verdict inconclusive): packaged anyway, explicitly and recorded
    "eval.gate.mode=exploratory",
    "package.allow_failed_gate=true",
]


def _run(tiny_llama: Path, store: Path, *extra: str):
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.runner import run_pipeline

    cfg = compose([f"model.path={tiny_llama}", f"store_dir={store}", *BASE, *extra])
    return run_pipeline(cfg, console=Console(quiet=True))


@pytest.fixture(scope="module")
def packaged(tmp_path_factory, tiny_llama):
    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")
    store = tmp_path_factory.mktemp("store")
    summary = _run(tiny_llama, store, "quant=none", "eval.limit=6")
    assert summary.exit_code == 0, summary.error
    return {r.stage: Path(r.path) for r in summary.stages}


def test_package_records_served_equals_evaluated(packaged):
    man = json.loads((packaged["package"] / "release_manifest.json").read_text())
    p = man["parity"]
    assert p["status"] == "passed" and p["matched"] == p["total"] == 12  # 6 items x (unary, streamed)
    assert p["sample"] == p["of"] == 6 and p["per_mode"] == {"unary": 6, "stream": 6}
    assert p["mode"].startswith("grpc ensemble") and "pipeline client --parity" in p["command"]
    # the evaluated answers compared are the candidate's, from the evaluate artifact
    rows = [json.loads(x) for x in (packaged["evaluate"] / "outputs.jsonl").read_text().splitlines()]
    exp = [json.loads(x) for x in (packaged["package"] / "parity_expected.jsonl").read_text().splitlines()][1:]
    assert {r["id"]: r["expected"] for r in exp} == {r["id"]: r["text"] for r in rows if r.get("runner") == "engine"}
    # the requests and expected answers travel in the release archive (the check can run on the serving host)
    arc = next((packaged["package"] / "release").glob("*.tar.gz"))
    with tarfile.open(arc) as t:
        assert any(n.endswith("/parity_expected.jsonl") for n in t.getnames())
        # serving the staged repository for the check must not change it (bytecode caches made the archive differ
        # between two packagings of the same inputs)
        assert not [n for n in t.getnames() if "__pycache__" in n or n.endswith(".pyc")]
    assert not list((packaged["package"] / "model_repository").rglob("__pycache__"))
    assert not [k for k in man["repository_files"] if k.endswith(".pyc")]


def test_parity_command_against_a_running_server(tmp_path, packaged):
    """The check passes against the server of its own package, and a server of another package is exit 2 naming the
    mismatch (it used to replay and report every answer as a parity failure, exit 3)."""
    import shutil

    from pipeline.serve.parity import served_package_id

    other = tmp_path / "other"  # another package's parity file: its recorded id is not the served one
    shutil.copytree(packaged["package"], other, symlinks=True)
    exp = other / "parity_expected.jsonl"
    head, *rows = exp.read_text().splitlines()
    meta = json.loads(head)["meta"]
    exp.write_text("\n".join([json.dumps({"meta": {**meta, "package_id": "0" * 64}}), *rows]) + "\n")

    def parity(pkg: Path, url: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "pipeline", "client", "--parity", str(pkg), "--url", url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    with TritonServer(packaged["package"] / "model_repository", ready_timeout_s=180) as srv:
        served = served_package_id(srv.grpc_url)
        r = parity(packaged["package"], srv.grpc_url)
        wrong = parity(other, srv.grpc_url)
    assert served and served == meta["package_id"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "served == evaluated: 12/12" in r.stdout
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert "serves another package" in wrong.stderr and f"pipeline_package_id={served[:16]}" in wrong.stderr
    assert "0" * 16 in wrong.stderr and "Fix:" in wrong.stderr and "served == evaluated" not in wrong.stdout


def test_served_differs_from_evaluated_fails_with_exit_3(tmp_path, packaged):
    """Evaluated answers that the deployment does not serve (a copy of the package whose expected answers were altered;
    eval.candidate=baseline, the earlier way to make them differ, is refused now that evaluate's checks run for
    stages=[package], and the store re-verifies an altered evaluate artifact): the parity check exits 3 and shows the
    first difference side by side."""
    import shutil

    pkg = tmp_path / "pkg"
    shutil.copytree(packaged["package"], pkg, symlinks=True)
    exp = pkg / "parity_expected.jsonl"
    head, *rows = exp.read_text().splitlines()
    rows = [json.dumps({**json.loads(r), "expected": "evaluated, not served: " + json.loads(r)["expected"]}) for r in rows]
    exp.write_text("\n".join([head, *rows]) + "\n")
    with TritonServer(pkg / "model_repository", ready_timeout_s=180) as srv:
        r = subprocess.run(
            [sys.executable, "-m", "pipeline", "client", "--parity", str(pkg), "--url", srv.grpc_url],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "served == evaluated: 0/12" in r.stdout and "evaluated:" in r.stderr and "served:" in r.stderr


def test_disabling_is_explicit_and_recorded(tmp_path, packaged, tiny_llama):
    s = _run(tiny_llama, tmp_path / "store", "quant=none", "eval.limit=6", "package.parity=false")
    assert s.exit_code == 0, s.error
    pkg = {r.stage: Path(r.path) for r in s.stages}["package"]
    p = json.loads((pkg / "release_manifest.json").read_text())["parity"]
    assert p["status"] == "disabled" and p["disabled_by"] == "package.parity=false" and p["matched"] is None


def test_tensorrt_llm_package_is_recorded_not_run_here_with_the_command(tmp_path, packaged):
    from types import SimpleNamespace

    from pipeline.serve.parity import run_parity

    cfg = SimpleNamespace(
        package=SimpleNamespace(parity=True, parity_sample=64, parity_seed=0),
        eval=SimpleNamespace(max_new_tokens=64, stop=[]),
        model=SimpleNamespace(apply_chat_template=True),
    )
    from pipeline.core.config import compose

    real = compose(["model.path=unused", *BASE, "quant=none", "eval.limit=6"])
    cfg.eval.max_new_tokens, cfg.eval.stop = real.eval.max_new_tokens, list(real.eval.stop)
    rec = run_parity(tmp_path, packaged["package"] / "model_repository", packaged["evaluate"], target="tensorrt_llm", cfg=cfg)
    assert rec["status"] == "not run here" and rec["matched"] is None
    assert rec["command"].startswith("pipeline client --parity ") and "--url" in rec["command"]
    assert (tmp_path / "parity_expected.jsonl").is_file()


def test_serve_without_a_path_refuses_a_newest_package_the_gate_does_not_vouch_for(packaged, tmp_path):
    """This module's package was packaged with package.allow_failed_gate=true (an inconclusive gate): `pipeline serve`
    with no path used to serve it as "the newest package" with only a warning; now exit 2 naming it and the fix, and
    naming it explicitly is the way to serve it anyway (not started here: the refusal comes before any server)."""
    store = packaged["package"].parent.parent
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "serve", f"store_dir={store}", "package.grpc_port=0", "package.http_port=0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "did not pass its evaluation gate" in r.stderr and f"pipeline serve {packaged['package']}" in r.stderr
    assert "starting tritonserver" not in r.stdout


def test_parity_of_a_path_that_is_no_package_folder_says_what_it_is(packaged, tmp_path):
    """A release archive or a missing path used to be reported as '<path>/parity_expected.jsonl is missing'."""
    from pipeline.errors import InputError
    from pipeline.serve.parity import check_against_server

    archive = next((packaged["package"] / "release").glob("*.tar.gz"))
    with pytest.raises(InputError, match=r"a file, not a package folder\. Fix: unpack it first \(tar -xzf\)"):
        check_against_server(archive, "127.0.0.1:1")
    with pytest.raises(InputError, match=r"no such file or folder"):
        check_against_server(tmp_path / "nosuch", "127.0.0.1:1")
