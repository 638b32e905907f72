"""The package stage's release gate: the evaluate input's verdict becomes the release manifest's ``evaluation.gate``
(:func:`release_gate`); a verdict that did not pass is refused (``GateFailed``, exit 3) unless
``package.allow_failed_gate``, which is then recorded. :func:`first_scopes` keeps a long gate reason to its first slice."""

from __future__ import annotations

import re
from typing import Any

from ..core.contracts.evaluate import EvalResult
from ..core.contracts.package import ReleaseGate
from ..core.stage import StageContext
from ..errors import GateFailed


def release_gate(ctx: StageContext) -> dict[str, Any]:
    """The release manifest's ``evaluation.gate`` (:class:`~pipeline.core.contracts.package.ReleaseGate`) from the evaluate
    input's verdict. Raises :class:`GateFailed` (exit 3) for a verdict that did not pass, unless
    ``package.allow_failed_gate``."""
    ev = ctx.upstream("evaluate")
    gate = ev.result_as(EvalResult).gate if ev is not None else None
    if gate is not None and gate.passed:
        return ReleaseGate(gate, override=False).to_json()
    reason = first_scopes(gate.reason if gate is not None else "no evaluation verdict")
    if not ctx.cfg.package.allow_failed_gate and gate is not None and gate.inconclusive:
        fix = gate.fix or (
            "the gate is INCONCLUSIVE, not failed: the eval set is too small to show non-inferiority. Fix: a larger "
            "eval set (eval.eval_set), an explicit allowance (eval.gate.max_drop / eval.gate.slice_max_drop), or "
            "eval.gate.mode=exploratory"
        )
        # the gate's fix already explains the verdict scope by scope: the reason is then not repeated
        fix = first_scopes(fix).rstrip(". ")
        if "package.allow_failed_gate" not in fix:
            fix += "; or override explicitly with package.allow_failed_gate=true (recorded in release_manifest.json)"
        why = "" if gate.fix else f" ({reason})"
        raise GateFailed(f"package: refusing to package an artifact whose evaluation gate is inconclusive{why}: {fix}.")
    if not ctx.cfg.package.allow_failed_gate:
        raise GateFailed(
            f"package: refusing to package an artifact whose evaluation gate failed ({reason}). "
            f"Fix: improve the candidate (recipe, calibration), or override explicitly with package.allow_failed_gate=true "
            f"(recorded in release_manifest.json)."
        )
    ctx.log.warning(
        "packaging despite %s evaluation gate (%s): package.allow_failed_gate=true",
        "an inconclusive" if gate is not None and gate.inconclusive else "a failed",
        reason,
    )
    verdict = "was inconclusive" if gate is not None and gate.inconclusive else "failed"
    return ReleaseGate(
        gate, override=True, override_note=f"package.allow_failed_gate=true: packaged although the evaluation gate {verdict}"
    ).to_json()


def first_scopes(text: str, keep: int = 1) -> str:
    """A gate reason or fix with only its first ``keep`` slice scopes (the gate lists every scope, "; slice:<name>"
    after "; slice:<name>"; the evaluate stage has printed them all and eval_report.json keeps them). Every
    ``overall`` part is kept, wherever it stands (a failed ``overall min_top1`` after the slices' ``max_drop`` is the
    reason the gate failed), and so is the text after the last elided part's ". Fix:"."""
    parts = re.split(r"; (?=(?:overall|slice:\S+) )", text)
    elided = [i for i, p in enumerate(parts) if p.startswith("slice:")][keep:]
    if not elided:
        return text
    m = re.search(r"\. Fix: .*$", parts[-1], re.S) if elided[-1] == len(parts) - 1 else None
    kept = "; ".join(p for i, p in enumerate(parts) if i not in elided)
    return f"{kept}; and {len(elided)} more slice(s) (eval_report.json)" + (m.group(0) if m else "")
