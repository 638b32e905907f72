"""The evaluate stage's artifact: file names and readers of ``artifacts/evaluate/<key>/``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..artifacts import PathOf, StageArtifact
from ..decoding import DecodingPolicy
from .result import Record, StageResult, from_fields, json_object

D = TypeVar("D")


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

    def stored_generation(self) -> StoredGeneration:
        """What this artifact generated (:class:`StoredGeneration`), from ``outputs.jsonl`` and ``eval_report.json``.

        Raises:
            InputError / OSError / ValueError: a file is missing or not what the evaluate stage writes.
        """
        import json

        report = json_object(json.loads(self.report_path.read_text(encoding="utf-8")))
        answers: dict[str, dict[str, StoredAnswer]] = {}
        for line in self.outputs_path.read_text(encoding="utf-8").splitlines():
            a = StoredAnswer.from_json(json.loads(line))
            if a.runner is not None:  # a skipped item's row has no runner
                answers.setdefault(str(a.runner), {})[str(a.id)] = a
        fidelity = report.get("fidelity")
        return StoredGeneration(
            answers=answers,
            batches={r: s.batch_size for r, s in _each(RunnerScores.from_json, report.get("runners")).items()},
            fidelity=fidelity if isinstance(fidelity, dict) else None,
            speculative=EvalReport.from_json(report, source=self.report_path).speculative,
        )


@dataclasses.dataclass(frozen=True)
class StoredAnswer(Record):
    """One runner's answer in ``outputs.jsonl`` (a skipped item's row has no ``runner``; None where a row lacks a
    field)."""

    id: Any = None
    runner: Any = None
    text: Any = None
    output_ids: Any = None
    finish_reason: Any = None
    error: Any = None


@dataclasses.dataclass(frozen=True)
class StoredGeneration:
    """What an evaluate artifact generated, which its gate does not change (a run whose key differs only in
    ``eval.gate`` reuses it: ``pipeline.evaluate.running.stored_runs``): every runner's answers by item id, the batch
    each runner ran with, and the report's ``fidelity`` and ``speculative`` sections as written."""

    answers: dict[str, dict[str, StoredAnswer]]
    batches: dict[str, int | None]
    fidelity: dict[str, Any] | None
    speculative: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class EvalSetRef:
    """The eval set a report was computed on: ``name``, ``path``, ``sha256`` of the file, ``limit`` (items; None: all),
    ``evaluated`` (items run)."""

    name: str | None = None
    path: Path | None = None
    sha256: str | None = None
    limit: int | None = None
    evaluated: int | None = None


def _each(parse: Callable[[dict[str, Any]], D], v: Any) -> dict[str, D]:
    """A JSON object of records (``name -> {...}``) parsed one by one; empty when ``v`` is not an object."""
    return {str(k): parse(json_object(x)) for k, x in json_object(v).items()}


@dataclasses.dataclass(frozen=True)
class SliceScore:
    """A runner's mean score (0-1) and item count on one slice."""

    score: float | None = None
    n: int | None = None


@dataclasses.dataclass(frozen=True)
class FinishReasons:
    """How many of a runner's answers ended on ``eos``, a ``stop`` string or the ``length`` limit."""

    eos: int = 0
    stop: int = 0
    length: int = 0


@dataclasses.dataclass(frozen=True)
class RunnerScores:
    """``eval_report.json`` ``runners.<name>``: mean score (0-1) and items scored, overall and per slice, items skipped
    as too long, errors, finish reasons and the batch size it ran with."""

    score: float | None = None
    n: int | None = None
    slices: dict[str, SliceScore] = dataclasses.field(default_factory=dict)
    skipped_too_long: int = 0
    errors: int = 0
    finish_reasons: FinishReasons = FinishReasons()
    batch_size: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunnerScores:
        fr = from_fields(FinishReasons, json_object(d.get("finish_reasons")))
        return from_fields(cls, {**d, "slices": _each(lambda v: from_fields(SliceScore, v), d.get("slices")), "finish_reasons": fr})


