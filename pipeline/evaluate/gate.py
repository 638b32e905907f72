"""Release gate: a non-inferiority test overall and on every slice, plus fidelity thresholds.

The question a release asks is "is the candidate *not worse* than the baseline by more than the
allowance delta?", so the null hypothesis is H0: drop >= delta, where drop = baseline score -
candidate score on the same items (paired).  A scope passes only when H0 is rejected, i.e. when the
one-sided upper confidence bound (level ``gate.confidence``) of the drop is <= delta.  Absence of
evidence of a drop is not evidence of no drop: a collapse on 3 items is never "not significant enough
to fail" (the previous ``significant_only`` rule), it is *inconclusive* at best.

Verdict per scope (check ``max_drop``):

- ``fail``: the point estimate of the drop is above the allowance (always fails, in every mode);
- ``pass``: the upper bound is within the allowance;
- ``inconclusive``: neither; the set is too small (or too discordant) to show non-inferiority.  The
  detail names the number of items that would be needed (:func:`items_needed`).

The gate's verdict is the worst scope verdict (fail > inconclusive > pass).  Requiring *every* scope
to pass is an intersection-union test, so the whole gate keeps the per-scope level without a
multiplicity correction (Berger 1982, "Multiparameter hypothesis testing and acceptance sampling",
Technometrics 24:295-300).  ``gate.mode=release`` (default) fails on ``inconclusive`` (exit 3);
``gate.mode=exploratory`` lets an inconclusive run finish with exit 0, loudly, and records it: the
verdict stays ``passed: false`` for the package stage, which refuses to release it.

Upper bounds:

- binary metrics (every item's score is 0 or 1): Tango's asymmetric score interval for the difference
  of paired proportions (Tango 1998, "Equivalence test and confidence interval for the difference in
  proportions for the paired-sample design", Statistics in Medicine 17:891-908; recommended by
  Fagerland, Lydersen & Laake 2014, "Recommended tests and confidence intervals for paired binomial
  proportions", Statistics in Medicine 33:2850-2875).  It uses the discordant counts b (baseline right,
  candidate wrong) and c (the reverse): drop = (b - c) / n.  Unlike a bound conditioned on b + c, it
  stays informative when there are no discordant pairs: with b = c = 0 the bound is z^2 / (n + z^2).
- continuous metrics (e.g. ``rouge_l``, ``json_fields``) and mixed scopes: the paired-bootstrap
  one-sided percentile bound (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13;
  items resampled with replacement, pairs kept together), floored by Tango's bound on the fractional
  counts b = sum(max(d, 0)), c = sum(max(-d, 0)) of the paired differences d in [-1, 1].  The floor is
  needed because the bootstrap of n identical differences has zero width (3 items would "prove" a 0
  drop); it is conservative because a difference in [-1, 1] with the same positive and negative means
  has at most the variance of the {-1, 0, 1} variable Tango's interval assumes.

Other checks (point estimates): ``min_score`` (candidate score), ``min_agreement`` (identical output
text), and the fidelity thresholds ``max_kld`` / ``min_top1`` (overall, from ``fidelity.py``).

Items skipped by either runner (too long, engine error) are excluded pairwise and counted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.contracts.evaluate import VERDICTS, FidelityStats  # ordered from best to worst: the gate's verdict is the worst of its scopes'
from ..errors import InputError
from ..facts.recipes import RECIPES

MAX_ITEMS_NEEDED = 10_000_000


@dataclasses.dataclass
class PairedStats:
    """Paired comparison of baseline and candidate scores on the same items (scores in [0, 1])."""

    n: int
    baseline: float
    candidate: float
    drop: float
    """mean(baseline - candidate) over the paired items (0..1 scale)."""
    upper: float
    """One-sided ``confidence`` upper bound of the drop (Tango score bound or bootstrap, see module doc)."""
    confidence: float
    method: str
    """``tango`` (binary scores) or ``bootstrap+tango-floor`` (continuous / mixed)."""
    discordant: tuple[float, float]
    """(b, c): baseline right & candidate wrong, the reverse; fractional sums of positive / negative
    paired differences for continuous metrics."""
    agreement: float | None
    """Fraction of items whose candidate text equals the baseline's, or None."""

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["discordant"] = [round(x, 6) for x in self.discordant]
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()}


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(confidence))


