"""Running the runners over the prepared items (:func:`run_runners`): one model loaded at a time, each with the batch
``eval.batch_size`` resolves to, generating every answer; with ``eval.fidelity`` the baseline and the candidate also
compute teacher-forced logits on the eval answers and the calibration hold-out (the baseline's spilled to a file, the
candidate's compared as they arrive: :mod:`pipeline.evaluate.fidelity`). :func:`measurements`: what the runs measured
(the manifest's ``measurements``)."""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ..core.contracts.build import BuildArtifact, EngineLimits
from ..core.contracts.evaluate import EvalArtifact, FidelityStats, FidelitySummary
from ..core.contracts.export import ExportArtifact
from ..core.stage import StageContext
from ..errors import InputError
from .inputs import Setup, target_name


def _make_runner(name: str, ctx: StageContext, tokenizer: Any, stop_ids: list[int], pad_id: int, device: str = "cpu") -> Any:
    """Load runner ``name``; the baseline and simulated models on ``device`` (the resolved ``eval.device``): the
    baseline in its reference dtype (:func:`~pipeline.evaluate.runners.reference_dtype`), the simulated model in the
    calibration dtype on the CPU and in the export's 16-bit dtype on CUDA."""
    from .runners import EngineAdapter, HFRunner, checkpoint_dtype, load_reference_model, reference_dtype

    export_dir = ctx.inputs["export"].path
    penalty = ExportArtifact(export_dir).decoding().penalty  # one decoding policy for every runner (pipeline.core.decoding)
    if name == "baseline":
        src = ctx.external["reference_checkpoint"]
        dtype = reference_dtype(src, ctx.cfg.eval.reference_dtype, device)
        model = load_reference_model(src, dtype, allow_pickle=ctx.cfg.model.allow_pickle, device=device)
        return HFRunner(model, tokenizer, stop_ids=stop_ids, pad_id=pad_id, name=name, repetition_penalty=penalty)
    if name == "simulated":
        import torch

        from ..core.quant_state import load_simulated_model
        from ..core.sizing import compute_dtype

        sim_dtype = None if device == "cpu" else getattr(torch, compute_dtype("cuda", checkpoint_dtype(ExportArtifact(export_dir).hf_dir)))
        model = load_simulated_model(ctx.inputs["quantize"].path, export_dir, device=device, dtype=sim_dtype)
        return HFRunner(model, tokenizer, stop_ids=stop_ids, pad_id=pad_id, name=name, repetition_penalty=penalty)
    if name == "engine":
        from ..core.targets import get_target

        build_art = ctx.inputs["build"]
        runner = get_target(target_name(ctx.cfg, build_art)).load_runner(BuildArtifact(build_art.path).engine_dir)
        return EngineAdapter(runner, tokenizer, stop_ids=stop_ids, repetition_penalty=penalty)
    raise InputError(f"eval.runners: unknown runner {name!r}. Fix: use baseline, engine or simulated.")


def measurements(runs: Runs) -> dict[str, Any]:
    """What the runners measured (the manifest's ``measurements``; kept out of the report and ``outputs.jsonl``, whose
    bytes make the artifact's content digest): per runner the wall ``seconds``, ``items_per_s``, the completion
    latency's mean/p50/p90 and every item's (``latency_s_by_item``), and the teacher-forced passes' ``fidelity_s``."""
    out: dict[str, Any] = {"runners": {}, "fidelity_s": runs.fidelity_s}
    for name, outputs in runs.outputs.items():
        seconds = runs.seconds[name]
        lat = sorted(o.latency_s for o in outputs.values()) or [0.0]
        out["runners"][name] = {
            "seconds": round(seconds, 3),
            "items_per_s": round(len(outputs) / seconds, 3) if seconds > 0 else None,
            "latency_s": {
                "mean": statistics.fmean(lat),
                **{k: lat[min(len(lat) - 1, int(f * len(lat)))] for k, f in (("p50", 0.5), ("p90", 0.9))},
            },
            "latency_s_by_item": {i: round(o.latency_s, 6) for i, o in outputs.items()},
        }
    return out


