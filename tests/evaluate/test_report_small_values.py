"""A tiny value is printed tiny, not zero (fresh-user trial: the run table printed ``kld=0`` for a mean KLD of 2e-12,
the headline having rounded it to 6 decimals; the gate check's detail printed ``0.00000``). Exact zero stays 0."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
from rich.console import Console

from pipeline.core.config import compose
from pipeline.core.contracts.evaluate import FidelityStats
from pipeline.evaluate.gate import judge, paired_stats
from pipeline.evaluate.results import stage_result
from pipeline.report import RunSummary, StageReport, print_summary


def _run(kld: float, max_kld: float = 0.05) -> tuple[dict, str]:
    gate = compose(["eval.gate.mode=release", f"eval.gate.max_kld={max_kld}", "eval.gate.min_top1=0.0"]).eval.gate
    base = np.ones(480)
    stats = {"overall": paired_stats(base, base, binary=True, agree=None, confidence=0.95, samples=200, seed=0)}
    fo = {"kld": {"mean": kld, "se": kld / 10}, "top1": 1.0, "ln_ppl_ratio": 0.0, "positions": 4000}
    verdict = judge(gate, "int4_awq", stats, {"overall": 1.0}, fidelity=fo)
    st = SimpleNamespace(cand="engine", prepared=[], n_run=480)
    sc = SimpleNamespace(summaries={"engine": {"score": 1.0}}, overall=SimpleNamespace(baseline=1.0, drop=0.0, agreement=None))
    res = stage_result(st, SimpleNamespace(fidelity_overall=FidelityStats.from_json(fo)), sc, verdict)
    buf = io.StringIO()
    summary = RunSummary([StageReport("evaluate", "ran", 1.0, "p", "k", res.headline)], 0, [], 1.0)
    print_summary(summary, Console(file=buf, width=400))
    return verdict, buf.getvalue()


def test_a_tiny_kld_reads_tiny_not_zero():
    verdict, out = _run(2e-12)
    assert "kld=2e-12" in out and "kld=0," not in out, out
    [check] = [c for c in verdict["checks"] if c["check"] == "max_kld"]
    assert "mean KLD 2.0e-12 nats vs maximum 0.05000" in check["detail"], check
    verdict, out = _run(0.0)
    assert "kld=0," in out
    assert "mean KLD 0.00000 nats" in [c for c in verdict["checks"] if c["check"] == "max_kld"][0]["detail"]
    verdict, _ = _run(0.5, max_kld=0.01)  # ordinary values keep their format (tests/evaluate/test_gate_headline.py)
    assert "mean KLD 0.50000 nats vs maximum 0.01000" in [c for c in verdict["checks"] if c["check"] == "max_kld"][0]["detail"]
