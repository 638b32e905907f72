"""Orchestration: resolve stages, compute cache keys, run or reuse artifacts, write the summary."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .core import hostinfo, memory
from .core.config import STAGES, ConfigError, PipelineConfig, deprecations, key_fields, resolve_path
from .core.stage import Stage, StageContext, get_stage, resolve_order
from .core.store import (
    Artifact,
    ArtifactStore,
    cache_key,
    digest_path,
    install_log_redaction,
    redact,
    redact_files,
    redact_text,
    secret_fields,
    write_json_atomic,
)
from .errors import EXIT_FAILED, EXIT_GATE, EXIT_INTERRUPTED, EXIT_OK, PipelineError
from .validation import order_note
from .validation import validate as validate_config

log = logging.getLogger("pipeline")
SUMMARY_SCHEMA = "pipeline.summary/v1"


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


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _digest(p: Path) -> str:
    """digest_path, memoised per process on (path, size, mtime) of the file or folder's newest file."""
    try:
        st = p.stat()
        stamp = (
            str(p),
            st.st_size,
            max([st.st_mtime_ns] + [f.stat().st_mtime_ns for f in p.rglob("*") if f.is_file()] if p.is_dir() else [st.st_mtime_ns]),
        )
    except OSError:
        return digest_path(p)
    if stamp not in _DIGESTS:
        _DIGESTS[stamp] = digest_path(p)
    return _DIGESTS[stamp]


def compute_key(stage: Stage, cfg: PipelineConfig, inputs: dict[str, Artifact], external: dict[str, Path]) -> tuple[str, dict[str, Any]]:
    """The cache key of ``stage`` and the document it hashes (recorded in the manifest)."""
    doc = {
        "stage": stage.name,
        "stage_version": stage.version,
        "config": stage.key_config(cfg) if stage.key_config else {g: key_fields(getattr(cfg, g)) for g in stage.config_groups},
        # Upstream artifacts enter by their *key* (itself a hash of their inputs, config and versions), so
        # the chain is input-addressed like a build system's action keys: timing fields inside an upstream
        # report never invalidate downstream work. Output digests stay in each manifest for provenance.
        "inputs": {name: art.key for name, art in sorted(inputs.items())},
        "external": {name: _digest(p) for name, p in sorted(external.items())},
        "extras": stage.key_extras(cfg, inputs),
        "versions": hostinfo.library_versions(stage.libraries),
    }
    return cache_key(doc), doc


#: the config field behind each external input name of the stages (``Stage.external_inputs``), for error messages
_INPUT_FIELDS = {
    "calibration": "calibration.path",
    "corpus": "calibration.path",
    "eval_set": "eval.eval_set",
    "reference_checkpoint": "model.path",
    "draft_model": "eval.draft_model_path",
}
#: external inputs that are one file (a folder there is refused with the others, before any stage runs)
_FILE_FIELDS = {"calibration.path", "eval.eval_set"}


def _resolve_externals(stage: Stage, cfg: PipelineConfig) -> tuple[dict[str, Path], dict[str, str]]:
    """``stage``'s external inputs: ``(resolved {name: existing path}, missing {"<field>=<value>": message})``, each
    message naming the config field, the value, where it was looked for and the fix."""
    out: dict[str, Path] = {}
    missing: dict[str, str] = {}
    for name, p in stage.external_inputs(cfg).items():
        rp = resolve_path(str(p))
        if rp is None or not rp.exists():
            field = _INPUT_FIELDS.get(name)
            what = f"{field}={p}" if field else f"input {name!r} ({p})"
            missing[what] = (
                f"{what}: not found (looked for {rp}; the {stage.name} stage reads it). "
                f"Fix: {'set ' + field + ' to' if field else 'point the config at'} an existing path (relative paths are "
                "resolved against the directory you run pipeline from, then the repository)."
            )
        elif rp.is_dir() and _INPUT_FIELDS.get(name) in _FILE_FIELDS:
            field = _INPUT_FIELDS[name]
            missing[f"{field}={p}"] = (
                f"{field}={p}: is a directory ({rp}); the {stage.name} stage reads one file. "
                f"Fix: set {field} to the data file itself (e.g. a .jsonl file, one JSON object per line)."
            )
        else:
            out[name] = rp
    return out, missing


