"""Resumable layer-by-layer calibration: a run killed after layer k resumes at layer k+1 from ModelOpt's per-layer
checkpoint in the store's resume folder and writes the same bytes as an uninterrupted run.

Real components: ModelOpt 0.47's layerwise calibration with its ``checkpoint_dir`` (int4 AWQ on a tiny Llama through
the real export stage), interrupted by a KeyboardInterrupt (what Ctrl-C raises) right after ModelOpt saved a layer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pipeline.core.config import compose

CALIB = ["calibration.calib_size=16", "calibration.min_samples=4", "calibration.calib_max_seq_length=48", "calibration.batch_size=8"]
LAYERWISE = [*CALIB, "quant=int4_awq", "calibration.layerwise=true"]


def _run(cfg, export_dir, repo_root, out: Path, resume: Path):
    from pipeline.quantize.run import quantize

    out.mkdir(parents=True)
    return quantize(cfg, export_dir, Path(repo_root) / "evaluation/data/support_calib_v2.jsonl", out, resume_dir=resume)


def _same_bytes(a: Path, b: Path) -> None:
    with safe_open(str(a / "quant_state.safetensors"), "pt") as x, safe_open(str(b / "quant_state.safetensors"), "pt") as y:
        assert sorted(x.keys()) == sorted(y.keys())
        for k in x.keys():
            assert torch.equal(x.get_tensor(k), y.get_tensor(k)), k
    assert (a / "trtllm_checkpoint/rank0.safetensors").read_bytes() == (b / "trtllm_checkpoint/rank0.safetensors").read_bytes()
    assert (a / "hf/model.safetensors").read_bytes() == (b / "hf/model.safetensors").read_bytes()
    # no run's folder (the resume checkpoint's path) in the stored ModelOpt state
    assert (a / "quant_state.json").read_bytes() == (b / "quant_state.json").read_bytes()


def test_a_killed_layerwise_calibration_resumes_at_the_next_layer_with_the_same_bytes(tmp_path, export_dir, repo_root, monkeypatch, caplog):
    from modelopt.torch.quantization.utils import layerwise_calib

    cfg = compose(LAYERWISE)
    whole = _run(cfg, export_dir, repo_root, tmp_path / "uninterrupted", tmp_path / "resume-a")
    assert whole["placement"]["layerwise"]

    save = layerwise_calib._CheckpointState.save

    def save_then_die(self, layer_idx, *a, **kw):
        save(self, layer_idx, *a, **kw)
        if layer_idx == 0:
            raise KeyboardInterrupt  # Ctrl-C right after layer 0 was checkpointed

    monkeypatch.setattr(layerwise_calib._CheckpointState, "save", save_then_die)
    resume = tmp_path / "resume-b"
    with pytest.raises(KeyboardInterrupt):
        _run(cfg, export_dir, repo_root, tmp_path / "killed", resume)
    assert (resume / "layerwise").is_dir()  # the checkpoint outlives the killed run
    monkeypatch.setattr(layerwise_calib._CheckpointState, "save", save)

    with caplog.at_level("WARNING", logger="pipeline.quantize"):
        res = _run(cfg, export_dir, repo_root, tmp_path / "resumed", resume)
    assert res["placement"]["resumed_at_layer"] == 1
    assert any("resuming layer-by-layer calibration at layer 1 of" in r.getMessage() for r in caplog.records)
    assert whole["placement"]["resumed_at_layer"] is None
    _same_bytes(tmp_path / "uninterrupted", tmp_path / "resumed")


def test_the_store_keeps_the_resume_folder_until_the_key_is_published(tmp_path):
    from pipeline.core.store import ArtifactStore

    store = ArtifactStore(tmp_path)
    rd = store.resume_dir("quantize", "k" * 64)
    with store.locked("quantize", "k" * 64):
        with pytest.raises(RuntimeError), store.produce("quantize", "k" * 64, {}) as (tmp, _):
            rd.mkdir(parents=True)
            raise RuntimeError("killed")
        assert rd.is_dir()  # a failed run leaves it for the next run of the key
        with store.produce("quantize", "k" * 64, {}) as (tmp, _):
            (tmp / "x").write_text("1")
    assert not rd.exists() and store.lookup("quantize", "k" * 64) is not None