def tango_statistic(b: float, c: float, n: float, delta: float) -> float:
    """Tango's score statistic T(delta) for H0: p_b - p_c = delta (Tango 1998, eq. 3; Fagerland et al. 2014, sec. 4.2).

    T = (b - c - n delta) / sqrt(n (2 q + delta (1 - delta))), with q the restricted maximum-likelihood
    estimate of p_c under H0: q = (sqrt(B^2 - 4 A C) - B) / (2 A), A = 2n, B = -b - c + (2n - b + c) delta,
    C = -c delta (1 - delta).  Decreasing in delta.  Counts may be fractional (continuous floor).
    """
    A = 2.0 * n
    B = -b - c + (2.0 * n - b + c) * delta
    C = -c * delta * (1.0 - delta)
    q = (math.sqrt(max(B * B - 4.0 * A * C, 0.0)) - B) / (2.0 * A)
    var = n * (2.0 * q + delta * (1.0 - delta))
    num = b - c - n * delta
    if var <= 0.0:
        return 0.0 if num == 0 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def tango_upper(b: float, c: float, n: float, confidence: float) -> float:
    """One-sided ``confidence`` upper bound of the paired drop (b - c) / n from Tango's score interval.

    The largest delta in [d, 1] with T(delta) >= -z_{confidence} (root found with ``scipy.optimize.brentq``);
    1.0 when T stays above -z up to delta = 1.  Returns 1.0 for n = 0.
    """
    if n <= 0:
        return 1.0
    from scipy.optimize import brentq

    z = _z(confidence)
    d = (b - c) / n
    hi = 1.0 - 1e-12
    f = lambda delta: tango_statistic(b, c, n, delta) + z  # noqa: E731
    if f(hi) >= 0.0:
        return 1.0
    lo = max(-1.0 + 1e-12, d)
    if f(lo) <= 0.0:  # numerical edge (d = 1 handled above)
        return float(lo)
    return float(brentq(f, lo, hi, xtol=1e-10))


def bootstrap_upper(diff: np.ndarray, *, confidence: float, samples: int, seed: int) -> float:
    """One-sided percentile upper bound of mean(``diff``) over ``samples`` paired resamples (float array (n,))."""
    n = len(diff)
    if n == 0:
        return 1.0
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(samples, n))
    return float(np.quantile(diff[idx].mean(axis=1), confidence))


def items_needed(b: float, c: float, n: int, allowance: float, confidence: float) -> int | None:
    """Smallest eval-set size whose upper bound would be within ``allowance`` at the observed rates.

    Assumes the observed discordance rates p_b = b / n and p_c = c / n stay the same on a larger set
    (counts scaled) and searches the smallest n' with ``tango_upper(p_b n', p_c n', n') <= allowance``.
    Large-sample form: n ~ z^2 (p_disc - d^2) / (allowance - d)^2 with p_disc = (b + c) / n, d = (b - c) / n;
    at d = 0 that is the familiar (z sqrt(p_disc) / allowance)^2.  When no discordant pair was observed
    (b + c = 0) that formula would say 0; the score interval instead uses the discordance H0 itself
    implies (p_disc = allowance, every discordant pair a loss), giving n = z^2 (1 - allowance) / allowance.
    Returns None when the observed drop is at or above the allowance (no size can show non-inferiority).
    """
    if n <= 0 or allowance <= 0:
        return None
    pb, pc = b / n, c / n
    if pb - pc >= allowance:
        return None
    ok = lambda m: tango_upper(pb * m, pc * m, m, confidence) <= allowance  # noqa: E731
    lo, hi = 1, max(2, n)
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_ITEMS_NEEDED:
            return None
    while lo < hi:  # the bound shrinks with m at fixed rates
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return int(hi)


def fewest_items(allowance: float, confidence: float) -> int | None:
    """The fewest paired items on which a scope can pass at all: :func:`items_needed` in the best case short of the
    candidate beating its baseline (no drop and no discordant pair, b = c = 0, where Tango's bound is
    z^2 / (n + z^2)): n = z^2 (1 - allowance) / allowance, rounded up (52 items at a 5 pp allowance and 95 %
    confidence).  A scope with fewer items is *inconclusive* at best whatever the candidate scores, unless it scores
    better than the baseline on enough items (c > b).  None when no size can show it (a zero allowance)."""
    return items_needed(0.0, 0.0, 1, allowance, confidence)


