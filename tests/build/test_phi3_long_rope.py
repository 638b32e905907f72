"""A Phi-3 whose two position lengths differ without LongRoPE factors: onnxruntime-genai's builder takes it for the
LongRoPE (128K) model and dies with ``KeyError: 'multi_cache'``, after export and quantize ran (fresh-user trial:
``max_position_embeddings=512`` with transformers' default ``original_max_position_embeddings=4096``, exit 1 at build).
Now refused at config time (exit 2) naming both fields; the same model with equal lengths builds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tiny

from pipeline.core.config import compose
from pipeline.validation import stage_problems

ROOT = Path(__file__).resolve().parents[2]


def _problems(ckpt: Path) -> list[str]:
    return [str(p) for p in stage_problems(compose([f"model.path={ckpt}", "target=onnxruntime_genai", "quant=none"]))]


def test_phi3_with_unequal_lengths_and_no_long_rope_is_refused_before_any_work(tmp_path):
    ckpt = tiny.make_checkpoint(tmp_path / "phi3", "phi3", max_position_embeddings=512)
    c = json.loads((ckpt / "config.json").read_text())
    c.pop("original_max_position_embeddings", None)  # as a user's config.json may: transformers fills in 4096
    (ckpt / "config.json").write_text(json.dumps(c))
    msgs = [m for m in _problems(ckpt) if "original_max_position_embeddings" in m]
    assert len(msgs) == 1, _problems(ckpt)
    assert "max_position_embeddings=512 but original_max_position_embeddings=4096 (the transformers default)" in msgs[0]
    assert "set original_max_position_embeddings=512 in config.json" in msgs[0]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            f"model.path={ckpt}",
            "target=onnxruntime_genai",
            "quant=none",
            f"store_dir={tmp_path / 'store'}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "original_max_position_embeddings" in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").glob("*/*"))  # nothing ran

    c["original_max_position_embeddings"] = 512
    (ckpt / "config.json").write_text(json.dumps(c))
    assert not [m for m in _problems(ckpt) if "original_max_position_embeddings" in m]
    c["original_max_position_embeddings"] = 256
    c["rope_scaling"] = {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}
    (ckpt / "config.json").write_text(json.dumps(c))
    assert not [m for m in _problems(ckpt) if "original_max_position_embeddings" in m]  # a real LongRoPE model
