"""``quant.exclude_modules`` must keep each layer's q/k/v whole: refused before any stage runs (exit 2), not an
AssertionError from ModelOpt's TensorRT-LLM export after it (exit 1). A split gate/up quantizes (up_proj then
keeps its own scale)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import tiny
from rich.console import Console

from pipeline.core.config import compose
from pipeline.runner import run_pipeline

CALIB = ["calibration.calib_size=16", "calibration.min_samples=4", "calibration.calib_max_seq_length=48", "calibration.batch_size=8"]


def _run(tmp_path: Path, src: Path, exclude: str):
    over = [
        f"model.path={src}",
        "stages=[export,quantize]",
        f"store_dir={tmp_path / 'store'}",
        "progress=false",
        "quant=int4_awq",
        f"quant.exclude_modules={exclude}",
        *CALIB,
    ]
    buf = io.StringIO()
    return run_pipeline(compose(over), console=Console(file=buf, width=200)), buf.getvalue()


def test_a_split_qkv_group_is_refused_before_calibration(tmp_path):
    src = tiny.make_checkpoint(tmp_path / "src", "llama")
    s, _ = _run(tmp_path, src, "[lm_head,*k_proj]")
    assert s.exit_code == 2, s.error
    assert "quant.exclude_modules" in s.error and "model.layers.0.self_attn: k_proj kept, q_proj/v_proj quantized" in s.error
    # found from config.json before any stage runs (pipeline/quantize/checks.py), with the fix
    assert "configuration problem" in s.error and "*q_proj,*k_proj,*v_proj" in s.error
    assert {r.status for r in s.stages} == {"not-run"}
    # the whole group kept in high precision is fine: quantize runs, the three projections stay unquantized
    s, _ = _run(tmp_path, src, "[lm_head,*q_proj,*k_proj,*v_proj]")
    assert s.exit_code == 0, s.error
    rep = json.loads((Path(next(r for r in s.stages if r.stage == "quantize").path) / "quant_report.json").read_text())
    assert {m for m in rep["excluded_modules"] if "self_attn" in m} == {
        f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "k_proj", "v_proj")
    }


def test_a_split_gate_up_group_quantizes(tmp_path):
    src = tiny.make_checkpoint(tmp_path / "src", "llama")
    s, _ = _run(tmp_path, src, "[lm_head,*gate_proj]")
    assert s.exit_code == 0, s.error
    rep = json.loads((Path(next(r for r in s.stages if r.stage == "quantize").path) / "quant_report.json").read_text())
    # q/k/v of both layers share a scale; up_proj is the only quantized reader of its input, so it keeps its own
    assert rep["resmooth"]["shared_groups"] == 2 and rep["resmooth"]["skipped"] == []
