from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# On a shared developer box, several suites run at once on 2 cores: one thread per process avoids
# oversubscription. CI (CI=true) runs alone and keeps the library defaults.
if not os.environ.get("CI"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import tiny  # noqa: E402


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random-weight Llama checkpoint (GQA, untied) with a byte-level BPE tokenizer."""
    return tiny.make_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture()
def make_checkpoint(tmp_path):
    """Factory: make_checkpoint(arch='llama', name=None, **config_overrides) -> Path."""

    def _make(arch: str = "llama", name: str | None = None, **kw):
        return tiny.make_checkpoint(tmp_path / (name or arch), arch, **kw)

    return _make


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """A tiny random-weight Llama through the real export stage (one per test module that asks for it)."""
    import tiny

    from pipeline.export.checkpoint import export_checkpoint

    src = tiny.make_checkpoint(tmp_path_factory.mktemp("src"), "llama")
    out = tmp_path_factory.mktemp("export")
    export_checkpoint(src, out)
    return out
