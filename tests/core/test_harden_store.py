"""Issue 16 items 3 and 7: ``verify_cache=true`` holds on every lookup path; only published artifacts are served.

Real export stage on a tiny real checkpoint through the real runner and store.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import compose
from pipeline.core.store import MANIFEST, ArtifactStore
from pipeline.runner import run_pipeline


def run(ckpt: Path, store: Path, *extra: str):
    cfg = compose([f"model.path={ckpt}", "stages=[export]", f"store_dir={store}", "progress=false", *extra])
    summary = run_pipeline(cfg, overrides=list(extra), console=Console(file=io.StringIO()))
    assert summary.exit_code == 0, summary.error
    (rep,) = summary.stages
    return rep


@pytest.fixture()
def ckpt(tiny_llama, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_llama, tmp_path / "ckpt"))


def test_verify_cache_rebuilds_a_corrupted_artifact_instead_of_reusing_it(ckpt, tmp_path):
    store = tmp_path / "store"
    first = run(ckpt, store)
    weights = Path(first.path) / "hf" / "model.safetensors"
    good = weights.read_bytes()
    bad = bytearray(good)
    bad[-64:] = bytes(64)  # same size: only a re-hash can tell
    weights.write_bytes(bytes(bad))

    second = run(ckpt, store, "verify_cache=true")
    assert second.status == "ran", "a corrupted artifact rejected by verify_cache was reused"
    assert second.key == first.key
    assert (Path(second.path) / "hf" / "model.safetensors").read_bytes() == good  # rebuilt: the good bytes again
    assert ArtifactStore(store).lookup("export", first.key, verify=True) is not None


def test_every_lookup_of_a_verifying_store_rehashes(ckpt, tmp_path):
    store = tmp_path / "store"
    rep = run(ckpt, store)
    f = Path(rep.path) / "model_info.json"
    f.write_bytes(f.read_bytes().replace(b'"', b"'", 1))
    st = ArtifactStore(store, verify=True)
    assert st.lookup("export", rep.key) is None
    with st.locked("export", rep.key):  # the second look, under the lock, uses the same setting
        assert st.lookup("export", rep.key) is None
    assert ArtifactStore(store).lookup("export", rep.key) is not None  # sizes alone cannot tell


def _fake_package(stage_dir: Path, folder: str, key: str) -> Path:
    d = stage_dir / folder
    (d / "model_repository" / "ensemble").mkdir(parents=True)
    (d / "model_repository" / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\n')
    files = {
        "model_repository/ensemble/config.pbtxt": {
            "sha256": __import__("pipeline.core.store", fromlist=["x"]).sha256_file(d / "model_repository" / "ensemble" / "config.pbtxt"),
            "bytes": 17,
        }
    }
    (d / MANIFEST).write_text(
        json.dumps({"schema": "pipeline.manifest/v1", "complete": True, "key": key, "outputs": files, "output_digest": "x"})
    )
    return d


def test_serve_picks_only_published_packages_never_staging_folders(tmp_path):
    from pipeline.serve.serve import find_latest_repository

    stage_dir = tmp_path / "store" / "package"
    good = _fake_package(stage_dir, "a" * 24, "a" * 64)
    # a run killed between writing the manifest and the rename leaves a newer, complete-looking staging folder
    _fake_package(stage_dir, f".tmp-{'b' * 24}-123-abcdef", "b" * 64)
    assert find_latest_repository(str(tmp_path / "store")) == good / "model_repository"
    assert [a.path for a in ArtifactStore(tmp_path / "store").published("package")] == [good]