def _all_externals(order: list[str], cfg: PipelineConfig) -> dict[str, dict[str, Path]]:
    """:func:`_resolve_externals` of every stage in ``order``. Every missing input is reported in one InputError,
    once even when several stages read it (the calibration set: quantize, and evaluate's held-out text); its
    ``stage`` attribute is the first stage with a missing input (the one the run summary marks failed)."""
    from .errors import InputError

    out: dict[str, dict[str, Path]] = {}
    missing: dict[str, str] = {}
    first: str | None = None
    for name in order:
        out[name], gone = _resolve_externals(get_stage(name), cfg)
        if gone and first is None:
            first = name
        for what, msg in gone.items():
            missing.setdefault(what, msg)  # the first stage's message wins
    if missing:
        msgs = list(missing.values())
        err = InputError(msgs[0] if len(msgs) == 1 else f"{len(msgs)} missing inputs:\n" + "\n".join(f"  - {m}" for m in msgs))
        err.stage = first  # type: ignore[attr-defined]
        raise err
    return out


def _open_store(store_dir: str, verify: bool = False) -> ArtifactStore:
    """The artifact store at ``store_dir``, created if needed; InputError (exit 2) when unusable."""
    from .errors import InputError

    if not str(store_dir).strip():
        raise InputError("store_dir='': empty. Fix: set store_dir to a folder, e.g. store_dir=artifacts (the default).")
    root = resolve_path(str(store_dir)) or Path(store_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise InputError(
            f"store_dir={str(store_dir)!r}: cannot create or write {root} ({e.strerror or e}). "
            "Fix: point store_dir at a writable folder (it is created if missing)."
        ) from e
    # ModelOpt's CUDA extension is compiled on first use into TORCH_EXTENSIONS_DIR (~50 s on a fresh GPU machine):
    # kept beside the store, so a CI job that caches the store keeps it (pipeline.quantize.calibrate.cuda_extension)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(root / ".cache" / "torch_extensions"))
    return ArtifactStore(root, verify=verify)


def _target_available(cfg: PipelineConfig, store: ArtifactStore, order: list[str], externals: dict[str, dict[str, Path]]) -> None:
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
    for s in order:
        if s == "build":
            break
        st = get_stage(s)
        key, _ = compute_key(st, cfg, {d: pending[d] for d in st.deps_for(cfg)}, externals[s])
        pending[s] = Artifact(s, key, store.path_for(s, key), {"output_digest": f"pending:{key}", "result": {}})
    quant = pending.get("quantize")
    from .core.contracts.quantize import QuantizeArtifact

    ckpt = QuantizeArtifact(quant.path if quant else store.root / "quantize" / "<key>").trtllm_checkpoint
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
    state = _RunState()
    overrides = list(overrides or [])
    exit_code, error = EXIT_OK, None
    install_log_redaction()
    if summary_dir is not None:
        redact_run_outputs(Path(summary_dir))
    deprecated = _config_warnings(cfg, console)
    try:
        _run_stages(cfg, console, state)
        if state.gate_failed and exit_code == EXIT_OK:
            verdict = "inconclusive (not failed: the eval set cannot show non-inferiority)" if state.gate_inconclusive else "failed"
            exit_code, error = EXIT_GATE, f"evaluation gate {verdict}: {state.gate_failed}"
    except KeyboardInterrupt:
        exit_code, error = EXIT_INTERRUPTED, "interrupted"
        _mark_failed(state.reports, cfg, error)
    except ConfigError as e:  # found before any stage ran: no stage is to blame, none ran
        exit_code, error = e.exit_code, str(e)
        _mark_failed(state.reports, cfg, error, blame=False)
    except PipelineError as e:
        exit_code, error = e.exit_code, str(e)
        _mark_failed(state.reports, cfg, error, getattr(e, "stage", None))
    except Exception as e:
        log.exception("stage failed")
        exit_code, error = EXIT_FAILED, f"{type(e).__name__}: {e}"
        _mark_failed(state.reports, cfg, error)
    summary = RunSummary(
        state.reports,
        exit_code,
        overrides,
        time.time() - t_start,
        state.plan,
        redact_text(error) if error else error,
        model=_model_facts(cfg, overrides),
        gate=state.gate_info or None,
        deprecations=deprecated,
    )
    print_summary(summary, console)
    if summary_dir is not None:
        _write_summary(summary, summary_dir, console)
    _ci_reports(state, summary_dir, console)
    return summary


def _config_warnings(cfg: PipelineConfig, console: Console) -> list[str]:
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


def _run_stages(cfg: PipelineConfig, console: Console, state: _RunState) -> None:
    """Validate, plan, check every external input and the build target, then run (or reuse, or dry-run) each stage
    in order, recording reports and gate results in ``state``. Raises on the first failing stage."""
    validate_config(cfg)
    order = resolve_order(list(cfg.stages), cfg)
    state.plan = _plan(cfg, console, order)
    store = _open_store(cfg.store_dir, verify=cfg.verify_cache)  # verify_cache holds on every lookup
    # Every stage's external inputs (checkpoint, calibration set, eval set) are checked before the first
    # stage runs, and so is the build target's availability: nothing heavy runs on a doomed request.
    externals = _all_externals(order, cfg)
    if "build" in order and not cfg.dry_run:
        _target_available(cfg, store, order, externals)
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
        t0 = time.time()
        inputs = {d: done[d] for d in stage.deps_for(cfg)}
        external = externals[name]
        key, key_doc = compute_key(stage, cfg, inputs, external)
        ctx = StageContext(
            cfg=cfg,
            inputs=inputs,
            external=external,
            out=None,
            manifest=_manifest(name, key_doc, inputs, external, state.plan),
            console=console,
            log=logging.getLogger(f"pipeline.{name}"),
            show_progress=show_progress,
        )
        if cfg.dry_run:
            done[name] = _dry_run_stage(stage, ctx, store, key, t0, state)
            continue
        art = _run_or_reuse(stage, ctx, store, key, t0, state)
        done[name] = art
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
        "inputs": {d: {"path": str(a.path), "digest": a.digest, "key": a.key} for d, a in inputs.items()},
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
    would_run = {d for d, a in ctx.inputs.items() if a.manifest.get("pending")}  # the inputs this dry run would produce
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
        note = f"{WOULD_RUN}: not built yet; would write {path}"
    if note is not None:
        ctx.console.print(f"[yellow]dry run:[/] {name}: {escape(note)}")
    state.reports.append(StageReport(name, "dry-run", time.time() - t0, None, key, info.get("headline", {}), notes=[note] if note else []))
    if cached is None:
        cached = Artifact(name, key, path, {"output_digest": f"pending:{key}", "result": {}, "pending": True})
    return cached


def _stale_inputs(art: Artifact, inputs: dict[str, Artifact], rerun: set[str]) -> str | None:
    """Why the stored artifact ``art`` (its key matches) must not be reused with this run's ``inputs``, or None.

    Keys are input-addressed: an upstream enters a key by its *key*, so an upstream re-produced for the same key
    (its stored artifact was missing, damaged, or rejected by ``verify_cache=true``) leaves every downstream key as
    it was.  What the downstream artifact was computed from is then unknown (perhaps the rejected bytes), so it is
    not reused when an upstream it depends on was re-produced in this run (``rerun``) or when the upstream digest
    its manifest records differs from the upstream in use now (re-produced by an earlier run)."""
    recorded = art.manifest.get("inputs") or {}
    for d, up in sorted(inputs.items()):
        rec = recorded.get(d, {}).get("digest") if isinstance(recorded.get(d), dict) else None
        if isinstance(rec, str) and rec != up.digest and not up.manifest.get("pending"):  # pending: a dry run's
            when = "re-produced in this run" if d in rerun else "re-produced after it"
            return f"it was computed from the {d} artifact with digest {rec[:12]}, but the {d} in use ({when}) has digest {up.digest[:12]}"
        if d in rerun:
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
        state.reports.append(StageReport(name, "cached", lookup_s, str(art.path), key, art.result.get("headline", {}), lookup_s=lookup_s))
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
            with store.produce(name, key, ctx.manifest) as (tmp, mf):
                ctx.out, ctx.resume_dir = tmp, store.resume_dir(name, key)
                t_run = time.time()
                with memory.measure() as peak:
                    result = stage.run(ctx) or {}
                mf["result"] = redact(result)
                mf.setdefault("timings", {})["run_s"] = round(time.time() - t_run, 3)
                mf["memory"] = peak.as_dict()
            art = store.lookup(name, key)
            assert art is not None, f"{name}: artifact vanished after publishing"
            status = "ran"
        else:
            status = "cached"
    secs = time.time() - t0
    mem = art.manifest.get("memory") if status == "ran" else None
    state.reports.append(
        StageReport(name, status, secs, str(art.path), key, art.result.get("headline", {}), lookup_s=lookup_s, memory=mem, notes=notes)
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
    from .core.contracts.evaluate import gate_of

    gate = gate_of(art.result) if name == "evaluate" else None
    if gate is not None:
        state.gate_info["evaluate"] = gate.to_json()
        state.eval_dir = Path(art.path)
    if name == "package":
        parity = _parity_record(art)
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


JUNIT_FILE = "junit.xml"
"""The run's gate as JUnit XML, next to ``summary.json`` (the evaluate artifact's checks + serving parity)."""


def _ci_reports(state: _RunState, summary_dir: Path | None, console: Console) -> None:
    """For CI jobs, when this run evaluated (ran or cache hit): ``<run dir>/junit.xml`` (gate checks and the package
    stage's serving parity, ``pipeline.evaluate.junit``) and, when ``$GITHUB_STEP_SUMMARY`` is set, the gate table
    appended to it. A write failure is reported, not raised (the run's exit code stays the gate's)."""
    from .core.contracts.evaluate import EvalArtifact
    from .evaluate.junit import append_step_summary, write_junit

    if state.eval_dir is None:
        return
    try:
        rep = EvalArtifact(state.eval_dir).report().document
        parity = state.gate_info.get("parity")
        if summary_dir is not None:
            summary_dir.mkdir(parents=True, exist_ok=True)
            write_junit(summary_dir / JUNIT_FILE, rep, parity)
        append_step_summary(rep, parity)
    except (OSError, ValueError, KeyError) as e:
        console.print(f"[red]could not write the CI gate reports (junit.xml / $GITHUB_STEP_SUMMARY): {escape(str(e))}[/]")


def _write_summary(summary: RunSummary, summary_dir: Path, console: Console) -> None:
    """``summary.json`` (redacted); a write failure is reported, not raised."""
    try:
        summary_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(summary_dir / "summary.json", redact(summary.to_json()))
    except OSError as e:
        console.print(f"[red]could not write the run summary to {summary_dir}: {e}[/]")


def _model_facts(cfg: PipelineConfig, overrides: list[str]) -> dict[str, Any] | None:
    """The model's name and dtype and where each came from (``set`` in the config, or derived from the checkpoint:
    the folder name / ``config.json`` ``torch_dtype``; pipeline/core/config/model.py)."""
    try:
        from .core.config.model import checkpoint_dtype, checkpoint_name

        m = cfg.model
        set_keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
        derived_name = m.path is not None and "model.name" not in set_keys and m.name == checkpoint_name(m.path)
        derived_dtype = m.path is not None and "model.dtype" not in set_keys and m.dtype == checkpoint_dtype(m.path)
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


def _mark_failed(reports: list[StageReport], cfg: PipelineConfig, error: str, stage: str | None = None, *, blame: bool = True) -> None:
    """Report the stages that did not finish: ``stage`` (the one the error belongs to, when a check before the first
    stage named it; else the first unfinished one) as failed, the others as not run; with ``blame=False`` (a
    configuration error) every one as not run."""
    seen = {r.stage for r in reports}
    try:
        order = resolve_order(list(cfg.stages), cfg)
    except Exception:
        order = [s for s in STAGES if s in cfg.stages]
    pending = [s for s in order if s not in seen]
    failed = (stage if stage in pending else (pending[0] if pending else None)) if blame else None
    for s in pending:
        reports.append(StageReport(s, "failed" if s == failed else "not-run", 0.0, error=error if s == failed else None))


def print_summary(summary: RunSummary, console: Console) -> None:
    """The run's table on ``console`` (a record like the summary: model name, paths and headlines are redacted); the
    ``error (exit N): ...`` line of a failed run goes to stderr (none when ``console`` is quiet)."""
    m = summary.model
    title = "pipeline run"
    if m:
        title += f" - model {m['name']} ({m['name_source']}), dtype {m['dtype']} ({m['dtype_source']})"
    t = Table(title=escape(redact_text(title)), show_lines=False)
    for col in ("stage", "status", "time", "output", "headline"):
        t.add_column(col)
    for r in summary.stages:
        style = {"cached": "green", "ran": "cyan", "failed": "red", "not-run": "dim", "dry-run": "yellow"}.get(r.status, "")
        head = ", ".join(f"{k}={_fmt(v)}" for k, v in r.headline.items())
        cells = (redact_text(r.path or "-"), redact_text(head or (r.error or "")[:120]))
        t.add_row(r.stage, f"[{style}]{r.status}[/]", f"{r.seconds:.2f} s", *map(escape, cells))
    console.print(t)
    if summary.gate:
        print_gate(summary.gate, console)
    if summary.error:  # on stderr, unwrapped, as every other error line of the CLI (stdout keeps the summary)
        if not console.quiet:
            console.file.flush()
            print(f"error (exit {summary.exit_code}): {summary.error}", file=sys.stderr, flush=True)
    else:
        console.print(f"[bold green]ok[/] in {summary.total_s:.1f} s")


def _parity_record(art: Artifact) -> dict[str, Any] | None:
    """The package stage's serving-parity record (:meth:`pipeline.core.contracts.package.PackageArtifact.parity_record`)."""
    from .core.contracts.package import PackageArtifact

    return PackageArtifact(Path(art.path)).parity_record(art.result)


def print_gate(gate: dict[str, Any], console: Console) -> None:
    """The release-gate section of the run summary: non-inferiority verdict (bound vs allowance), fidelity
    (mean KLD, top-1 agreement) and serving parity (``served == evaluated: N/N`` from the package stage's
    ``parity`` result; "not checked" when absent).  ``gate`` is ``{"evaluate": <GateVerdict record>, "parity": ...}``
    (``summary.json`` ``gate``)."""
    from .core.contracts.evaluate import GateVerdict

    ev = GateVerdict.from_json(gate.get("evaluate"))
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
        if ev.inconclusive and ev.fix:
            console.print(f"[bold]gate[/]  [yellow]{escape(ev.fix)}[/]")
        f = ev.fidelity
        if f is not None:
            console.print(
                f"[bold]gate[/]  fidelity: mean KLD {f.kld_mean:.4g} ± {f.kld_se:.2g} nats, same top token "
                f"{100 * f.top1:.2f}% ({f.positions} teacher-forced tokens)"
            )
    p = gate.get("parity")
    if isinstance(p, dict) and p.get("total") is not None:
        console.print(
            f"[bold]gate[/]  served == evaluated: {p.get('matched')}/{p.get('total')}"
            + (f" ({escape(str(p['note']))})" if p.get("note") else "")
        )
    elif isinstance(p, dict):
        console.print(f"[bold]gate[/]  served == evaluated: {escape(str(p.get('status') or 'not checked'))}")
    else:
        console.print("[bold]gate[/]  served == evaluated: not checked in this run")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


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
        record_exit_code(int(doc.get("exit_code") or 0))


_WORST_EXIT = [0]


def record_exit_code(code: int) -> None:
    """Remember ``code`` for :func:`worst_exit_code` (the runs and multirun comparisons of this process)."""
    _WORST_EXIT[0] = max(_WORST_EXIT[0], int(code))


def worst_exit_code() -> int:
    """The highest exit code recorded in this process: what ``pipeline`` (single run or ``-m`` sweep) exits with."""
    return _WORST_EXIT[0]


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
        row: dict[str, Any] = {"job": job, "overrides": " ".join(s.get("overrides", [])), "exit_code": s.get("exit_code")}
        for st in s.get("stages", []):
            for k, v in (st.get("headline") or {}).items():
                row[f"{st['stage']}.{k}"] = v
        if s.get("error"):
            row["error"] = str(s["error"])[:200]
        rows.append(row)
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    codes = [r.get("exit_code") for r in rows]
    worst = max((c if isinstance(c, int) else EXIT_FAILED for c in codes), default=EXIT_OK)
    doc = {"schema": "pipeline.comparison/v1", "columns": cols, "rows": rows, "exit_code": worst}
    write_json_atomic(sweep_dir / "comparison.json", doc)
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:  # one line per job: newlines and pipes inside a cell would break the table
        md.append("| " + " | ".join(_fmt(r.get(c, "")).replace("\n", " ").replace("|", "\\|") for c in cols) + " |")
    (sweep_dir / "comparison.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    # The console shows what differs between the jobs (the files keep every column): the overrides that
    # vary, the headline values that vary, and the verdict columns.
    split = [str(r.get("overrides", "")).split() for r in rows]
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
