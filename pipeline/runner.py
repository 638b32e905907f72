"""Orchestration: resolve stages, compute cache keys, run or reuse artifacts; the summary, gate and CI reports of the
run are written by :mod:`pipeline.report`."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .core import hostinfo, memory
from .core.config import ConfigError, PipelineConfig, key_fields
from .core.contracts.manifest import ArtifactManifest, RunGate
from .core.contracts.result import StageResult
from .core.stage import Stage, StageContext, get_stage, resolve_order
from .core.store import Artifact, ArtifactStore, cache_key, digest_input, install_log_redaction, not_inputs, redact, redact_text
from .errors import EXIT_FAILED, EXIT_GATE, EXIT_INTERRUPTED, EXIT_OK, PipelineError, caused_by_interrupt
from .preflight import all_externals, open_store
from .report import (
    INTERRUPTED,
    RunSummary,
    StageReport,
    ci_reports,
    config_warnings,
    mark_failed,
    model_facts,
    parity_record,
    print_cached_eval_warnings,
    print_summary,
    redact_run_outputs,
    write_summary,
)
from .validation import validate as validate_config

log = logging.getLogger("pipeline")


_DIGESTS: dict[tuple[str, int, int, tuple[str, ...]], str] = {}


def _digest(p: Path, outputs: tuple[Path, ...] = ()) -> str:
    """digest_input (a folder less the run's own outputs inside it: :func:`pipeline.core.store.input_files`), memoised
    per process on (path, size, mtime) of the file or the folder's newest input file."""
    try:
        st = p.stat()
        skip = not_inputs(p, outputs) if p.is_dir() else set()
        newest = [f.stat().st_mtime_ns for f in p.rglob("*") if f.relative_to(p).parts[0] not in skip and f.is_file()] if p.is_dir() else []
        stamp = (str(p), st.st_size, max([st.st_mtime_ns, *newest]), tuple(sorted(skip)))
    except OSError:
        return digest_input(p, outputs)
    if stamp not in _DIGESTS:
        _DIGESTS[stamp] = digest_input(p, outputs)
    return _DIGESTS[stamp]


def compute_key(
    stage: Stage, cfg: PipelineConfig, inputs: dict[str, Artifact], external: dict[str, Path], outputs: tuple[Path, ...] = ()
) -> tuple[str, dict[str, Any]]:
    """The cache key of ``stage`` and the document it hashes (recorded in the manifest).  ``outputs``: the run's own
    output folders (the store, the run folder), left out of an external folder that holds them."""
    doc = {
        "stage": stage.name,
        "stage_version": stage.version,
        "config": stage.key_config(cfg) if stage.key_config else {g: key_fields(getattr(cfg, g)) for g in stage.config_groups},
        # Upstream artifacts enter by their *key* (itself a hash of their inputs, config and versions), so
        # the chain is input-addressed like a build system's action keys: timing fields inside an upstream
        # report never invalidate downstream work. Output digests stay in each manifest for provenance.
        "inputs": {name: art.key for name, art in sorted(inputs.items())},
        "external": {name: _digest(p, outputs) for name, p in sorted(external.items())},
        "extras": stage.key_extras(cfg, inputs),
        "versions": hostinfo.library_versions(stage.libraries),
    }
    return cache_key(doc), doc


def _target_available(
    cfg: PipelineConfig, store: ArtifactStore, order: list[str], externals: dict[str, dict[str, Path]], outputs: tuple[Path, ...]
) -> None:
    """Run the build target's preflight before any stage runs (PreflightError, exit 4, with the exact
    command), so a request this machine cannot build never spends hours calibrating first.

    Keys are input-addressed, so the quantize artifact's future folder is known before it exists.
    """
    from .core.targets import get_target, resolve_target

    name, _ = resolve_target(cfg)
    target = get_target(name)
    ok, _reason = target.available()
    if ok:
        return
    pending: dict[str, Artifact] = {}
    quant = store.root / "quantize" / "<key>"
    for s in order:
        if s == "build":
            break
        st = get_stage(s)
        key, _ = compute_key(st, cfg, {d: pending[d] for d in st.deps_for(cfg)}, externals[s], outputs)
        pending[s] = Artifact(s, key, store.path_for(s, key), {"output_digest": f"pending:{key}", "result": {}})
        if s == "quantize":
            quant = pending[s].path
    from .core.contracts.quantize import QuantizeArtifact

    ckpt = QuantizeArtifact(quant).trtllm_checkpoint
    target.preflight(cfg, ckpt, None)


def _plan(cfg: PipelineConfig, console: Console, order: list[str]) -> dict[str, Any] | None:
    from .planner import plan_for_run

    try:
        return plan_for_run(cfg, console, order)
    except PipelineError:
        raise
    except Exception as e:
        log.warning("planner failed: %s", e)
        return None


@dataclasses.dataclass
class _RunState:
    """What a run has established so far; kept when a stage fails, for the summary."""

    reports: list[StageReport] = dataclasses.field(default_factory=list)
    plan: dict[str, Any] | None = None
    gate_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    gate_failed: str | None = None
    gate_inconclusive: bool = False  # the verdict that set gate_failed could show neither pass nor failure
    eval_dir: Path | None = None
    """The evaluate artifact of this run (its ``eval_report.json`` feeds the run's JUnit XML and step summary)."""
    started: dict[str, float] = dataclasses.field(default_factory=dict)
    """When each stage began (``time.time()``): a stage that fails or is interrupted is reported with the time it ran."""
    run_dir: Path | None = None
    """The run's output folder (Hydra's, where ``pipeline.log`` and ``summary.json`` go); None outside the CLI."""


def _console() -> Console:
    """The run's console. No emoji codes (user text such as a slice named ``a`` would read ``:a:`` as one); when
    stdout is not a terminal (CI logs) and ``COLUMNS`` is unset, 160 columns so tables are not cut at Rich's 80."""
    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=False, emoji=False, width=160 if wide else None)


