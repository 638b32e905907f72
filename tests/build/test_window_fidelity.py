"""Issue 24 case 9: evaluate's teacher-forced fidelity pass on a sliding-window engine.

A Mistral with ``sliding_window=16`` < ``max_seq_len`` builds a windowed KV cache (the documented fix for evaluate is
``build.max_batch_size=1``).  The fidelity pass sized the engine's KV cache to the sequence, so a held-out sample
shorter than the window ended the run with exit 1 (onnxruntime-genai GroupQueryAttention: "KV cache capacity (10)
must be at least local_window_size (16)").  Now a short sequence gets a cache of the window's size; sequences shorter
and longer than the window give transformers' teacher-forced logits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def windowed(tmp_path_factory) -> tuple[Path, Path]:
    """(export hf dir, engine dir) of the tiny windowed Mistral, built by the real pipeline."""
    import json

    root = tmp_path_factory.mktemp("window")
    ck = tiny.make_family(root / "ck", "mistral_window")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    args = [f"model.path={ck}", "quant=none", "target=onnxruntime_genai", "stages=[build]", "build.max_batch_size=1"]
    args += [f"store_dir={root / 'store'}", "progress=false", f"hydra.run.dir={root / 'run'}"]
    r = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=str(root), env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((root / "run" / "summary.json").read_text())
    path = {st["stage"]: Path(st["path"]) for st in s["stages"]}
    gc = json.loads((path["build"] / "engine" / "genai_config.json").read_text())
    assert gc["model"]["decoder"]["sliding_window"]["window_size"] == 16  # the window binds
    return path["export"] / "hf", path["build"] / "engine"


def test_teacher_forced_logits_below_and_above_the_window_equal_transformers(windowed):
    from pipeline.build.targets.onnxruntime_genai.builder import OrtEngineRunner
    from pipeline.evaluate.fidelity import TFSequence
    from pipeline.evaluate.runners import EngineAdapter, HFRunner, load_hf_model

    hf, engine = windowed
    seqs = [
        TFSequence(id="short", slice="s", prompt=list(range(5, 11)), continuation=[7, 8, 9, 10]),  # 9 tokens < 16
        TFSequence(id="long", slice="s", prompt=list(range(5, 45)), continuation=[7, 8, 9, 10]),  # 43 tokens > 16
    ]
    eng = EngineAdapter(OrtEngineRunner(engine, max_batch_size=1), None, stop_ids=[2])
    try:
        got = eng.teacher_forced_logits(seqs, 1)  # old code: the short one raised (KV cache capacity < window)
    finally:
        eng.close()
    ref = HFRunner(load_hf_model(hf), None, stop_ids=[2], pad_id=0, name="baseline").teacher_forced_logits(seqs, 1)
    for s, a, b in zip(seqs, got, ref):
        assert a.shape == b.shape == (4, b.shape[1]), s.id
        assert np.array_equal(a.argmax(-1), b.argmax(-1)), s.id
        assert float(np.abs(a - b).max()) < 1e-3, (s.id, float(np.abs(a - b).max()))
