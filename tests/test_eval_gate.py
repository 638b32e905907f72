"""The release gate on score fixtures: a collapsed variant fails, a variant within tolerance passes,
a small noisy drop passes under "significant drops only" (and fails on the point estimate)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config.eval import GateConfig
from pipeline.evaluation import gate as G


def _scores(n, acc, seed):
    rng = np.random.default_rng(seed)
    return (rng.random(n) < acc).astype(float)


def _judge(base, cand, gate, recipe="int4_awq", slices=None):
    stats = {"overall": G.paired_stats(base, cand, binary=True, agree=list(base == cand), confidence=gate.confidence,
                                       samples=gate.bootstrap_samples, seed=gate.seed)}
    scores = {"overall": float(np.mean(cand))}
    for name, idx in (slices or {}).items():
        stats[f"slice:{name}"] = G.paired_stats(base[idx], cand[idx], binary=True, agree=list(base[idx] == cand[idx]),
                                                confidence=gate.confidence, samples=gate.bootstrap_samples, seed=gate.seed)
        scores[f"slice:{name}"] = float(np.mean(cand[idx]))
    return G.judge(gate, recipe, stats, scores)


def test_collapsed_variant_fails_and_names_slice():
    base = _scores(240, 0.85, 0)
    cand = base.copy()
    cand[120:] = 0.0  # slice "b" collapsed
    slices = {"a": np.arange(120), "b": np.arange(120, 240)}
    v = _judge(base, cand, GateConfig(), slices=slices)
    assert not v["passed"]
    assert "slice:b max_drop" in v["reason"] and "slice:a" not in v["reason"]
    assert "CI" in v["reason"]


def test_within_tolerance_passes():
    base = _scores(300, 0.8, 1)
    cand = base.copy()
    flip = np.flatnonzero(base == 1)[:3]  # 1 pp drop, allowance for int4_awq 5 pp
    cand[flip] = 0
    v = _judge(base, cand, GateConfig(significant_only=False))
    assert v["passed"], v["reason"]


def test_small_noisy_drop_passes_only_under_significant_only():
    base = _scores(60, 0.7, 2)
    cand = base.copy()
    ones, zeros = np.flatnonzero(base == 1), np.flatnonzero(base == 0)
    cand[ones[:6]] = 0  # 6 lost ...
    cand[zeros[:2]] = 1  # ... 2 gained: drop 6.7 pp, noise on 60 items
    strict = GateConfig(significant_only=False, max_drop=0.02)
    assert not _judge(base, cand, strict)["passed"]
    lenient = GateConfig(significant_only=True, max_drop=0.02)
    v = _judge(base, cand, lenient)
    assert v["passed"], v["reason"]
    st = G.paired_stats(base, cand, binary=True, agree=None, confidence=0.95, samples=2000, seed=0)
    assert st.ci_low < 0.02 < st.ci_high and st.discordant == (6, 2) and st.mcnemar_p > 0.05


def test_recipe_defaults_tighter_for_fp8():
    g = GateConfig()
    assert G.allowances(g, "fp8")[0] < G.allowances(g, "int4_awq")[0]
    base = np.ones(400)
    cand = base.copy()
    cand[:16] = 0  # 4 pp drop: inside int4_awq's 5 pp, outside fp8's 2 pp
    g = GateConfig(significant_only=False)
    assert _judge(base, cand, g, recipe="int4_awq")["passed"]
    assert not _judge(base, cand, g, recipe="fp8")["passed"]


def test_min_score_and_agreement():
    base = _scores(100, 0.5, 3)
    v = _judge(base, base.copy(), GateConfig(min_score=0.9))
    assert not v["passed"] and "overall min_score" in v["reason"]
    cand = 1.0 - base  # same accuracy on average, no agreement
    v = _judge(base, cand, GateConfig(min_agreement=0.8, max_drop=1.0))
    assert not v["passed"] and "min_agreement" in v["reason"]


def test_mcnemar_exact_matches_binomial():
    # b=8, c=1: two-sided exact p = 2 * P(X <= 1 | n=9, 0.5) = 2 * 10/512
    assert G.mcnemar_exact(8, 1) == pytest.approx(20 / 512)
    assert G.mcnemar_exact(0, 0) == 1.0


def test_bootstrap_interval_brackets_mean():
    diff = np.array([1.0] * 10 + [0.0] * 90)
    lo, hi = G.bootstrap_ci(diff, confidence=0.95, samples=2000, seed=0)
    assert lo < 0.1 < hi and lo >= 0.0