def _pipeline_config(cfg: Any, overrides: list[str]) -> PipelineConfig:
    """``run_pipeline``'s ``cfg`` as a :class:`PipelineConfig`: one as is, a Hydra ``DictConfig`` of the pipeline's
    config converted as the CLI converts it (:func:`pipeline.core.config.to_object`: ConfigError, exit 2, for a bad
    one); anything else (a dict, a list of overrides) raises :class:`ConfigTypeError` (exit 2) naming what it takes."""
    from omegaconf import DictConfig

    from .core.config import ConfigTypeError, Problem, to_object

    if isinstance(cfg, PipelineConfig):
        return cfg
    if isinstance(cfg, DictConfig):
        return to_object(cfg, overrides)
    if isinstance(cfg, (list, tuple, str)):
        fix = f"cfg = pipeline.compose({cfg.split() if isinstance(cfg, str) else list(cfg)!r}); pipeline.run(cfg)"
    elif isinstance(cfg, Mapping):
        fix = 'cfg = pipeline.compose([f"{k}={v}" for k, v in overrides.items()]) for a dict of overrides; pipeline.run(cfg)'
    else:
        fix = 'cfg = pipeline.compose(["quant=int4_awq", "stages=[export,quantize]"]); pipeline.run(cfg)'
    what = (
        f"is of type {type(cfg).__name__}; run takes the PipelineConfig of pipeline.compose(...) (or a Hydra DictConfig "
        "of the pipeline's config), so the config gets the CLI's presets and checks."
    )
    raise ConfigTypeError([Problem("cfg", cfg, what, fix)])


