"""The trade-off the shipped example must show, measured on the embedded default model (slow, still run by make test).

Each recipe is quantized with the shipped calibration set and evaluated teacher-forced against the fp32 source
checkpoint (``pipeline/evaluate/fidelity.py``), with ModelOpt's simulated model as the candidate (it is
what the ORT engine deploys: tests/build/test_build_ort.py and tests/facts/test_recipes.py hold the engine to it).
Everything is seeded and single-threaded, so the numbers are reproducible; docs/results.md "Recipe trade-offs" gives them.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import REPO_ROOT, compose
from pipeline.runner import run_pipeline

MODEL = Path(REPO_ROOT) / "models" / "support-llama"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"default model absent: {MODEL}/config.json"),
]


def _report(store: Path, *overrides: str) -> dict:
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
    return json.loads((Path(ev.path) / "eval_report.json").read_text())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    return {r: _report(store, f"quant={r}") for r in ("none", "int8_wo", "int4_awq", "int4_rtn")}


def test_mean_kld_orders_the_precisions(sweep):
    """Data v2 model, on the eval answers and on held-out calibration-domain text: none < int8 < int4, int8 at least
    ten times below either int4 recipe.  AWQ (resmoothed, the default) and RTN are within about one standard error of
    each other on both (docs/results.md "Recipe trade-offs"), so between them only "AWQ is not significantly worse" is
    asserted: its mean KLD is below RTN's plus two combined standard errors."""
    for scope in ("overall", "calibration_heldout"):
        k = {r: rep["fidelity"][scope]["kld"] for r, rep in sweep.items()}
        m = {r: v["mean"] for r, v in k.items()}
        assert m["none"] < m["int8_wo"] < min(m["int4_awq"], m["int4_rtn"]), (scope, m)
        assert m["int8_wo"] * 10 < min(m["int4_awq"], m["int4_rtn"]), (scope, m)
        se = (k["int4_awq"]["se"] ** 2 + k["int4_rtn"]["se"] ** 2) ** 0.5
        assert m["int4_awq"] < m["int4_rtn"] + 2 * se, (scope, m, se)


def test_business_eval_separates_int4_from_the_8_bit_formats(sweep):
    """The v2 copy-heavy slices lose answers under int4; int8 keeps them. Items right of the 400 on the two slices of
    200 (simulated model, 2026-12-07): none 338, int8_wo 339, int4_awq 332, int4_rtn 332 (with the ORT engines: 338,
    337, 333, 331; docs/results.md). On the earlier 160 items RTN was two items below AWQ; on 400 the two int4 recipes
    are level, so only "plain rounding is not better than AWQ" is asserted between them."""
    hard = ("copy_number", "extract_fields")

    def correct(rep: dict) -> float:
        r = rep["runners"][rep["candidate"]]["slices"]
        return sum(r[s]["score"] * r[s]["n"] for s in hard)

    got = {r: correct(rep) for r, rep in sweep.items()}
    assert max(got["int4_awq"], got["int4_rtn"]) <= min(got["none"], got["int8_wo"]) - 4, got
    assert got["int4_rtn"] <= got["int4_awq"], got