def paired_stats(
    base: Sequence[float], cand: Sequence[float], *, binary: bool, agree: Sequence[bool] | None, confidence: float, samples: int, seed: int
) -> PairedStats:
    """Paired statistics of ``base`` and ``cand`` (per-item scores in [0, 1], same order, same length).

    ``binary``: every score is 0 or 1 (Tango's bound); else the bootstrap bound with the Tango floor.
    """
    b_ = np.asarray(base, dtype=float)
    c_ = np.asarray(cand, dtype=float)
    n = len(b_)
    diff = b_ - c_
    nb, nc = float(np.clip(diff, 0, None).sum()), float(np.clip(-diff, 0, None).sum())
    if binary:
        nb, nc = float(np.sum((b_ >= 0.5) & (c_ < 0.5))), float(np.sum((b_ < 0.5) & (c_ >= 0.5)))
        upper, method = tango_upper(nb, nc, n, confidence), "tango"
    else:
        upper = max(bootstrap_upper(diff, confidence=confidence, samples=samples, seed=seed), tango_upper(nb, nc, n, confidence))
        method = "bootstrap+tango-floor"
    return PairedStats(
        n,
        float(b_.mean()) if n else 0.0,
        float(c_.mean()) if n else 0.0,
        float(diff.mean()) if n else 0.0,
        float(upper),
        confidence,
        method,
        (nb, nc),
        (float(np.mean(agree)) if agree is not None and n else None),
    )


def scope_verdict(st: PairedStats, allowance: float) -> tuple[str, int | None]:
    """(``pass`` | ``inconclusive`` | ``fail``, items needed or None) for one scope (see module doc)."""
    if st.drop > allowance + 1e-12:
        return "fail", None
    if st.upper <= allowance + 1e-12:
        return "pass", None
    return "inconclusive", items_needed(st.discordant[0], st.discordant[1], st.n, allowance, st.confidence)


@dataclasses.dataclass
class Check:
    scope: str
    """``overall`` or ``slice:<name>``."""
    check: str
    """min_score | max_drop | min_agreement | max_kld | min_top1 | engine_errors."""
    value: float
    threshold: float
    verdict: str
    """pass | inconclusive | fail."""
    detail: str
    upper: float | None = None
    items_needed: int | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["passed"] = self.passed
        d["value"], d["threshold"] = round(self.value, 6), round(self.threshold, 6)
        if self.upper is not None:
            d["upper"] = round(self.upper, 6)
        return d


def allowances(gate: Any, recipe: str) -> tuple[float, float]:
    """(overall, per-slice) allowed drop for ``recipe`` from a ``GateConfig``: ``max_drop``, else
    ``max_drop_by_recipe[recipe]``, else the recipe's default (``Recipe.max_drop``, pipeline/facts/recipes.py).

    Raises:
        InputError: no allowance for ``recipe`` anywhere (a recipe the table does not know).
    """
    overall = gate.max_drop
    if overall is None:
        known = RECIPES.get(recipe)
        overall = gate.max_drop_by_recipe.get(recipe, known.max_drop if known else None)
    if overall is None:
        raise InputError(
            f"eval.gate.max_drop_by_recipe: no allowed drop for recipe {recipe!r}. "
            f"Fix: set eval.gate.max_drop=<drop> or eval.gate.max_drop_by_recipe.{recipe}=<drop> (absolute, 0..1)."
        )
    per_slice = gate.slice_max_drop if gate.slice_max_drop is not None else 2.0 * overall
    return float(overall), float(per_slice)


def allowance_sources(gate: Any, recipe: str) -> tuple[str, str]:
    """Where :func:`allowances` took the (overall, per-slice) allowance from, as config keys a user can set."""
    if gate.max_drop is not None:
        overall = "eval.gate.max_drop (set explicitly)"
    else:
        overall = f"the recipe default eval.gate.max_drop_by_recipe.{recipe}"
    per_slice = (
        "eval.gate.slice_max_drop (set explicitly)"
        if gate.slice_max_drop is not None
        else f"default eval.gate.slice_max_drop = 2 x the overall allowance ({overall})"
    )
    return overall, per_slice


