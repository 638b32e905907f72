"""Reporting of a pipeline run: the run summary (``summary.json`` and its table), the release-gate section, the CI
gate reports (``junit.xml``, ``$GITHUB_STEP_SUMMARY``) and the comparison of a multirun sweep's jobs.

:mod:`pipeline.runner` runs the stages and hands what happened to these functions; nothing here runs a stage.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .core.config import STAGES, PipelineConfig, deprecations
from .core.contracts.manifest import RunSummaryRecord
from .core.contracts.package import ParityRecord
from .core.markdown import md_cell, md_table
from .core.stage import resolve_order
from .core.store import Artifact, redact, redact_files, redact_text, secret_fields, write_json_atomic
from .errors import EXIT_FAILED, EXIT_OK
from .validation import order_note

SUMMARY_SCHEMA = "pipeline.summary/v1"
INTERRUPTED = "interrupted"
"""The run's ``error`` (and its failed stage's) after Ctrl-C, SIGTERM or SIGHUP (exit 130); the table shows that stage
as interrupted."""


@dataclasses.dataclass
class StageReport:
    stage: str
    status: str  # cached | ran | failed | dry-run | not-run
    seconds: float
    path: str | None = None
    key: str | None = None
    headline: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    lookup_s: float | None = None
    memory: dict[str, Any] | None = None
    """Peak host RSS (this process and its children) and GPU memory of a stage that ran (:mod:`pipeline.core.memory`)."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """Why a stored artifact of this key was not reused (moved aside and produced again), one line each."""


@dataclasses.dataclass
class RunSummary:
    stages: list[StageReport]
    exit_code: int
    overrides: list[str]
    total_s: float
    plan: dict[str, Any] | None = None
    error: str | None = None
    model: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    """The release-gate section: the evaluate stage's ``gate`` result and the package stage's ``parity``."""
    deprecations: list[str] = dataclasses.field(default_factory=list)
    """One warning per deprecated config spelling the run used (:func:`pipeline.core.config.deprecations`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SUMMARY_SCHEMA,
            "model": self.model,
            "exit_code": self.exit_code,
            "ok": self.exit_code == EXIT_OK,
            "overrides": self.overrides,
            "total_s": round(self.total_s, 3),
            "error": self.error,
            "plan": self.plan,
            "gate": self.gate,
            "deprecations": self.deprecations,
            "stages": [dataclasses.asdict(s) for s in self.stages],
        }


def mark_failed(
    reports: list[StageReport],
    cfg: PipelineConfig,
    error: str,
    stage: str | None = None,
    *,
    blame: bool = True,
    started: dict[str, float] | None = None,
) -> None:
    """Report the stages that did not finish: ``stage`` (the one the error belongs to, when a check before the first
    stage named it; else the first unfinished one) as failed, with the seconds it ran since ``started[stage]`` (0 when
    it had not started), the others as not run; with ``blame=False`` (a configuration error) every one as not run."""
    seen = {r.stage for r in reports}
    try:
        order = resolve_order(list(cfg.stages), cfg)
    except Exception:
        order = [s for s in STAGES if s in cfg.stages]
    pending = [s for s in order if s not in seen]
    failed = (stage if stage in pending else (pending[0] if pending else None)) if blame else None
    started, now = started or {}, time.time()
    for s in pending:
        seconds = now - started[s] if s == failed and s in started else 0.0
        reports.append(StageReport(s, "failed" if s == failed else "not-run", seconds, error=error if s == failed else None))


def config_warnings(cfg: PipelineConfig, console: Console) -> list[str]:
    """Print one warning per config field that holds a secret-looking value (the run uses it as given; every
    recorded copy masks it: pipeline.core.store.redact) and a note when ``stages`` is written out of pipeline order
    (:func:`pipeline.validation.order_note`); returns the deprecation notes, for the summary.  A deprecated spelling is
    not printed here: resolving the config (:func:`pipeline.core.config.to_object`) logged it already."""
    for field_name in secret_fields(cfg):
        console.print(
            f"[yellow]warning:[/] {field_name} holds a secret-looking value; the run uses it as given and every record "
            f"of it (manifests, summary, logs, .hydra/*.yaml) shows ***redacted*** (secrets belong in the environment, "
            f"e.g. HF_TOKEN, never in the config)."
        )
    order = order_note(cfg)
    if order:
        console.print(f"note: {escape(order)}")
    return deprecations(cfg)


JUNIT_FILE = "junit.xml"
"""The run's gate as JUnit XML, next to ``summary.json`` (the evaluate artifact's checks + serving parity)."""


