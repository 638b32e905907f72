from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Threads per test process: the cores divided by the pytest-xdist workers (`make test` runs 2 workers on the 2-core
# CI host), so torch's and onnxruntime's OpenMP pools never oversubscribe the cores; spin-waiting pools on
# oversubscribed cores made the suite about 1.2x slower on a measured pair of files (tests/quantize/test_quantize.py +
# tests/evaluate/test_evaluate_stage.py, 104 s vs 86 s). A developer box running several suites at once (no CI=true)
# keeps one thread per process. An explicit OMP_NUM_THREADS wins.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
_threads = 1 if not os.environ.get("CI") else max(1, (os.cpu_count() or 1) // _workers)
os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
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