@dataclasses.dataclass
class _Fidelity:
    """The teacher-forced fidelity state (:func:`_fidelity_plan`) that :func:`_run_all` fills: how to build the sequences
    from the baseline's outputs, the two runners compared, the held-out calibration sequences and the baseline's spill
    file; then the sequences, each runner's logits (the baseline's spilled, the candidate's compared) and seconds, or
    why the candidate has no logits (``unavailable``)."""

    make: Any
    runners: tuple[str, str]
    heldout: list[Any]
    spill: Path
    seqs: list[Any] = dataclasses.field(default_factory=list)
    baseline_logits: Any = None
    candidate_logits: Any = None
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    unavailable: str | None = None


def _run_all(
    ctx: StageContext,
    runners: list[str],
    prepared: list[Any],
    tokenizer: Any,
    stop_ids: list[int],
    pad_id: int,
    n_run: int,
    outputs: dict[str, Any],
    seconds: dict[str, float],
    fid: _Fidelity | None = None,
    device: str = "cpu",
    batches: dict[str, int] | None = None,
) -> None:
    """Generate with every runner (one loaded at a time; the baseline and simulated models on ``device``, each with the
    batch :func:`_batch` chooses, recorded in ``batches``); with ``fid`` the baseline and the candidate also compute
    teacher-forced logits (``fid.baseline_logits`` / ``fid.candidate_logits``, seconds in ``fid.seconds[runner]``); an
    engine without logits records ``fid.unavailable``."""
    batches = {} if batches is None else batches
    for name in runners:
        t0 = time.perf_counter()
        runner = _make_runner(name, ctx, tokenizer, stop_ids, pad_id, device)
        try:
            todo = [p for p in prepared if not p.skipped]
            batches[name] = _batch(ctx, runner, device, max((len(p.input_ids) + p.max_new_tokens for p in todo), default=1), len(todo))
            with ctx.progress(f"evaluate: {name}", total=n_run) as adv:
                outputs[name] = runner.run(prepared, batches[name], adv)
            if fid is not None and name == "baseline":
                fid.seqs = fid.make(outputs[name]) + fid.heldout
            if fid is not None and name in fid.runners and fid.unavailable is None:
                t1 = time.perf_counter()
                try:
                    with ctx.progress(f"evaluate: {name} fidelity", total=len(fid.seqs)) as adv:
                        seq = max((len(q.prompt) + len(q.continuation) for q in fid.seqs), default=1)
                        runner.teacher_forced_logits(
                            fid.seqs, _batch(ctx, runner, device, seq, len(fid.seqs)), adv, into=_logit_sink(fid, name)
                        )
                except NotImplementedError as e:
                    fid.unavailable = str(e)
                fid.seconds[name] = round(time.perf_counter() - t1, 3)
        finally:
            runner.close()
        seconds[name] = time.perf_counter() - t0


def _batch(ctx: StageContext, runner: Any, device: str, seq_len: int, n_items: int) -> int:
    """``eval.batch_size`` for one pass of ``runner`` (:func:`pipeline.evaluate.runners.choose_batch`; the engine and
    a runner on the CPU: ``runner`` None or ``device`` cpu); the reason is logged."""
    from .runners import choose_batch

    model = getattr(runner, "model", None)
    on = device if model is not None and hasattr(model, "config") else "cpu"
    dtype = str(getattr(model, "dtype", "torch.float32")).removeprefix("torch.")
    n, why = choose_batch(ctx.cfg.eval.batch_size, on, getattr(model, "config", None), seq_len, n_items, dtype)
    ctx.log.info("%s", why)
    return n