def run_pipeline(
    cfg: PipelineConfig, *, overrides: list[str] | None = None, summary_dir: Path | None = None, console: Console | None = None
) -> RunSummary:
    """Run the configured stages; never raises for stage failures (see ``RunSummary.exit_code``).

    ``cfg``: the :class:`PipelineConfig` of :func:`pipeline.core.config.compose`, or a Hydra ``DictConfig`` of the
    pipeline's config; anything else (a dict, a list of overrides) raises ``ConfigTypeError`` (a ``ConfigError``,
    exit 2, and a ``TypeError``) before any work, as a DictConfig compose would refuse raises ``ConfigError``."""
    cfg = _pipeline_config(cfg, list(overrides or []))
    console = console or _console()
    t_start = time.time()
    state = _RunState(run_dir=Path(summary_dir) if summary_dir is not None else None)
    overrides = list(overrides or [])
    exit_code, error = EXIT_OK, None
    install_log_redaction()
    if summary_dir is not None:
        redact_run_outputs(Path(summary_dir))
    deprecated = config_warnings(cfg, console)
    try:
        _run_stages(cfg, console, state)
        if state.gate_failed and exit_code == EXIT_OK:
            verdict = "inconclusive (not failed: the eval set cannot show non-inferiority)" if state.gate_inconclusive else "failed"
            exit_code, error = EXIT_GATE, f"evaluation gate {verdict}: {state.gate_failed}"
    except KeyboardInterrupt:
        exit_code, error = EXIT_INTERRUPTED, INTERRUPTED
        mark_failed(state.reports, cfg, error, started=state.started)
    except ConfigError as e:  # found before any stage ran: no stage is to blame, none ran
        exit_code, error = e.exit_code, str(e)
        mark_failed(state.reports, cfg, error, blame=False)
    except PipelineError as e:
        exit_code, error = e.exit_code, str(e)
        mark_failed(state.reports, cfg, error, getattr(e, "stage", None), started=state.started)
    except Exception as e:
        if caused_by_interrupt(e):  # a Ctrl-C that a library re-raised as its own error (an import under way: ModuleNotFoundError)
            exit_code, error = EXIT_INTERRUPTED, INTERRUPTED
        else:
            log.exception("stage failed")
            exit_code, error = EXIT_FAILED, f"{type(e).__name__}: {e}"
        mark_failed(state.reports, cfg, error, started=state.started)
    summary = RunSummary(
        state.reports,
        exit_code,
        overrides,
        time.time() - t_start,
        state.plan,
        redact_text(error) if error else error,
        model=model_facts(cfg, overrides),
        gate=state.gate_info or None,
        deprecations=deprecated,
    )
    print_summary(summary, console)
    if summary_dir is not None:
        write_summary(summary, summary_dir, console)
    ci_reports(state.eval_dir, RunGate.from_json(state.gate_info).parity, summary_dir, console)
    return summary


def _run_stages(cfg: PipelineConfig, console: Console, state: _RunState) -> None:
    """Validate, plan, check every external input and the build target, then run (or reuse, or dry-run) each stage
    in order, recording reports and gate results in ``state``. Raises on the first failing stage."""
    validate_config(cfg, list_inputs=True)  # one ConfigError (exit 2), with the missing inputs of the stages that run
    order = resolve_order(list(cfg.stages), cfg)
    # Every stage's external inputs (checkpoint, calibration set, eval set) are checked before the first
    # stage runs, and before the plan: an input no run can use (a shapes-only preset to export) is exit 2 on any
    # host, where the plan's refusal (exit 4) depends on the host's free memory and disk (CI).
    externals = all_externals(order, cfg)
    state.plan = _plan(cfg, console, order)
    store = open_store(cfg.store_dir, verify=cfg.verify_cache)  # verify_cache holds on every lookup
    # the run's own outputs, when they lie inside an external input folder (a run from inside the checkpoint), are
    # not its input: left out of its digest (pipeline.core.store.input_files) and of model_info.json's files
    outputs = (store.root, *([state.run_dir] if state.run_dir is not None else []))
    # The build target's availability too: nothing heavy runs on a doomed request.
    if "build" in order and not cfg.dry_run:
        _target_available(cfg, store, order, externals, outputs)
    for stage_name, setting, field in (
        ("quantize", cfg.calibration.device, "calibration.device"),
        ("evaluate", cfg.eval.device, "eval.device"),
    ):
        if stage_name in order and not cfg.dry_run and str(setting).strip().lower().startswith("cuda"):
            hostinfo.resolve_torch_device(setting, field)  # a named GPU that is not there: exit 2 before export runs
    done: dict[str, Artifact] = {}
    show_progress = cfg.progress and console.is_terminal
    for name in order:
        stage = get_stage(name)
        t0 = state.started[name] = time.time()
        inputs = {d: done[d] for d in stage.deps_for(cfg)}
        external = externals[name]
        key, key_doc = compute_key(stage, cfg, inputs, external, outputs)
        ctx = StageContext(
            cfg=cfg,
            inputs=inputs,
            external=external,
            out=None,
            manifest=_manifest(name, key_doc, inputs, external, state.plan),
            console=console,
            log=logging.getLogger(f"pipeline.{name}"),
            show_progress=show_progress,
            outputs=outputs,
        )
        if stage.generation_key is not None:
            ctx.manifest["generation_key"] = cache_key(stage.generation_key(key_doc))
        if cfg.dry_run:
            done[name] = _dry_run_stage(stage, ctx, store, key, t0, state)
            continue
        art = _run_or_reuse(stage, ctx, store, key, t0, state)
        done[name] = art
        if name == "evaluate" and state.reports[-1].status == "cached":  # a fresh run printed them with its table
            print_cached_eval_warnings(Path(art.path), console)
        _record_gate(name, art, console, state, allow_failed_gate=bool(cfg.package.allow_failed_gate), packaging="package" in order)
        if name == "package" and cfg.package.publish:
            _publish(art, cfg, console, state)


