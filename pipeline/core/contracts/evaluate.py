"""The evaluate stage's artifact: file names and readers of ``artifacts/evaluate/<key>/``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from ..artifacts import PathOf, StageArtifact
from .result import StageResult


class EvalArtifact(StageArtifact):
    """Evaluate stage output: the report (schema ``pipeline.eval_report/v1``) and every generated answer."""

    REPORT_JSON: ClassVar[str] = "eval_report.json"
    REPORT_MD: ClassVar[str] = "eval_report.md"
    REPORT_HTML: ClassVar[str] = "eval_report.html"
    OUTPUTS: ClassVar[str] = "outputs.jsonl"
    JUNIT_XML: ClassVar[str] = "eval_junit.xml"
    """The gate as JUnit XML, one testcase per check (``pipeline.evaluate.junit``)."""

    report_path = PathOf(REPORT_JSON)
    outputs_path = PathOf(OUTPUTS)

    def report(self) -> EvalReport:
        """``eval_report.json`` as an :class:`EvalReport`.

        Raises:
            InputError: the file is missing, not a JSON object, or a field the readers use has the wrong type.
        """
        from ...errors import InputError
        from ..artifacts import _read_json

        fix = "re-run the evaluate stage (force=true stages=[evaluate])"
        if not self.report_path.is_file():
            raise InputError(f"{self.report_path} is missing. Fix: {fix}.")
        return EvalReport.from_json(_read_json(self.report_path, fix), source=self.report_path)


@dataclasses.dataclass(frozen=True)
class EvalSetRef:
    """The eval set a report was computed on: ``name``, ``path``, ``sha256`` of the file, ``limit`` (items; None: all)."""

    name: str | None = None
    path: Path | None = None
    sha256: str | None = None
    limit: int | None = None


@dataclasses.dataclass(frozen=True)
class EvalReport:
    """``eval_report.json`` (schema ``pipeline.eval_report/v1``; every key in :mod:`pipeline.evaluate.report`).

    Attributes:
        candidate: the runner the gate judged (``engine`` | ``simulated`` | ...).
        candidate_note: why that runner was chosen (``eval.candidate=auto``), else None.
        eval_set: the eval set evaluated.
        limits: the limits the prompts were checked against (tokens / sequences: ``max_input_len``, ``max_seq_len``,
            ``max_batch_size``; a value is None when unknown).
        speculative: the measured speculative-decoding acceptance (None unless measured).
        document: the whole report, for the writers of its other sections (JUnit, step summary).
    """

    candidate: str | None = None
    candidate_note: str | None = None
    eval_set: EvalSetRef = EvalSetRef()
    limits: dict[str, int | None] = dataclasses.field(default_factory=dict)
    speculative: dict[str, Any] | None = None
    document: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any], source: Path | str = "eval_report.json") -> EvalReport:
        """Raises: InputError when a field the readers use has the wrong type, or a limit below 1 (names ``source``,
        the field, the value, what was expected and the fix)."""
        from ..artifacts import DocumentFields

        f = DocumentFields(source, "re-run the evaluate stage (force=true stages=[evaluate])")
        typed = f.get
        es = typed("eval_set", d.get("eval_set"), dict) or {}
        path = typed("eval_set.path", es.get("path"), str)
        notes = typed("notes", d.get("notes"), dict) or {}
        limits = typed("limits", d.get("limits"), dict) or {}
        for k, v in limits.items():
            typed(f"limits.{k}", v, int, minimum=1)  # None: unknown
        return cls(
            candidate=typed("candidate", d.get("candidate"), str),
            candidate_note=typed("notes.candidate", notes.get("candidate"), str),
            eval_set=EvalSetRef(
                name=typed("eval_set.name", es.get("name"), str),
                path=Path(path) if path else None,
                sha256=typed("eval_set.sha256", es.get("sha256"), str),
                limit=typed("eval_set.limit", es.get("limit"), int, minimum=1),
            ),
            limits=dict(limits),
            speculative=typed("speculative", d.get("speculative"), dict),
            document=dict(d),
        )

    def gate_metrics(self) -> dict[str, float]:
        """The candidate's gate numbers, overall and per slice, as plain floats (absent ones left out): ``score``,
        ``baseline``, ``drop`` and ``drop_upper`` (the one-sided upper bound of the paired drop), ``allowed_drop``,
        ``kld_mean`` and ``top1`` (fidelity, when measured), ``slice.<name>.score|drop|drop_upper``.  Scores and drops
        are fractions of the eval metric (0-1)."""
        d = self.document
        cand = (d.get("runners") or {}).get(self.candidate) or {}
        comp = d.get("comparison") or {}
        ov = comp.get("overall") or {}
        pairs: dict[str, Any] = {
            "score": cand.get("score"),
            "baseline": ov.get("baseline"),
            "drop": ov.get("drop"),
            "drop_upper": ov.get("upper"),
        }
        pairs["allowed_drop"] = ((d.get("gate") or {}).get("allowed_drop") or {}).get("overall")
        fo = (d.get("fidelity") or {}).get("overall") or {}
        if fo.get("positions"):
            pairs["kld_mean"], pairs["top1"] = (fo.get("kld") or {}).get("mean"), fo.get("top1")
        for name, v in sorted((cand.get("slices") or {}).items()):
            st = (comp.get("slices") or {}).get(name) or {}
            pairs[f"slice.{name}.score"] = v.get("score")
            pairs[f"slice.{name}.drop"] = st.get("drop")
            pairs[f"slice.{name}.drop_upper"] = st.get("upper")
        return {k: float(v) for k, v in pairs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


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
    ``evaluation`` (``pipeline.evaluate.gate.judge`` decides it; ``pipeline.evaluate.results.gate_summary`` writes it).

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalResult(StageResult):
    """The evaluate stage's result (``manifest.json`` ``result``).

    Attributes:
        headline: ``score``, ``baseline``, ``drop``, ``agreement``, ``gate``, ``runner``, and ``kld`` / ``top1``
            (fidelity measured) and ``drop_ub`` (a non-inferiority bound) when there are.
        gate: the gate verdict (``summary.json`` ``gate.evaluate``, the release manifest's ``evaluation.gate``);
            None when the document has none.
        skipped_too_long: eval items skipped because they do not fit the engine's limits.
        evaluated: eval items run.
        candidate: the runner the gate judged.
        report: the report's file name in the artifact (``eval_report.json``).
    """

    gate: GateVerdict | None = None
    skipped_too_long: int | None = None
    evaluated: int | None = None
    candidate: str | None = None
    report: str | None = None

    @classmethod
    def _parse_field(cls, name: str, value: Any) -> Any:
        return GateVerdict.from_json(value) if name == "gate" else super()._parse_field(name, value)