def _logit_sink(fid: _Fidelity, name: str) -> Any:
    """Where ``name``'s teacher-forced logits go (kept in ``fid``): the baseline's to a file
    (:class:`~pipeline.evaluate.fidelity.SpilledLogits`, ``fid.spill``), the candidate's straight into the comparison
    with it (:class:`~pipeline.evaluate.fidelity.StreamedComparison`): one sequence's logits in memory at a time."""
    from . import fidelity as F

    if name == "baseline":
        fid.baseline_logits = F.SpilledLogits(fid.spill)
        return fid.baseline_logits
    fid.candidate_logits = F.StreamedComparison(fid.seqs, fid.baseline_logits)
    return fid.candidate_logits


@dataclasses.dataclass
class Runs:
    """Every runner's outputs (``{runner: {item id: output}}``), wall seconds and the fidelity section."""

    outputs: dict[str, dict[str, Any]]
    seconds: dict[str, float]
    fidelity: dict[str, Any] | None
    fidelity_s: dict[str, float] | None = None
    batches: dict[str, int] = dataclasses.field(default_factory=dict)  # each runner's generation batch

    @property
    def fidelity_overall(self) -> FidelityStats:
        """The fidelity section's ``overall`` (``positions`` 0: not measured)."""
        fs = FidelitySummary.from_json(self.fidelity)
        return fs.overall if fs is not None else FidelityStats()


def _fidelity_wanted(ctx: StageContext, st: Setup) -> bool:
    """Whether the run measures teacher-forced fidelity: asked for, with a baseline and another candidate."""
    return bool(ctx.cfg.eval.fidelity and "baseline" in st.runners and st.cand != "baseline")


def run_runners(ctx: StageContext, st: Setup) -> Runs:
    """Run every runner over the prepared items (:func:`_run_all`), with teacher-forced fidelity when asked for."""
    outputs: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    fid = _fidelity_plan(ctx, st) if _fidelity_wanted(ctx, st) else None
    try:
        batches: dict[str, int] = {}
        _run_all(ctx, st.runners, st.prepared, st.tokenizer, st.stop_ids, st.pad_id, st.n_run, outputs, seconds, fid, st.device, batches)
        if fid is None:
            return Runs(outputs, seconds, None, None, batches)
        return Runs(outputs, seconds, _fidelity_result(fid, st.cand), fid.seconds, batches)
    finally:
        base = fid.baseline_logits if fid is not None else None
        if base is not None and hasattr(base, "close"):
            base.close()  # the spilled baseline logits never reach the artifact


@dataclasses.dataclass
class Stored:
    """The runs reused from an artifact whose key differs only in ``eval.gate`` (:func:`stored_runs`), with its
    ``speculative`` section and its manifest's ``measurements`` (naming the artifact in ``answers_reused_from``)."""

    runs: Runs
    speculative: dict[str, Any] | None
    measurements: dict[str, Any]


def stored_runs(ctx: StageContext, st: Setup) -> Stored | None:
    """The answers and fidelity section of ``ctx.prior`` (the generation does not depend on ``eval.gate``), or None
    when there is none or they do not cover this run's runners and items (then the runners generate)."""
    from .runners import ItemOutput

    prior = ctx.prior
    if prior is None:
        return None
    try:
        g = EvalArtifact(prior.path).stored_generation()
    except (OSError, ValueError, InputError) as e:
        ctx.log.warning("evaluate: the answers of %s are not readable (%s); generating them", prior.path, e)
        return None
    todo = [p.item.id for p in st.prepared if not p.skipped]
    if (
        set(g.answers) != set(st.runners)
        or any(set(g.answers[r]) != set(todo) for r in g.answers)
        or _fidelity_wanted(ctx, st) != bool(g.fidelity)
    ):
        ctx.log.warning("evaluate: the answers of %s do not cover this run's runners and items; generating them", prior.path)
        return None
    outputs = {
        r: {i: ItemOutput(i, a.text, list(a.output_ids), a.finish_reason, 0.0, a.error) for i in todo for a in [g.answers[r][i]]}
        for r in st.runners
    }
    batches = {r: b for r, b in g.batches.items() if b is not None}
    note = f"evaluate: eval.gate changed only: reusing the answers and fidelity of artifact {prior.key} (no generation)"
    ctx.console.print(note, markup=False, highlight=False)
    ctx.log.info("%s", note)
    return Stored(Runs(outputs, {}, g.fidelity, None, batches), g.speculative, {**prior.doc.measurements, "answers_reused_from": prior.key})


