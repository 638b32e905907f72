"""``quant.resmooth``: one AWQ pre-quant scale per shared input, written by the quantize stage and folded by the build.

Real ModelOpt calibration of a tiny Llama (2 layers, GQA) through the pipeline; the ORT engine built from the
resmoothed artifact is held to ModelOpt's simulated model in tests/build/test_build_ort.py
(``test_int4_awq_engine_agrees_with_modelopt_simulated_model``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import tiny
from rich.console import Console

from pipeline.core.config import compose
from pipeline.core.quant_state import load_simulated_model
from pipeline.runner import run_pipeline

CALIB = ["calibration.calib_size=16", "calibration.min_samples=4", "calibration.calib_max_seq_length=48", "calibration.batch_size=8"]
GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return tiny.make_checkpoint(tmp_path_factory.mktemp("rs") / "src", "llama")


def _quantize(src: Path, store: Path, *extra: str) -> tuple[Path, Path]:
    over = [f"model.path={src}", "stages=[export,quantize]", f"store_dir={store}", "progress=false", *CALIB, *extra]
    s = run_pipeline(compose(over), console=Console(file=io.StringIO()))
    assert s.exit_code == 0, s.error
    paths = {r.stage: Path(r.path) for r in s.stages}
    return paths["export"], paths["quantize"]


def _scales(model, layer: int, sub: str, names: tuple[str, ...]) -> list:
    block = getattr(model.model.layers[layer], sub)
    return [getattr(block, n).input_quantizer.pre_quant_scale for n in names]


def test_int4_awq_shares_one_scale_per_input_and_restores(src, tmp_path):
    import torch

    export, quant = _quantize(src, tmp_path / "store", "quant=int4_awq")
    rep = json.loads((quant / "quant_report.json").read_text())["resmooth"]
    assert rep == {"applied": True, "shared_groups": 4, "skipped": [], "reason": None}  # 2 layers x (q/k/v, gate/up)
    model = load_simulated_model(quant, export)  # the probe check proves the restored model is the resmoothed one
    for layer in range(2):
        for sub, names in GROUPS:
            got = _scales(model, layer, sub, names)
            assert all(torch.equal(got[0], s) for s in got[1:]), (layer, sub)
        # down_proj reads its own input: its calibrated scale is kept (AWQ's search moved it away from all ones)
        p = model.model.layers[layer].mlp.down_proj.input_quantizer.pre_quant_scale
        assert not torch.equal(p, torch.ones_like(p))


def test_resmooth_false_keeps_each_calibrated_scale(src, tmp_path):
    import torch

    export, quant = _quantize(src, tmp_path / "store", "quant=int4_awq", "quant.resmooth=false")
    rep = json.loads((quant / "quant_report.json").read_text())["resmooth"]
    assert rep == {"applied": False, "reason": "quant.resmooth=false"}
    model = load_simulated_model(quant, export)
    got = _scales(model, 0, "self_attn", ("q_proj", "k_proj", "v_proj"))
    assert not torch.equal(got[0], got[1]), "AWQ calibrates a scale per linear; without resmooth they differ"


def test_recipes_without_prescale_or_with_quantized_activations_are_left_alone(src, tmp_path):
    # int4_rtn has no pre-quant scale: quant.resmooth is not read (nor in its quantize key), whatever its value
    _, quant = _quantize(src, tmp_path / "store", "quant=int4_rtn", "quant.resmooth=false")
    assert json.loads((quant / "quant_report.json").read_text())["resmooth"] == {
        "applied": False,
        "shared_groups": 0,
        "skipped": [],
        "reason": "quant=int4_rtn has no AWQ/SmoothQuant pre-quant scale",
    }
    _, quant = _quantize(src, tmp_path / "store", "quant=int8_sq", "quant.kv_cache_dtype=int8")
    rep = json.loads((quant / "quant_report.json").read_text())["resmooth"]
    assert rep["applied"] is False and rep["shared_groups"] == 0 and len(rep["skipped"]) == 4, rep
    assert all("activations are quantized" in s for s in rep["skipped"]), rep