def _publish(art: Artifact, cfg: PipelineConfig, console: Console, state: _RunState) -> None:
    """``package.publish=mlflow``: register the release (ran or cached) as a new model version
    (``pipeline.package.publish``); recorded in the summary's ``gate.publish``. Raises GateFailed (exit 3) for a
    release whose gate did not pass, PreflightError (exit 4) when the registry does not answer."""
    from .package.publish import publish_mlflow

    rec = publish_mlflow(Path(art.path), cfg)
    state.gate_info["publish"] = rec
    note = " [bold yellow](gate override)[/]" if rec["gate_override"] else ""
    console.print(f"[green]✓[/] publish   {escape(rec['model'])} version {rec['version']} in {escape(str(rec['tracking_uri']))}{note}")


def _manifest(
    name: str, key_doc: dict[str, Any], inputs: dict[str, Artifact], external: dict[str, Path], plan: dict[str, Any] | None
) -> dict[str, Any]:
    """The artifact manifest a stage starts from (config and key document redacted, inputs, versions, host)."""
    manifest: dict[str, Any] = {
        "config": redact(key_doc["config"]),
        "key_document": redact(key_doc),
        "inputs": {d: {"path": str(a.path), "digest": a.digest, "key": a.key, "production": a.doc.production} for d, a in inputs.items()},
        "external": {n: {"path": str(p), "digest": key_doc["external"][n]} for n, p in external.items()},
        "versions": key_doc["versions"],
        "host": hostinfo.host(),
    }
    if plan is not None and name == "build":  # the memory/speed plan for exactly this engine's config
        manifest["plan"] = plan
    return manifest


WOULD_RUN = "would run"
"""The first words of a dry-run stage's note when the real run would run it (the rest says why)."""


def _dry_run_stage(stage: Stage, ctx: StageContext, store: ArtifactStore, key: str, t0: float, state: _RunState) -> Artifact:
    """``dry_run=true``: the stage's dry-run report, and the cached artifact or a provisional one.

    Not built yet: later stages are planned against the folder this stage *would* write. Their keys are
    provisional (marked "pending") because the real digest is unknown.

    The reuse decision is the real run's (:func:`_reuse`): a stored artifact that would not be reused (damaged, or an
    upstream that would be produced again) is said, with why, and its stage counts as one that would run."""
    name = stage.name
    info = stage.dry_run(ctx) if stage.dry_run else {}
    would_run = {d for d, a in ctx.inputs.items() if a.doc.pending}  # the inputs this dry run would produce
    forced = ctx.cfg.force and name in ctx.cfg.stages
    cached, why = (None, None) if forced or not stage.cacheable else _reuse(stage, ctx, store, key, would_run)
    path = store.path_for(name, key)
    if cached is not None:
        note = None
    elif why is not None:
        note = redact_text(f"{WOULD_RUN}: {key[:24]}: {why[0]}; it would be moved aside, {why[1]}")
    elif forced or not stage.cacheable:
        note = f"{WOULD_RUN}: " + ("force=true names it" if forced else "it is never cached")
    else:
        prior = _prior(stage, ctx, store, would_run)
        reuse = f"; would reuse the generation of {prior.key[:24]} (only fields it does not depend on changed)" if prior else ""
        note = f"{WOULD_RUN}: not built yet; would write {path}{reuse}"
    if note is not None:
        ctx.console.print(f"[yellow]dry run:[/] {name}: {escape(note)}")
    state.reports.append(
        StageReport(name, "dry-run", time.time() - t0, None, key, StageResult.from_json(info).headline, notes=[note] if note else [])
    )
    if cached is None:
        cached = Artifact(name, key, path, {"output_digest": f"pending:{key}", "result": {}, "pending": True})
    return cached