def _fidelity_plan(ctx: StageContext, st: Setup) -> _Fidelity:
    """The ``fid`` state :func:`_run_all` fills: how to build the teacher-forced sequences from the baseline's
    outputs, the two runners compared, and the held-out calibration samples that fit the engine's limits."""
    from ..data.metrics import get_metric
    from . import fidelity as F

    item_by_id = {p.item.id: p.item for p in st.prepared}

    def make_seqs(base_out: dict[str, Any]) -> list[Any]:
        # the reference answer in the baseline's own tokens where it answered correctly (fidelity.build_sequences)
        ok = {
            i: o.output_ids
            for i, o in base_out.items()
            if o.finish_reason == "eos" and get_metric(item_by_id[i].metric)(o.text, item_by_id[i]) >= 1.0
        }
        return F.build_sequences(st.prepared, st.tokenizer, st.stop_ids, ok)

    # held-out samples that fit the engine's limits (one context pass of len - 1 tokens)
    lim = EngineLimits.from_json(st.limits)
    fits = min(int(lim.max_input_len), int(lim.max_seq_len or 1 << 30) - 1)
    return _Fidelity(
        make=make_seqs,
        runners=("baseline", st.cand),
        heldout=F.heldout_sequences([h for h in _heldout_samples(ctx, st.tokenizer) if len(h) - 1 <= fits]),
        spill=Path(ctx.out or tempfile.gettempdir()) / f".fidelity-baseline-{os.getpid()}.f32",
    )


def _fidelity_result(fid: _Fidelity, cand: str) -> dict[str, Any]:
    """The report's ``fidelity`` section from the filled ``fid`` state (:func:`pipeline.evaluate.fidelity.compare`)."""

    if fid.unavailable is not None:
        return {"candidate": cand, "unavailable": fid.unavailable}
    n_all = len(fid.seqs)
    n_tune = n_all - len(fid.heldout)
    cmp = fid.candidate_logits  # F.StreamedComparison (_logit_sink)
    held = cmp.result(n_tune, n_all) if fid.heldout else None
    return {
        "candidate": cand,
        **cmp.result(0, n_tune),
        "calibration_heldout": ({"samples": held["items"], **held["overall"]} if held else None),
        "sequence": "prompt + reference answer (the baseline's tokens where it answered correctly) + eos, cut to the item budget",
    }


def _heldout_samples(ctx: StageContext, tokenizer: Any) -> list[list[int]]:
    """Calibration samples calibration did not use: the ``eval.fidelity_heldout`` samples after the first
    ``calibration.calib_size`` in the calibration set's seeded order (``pipeline.data.calibration.load_calibration``)."""
    import dataclasses

    n = ctx.cfg.eval.fidelity_heldout
    path = ctx.external_path("calibration")
    if not n or path is None:
        return []
    from ..data.calibration import load_calibration

    c = ctx.cfg.calibration
    wider = dataclasses.replace(c, calib_size=c.calib_size + n, min_samples=0)
    try:
        cs = load_calibration(wider, tokenizer, path, requested=f" ({c.calib_size} calibration + {n} eval.fidelity_heldout)")
    except InputError as e:  # the measurement is optional; the quantize stage reports calibration problems
        ctx.log.warning("fidelity: no calibration hold-out (%s)", e)
        return []
    return [list(s) for s in cs.samples[c.calib_size :]]