@dataclasses.dataclass(frozen=True)
class PairedRow:
    """One scope of ``eval_report.json`` ``comparison`` (candidate vs baseline): the baseline's score, the drop, its
    one-sided upper bound (None: not computed) and the fraction of identical answers (None: not measured)."""

    baseline: float | None = None
    drop: float | None = None
    upper: float | None = None
    agreement: float | None = None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``eval_report.json`` ``comparison``: overall (None without a baseline) and per slice."""

    overall: PairedRow | None = None
    slices: dict[str, PairedRow] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Comparison:
        o = d.get("overall")
        return cls(from_fields(PairedRow, o) if isinstance(o, dict) else None, _each(lambda v: from_fields(PairedRow, v), d.get("slices")))


@dataclasses.dataclass(frozen=True)
class KldStats:
    """KL divergence per teacher-forced position (nats): mean and its standard error, median, upper quantiles, max."""

    mean: float = 0.0
    se: float = 0.0
    median: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    p99_9: float = 0.0
    max: float = 0.0


@dataclasses.dataclass(frozen=True)
class FidelityStats:
    """Fidelity on one scope (``pipeline.evaluate.fidelity``): teacher-forced ``positions`` (0: not measured), KLD,
    the fraction with the same top token, perplexities and ln(PPL_cand / PPL_base), each with its standard error;
    ``samples`` for the calibration hold-out."""

    positions: int = 0
    kld: KldStats = KldStats()
    top1: float = 0.0
    top1_se: float = 0.0
    ppl_base: float = 0.0
    ppl_cand: float = 0.0
    ln_ppl_ratio: float = 0.0
    ln_ppl_ratio_se: float = 0.0
    samples: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FidelityStats:
        return from_fields(cls, {**d, "kld": from_fields(KldStats, json_object(d.get("kld")))})


@dataclasses.dataclass(frozen=True)
class FidelitySummary:
    """``eval_report.json`` ``fidelity``: the ``candidate`` measured against the baseline over ``items`` items,
    overall, per slice and on the calibration hold-out, or why it was not (``unavailable``)."""

    candidate: str | None = None
    unavailable: str | None = None
    items: int | None = None
    overall: FidelityStats = FidelityStats()
    slices: dict[str, FidelityStats] = dataclasses.field(default_factory=dict)
    calibration_heldout: FidelityStats = FidelityStats()

    @classmethod
    def from_json(cls, d: Any) -> FidelitySummary | None:
        """None for an absent or empty section (fidelity not asked for)."""
        if not isinstance(d, dict) or not d:
            return None
        parts = {k: FidelityStats.from_json(json_object(d.get(k))) for k in ("overall", "calibration_heldout")}
        return from_fields(cls, {**d, **parts, "slices": _each(FidelityStats.from_json, d.get("slices"))})


@dataclasses.dataclass(frozen=True)
class GateCheck:
    """One of ``eval_report.json`` ``gate.checks`` (``pipeline.evaluate.gate.judge``): scope (``overall`` |
    ``slice:<name>``), check name, verdict (from ``passed`` when absent), a one-line detail, the value against the
    threshold (``max_drop``: the drop, its upper bound and the allowance, fractions) and the items an inconclusive
    scope would need."""

    scope: str = "overall"
    check: str = ""
    verdict: str = "fail"
    passed: bool = False
    detail: str = ""
    value: Any = None
    threshold: Any = None
    upper: float | None = None
    items_needed: int | None = None


@dataclasses.dataclass(frozen=True)
class ReportGate:
    """``eval_report.json`` ``gate`` (``pipeline.evaluate.gate.judge``): verdict (from ``passed`` when absent), mode,
    reason, the inconclusive fix, the confidence of the upper bounds, the allowed drop overall and per slice
    (fractions) and every check."""

    passed: bool = False
    verdict: str = "fail"
    mode: str = "release"
    reason: str = ""
    fix: str | None = None
    confidence: float | None = None
    allowed_drop: float | None = None
    slice_allowed_drop: float | None = None
    checks: tuple[GateCheck, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReportGate:
        def derived(x: dict[str, Any]) -> dict[str, Any]:
            return {"verdict": "pass" if x.get("passed") else "fail", **x}

        a = json_object(d.get("allowed_drop"))
        checks = tuple(from_fields(GateCheck, derived(c)) for c in d.get("checks") or () if isinstance(c, dict))
        return from_fields(cls, {**derived(d), "checks": checks, "allowed_drop": a.get("overall"), "slice_allowed_drop": a.get("slice")})


@dataclasses.dataclass(frozen=True)
class SkippedItems:
    """``eval_report.json`` ``skipped``: the ids of the items longer than ``max_input_len`` tokens."""

    too_long: Sequence[str] = ()
    max_input_len: int | None = None


@dataclasses.dataclass(frozen=True)
class SpeculativeMeasurement:
    """``eval_report.json`` ``speculative`` (``pipeline.evaluate.draft.speculative_summary``): the draft measured, its
    ``k`` draft tokens, the acceptance rate (0-1) overall and per slice, and the mean tokens per target step (None where
    not recorded)."""

    draft_model: Any = None
    k: Any = None
    acceptance_rate: Any = None
    mean_tokens_per_step: Any = None
    slice_acceptance: dict[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SpeculativeMeasurement:
        rates = {str(k): float(v.get("acceptance_rate") or 0.0) for k, v in json_object(d.get("slices")).items()}
        return from_fields(cls, {**d, "slice_acceptance": rates})


@dataclasses.dataclass(frozen=True)
class EvalReport:
    """``eval_report.json`` (schema ``pipeline.eval_report/v1``; every key in :mod:`pipeline.evaluate.report`), the
    fields its readers use (the renderers of :mod:`pipeline.evaluate.report` and :mod:`pipeline.evaluate.junit`,
    package, parity, publish).

    Attributes:
        candidate: the runner the gate judged (``engine`` | ``simulated`` | ...).
        candidate_note: why that runner was chosen (``eval.candidate=auto``), else None.
        eval_set: the eval set evaluated.
        limits: the limits the prompts were checked against (tokens / sequences: ``max_input_len``, ``max_seq_len``,
            ``max_batch_size``; a value is None when unknown).
        speculative: the measured speculative-decoding acceptance (None unless measured).
        recipe, target: the quantization recipe and the build target (None: no engine built).
        runners: each runner's scores, by name (in run order).
        comparison: candidate vs baseline, overall and per slice.
        gate: the gate's verdict and checks.
        fidelity: the teacher-forced fidelity (None when not asked for).
        skipped: the items skipped as too long.
        decoding: the decoding policy every runner applied (None in a report without one).
        pairwise_agreement: ``"<runner a>~<runner b>"`` -> fraction of items with identical answers.
        worst_regressions: the rows of the worst regressions (``id``, ``slice``, ``prompt``, ``reference``,
            ``baseline``, ``candidate``, ``baseline_score``, ``candidate_score``), worst first.
        rope_type: the checkpoint's RoPE scaling type (None: plain RoPE).
        warnings: what the stage warned about (e.g. chat items fed without a chat template); also logged.
    """

    candidate: str | None = None
    candidate_note: str | None = None
    eval_set: EvalSetRef = EvalSetRef()
    limits: dict[str, int | None] = dataclasses.field(default_factory=dict)
    speculative: dict[str, Any] | None = None
    recipe: str | None = None
    target: str | None = None
    runners: dict[str, RunnerScores] = dataclasses.field(default_factory=dict)
    comparison: Comparison = Comparison()
    gate: ReportGate = ReportGate()
    fidelity: FidelitySummary | None = None
    skipped: SkippedItems = SkippedItems()
    decoding: DecodingPolicy | None = None
    pairwise_agreement: dict[str, float] = dataclasses.field(default_factory=dict)
    worst_regressions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rope_type: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)

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
        decoding = json_object(d.get("decoding"))
        return cls(
            candidate=typed("candidate", d.get("candidate"), str),
            candidate_note=typed("notes.candidate", notes.get("candidate"), str),
            eval_set=EvalSetRef(
                name=typed("eval_set.name", es.get("name"), str),
                path=Path(path) if path else None,
                sha256=typed("eval_set.sha256", es.get("sha256"), str),
                limit=typed("eval_set.limit", es.get("limit"), int, minimum=1),
                evaluated=typed("eval_set.evaluated", es.get("evaluated"), int),
            ),
            limits=dict(limits),
            speculative=typed("speculative", d.get("speculative"), dict),
            recipe=typed("recipe", d.get("recipe"), str),
            target=typed("target", d.get("target"), str),
            runners=_each(RunnerScores.from_json, d.get("runners")),
            comparison=Comparison.from_json(json_object(d.get("comparison"))),
            gate=ReportGate.from_json(json_object(d.get("gate"))),
            fidelity=FidelitySummary.from_json(d.get("fidelity")),
            skipped=from_fields(SkippedItems, json_object(d.get("skipped"))),
            decoding=DecodingPolicy.from_json(decoding) if decoding else None,
            pairwise_agreement=json_object(d.get("pairwise_agreement")),
            worst_regressions=list(d.get("worst_regressions") or ()),
            rope_type=json_object(d.get("rope_scaling")).get("rope_type"),
            warnings=[str(w) for w in (typed("warnings", d.get("warnings"), list) or [])],
        )

    def gate_metrics(self) -> dict[str, float]:
        """The candidate's gate numbers, overall and per slice, as plain floats (absent ones left out): ``score``,
        ``baseline``, ``drop`` and ``drop_upper`` (the one-sided upper bound of the paired drop), ``allowed_drop``,
        ``kld_mean`` and ``top1`` (fidelity, when measured), ``slice.<name>.score|drop|drop_upper``.  Scores and drops
        are fractions of the eval metric (0-1)."""
        cand = self.runners.get(self.candidate or "", RunnerScores())
        ov = self.comparison.overall or PairedRow()
        pairs: dict[str, Any] = {"score": cand.score, "baseline": ov.baseline, "drop": ov.drop, "drop_upper": ov.upper}
        pairs["allowed_drop"] = self.gate.allowed_drop
        fo = self.fidelity.overall if self.fidelity else FidelityStats()
        if fo.positions:
            pairs["kld_mean"], pairs["top1"] = fo.kld.mean, fo.top1
        for name, v in sorted(cand.slices.items()):
            st = self.comparison.slices.get(name, PairedRow())
            pairs[f"slice.{name}.score"] = v.score
            pairs[f"slice.{name}.drop"] = st.drop
            pairs[f"slice.{name}.drop_upper"] = st.upper
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