def inconclusive_fix(gate: Any, recipe: str, checks: Sequence[Check], n_items: dict[str, int] | None = None) -> str | None:
    """The message for an *inconclusive* gate (no check failed, at least one ``max_drop`` check inconclusive):
    says it is inconclusive, not failed; names each inconclusive scope, its allowance and where the allowance comes
    from, and the items needed; gives the fixes (a larger eval set, an explicit allowance, ``eval.gate.mode=exploratory``).
    None when the gate is not inconclusive (a real fail keeps the fail message: improve the candidate)."""
    if any(c.verdict == "fail" for c in checks):
        return None
    inc = [c for c in checks if c.verdict == "inconclusive" and c.check == "max_drop"]
    if not inc:
        return None
    src_all, src_slice = allowance_sources(gate, recipe)
    parts = []
    for c in inc:
        src = src_all if c.scope == "overall" else src_slice
        need = f"about {c.items_needed} items needed" if c.items_needed is not None else "no eval-set size can show it"
        have = (n_items or {}).get(c.scope)
        have_txt = f" (it has {have})" if have is not None else ""
        up = f", upper bound {100 * c.upper:+.1f} pp" if c.upper is not None else ""
        parts.append(f"{c.scope}: drop {100 * c.value:+.1f} pp{up} vs allowance {100 * c.threshold:.1f} pp from {src}; {need}{have_txt}")
    keys = sorted({"eval.gate.max_drop=<drop>" if c.scope == "overall" else "eval.gate.slice_max_drop=<drop>" for c in inc})
    return (
        f"the gate is INCONCLUSIVE, not failed: the eval set is too small to show non-inferiority at "
        f"{gate.confidence:.0%} confidence (no measured drop exceeds its allowance). " + "; ".join(parts) + ". "
        "Fix: a larger eval set (eval.eval_set=<JSONL with the items needed per scope>), or an explicit allowance you accept ("
        + " / ".join(keys)
        + ", absolute 0..1), or "
        + (
            "package.allow_failed_gate=true to package it anyway (eval.gate.mode=exploratory is already set: it records "
            "the result as not releasable, and the package stage refuses such an artifact unless told; recorded in the "
            "release manifest)."
            if getattr(gate, "mode", "") == "exploratory"
            else "eval.gate.mode=exploratory (exit 0 for a run that stops at evaluate, recorded as not releasable; a run "
            "that packages also needs package.allow_failed_gate=true, recorded in the release manifest)."
        )
    )


def fidelity_thresholds(gate: Any, recipe: str) -> tuple[float | None, float | None]:
    """(max mean KLD in nats, min top-1 agreement) for ``recipe``; None = not checked."""
    kld = gate.max_kld if gate.max_kld is not None else gate.max_kld_by_recipe.get(recipe)
    top1 = gate.min_top1 if gate.min_top1 is not None else gate.min_top1_by_recipe.get(recipe)
    return (None if kld is None else float(kld)), (None if top1 is None else float(top1))


def _needed_text(k: int | None) -> str:
    return (
        f"about {k} paired items would be needed at the observed discordance"
        if k is not None
        else "no eval-set size can show it at the observed drop"
    )


def judge(
    gate: Any,
    recipe: str,
    stats: dict[str, PairedStats | None],
    cand_scores: dict[str, float],
    fidelity: FidelityStats | dict[str, Any] | None = None,
    cand_errors: int = 0,
) -> dict[str, Any]:
    """Apply the gate.

    Args:
        gate: ``pipeline.core.config.eval.GateConfig``.
        recipe: the quantization recipe (selects the default allowance and fidelity thresholds).
        stats: ``{"overall": PairedStats, "slice:<name>": PairedStats}``; None values mean no baseline.
        cand_scores: candidate score per scope (used for ``min_score``).
        fidelity: the overall fidelity summary (``fidelity.summarize``: ``kld.mean``, ``top1``; typed or its JSON) or None.
        cand_errors: eval items on which the candidate runner failed (an engine error). Any error fails the gate:
            a broken engine must not pass because its baseline scores as low as its empty answers.
    Returns:
        ``{"passed", "verdict", "non_inferiority", "failed_checks", "mode", "reason", "fix", "checks": [...],
        "allowed_drop": {...}, "confidence", "bound"}``: ``verdict`` is the worst check verdict;
        ``non_inferiority`` the worst verdict of the ``max_drop`` checks alone (so a fidelity or
        ``min_score`` failure is never reported as a non-inferiority failure); ``failed_checks`` lists every
        non-passing check (``scope``, ``check``, ``verdict``, ``detail``); ``passed`` is ``verdict == "pass"`` (in both
        modes: the package stage never releases an unproven candidate); ``reason`` names every
        non-passing scope with the value, the bound, the threshold and, when inconclusive, the items needed;
        ``fix`` the inconclusive message (:func:`inconclusive_fix`), None unless the gate is inconclusive.
    """
    allow_all, allow_slice = allowances(gate, recipe)
    checks: list[Check] = []
    for scope, cand in cand_scores.items():
        checks += _scope_checks(gate, scope, cand, stats.get(scope), allow_all if scope == "overall" else allow_slice)
    checks.append(
        Check(
            "overall",
            "engine_errors",
            float(cand_errors),
            0.0,
            "fail" if cand_errors else "pass",
            f"the candidate failed on {cand_errors} item(s) (see eval_report.json items[].error)" if cand_errors else "no candidate errors",
        )
    )
    max_kld, min_top1 = fidelity_thresholds(gate, recipe)
    checks += _fidelity_checks(fidelity, max_kld, min_top1)
    verdict = max((c.verdict for c in checks), key=VERDICTS.index, default="pass")
    non_inferiority = max((c.verdict for c in checks if c.check == "max_drop"), key=VERDICTS.index, default="pass")
    # the worst first (fail before inconclusive), so every place that shortens the reason keeps what failed
    bad = sorted((c for c in checks if not c.passed), key=lambda c: -VERDICTS.index(c.verdict))
    reason = "; ".join(f"{c.scope} {c.check}: {c.detail}" for c in bad) if bad else "all checks passed"
    ov = next((c for c in checks if c.scope == "overall" and c.check == "max_drop"), None)
    counts = {v: sum(1 for c in checks if c.check == "max_drop" and c.verdict == v) for v in VERDICTS}
    n_items = {scope: st.n for scope, st in stats.items() if st is not None}
    return {
        "fix": inconclusive_fix(gate, recipe, checks, n_items),
        "passed": verdict == "pass",
        "verdict": verdict,
        "non_inferiority": non_inferiority,
        "failed_checks": [{"scope": c.scope, "check": c.check, "verdict": c.verdict, "detail": c.detail} for c in bad],
        "mode": gate.mode,
        "reason": reason,
        "scopes": counts,
        "checks": [c.to_json() for c in checks],
        "allowed_drop": {"overall": allow_all, "slice": allow_slice},
        "confidence": gate.confidence,
        "bound": ({"drop": ov.value, "upper": ov.upper, "allowance": ov.threshold} if ov is not None else None),
        "fidelity_thresholds": {"max_kld": max_kld, "min_top1": min_top1},
    }