def _stale_inputs(art: Artifact, inputs: dict[str, Artifact], rerun: set[str]) -> str | None:
    """Why the stored artifact ``art`` (its key matches) must not be reused with this run's ``inputs``, or None.

    Keys are input-addressed: an upstream enters a key by its *key*, so an upstream re-produced for the same key
    (its stored artifact was missing, damaged, or rejected by ``verify_cache=true``) leaves every downstream key as
    it was.  What the downstream artifact was computed from is then unknown (perhaps the rejected bytes), so it is
    not reused when an upstream it depends on was re-produced in this run (``rerun``) or when the upstream digest
    its manifest records differs from the upstream in use now (re-produced by an earlier run).  A downstream that
    records the very production of the upstream in use (its manifest's ``production`` id: a concurrent run sharing the
    store computed it from the upstream this run published) is reused."""
    for d, up in sorted(inputs.items()):
        rec_doc = art.doc.input(d)
        rec = rec_doc.digest
        if isinstance(rec, str) and rec != up.digest and not up.doc.pending:  # pending: a dry run's
            when = "re-produced in this run" if d in rerun else "re-produced after it"
            return f"it was computed from the {d} artifact with digest {rec[:12]}, but the {d} in use ({when}) has digest {up.digest[:12]}"
        same_production = rec_doc.production is not None and rec_doc.production == up.doc.production
        if d in rerun and not same_production:
            return f"its input {d} was re-produced in this run (the stored {d} was missing or rejected), so what it was computed from is unknown"
    return None


def _reuse(
    stage: Stage, ctx: StageContext, store: ArtifactStore, key: str, rerun: set[str]
) -> tuple[Artifact | None, tuple[str, str] | None]:
    """The stored artifact of ``key`` when it may be reused, else ``(None, why)``: ``why`` is None when nothing is
    stored, else ``(why the stored folder is not reused, what is done instead)``: it does not match its manifest
    (:meth:`ArtifactStore.inspect`), rebuilding; or an input changed under it (:func:`_stale_inputs`), re-running.
    The one reuse decision of the runner (the first look and the look under the lock)."""
    art, bad = store.inspect(stage.name, key)
    if bad is not None:
        return None, (bad, "rebuilding")
    stale = _stale_inputs(art, ctx.inputs, rerun) if art is not None else None
    if stale is not None:
        return None, (f"not reused: {stale}", "re-running")
    return art, None


def _prior(stage: Stage, ctx: StageContext, store: ArtifactStore, rerun: set[str]) -> Artifact | None:
    """The newest trusted artifact of ``stage`` with this run's generation key (``Stage.generation_key``) computed from
    the inputs in use (:func:`_stale_inputs`), whose costly work the stage may reuse (``StageContext.prior``)."""
    gkey = ArtifactManifest.from_json(ctx.manifest).generation_key
    if not isinstance(gkey, str):
        return None
    return next((a for a in store.with_generation_key(stage.name, gkey) if _stale_inputs(a, ctx.inputs, rerun) is None), None)


