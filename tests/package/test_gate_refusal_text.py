"""The package stage's gate refusal (the last line a CI job shows) shortens a long per-slice reason but never drops
the check that failed. Found by a fresh-user trial: int4 on a random-weight Qwen2 failed on ``overall min_top1``, and
the refusal listed only the inconclusive slice scopes, then "and 2 more slice(s)", without min_top1."""

from __future__ import annotations

from pipeline.package.gate import first_scopes

REASON = (
    "overall max_drop: drop +0.0 pp, upper bound +30.0 pp vs allowed 1.0 pp; about 900 items needed; "
    "slice:a max_drop: drop +0.0 pp; slice:b max_drop: drop +0.0 pp; slice:c max_drop: drop +0.0 pp; "
    "overall min_top1: top-1 agreement 72.97% vs minimum 95.00%"
)


def test_overall_checks_after_the_slices_are_kept():
    short = first_scopes(REASON)
    assert "overall min_top1: top-1 agreement 72.97% vs minimum 95.00%" in short
    assert "slice:a max_drop" in short and "slice:b" not in short and "slice:c" not in short
    assert short.endswith("and 2 more slice(s) (eval_report.json)")


def test_the_fix_after_the_last_elided_slice_is_kept():
    fix = "INCONCLUSIVE: overall: drop 1 pp; slice:a: drop 2 pp, 40 items; slice:b: drop 3 pp, 50 items. Fix: a larger eval set"
    short = first_scopes(fix)
    assert (
        short
        == "INCONCLUSIVE: overall: drop 1 pp; slice:a: drop 2 pp, 40 items; and 1 more slice(s) (eval_report.json). Fix: a larger eval set"
    )


def test_a_short_reason_is_unchanged():
    assert first_scopes("overall max_drop: x; slice:a max_drop: y") == "overall max_drop: x; slice:a max_drop: y"