def _scope_checks(gate: Any, scope: str, cand: float, st: PairedStats | None, allow: float) -> list[Check]:
    """:func:`judge`'s checks of one scope: ``min_score``; with a baseline, ``max_drop`` (non-inferiority at
    ``gate.confidence``) and ``min_agreement`` (when set)."""
    checks = [
        Check(
            scope,
            "min_score",
            cand,
            gate.min_score,
            "pass" if cand >= gate.min_score - 1e-12 else "fail",
            f"score {cand:.3f} vs minimum {gate.min_score:.3f}",
        )
    ]
    if st is None or st.n == 0:
        return checks
    verdict, need = scope_verdict(st, allow)
    head = f"drop {100 * st.drop:+.1f} pp, {gate.confidence:.0%} upper bound {100 * st.upper:+.1f} pp vs allowed {100 * allow:.1f} pp (n={st.n})"
    if verdict == "fail":
        detail = f"{head}: the measured drop itself is above the allowance"
    elif verdict == "inconclusive":
        detail = f"{head}: inconclusive, too few items to show non-inferiority; {_needed_text(need)}"
    else:
        detail = head
    checks.append(Check(scope, "max_drop", st.drop, allow, verdict, detail, st.upper, need))
    if gate.min_agreement > 0 and st.agreement is not None:
        ok = st.agreement >= gate.min_agreement - 1e-12
        checks.append(
            Check(
                scope,
                "min_agreement",
                st.agreement,
                gate.min_agreement,
                "pass" if ok else "fail",
                f"agreement {st.agreement:.3f} vs minimum {gate.min_agreement:.3f}",
            )
        )
    return checks


def _nats(x: float) -> str:
    """A KLD as the gate checks print it: 5 decimals, or ``2.0e-12`` for a value those would show as 0.00000 (exact
    zero stays ``0.00000``)."""
    return f"{x:.1e}" if x and abs(x) < 5e-6 else f"{x:.5f}"


def _fidelity_checks(fidelity: FidelityStats | dict[str, Any] | None, max_kld: float | None, min_top1: float | None) -> list[Check]:
    """:func:`judge`'s teacher-forced fidelity checks (``max_kld``, ``min_top1``), when fidelity was measured."""
    checks: list[Check] = []
    fo = fidelity if isinstance(fidelity, FidelityStats) else FidelityStats.from_json(fidelity or {})
    if not fo.positions:
        return checks
    if max_kld is not None:
        v = float(fo.kld.mean)
        checks.append(
            Check(
                "overall",
                "max_kld",
                v,
                max_kld,
                "pass" if v <= max_kld else "fail",
                f"mean KLD {_nats(v)} nats vs maximum {_nats(max_kld)} ({fo.positions} teacher-forced tokens)",
            )
        )
    if min_top1 is not None:
        v = float(fo.top1)
        checks.append(
            Check(
                "overall",
                "min_top1",
                v,
                min_top1,
                "pass" if v >= min_top1 - 1e-12 else "fail",
                f"top-1 agreement {100 * v:.2f}% vs minimum {100 * min_top1:.2f}%",
            )
        )
    return checks
