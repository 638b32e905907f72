"""The gate headline names the check that failed: a fidelity threshold (max_kld / min_top1) or min_score failure is
not reported as a non-inferiority failure (it used to print "non-inferiority fail" for a KLD breach)."""

from __future__ import annotations

import io

import numpy as np
from rich.console import Console

from pipeline.core.config import compose
from pipeline.evaluate.gate import judge, paired_stats
from pipeline.evaluate.results import gate_summary
from pipeline.report import RunSummary, print_summary


def _ps(base, cand):
    return paired_stats(base, cand, binary=True, agree=None, confidence=0.95, samples=200, seed=0)


def _headline(*overrides: str, base_score: float = 1.0, kld: float = 0.5, top1: float = 0.80) -> tuple[dict, str]:
    gate = compose(["eval.gate.mode=release", *overrides]).eval.gate
    n = 480
    base = np.full(n, base_score)
    cand = base.copy()  # the candidate keeps every answer: non-inferiority holds on 480 items
    slices = {"a": np.arange(240), "b": np.arange(240, n)}
    stats = {"overall": _ps(base, cand)}
    stats.update({f"slice:{k}": _ps(base[i], cand[i]) for k, i in slices.items()})
    scores = {k: float(cand.mean()) for k in ("overall", "slice:a", "slice:b")}
    fo = {"kld": {"mean": kld, "se": 0.01}, "top1": top1, "ln_ppl_ratio": 0.1, "positions": 4000}
    verdict = judge(gate, "int4_awq", stats, scores, fidelity=fo)
    ev = {"passed": verdict["passed"], "reason": verdict["reason"], **gate_summary(verdict, fo)}
    buf = io.StringIO()
    print_summary(RunSummary([], 3, [], 1.0, None, "evaluation gate failed", gate={"evaluate": ev}), Console(file=buf, width=400))
    return verdict, buf.getvalue()


def test_kld_breach_is_named_and_non_inferiority_reported_as_passed():
    verdict, out = _headline("eval.gate.max_kld=0.01", "eval.gate.min_top1=0.0")
    assert verdict["verdict"] == "fail" and verdict["non_inferiority"] == "pass"
    assert [c["check"] for c in verdict["failed_checks"]] == ["max_kld"]
    assert "non-inferiority fail" not in out
    assert "non-inferiority pass" in out
    assert "fail on max_kld (mean KLD 0.50000 nats vs maximum 0.01000" in out


def test_top1_breach_is_named():
    verdict, out = _headline("eval.gate.max_kld=10", "eval.gate.min_top1=0.99")
    assert [c["check"] for c in verdict["failed_checks"]] == ["min_top1"]
    assert "fail on min_top1 (top-1 agreement 80.00% vs minimum 99.00%)" in out and "non-inferiority pass" in out


def test_min_score_breach_is_named_per_scope():
    verdict, out = _headline("eval.gate.max_kld=10", "eval.gate.min_top1=0.0", "eval.gate.min_score=0.9", base_score=0.0)
    assert verdict["non_inferiority"] == "pass" and verdict["verdict"] == "fail"
    assert "fail on min_score (score 0.000 vs minimum 0.900); min_score [slice:a]" in out
    assert "non-inferiority pass" in out and "non-inferiority fail" not in out


def test_non_inferiority_failure_still_headlines_as_such():
    gate = compose(["eval.gate.mode=release", "eval.gate.max_kld=10", "eval.gate.min_top1=0.0"]).eval.gate
    base = np.ones(480)
    cand = base.copy()
    cand[:60] = 0.0  # 12.5 pp drop
    stats = {"overall": _ps(base, cand)}
    fo = {"kld": {"mean": 0.001, "se": 0.0001}, "top1": 1.0, "ln_ppl_ratio": 0.0, "positions": 4000}
    verdict = judge(gate, "int4_awq", stats, {"overall": float(cand.mean())}, fidelity=fo)
    ev = {"passed": verdict["passed"], "reason": verdict["reason"], **gate_summary(verdict, fo)}
    buf = io.StringIO()
    print_summary(RunSummary([], 3, [], 1.0, None, "evaluation gate failed", gate={"evaluate": ev}), Console(file=buf, width=400))
    out = buf.getvalue()
    assert verdict["non_inferiority"] == "fail" and verdict["failed_checks"][0]["check"] == "max_drop"
    assert "non-inferiority fail" in out and " on max_drop" not in out
