"""The trade-off the shipped example must show, measured on the embedded default model (slow, still run by make test).

Each recipe is quantized with the shipped calibration set and evaluated teacher-forced against the fp32 source
checkpoint (``pipeline/evaluation/fidelity.py``), with ModelOpt's simulated model as the candidate (it is
what the ORT engine deploys: tests/test_build_ort.py and tests/test_recipes.py hold the engine to it).
Everything is seeded and single-threaded, so the numbers are reproducible; README "Recipe trade-offs" gives them.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.config import REPO_ROOT, compose
from pipeline.runner import run_pipeline

MODEL = Path(REPO_ROOT) / "models" / "support-llama"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"default model absent: {MODEL}/config.json"),
]


def _fidelity(store: Path, *overrides: str) -> dict:
    cfg = compose(
        [
            "stages=[export,quantize,evaluate]",
            "eval.runners=[baseline,simulated]",
            f"store_dir={store}",
            "progress=false",
            "eval.gate.mode=exploratory",
            *overrides,
        ]
    )
    summary = run_pipeline(cfg, overrides=list(overrides), console=Console(file=io.StringIO(), width=160))
    ev = next(s for s in summary.stages if s.stage == "evaluate")
    return json.loads((Path(ev.path) / "eval_report.json").read_text())["fidelity"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    return {r: _fidelity(store, f"quant={r}") for r in ("none", "int8_wo", "int4_awq", "int4_rtn")}


def test_mean_kld_is_strictly_ordered_none_int8_awq_rtn(sweep):
    kld = {r: f["overall"]["kld"]["mean"] for r, f in sweep.items()}
    assert kld["none"] < kld["int8_wo"] < kld["int4_awq"] < kld["int4_rtn"], kld
    held = {r: f["calibration_heldout"]["kld"]["mean"] for r, f in sweep.items()}
    assert held["none"] < held["int8_wo"] < held["int4_awq"] < held["int4_rtn"], held