def ci_reports(eval_dir: Path | None, parity: ParityRecord | None, summary_dir: Path | None, console: Console) -> None:
    """For CI jobs, when this run evaluated (ran or cache hit): ``<run dir>/junit.xml`` (gate checks and the package
    stage's serving parity, ``pipeline.evaluate.junit``) and, when ``$GITHUB_STEP_SUMMARY`` is set, the gate table
    appended to it. A write failure is reported, not raised (the run's exit code stays the gate's)."""
    from .core.contracts.evaluate import EvalArtifact
    from .evaluate.junit import append_step_summary, write_junit

    if eval_dir is None:
        return
    try:
        rep, par = EvalArtifact(eval_dir).report(), parity
        if summary_dir is not None:
            summary_dir.mkdir(parents=True, exist_ok=True)
            write_junit(summary_dir / JUNIT_FILE, rep, par)
        append_step_summary(rep, par)
    except (OSError, ValueError, KeyError) as e:
        console.print(f"[red]could not write the CI gate reports (junit.xml / $GITHUB_STEP_SUMMARY): {escape(str(e))}[/]")


def print_cached_eval_warnings(eval_dir: Path, console: Console) -> None:
    """The warnings of a cached evaluate (``eval_report.json`` ``warnings``, e.g. chat items fed without a chat
    template), printed as the fresh run printed them (``pipeline.evaluate.report.print_warnings``).  A report that
    cannot be read prints nothing here: :func:`ci_reports` says so."""
    from .core.contracts.evaluate import EvalArtifact
    from .evaluate.report import print_warnings

    try:
        rep = EvalArtifact(eval_dir).report()
    except (OSError, ValueError):
        return
    print_warnings(rep, console)


def write_summary(summary: RunSummary, summary_dir: Path, console: Console) -> None:
    """``summary.json`` (redacted); a write failure is reported, not raised."""
    try:
        summary_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(summary_dir / "summary.json", redact(summary.to_json()))
    except OSError as e:
        console.print(f"[red]could not write the run summary to {summary_dir}: {e}[/]")


def model_facts(cfg: PipelineConfig, overrides: list[str]) -> dict[str, Any] | None:
    """The model's name and dtype and where each came from (``set`` in the config, or derived from the checkpoint:
    the folder name / ``config.json`` ``torch_dtype``; pipeline/core/config/model.py).  None when there is no model
    to name: no checkpoint (``model.path`` empty, blank or null: the run refuses it) and no ``model.name`` but the
    placeholder ``model`` (the title read "model model (checkpoint folder)")."""
    try:
        from .core.config.model import checkpoint_dtype, checkpoint_name

        m = cfg.model
        set_keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
        has_path = bool(str(m.path or "").strip())
        if not has_path and "model.name" not in set_keys and m.name == checkpoint_name(m.path):
            return None
        derived_name = has_path and "model.name" not in set_keys and m.name == checkpoint_name(m.path)
        derived_dtype = has_path and "model.dtype" not in set_keys and m.dtype == checkpoint_dtype(m.path)
        return {
            "name": m.name,
            "name_source": "checkpoint folder" if derived_name else "config",
            "dtype": m.dtype,
            "dtype_source": "checkpoint torch_dtype" if derived_dtype else "config",
        }
    except Exception:
        return None


def redact_run_outputs(run_dir: Path) -> None:
    """Apply the one redaction to what Hydra wrote before the run started: ``.hydra/*.yaml`` of the job and the
    sweep's ``multirun.yaml`` (config and overrides, verbatim)."""
    files = list((run_dir / ".hydra").glob("*.yaml")) if (run_dir / ".hydra").is_dir() else []
    files += [p / "multirun.yaml" for p in (run_dir, run_dir.parent, run_dir.parent.parent) if (p / "multirun.yaml").is_file()]
    redact_files(files)


def print_summary(summary: RunSummary, console: Console) -> None:
    """The run's table on ``console`` (a record like the summary: model name, paths and headlines are redacted); the
    ``error (exit N): ...`` line of a failed run goes to stderr (none when ``console`` is quiet); that line, or ``ok in
    N s``, is also logged to the ``pipeline`` logger (INFO), so the run's ``pipeline.log`` ends with the result."""
    m = summary.model
    title = "pipeline run"
    if m:
        title += f" - model {m['name']} ({m['name_source']}), dtype {m['dtype']} ({m['dtype_source']})"
    t = Table(title=escape(redact_text(title)), show_lines=False)
    for col in ("stage", "status", "time", "output", "headline"):
        t.add_column(col)
    for r in summary.stages:
        status = INTERRUPTED if r.status == "failed" and r.error == INTERRUPTED else r.status  # summary.json: failed
        style = {"cached": "green", "ran": "cyan", "failed": "red", "not-run": "dim", "dry-run": "yellow"}.get(r.status, "")
        head = ", ".join(f"{k}={_fmt(v)}" for k, v in r.headline.items())
        cells = (redact_text(r.path or "-"), redact_text(head or (r.error or "")[:120]))
        t.add_row(r.stage, f"[{style}]{status}[/]", f"{r.seconds:.2f} s", *map(escape, cells))
    console.print(t)
    if summary.gate:
        print_gate(summary.gate, console, said=summary.error)
    result = f"error (exit {summary.exit_code}): {summary.error}" if summary.error else f"ok in {summary.total_s:.1f} s"
    logging.getLogger("pipeline").info(result)  # the run's pipeline.log ends with how the run ended, too
    if summary.error:  # on stderr, unwrapped, as every other error line of the CLI (stdout keeps the summary)
        if not console.quiet:
            console.file.flush()
            print(result, file=sys.stderr, flush=True)
    else:
        console.print(f"[bold green]ok[/] in {summary.total_s:.1f} s")