def _run_or_reuse(stage: Stage, ctx: StageContext, store: ArtifactStore, key: str, t0: float, state: _RunState) -> Artifact:
    """The cached artifact for ``key``, else run the stage under the store's lock and publish its artifact
    (``force`` reruns the stages named in ``stages``; a stage that is not cacheable always runs).  A stored folder
    that is not reused (:func:`_reuse`) is moved aside first, with one line saying why (also in the stage's
    ``notes`` in the run summary)."""
    name, cfg, console = stage.name, ctx.cfg, ctx.console
    force = cfg.force and name in cfg.stages
    reusable = stage.cacheable and not force
    rerun = {r.stage for r in state.reports if r.status == "ran"}
    art = _reuse(stage, ctx, store, key, rerun)[0] if reusable else None
    lookup_s = time.time() - t0
    if art is not None:
        state.reports.append(StageReport(name, "cached", lookup_s, str(art.path), key, art.result.headline, lookup_s=lookup_s))
        console.print(f"[green]✓[/] {name:<9} cache hit ({lookup_s:.2f} s)  {art.path}")
        return art
    console.print(f"[cyan]▶[/] {name:<9} running ...")
    notes: list[str] = []
    with store.locked(name, key):
        art, why = _reuse(stage, ctx, store, key, rerun) if reusable else (None, None)
        if art is None:  # not produced by a concurrent run while we waited for the lock
            if why is not None:
                aside = store.set_aside(name, key)
                note = f"{name} {key[:24]}: {why[0]}; moved aside to {aside}, {why[1]}"
                notes.append(redact_text(note))
                console.print(f"[yellow]{escape(note)}[/]")
            ctx.prior = _prior(stage, ctx, store, rerun) if reusable else None
            with store.produce(name, key, ctx.manifest) as (tmp, mf):
                ctx.out, ctx.resume_dir = tmp, store.resume_dir(name, key)
                t_run = time.time()
                with memory.measure() as peak:
                    result = stage.run(ctx)
                mf["result"] = redact(result.to_json())
                mf.setdefault("timings", {})["run_s"] = round(time.time() - t_run, 3)
                mf["memory"] = peak.as_dict()
            art = store.lookup(name, key)
            assert art is not None, f"{name}: artifact vanished after publishing"
            status = "ran"
        else:
            status = "cached"
    secs = time.time() - t0
    mem = art.doc.memory if status == "ran" else None
    state.reports.append(
        StageReport(name, status, secs, str(art.path), key, art.result.headline, lookup_s=lookup_s, memory=mem, notes=notes)
    )
    console.print(f"[green]✓[/] {name:<9} {status} in {secs:.1f} s  {art.path}")
    return art


def _record_gate(
    name: str, art: Artifact, console: Console, state: _RunState, *, allow_failed_gate: bool = False, packaging: bool = False
) -> None:
    """Record the evaluate stage's gate and the package stage's parity in ``state.gate_info``; a failed gate sets
    ``state.gate_failed`` (an exploratory run's inconclusive verdict only warns: exit 0 for a run that stops at
    evaluate; when the package stage runs (``packaging``) it refuses the candidate, exit 3, unless
    ``package.allow_failed_gate``)."""
    from .core.contracts.evaluate import EvalResult

    gate = art.result_as(EvalResult).gate if name == "evaluate" else None
    if gate is not None:
        state.gate_info["evaluate"] = gate.to_json()
        state.eval_dir = Path(art.path)
    if name == "package":
        parity = parity_record(art)
        if parity is not None:
            state.gate_info["parity"] = parity
    if gate is not None and not gate.passed:
        if gate.exploratory and gate.inconclusive:
            if allow_failed_gate:
                then = (
                    "exit 0; the package stage packages it anyway because package.allow_failed_gate=true (recorded in the release manifest)"
                )
            elif packaging:
                then = "the package stage of this run will refuse to release this candidate: exit 3"
            else:
                then = "exit 0, but a package stage would refuse to release this candidate"
            console.print(f"[bold yellow]EXPLORATORY RUN: the gate is INCONCLUSIVE (eval.gate.mode=exploratory); {then}[/]")
        else:
            state.gate_failed, state.gate_inconclusive = gate.reason, gate.inconclusive
