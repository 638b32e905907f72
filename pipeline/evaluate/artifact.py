"""The evaluate stage's artifact: file names and readers of ``artifacts/evaluate/<key>/``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar


@dataclasses.dataclass(frozen=True)
class EvalArtifact:
    """Evaluate stage output: the report (schema ``pipeline.eval_report/v1``) and every generated answer."""

    path: Path
    REPORT_JSON: ClassVar[str] = "eval_report.json"
    REPORT_MD: ClassVar[str] = "eval_report.md"
    REPORT_HTML: ClassVar[str] = "eval_report.html"
    OUTPUTS: ClassVar[str] = "outputs.jsonl"
    JUNIT_XML: ClassVar[str] = "eval_junit.xml"
    """The gate as JUnit XML, one testcase per check (``pipeline.evaluate.junit``)."""
    FILES: ClassVar[tuple[str, ...]] = ("eval_report.json", "eval_report.md", "eval_report.html", "outputs.jsonl", "eval_junit.xml")

    @property
    def report_path(self) -> Path:
        return self.path / self.REPORT_JSON

    @property
    def outputs_path(self) -> Path:
        return self.path / self.OUTPUTS


VERDICTS: tuple[str, ...] = ("pass", "inconclusive", "fail")
"""Gate verdicts, best first (``pipeline.evaluate.gate.VERDICTS`` orders checks by the same list)."""


@dataclasses.dataclass(frozen=True)
class FailedCheck:
    """One gate check that did not pass: its scope (``overall`` or ``slice:<name>``), check name (``max_drop``,
    ``min_score``, ``engine_errors``, ``max_kld``, ``min_top1``), verdict and a one-line detail."""

    scope: str
    check: str
    verdict: str
    detail: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FailedCheck:
        return cls(str(d.get("scope", "overall")), str(d.get("check", "?")), str(d.get("verdict", "fail")), str(d.get("detail", "")))


@dataclasses.dataclass(frozen=True)
class GateBound:
    """The overall non-inferiority bound: the observed accuracy drop and its one-sided upper confidence bound against
    the allowance, all as fractions (0.01 = 1 percentage point); ``upper`` is None when it could not be computed."""

    drop: float
    upper: float | None
    allowance: float


@dataclasses.dataclass(frozen=True)
class GateFidelity:
    """The overall fidelity summary the gate used: mean KLD and its standard error (nats per token), the fraction of
    teacher-forced positions whose top token matches, ln(PPL_cand / PPL_base) and the number of positions."""

    kld_mean: float
    kld_se: float
    top1: float
    ln_ppl_ratio: float | None
    positions: int


@dataclasses.dataclass(frozen=True)
class GateVerdict:
    """The evaluate stage's gate record: the ``gate`` of its result, of ``summary.json`` and of the release manifest's
    ``evaluation`` (``pipeline.evaluate.gate.judge`` decides it; ``pipeline.evaluate.stage.gate_summary`` writes it).

    ``verdict`` is the worst check's (pass < inconclusive < fail); ``non_inferiority`` the worst of the ``max_drop``
    checks alone; ``passed`` is ``verdict == "pass"``; ``scopes`` counts the max_drop checks per verdict; ``fix`` is the
    inconclusive message (None otherwise).  :meth:`from_json` reads records of older versions: a missing ``verdict``
    is derived from ``passed``, a missing ``non_inferiority`` from ``verdict``.
    """

    passed: bool
    reason: str
    verdict: str
    non_inferiority: str
    mode: str = "release"
    fix: str | None = None
    failed_checks: tuple[FailedCheck, ...] = ()
    bound: GateBound | None = None
    scopes: dict[str, int] = dataclasses.field(default_factory=dict)
    fidelity: GateFidelity | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> GateVerdict | None:
        """The verdict of a gate record, or None for an absent/empty one (no evaluation ran)."""
        if not isinstance(d, dict) or not d:
            return None
        passed = d.get("passed") is True
        verdict = str(d.get("verdict") or ("pass" if passed else "fail"))
        b, f = d.get("bound"), d.get("fidelity")
        return cls(
            passed=passed,
            reason=str(d.get("reason") or ("all checks passed" if passed else "evaluation gate failed")),
            verdict=verdict,
            non_inferiority=str(d.get("non_inferiority") or verdict),
            mode=str(d.get("mode") or "release"),
            fix=d.get("fix") or None,
            failed_checks=tuple(FailedCheck.from_json(c) for c in d.get("failed_checks") or [] if isinstance(c, dict)),
            bound=GateBound(float(b["drop"]), b.get("upper"), float(b["allowance"])) if isinstance(b, dict) else None,
            scopes={str(k): int(v) for k, v in (d.get("scopes") or {}).items()},
            fidelity=GateFidelity(float(f["kld_mean"]), float(f["kld_se"]), float(f["top1"]), f.get("ln_ppl_ratio"), int(f["positions"]))
            if isinstance(f, dict)
            else None,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"failed_checks": [dataclasses.asdict(c) for c in self.failed_checks]}

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "inconclusive"

    @property
    def exploratory(self) -> bool:
        return self.mode == "exploratory"


def gate_of(result: dict[str, Any] | None) -> GateVerdict | None:
    """The gate verdict of an evaluate stage result (``Artifact.result``), or None when it has none."""
    return GateVerdict.from_json((result or {}).get("gate")) if isinstance(result, dict) else None