def parity_record(art: Artifact) -> dict[str, Any] | None:
    """The package stage's serving-parity record (:meth:`pipeline.core.contracts.package.PackageArtifact.parity_record`)."""
    from .core.contracts.package import PackageArtifact, PackageResult

    return PackageArtifact(Path(art.path)).parity_record(art.result_as(PackageResult))


def print_gate(gate: dict[str, Any], console: Console, *, said: str | None = None) -> None:
    """The release-gate section of the run summary: non-inferiority verdict (bound vs allowance), fidelity
    (mean KLD, top-1 agreement) and serving parity (``served == evaluated: N/N`` from the package stage's
    ``parity`` result; "not checked" when absent).  An inconclusive gate's fix is printed here unless ``said`` (the
    run's error line, printed next) already carries it (the package stage's refusal): once at the end of a run.  ``gate`` is ``{"evaluate": <GateVerdict record>, "parity": ...}``
    (``summary.json`` ``gate``)."""
    from .core.contracts.manifest import RunGate

    typed = RunGate.from_json(gate)
    ev = typed.evaluate
    if ev is not None:
        colors = {"pass": "green", "inconclusive": "yellow", "fail": "red"}
        # the headline names the checks that failed; non-inferiority is the max_drop checks' own verdict
        ni = ev.non_inferiority
        color = colors.get(ni, "red")
        other = [c for c in ev.failed_checks if c.check != "max_drop"]
        if other:
            named = "; ".join(f"{c.check}" + ("" if c.scope == "overall" else f" [{c.scope}]") + f" ({c.detail})" for c in other)
            xmode = " (exploratory: not releasable)" if ev.exploratory else ""
            console.print(f"[bold]gate[/]  [{colors.get(ev.verdict, 'red')}]{ev.verdict}[/] on {escape(named)}{xmode}")
        b = ev.bound
        bound = (
            f" drop {100 * b.drop:+.1f} pp, upper bound {100 * b.upper:+.1f} pp vs allowed {100 * b.allowance:.1f} pp"
            if b is not None and b.upper is not None
            else ""
        )
        mode = " (exploratory: not releasable)" if ev.exploratory and ni != "pass" else ""
        if ev.scopes:
            bound = f" (overall{bound}; scopes: " + ", ".join(f"{n} {v}" for v, n in ev.scopes.items() if n) + ")"
        console.print(f"[bold]gate[/]  non-inferiority [{color}]{ni}[/]{escape(bound)}{mode}")
        if ev.inconclusive and ev.fix and not (said and ev.fix.split(". ", 1)[0] in said):
            console.print(f"[bold]gate[/]  [yellow]{escape(ev.fix)}[/]")
        f = ev.fidelity
        if f is not None:
            console.print(
                f"[bold]gate[/]  fidelity: mean KLD {f.kld_mean:.4g} ± {f.kld_se:.2g} nats, same top token "
                f"{100 * f.top1:.2f}% ({f.positions} teacher-forced tokens)"
            )
    p = typed.parity
    if p is not None and p.total is not None:
        console.print(f"[bold]gate[/]  served == evaluated: {p.matched}/{p.total}" + (f" ({escape(str(p.note))})" if p.note else ""))
    elif p is not None:
        console.print(f"[bold]gate[/]  served == evaluated: {escape(str(p.status or 'not checked'))}")
    else:
        console.print("[bold]gate[/]  served == evaluated: not checked in this run")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_comparison(sweep_dir: Path, console: Console) -> dict[str, Any]:
    """Read every job's ``summary.json`` under ``sweep_dir`` and write ``comparison.json`` and ``comparison.md``.

    Job folders are found recursively (the default ``hydra.sweep.subdir`` is one flat folder per job,
    ``<num>-<swept overrides>``, pipeline.cli.job_dirname; a user's subdir may nest).  A job folder (it has ``.hydra/``) without a readable summary counts as failed
    (exit code 1).  The document's ``exit_code`` is the highest job exit code (0 when all passed).
    """
    rows = []
    job_dirs = {f.parent for f in sweep_dir.rglob("summary.json")} | {h.parent for h in sweep_dir.rglob(".hydra") if h.is_dir()}
    for d in sorted(job_dirs):
        job = d.relative_to(sweep_dir).as_posix()
        try:
            s = json.loads((d / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            rows.append(
                {
                    "job": job,
                    "overrides": "",
                    "exit_code": EXIT_FAILED,
                    "error": f"no readable summary.json ({type(e).__name__}): the job died before finishing",
                }
            )
            continue
        rec = RunSummaryRecord.from_json(s)
        row: dict[str, Any] = {"job": job, "overrides": " ".join(rec.overrides), "exit_code": rec.exit_code}
        for st in rec.stages:
            for k, v in st.headline.items():
                row[f"{st.stage}.{k}"] = v
        if rec.error:
            row["error"] = str(rec.error)[:200]
        rows.append(row)
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    codes = [r["exit_code"] for r in rows]  # every row has one (set above)
    worst = max((c if isinstance(c, int) else EXIT_FAILED for c in codes), default=EXIT_OK)
    doc = {"schema": "pipeline.comparison/v1", "columns": cols, "rows": rows, "exit_code": worst}
    write_json_atomic(sweep_dir / "comparison.json", doc)
    md = md_table(cols, ([md_cell(_fmt(r.get(c, ""))) for c in cols] for r in rows))  # one line per job
    (sweep_dir / "comparison.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    # The console shows what differs between the jobs (the files keep every column): the overrides that
    # vary, the headline values that vary, and the verdict columns.
    split = [str(r["overrides"]).split() for r in rows]
    common = set.intersection(*(set(x) for x in split)) if split else set()
    keep = {"exit_code", "evaluate.gate", "evaluate.score", "evaluate.drop", "evaluate.agreement", "evaluate.kld", "evaluate.top1"}
    shown = [c for c in cols if c not in ("job", "overrides") and (c in keep or len({_fmt(r.get(c, "")) for r in rows}) > 1)]
    title = f"comparison of {len(rows)} runs ({sweep_dir / 'comparison.md'})"
    heads = [c.replace("evaluate.", "eval.").replace("quantize.", "quant.") for c in shown]
    variants = [" ".join(o for o in ov if o not in common) or "-" for ov in split]
    cells = [[_fmt(r.get(c, "")) for c in shown] for r in rows]
    widths = [max([len(h), *(len(x[i]) for x in cells)]) for i, h in enumerate(heads)]
    if sum(widths) + 3 * len(widths) + max(map(len, variants), default=1) + 4 > console.width:
        # too wide for this terminal (every column would shrink to "e…"): one block per variant instead
        console.print(f"[bold]{title}[/]")
        for v, vals in zip(variants, cells):
            console.print(f"[bold]{escape(v)}[/]")
            for h, x in zip(heads, vals):
                if x != "":
                    console.print(f"  {h:<22} {escape(x)}", soft_wrap=True)
        return doc
    t = Table(title=title)
    t.add_column("variant", no_wrap=True)
    for h in heads:
        t.add_column(h)
    for v, vals in zip(variants, cells):
        t.add_row(v, *vals)
    console.print(t)
    return doc


# --------------------------------------------------------------------------- multirun
try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover
    _HydraCallback = object  # type: ignore[misc,assignment]


class MultirunComparison(_HydraCallback):  # type: ignore[misc,unused-ignore]  # _HydraCallback is Any when hydra is absent
    """Hydra callback: after ``-m`` sweeps, join every job's summary.json into one comparison table."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        """Write the comparison and make the ``pipeline -m`` exit code the worst job's.

        Runs in the launching process; jobs may have run in other processes (joblib, SLURM), so
        their exit codes are read from their ``summary.json`` files, not from in-process state.
        """
        sweep_dir = Path(config.hydra.sweep.dir)
        doc = write_comparison(sweep_dir, Console())
        record_exit_code(int(doc["exit_code"] or 0))


_WORST_EXIT = [0]


def record_exit_code(code: int) -> None:
    """Remember ``code`` for :func:`worst_exit_code` (the runs and multirun comparisons of this process)."""
    _WORST_EXIT[0] = max(_WORST_EXIT[0], int(code))


def worst_exit_code() -> int:
    """The highest exit code recorded in this process: what ``pipeline`` (single run or ``-m`` sweep) exits with."""
    return _WORST_EXIT[0]
