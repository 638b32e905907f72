"""Issue 16 item 4: ``pipeline serve x.tar.gz`` checks SHA256SUMS and the release manifest before unpacking.

The release is written with the package stage's own functions (make_archive, write_sha256sums, the manifest's
``repository_files``) and resolved with the function ``pipeline serve`` uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.store import digest_files, tree_files
from pipeline.errors import InputError
from pipeline.release.archive import make_archive, write_sha256sums
from pipeline.serve.serve import resolve_repository

MODEL_PY = "import triton_python_backend_utils as pb_utils\n\nclass TritonPythonModel:\n    pass\n"


def _release(root: Path, model_py: str = MODEL_PY, *, manifest_files_from: str | None = None, sums: bool = True) -> Path:
    repo = root / "src" / "model_repository"
    (repo / "ensemble").mkdir(parents=True, exist_ok=True)
    (repo / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\nplatform: "ensemble"\n')
    (repo / "preprocessing" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "preprocessing" / "1" / "model.py").write_text(manifest_files_from or model_py)
    files = tree_files(repo)
    manifest = {
        "schema": "pipeline.release_manifest/v1",
        "name": "m-1",
        "build": {"target": "onnxruntime_genai"},
        "sources": {"model_repository": digest_files(files)},
        "repository_files": {rel: m["sha256"] for rel, m in files.items()},
    }
    (repo / "preprocessing" / "1" / "model.py").write_text(model_py)  # what actually ships
    rel = root / "release"
    rel.mkdir(parents=True, exist_ok=True)
    (root / "src" / "release_manifest.json").write_text(json.dumps(manifest))
    (rel / "release_manifest.json").write_text(json.dumps(manifest))
    archive = rel / "m-1.tar.gz"
    make_archive(archive, [(repo, "m-1/model_repository"), (root / "src" / "release_manifest.json", "m-1/release_manifest.json")])
    if sums:
        write_sha256sums(rel / "SHA256SUMS", [archive, rel / "release_manifest.json"])
    return archive


def test_intact_release_is_served(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    repo = resolve_repository(str(_release(tmp_path / "r")), None)
    assert (repo / "preprocessing" / "1" / "model.py").read_text() == MODEL_PY


def test_tampered_archive_is_refused_naming_the_file_and_nothing_is_unpacked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    archive = _release(tmp_path / "r")
    evil = _release(tmp_path / "evil", MODEL_PY + "import os; os.system('touch /tmp/pwned')\n", sums=False)
    archive.write_bytes(evil.read_bytes())  # swap the archive, keep the release's SHA256SUMS
    with pytest.raises(InputError, match=r"m-1\.tar\.gz: sha256 .* does not match"):
        resolve_repository(str(archive), None)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_tampered_model_py_with_regenerated_sums_is_refused_by_the_manifest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the attacker rewrote model.py and SHA256SUMS, but the manifest still records the original file's sha256
    archive = _release(tmp_path / "r", MODEL_PY + "import os\n", manifest_files_from=MODEL_PY)
    with pytest.raises(InputError, match=r"preprocessing/1/model\.py: does not match release_manifest\.json"):
        resolve_repository(str(archive), None)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_archive_without_sha256sums_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    archive = _release(tmp_path / "r", sums=False)
    with pytest.raises(InputError, match="no SHA256SUMS"):
        resolve_repository(str(archive), None)


def test_serve_warns_about_a_release_the_gate_does_not_vouch_for():
    """``pipeline serve`` prints these on stderr before starting (pipeline/serve/serve.py ``release_warnings``)."""
    from pipeline.serve.serve import release_warnings

    ok = {"evaluation": {"gate": {"passed": True, "override": False, "verdict": "pass"}}, "parity": {"status": "passed"}}
    assert release_warnings(ok) == [] and release_warnings({}) == []
    forced = {
        "evaluation": {"gate": {"passed": False, "override": True, "verdict": "inconclusive", "reason": "slice:a max_drop ..."}},
        "parity": {"status": "disabled", "disabled_by": "package.parity=false"},
    }
    w = release_warnings(forced)
    assert len(w) == 2 and "allow_failed_gate" in w[0] and "inconclusive" in w[0] and "package.parity=false" in w[1], w
    assert release_warnings({"parity": {"status": "failed"}}) == ["this release's serving parity check did not pass (status 'failed')."]
    assert release_warnings({"parity": {"status": "not run here"}}) == []  # a TensorRT-LLM package checked on its GPU host
    long = release_warnings({"evaluation": {"gate": {"passed": False, "override": True, "verdict": "fail", "reason": "x" * 2000}}})
    assert len(long[0]) < 450 and "release_manifest.json -> evaluation.gate" in long[0]  # one readable line, not the whole list


def test_a_path_that_does_not_exist_is_reported_as_not_found(tmp_path):
    with pytest.raises(InputError, match=r"release/m-1\.tar\.gz: not found \(looked for .*\)\. Fix: give a package artifact folder"):
        resolve_repository(str(tmp_path / "release" / "m-1.tar.gz"), None)
