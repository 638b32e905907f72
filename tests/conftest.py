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
# The suite's runs use eval sets of a few items in the release gate mode to exercise the evaluate and package stages'
# own verdicts (inconclusive, exit 3); the config-time refusal of a set too small for the gate ever to pass
# (pipeline/evaluate/checks.py) is off for them and on in the tests of that check (tests/core/test_plan_run_agree.py).
os.environ.setdefault("PIPELINE_SKIP_GATE_SIZE_CHECK", "1")

import tiny  # noqa: E402


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def _shared_root(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this session shares (the parent of the workers' base temp folders;
    the base temp folder itself in a serial run)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random-weight Llama checkpoint (GQA, untied) with a byte-level BPE tokenizer, made once per session
    for all workers (seeded, so every worker would write the same bytes; one path keeps their store keys equal).
    Read-only: a test that changes a checkpoint copies it first."""
    from filelock import FileLock

    root = _shared_root(tmp_path_factory)
    out = root / "tiny_llama"
    with FileLock(str(root / ".tiny_llama.lock")):
        if not (out / "config.json").is_file():
            tmp = root / f".tiny_llama-{os.getpid()}"
            tiny.make_checkpoint(tmp, "llama")
            os.replace(tmp, out)
    return out


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory) -> Path:
    """One artifact store for the whole session, all workers included: the pipeline's content-addressed store
    (per-key file locks, atomic publish: pipeline/core/store.py) lets fixtures that run the same stages on the same
    inputs reuse each other's artifacts (tests/serve: the served tiny package's export, quantize and build).
    Only for fixtures that never change an artifact or count the store's contents."""
    d = _shared_root(tmp_path_factory) / "store"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture()
def make_checkpoint(tmp_path):
    """Factory: make_checkpoint(arch='llama', name=None, **config_overrides) -> Path."""

    def _make(arch: str = "llama", name: str | None = None, **kw):
        return tiny.make_checkpoint(tmp_path / (name or arch), arch, **kw)

    return _make


@pytest.fixture(scope="module")
def small_qwen2(tmp_path_factory) -> Path:
    """A tiny Qwen2 of small hidden size (64: below the default int4 group size of 128), tied embeddings, with a
    byte-level BPE tokenizer."""
    return tiny.make_checkpoint(
        tmp_path_factory.mktemp("small") / "qwen2",
        "qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """A tiny random-weight Llama through the real export stage (one per test module that asks for it)."""
    import tiny

    from pipeline.export.write import export_checkpoint

    src = tiny.make_checkpoint(tmp_path_factory.mktemp("src"), "llama")
    out = tmp_path_factory.mktemp("export")
    export_checkpoint(src, out)
    return out
