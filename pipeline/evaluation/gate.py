"""Release gate: thresholds overall and per slice, with paired statistics for small eval sets.

Checks (each overall and on every slice):

- ``min_score``: candidate score >= ``gate.min_score`` (point estimate).
- ``max_drop``: the drop ``baseline - candidate`` (mean paired difference of per-item scores) must
  not exceed the allowance (``gate.max_drop``, else ``gate.max_drop_by_recipe[recipe]``; per slice
  ``gate.slice_max_drop``, else 2 x the overall allowance).  With ``gate.significant_only`` the check
  fails only when the drop is *significantly* larger than the allowance: the lower bound of the
  two-sided paired-bootstrap percentile interval (Efron & Tibshirani 1993, "An Introduction to the
  Bootstrap", ch. 13; items resampled with replacement, pairs kept together) lies above the
  allowance, and, for binary metrics, McNemar's exact test on the discordant pairs (McNemar 1947;
  exact binomial form, two-sided, via ``scipy.stats.binomtest``) rejects "no difference" at
  ``1 - confidence``.  Without it the point estimate is compared with the allowance.
- ``min_agreement``: fraction of items whose candidate text equals the baseline's text (stripped)
  >= ``gate.min_agreement``.

Items skipped by either runner (too long, engine error) are excluded pairwise and counted.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass
class PairedStats:
    """Paired comparison of baseline and candidate scores on the same items."""

    n: int
    baseline: float
    candidate: float
    drop: float
    """mean(baseline - candidate) over the paired items (0..1 scale)."""
    ci_low: float
    ci_high: float
    confidence: float
    mcnemar_p: float | None
    """Two-sided exact McNemar p-value (binary metrics only), else None."""
    discordant: tuple[int, int] | None
    """(baseline right & candidate wrong, baseline wrong & candidate right) for binary metrics."""
    agreement: float | None

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["discordant"] = list(self.discordant) if self.discordant else None
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()}


def bootstrap_ci(diff: np.ndarray, *, confidence: float, samples: int, seed: int) -> tuple[float, float]:
    """Percentile interval of the mean of ``diff`` over ``samples`` resamples with replacement.

    ``diff``: float array (n,), the per-item paired differences.  Returns (low, high); (0, 0) for n = 0.
    """
    n = len(diff)
    if n == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(samples, n))
    means = diff[idx].mean(axis=1)
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [a, 1.0 - a])
    return float(lo), float(hi)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: ``binomtest(b, b + c, 0.5)`` (1.0 when there are no discordant pairs).

    ``b``: pairs where only the baseline is right; ``c``: pairs where only the candidate is right.
    """
    if b + c == 0:
        return 1.0
    try:
        from scipy.stats import binomtest

        return float(binomtest(b, b + c, 0.5, alternative="two-sided").pvalue)
    except ImportError:  # exact binomial tail from math (doubling the smaller tail; Agresti 2013, sec. 11.1.4)
        n, k = b + c, min(b, c)
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
        return min(1.0, 2.0 * tail)


def paired_stats(base: Sequence[float], cand: Sequence[float], *, binary: bool, agree: Sequence[bool] | None,
                 confidence: float, samples: int, seed: int) -> PairedStats:
    b = np.asarray(base, dtype=float)
    c = np.asarray(cand, dtype=float)
    n = len(b)
    diff = b - c
    lo, hi = bootstrap_ci(diff, confidence=confidence, samples=samples, seed=seed)
    p, disc = None, None
    if binary and n:
        nb = int(np.sum((b >= 0.5) & (c < 0.5)))
        nc = int(np.sum((b < 0.5) & (c >= 0.5)))
        disc, p = (nb, nc), mcnemar_exact(nb, nc)
    return PairedStats(n, float(b.mean()) if n else 0.0, float(c.mean()) if n else 0.0, float(diff.mean()) if n else 0.0,
                       lo, hi, confidence, p, disc, (float(np.mean(agree)) if agree is not None and n else None))


@dataclasses.dataclass
class Check:
    scope: str
    """``overall`` or ``slice:<name>``."""
    check: str
    """min_score | max_drop | min_agreement."""
    value: float
    threshold: float
    passed: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["value"], d["threshold"] = round(self.value, 6), round(self.threshold, 6)
        return d


def allowances(gate: Any, recipe: str) -> tuple[float, float]:
    """(overall, per-slice) allowed drop for ``recipe`` from a ``GateConfig``."""
    overall = gate.max_drop if gate.max_drop is not None else float(gate.max_drop_by_recipe.get(recipe, 0.05))
    per_slice = gate.slice_max_drop if gate.slice_max_drop is not None else 2.0 * overall
    return float(overall), float(per_slice)


def judge(gate: Any, recipe: str, stats: dict[str, PairedStats | None], cand_scores: dict[str, float]) -> dict[str, Any]:
    """Apply the gate.

    Args:
        gate: ``pipeline.config.eval.GateConfig``.
        recipe: the quantization recipe (selects the default allowance).
        stats: ``{"overall": PairedStats, "slice:<name>": PairedStats}``; None values mean no baseline.
        cand_scores: candidate score per scope (used for ``min_score`` when there is no baseline).
    Returns:
        ``{"passed": bool, "reason": str, "checks": [Check.to_json()...], "allowed_drop": {...}}``;
        ``reason`` names every failed scope, the measured value, the threshold and the interval.
    """
    allow_all, allow_slice = allowances(gate, recipe)
    alpha = 1.0 - gate.confidence
    checks: list[Check] = []
    for scope, cand in cand_scores.items():
        checks.append(Check(scope, "min_score", cand, gate.min_score, cand >= gate.min_score - 1e-12,
                            f"score {cand:.3f} vs minimum {gate.min_score:.3f}"))
        st = stats.get(scope)
        if st is None or st.n == 0:
            continue
        allow = allow_all if scope == "overall" else allow_slice
        ci = f"{gate.confidence:.0%} CI [{st.ci_low:+.3f}, {st.ci_high:+.3f}]"
        if gate.significant_only:
            sig = st.ci_low > allow and (st.mcnemar_p is None or st.mcnemar_p < alpha)
            mc = f", McNemar p={st.mcnemar_p:.3g}" if st.mcnemar_p is not None else ""
            detail = f"drop {st.drop:+.3f} ({ci}{mc}) vs allowed {allow:.3f}; fails only if significantly above"
            checks.append(Check(scope, "max_drop", st.drop, allow, not sig, detail))
        else:
            checks.append(Check(scope, "max_drop", st.drop, allow, st.drop <= allow + 1e-12, f"drop {st.drop:+.3f} ({ci}) vs allowed {allow:.3f}"))
        if gate.min_agreement > 0 and st.agreement is not None:
            checks.append(Check(scope, "min_agreement", st.agreement, gate.min_agreement, st.agreement >= gate.min_agreement - 1e-12,
                                f"agreement {st.agreement:.3f} vs minimum {gate.min_agreement:.3f}"))
    failed = [c for c in checks if not c.passed]
    reason = "; ".join(f"{c.scope} {c.check}: {c.detail}" for c in failed) if failed else "all checks passed"
    return {"passed": not failed, "reason": reason, "checks": [c.to_json() for c in checks],
            "allowed_drop": {"overall": allow_all, "slice": allow_slice}, "significant_only": bool(gate.significant_only),
            "confidence": gate.confidence}
