"""Evaluate stage: run the business eval set through the baseline (the *source* checkpoint in the reference
dtype, never the export) and the candidate (the built engine, or the ModelOpt simulated-quantization model),
score it, measure teacher-forced fidelity (``evaluation/fidelity.py``), apply the non-inferiority release gate
(``evaluation/gate.py``) and write the report (``eval_report.json`` / ``.md`` / ``.html``, ``outputs.jsonl``).

A failed gate does not raise: the artifact (with its report) is published and the result carries
``gate = {"passed": False, "reason": ...}``; the runner then exits 3 and the package stage refuses it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ..core.config.common import key_fields
from ..core.contracts.build import BuildArtifact, BuildResult, target_of
from ..core.contracts.evaluate import EvalArtifact, EvalResult, FailedCheck, GateBound, GateFidelity, GateVerdict
from ..core.contracts.export import ExportArtifact, ModelInfo
from ..core.stage import Stage, StageContext
from ..core.store import sha256_file
from ..errors import InputError
from .checks import checks

REPORT_SCHEMA = "pipeline.eval_report/v1"


# --------------------------------------------------------------------------- inputs
def engine_limits(build_art: Any, cfg: Any) -> dict[str, Any]:
    """Engine limits (max_input_len, max_seq_len, max_batch_size) of the build artifact (``BuildArtifact.limits``),
    else the build config's."""
    if build_art is None:
        return {k: getattr(cfg.build, k) for k in BuildArtifact.LIMIT_KEYS}
    return BuildArtifact(build_art.path).limits(build_art.result_as(BuildResult), cfg.build)


def target_name(cfg: Any, build_art: Any) -> str:
    return target_of(build_art, cfg.target.name)


def engine_usable(cfg: Any, build_art: Any) -> tuple[bool, str]:
    """Can the ``engine`` runner run this recipe here? (usable, reason)."""
    if build_art is None or not BuildArtifact(build_art.path).engine_dir.is_dir():
        return False, "the build artifact has no engine/ folder"
    name = target_name(cfg, build_art)
    from ..core.targets import get_target
    from ..errors import InputError

    try:
        tgt = get_target(name)
    except InputError as e:
        return False, f"build target {name!r} is not available ({e})"
    refusal = tgt.capabilities(cfg).recipe_refusal(cfg.quant.recipe)
    if refusal is not None:
        return False, f"target {name!r} cannot run recipe {cfg.quant.recipe!r}: {refusal}"
    ok, why = tgt.available()
    if not ok:
        return False, f"target {name!r} is not usable here: {why}"
    return True, f"target {name!r} runs recipe {cfg.quant.recipe!r}"


def resolve_runners(cfg: Any, build_art: Any) -> tuple[list[str], str, dict[str, str]]:
    """(runners in run order, candidate, notes) after resolving ``eval.candidate=auto``.

    ``auto`` picks ``engine`` when the engine runner is usable, else ``simulated``; with ``auto`` an
    unusable ``engine`` runner is dropped from ``eval.runners`` (and the reason is noted) instead of failing.
    """
    e = cfg.eval
    notes: dict[str, str] = {}
    runners = list(dict.fromkeys(e.runners))
    cand = e.candidate
    if cand == "auto":
        ok, why = engine_usable(cfg, build_art)
        cand = "engine" if ok else "simulated"
        notes["candidate"] = f"auto -> {cand}: {why}"
        if not ok and "engine" in runners:
            runners.remove("engine")
            notes["engine"] = f"not run: {why}"
    if cand not in runners:
        runners.append(cand)
    order = [r for r in ("baseline", cand) if r in runners] + [r for r in runners if r not in ("baseline", cand)]
    return order, cand, notes


# --------------------------------------------------------------------------- running
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


def _pad_id(info: ModelInfo, tokenizer: Any, stop_ids: list[int]) -> int:
    for v in (info.pad_token_id, getattr(tokenizer, "pad_token_id", None)):
        if isinstance(v, int):
            return v
    if stop_ids:
        return stop_ids[0]
    raise InputError(
        "the export has no pad_token_id and no eos_token_ids. Fix: set eos_token_id in the checkpoint's generation_config.json."
    )


def _summarise(outputs: dict[str, Any], scores: dict[str, float], prepared: list[Any]) -> dict[str, Any]:
    by_slice: dict[str, list[float]] = defaultdict(list)
    for p in prepared:
        if p.item.id in scores:
            by_slice[p.item.slice].append(scores[p.item.id])
    vals = list(scores.values())
    return {
        "score": statistics.fmean(vals) if vals else 0.0,
        "n": len(vals),
        "slices": {s: {"score": statistics.fmean(v), "n": len(v)} for s, v in sorted(by_slice.items())},
        "skipped_too_long": sum(1 for p in prepared if p.skipped),
        "errors": sum(1 for o in outputs.values() if o.finish_reason == "error"),
        "finish_reasons": dict(Counter(o.finish_reason for o in outputs.values())),
    }


def _measurements(runs: _Runs) -> dict[str, Any]:
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
    fid: dict[str, Any] | None = None,
    device: str = "cpu",
    batches: dict[str, int] | None = None,
) -> None:
    """Generate with every runner (one loaded at a time; the baseline and simulated models on ``device``, each with the
    batch :func:`_batch` chooses, recorded in ``batches``); with ``fid`` (``{"seqs", "runners": (baseline, cand)}``)
    the baseline and the candidate also compute teacher-forced logits (``fid["logits"][runner]``, seconds in
    ``fid["seconds"][runner]``); an engine without logits records ``fid["unavailable"]``."""
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
                fid["seqs"] = fid["make"](outputs[name]) + fid["heldout"]
            if fid is not None and name in fid["runners"] and "unavailable" not in fid:
                t1 = time.perf_counter()
                try:
                    with ctx.progress(f"evaluate: {name} fidelity", total=len(fid["seqs"])) as adv:
                        seq = max((len(q.prompt) + len(q.continuation) for q in fid["seqs"]), default=1)
                        fid["logits"][name] = runner.teacher_forced_logits(
                            fid["seqs"], _batch(ctx, runner, device, seq, len(fid["seqs"])), adv, into=_logit_sink(fid, name)
                        )
                except NotImplementedError as e:
                    fid["unavailable"] = str(e)
                fid["seconds"][name] = round(time.perf_counter() - t1, 3)
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


def _logit_sink(fid: dict[str, Any], name: str) -> Any:
    """Where ``name``'s teacher-forced logits go: the baseline's to a file (:class:`~pipeline.evaluate.fidelity.SpilledLogits`,
    ``fid["spill"]``), the candidate's straight into the comparison with it
    (:class:`~pipeline.evaluate.fidelity.StreamedComparison`): one sequence's logits in memory at a time."""
    from . import fidelity as F

    if name == "baseline":
        return F.SpilledLogits(fid["spill"])
    return F.StreamedComparison(fid["seqs"], fid["logits"]["baseline"])


def evaluate(ctx: StageContext) -> EvalResult:
    """Run, score, gate and report (see module docstring). Returns the stage result.

    PyTorch runs with ``eval.torch_threads`` intra-op threads (0 = 1 thread on hosts with <= 4 CPUs,
    where spinning worker threads contend with other processes; restored afterwards)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(ctx.cfg.eval.torch_threads or (1 if (os.cpu_count() or 1) <= 4 else before))
    try:
        return _evaluate(ctx)
    finally:
        torch.set_num_threads(before)


@dataclasses.dataclass
class _Setup:
    """The evaluate stage's inputs, resolved: eval items tokenized under the engine's limits, the runners to run."""

    eval_path: Any
    items: list[Any]
    build_art: Any
    tokenizer: Any
    stop_ids: list[int]
    pad_id: int
    limits: dict[str, Any]
    prepared: list[Any]  # pipeline.data.evalset.Prepared, one per item
    runners: list[str]
    cand: str
    notes: dict[str, str]
    n_run: int  # items not skipped
    device: str = "cpu"  # the resolved eval.device (cpu | cuda:N) of the baseline and simulated runners
    eval_format: dict[str, Any] = dataclasses.field(default_factory=lambda: {"format": "jsonl"})  # EvalSet.format


@dataclasses.dataclass
class _Runs:
    """Every runner's outputs (``{runner: {item id: output}}``), wall seconds and the fidelity section."""

    outputs: dict[str, dict[str, Any]]
    seconds: dict[str, float]
    fidelity: dict[str, Any] | None
    fidelity_s: dict[str, float] | None = None
    batches: dict[str, int] = dataclasses.field(default_factory=dict)  # each runner's generation batch


@dataclasses.dataclass
class _Scores:
    """Per-runner scores and summaries, and the candidate-vs-baseline paired statistics (``scope -> PairedStats``)."""

    scores: dict[str, dict[str, float]]
    summaries: dict[str, dict[str, Any]]
    stats: dict[str, Any]
    comparison: dict[str, Any] | None
    cand_scores: dict[str, float]


def _evaluate(ctx: StageContext) -> EvalResult:
    from . import gate as G
    from . import report as R
    from .junit import write_junit

    cfg, e = ctx.cfg, ctx.cfg.eval
    st = _setup(ctx)
    runs = _run_runners(ctx, st)
    sc = _score(e, st, runs)
    verdict = G.judge(
        e.gate,
        cfg.quant.recipe,
        sc.stats,
        sc.cand_scores,
        (runs.fidelity or {}).get("overall"),
        cand_errors=int(sc.summaries[st.cand]["errors"]),
    )
    worst = _worst_regressions(e, st, runs, sc) if sc.comparison else []
    speculative = _speculative(ctx, st, runs)
    rep = _report(ctx, st, runs, sc, verdict, worst, speculative)
    out = ctx.out
    assert out is not None
    _write_outputs(EvalArtifact(out).outputs_path, st, runs, sc)
    R.write_all(out, rep)
    ctx.manifest["measurements"] = _measurements(runs)
    write_junit(out / EvalArtifact.JUNIT_XML, rep)
    R.print_console(rep, ctx.console)
    return _stage_result(st, runs, sc, verdict)


def _setup(ctx: StageContext) -> _Setup:
    """Load the eval set and the export's tokenizer, tokenize every item under the engine's limits, pick the runners."""
    from ..core.tokenization import stop_token_ids
    from ..data.evalset import prepare, read_eval_set
    from .runners import load_tokenizer

    cfg, e = ctx.cfg, ctx.cfg.eval
    eval_path = ctx.external["eval_set"]
    es = read_eval_set(eval_path, limit=e.limit)
    items = es.items
    if es.format["format"] != "jsonl":
        ctx.log.info("eval set %s read as %s, mapping %s", eval_path, es.format["format"], es.format.get("mapping"))
    export_dir = ctx.inputs["export"].path
    build_art = ctx.inputs.get("build")
    info = ExportArtifact(export_dir).model_info()
    tokenizer = load_tokenizer(ExportArtifact(export_dir).hf_dir)
    stop_ids = stop_token_ids(info.eos_token_ids, list(getattr(cfg.model, "extra_stop_token_ids", []) or []))
    pad_id = _pad_id(info, tokenizer, stop_ids)
    limits = engine_limits(build_art, cfg)
    prepared = prepare(
        items,
        tokenizer,
        max_input_len=int(limits["max_input_len"]),
        max_seq_len=limits.get("max_seq_len"),
        default_max_new_tokens=e.max_new_tokens,
        extra_stop=e.stop,
        apply_chat_template=bool(getattr(cfg.model, "apply_chat_template", True)),
    )
    runners, cand, notes = resolve_runners(cfg, build_art)
    for k, v in notes.items():
        ctx.log.info("%s: %s", k, v)
    n_run = sum(1 for p in prepared if not p.skipped)
    from ..core.hostinfo import resolve_torch_device

    device = resolve_torch_device(e.device, "eval.device")
    return _Setup(
        eval_path, items, build_art, tokenizer, stop_ids, pad_id, limits, prepared, runners, cand, notes, n_run, device, es.format
    )


def _run_runners(ctx: StageContext, st: _Setup) -> _Runs:
    """Run every runner over the prepared items (:func:`_run_all`), with teacher-forced fidelity when asked for."""
    outputs: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    fid = _fidelity_plan(ctx, st) if ctx.cfg.eval.fidelity and "baseline" in st.runners and st.cand != "baseline" else None
    try:
        batches: dict[str, int] = {}
        _run_all(ctx, st.runners, st.prepared, st.tokenizer, st.stop_ids, st.pad_id, st.n_run, outputs, seconds, fid, st.device, batches)
        if fid is None:
            return _Runs(outputs, seconds, None, None, batches)
        return _Runs(outputs, seconds, _fidelity_result(fid, st.cand), fid["seconds"], batches)
    finally:
        base = (fid or {}).get("logits", {}).get("baseline")
        if base is not None and hasattr(base, "close"):
            base.close()  # the spilled baseline logits never reach the artifact


def _fidelity_plan(ctx: StageContext, st: _Setup) -> dict[str, Any]:
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
    fits = min(int(st.limits["max_input_len"]), int(st.limits.get("max_seq_len") or 1 << 30) - 1)
    return {
        "make": make_seqs,
        "runners": ("baseline", st.cand),
        "logits": {},
        "seconds": {},
        "heldout": F.heldout_sequences([h for h in _heldout_samples(ctx, st.tokenizer) if len(h) - 1 <= fits]),
        "spill": Path(ctx.out or tempfile.gettempdir()) / f".fidelity-baseline-{os.getpid()}.f32",
    }


def _fidelity_result(fid: dict[str, Any], cand: str) -> dict[str, Any]:
    """The report's ``fidelity`` section from the filled ``fid`` state (:func:`pipeline.evaluate.fidelity.compare`)."""

    if "unavailable" in fid:
        return {"candidate": cand, "unavailable": fid["unavailable"]}
    n_all = len(fid["seqs"])
    n_tune = n_all - len(fid["heldout"])
    cmp = fid["logits"][cand]  # F.StreamedComparison (_logit_sink)
    held = cmp.result(n_tune, n_all) if fid["heldout"] else None
    return {
        "candidate": cand,
        **cmp.result(0, n_tune),
        "calibration_heldout": ({"samples": held["items"], **held["overall"]} if held else None),
        "sequence": "prompt + reference answer (the baseline's tokens where it answered correctly) + eos, cut to the item budget",
    }


def _score(e: Any, st: _Setup, runs: _Runs) -> _Scores:
    """Score every output (an engine error scores 0: a broken engine must not pass the gate) and compare the
    candidate with the baseline, overall and per slice (:func:`pipeline.evaluate.gate.paired_stats`)."""
    from ..data.metrics import get_metric
    from . import gate as G

    prepared, outputs, cand = st.prepared, runs.outputs, st.cand
    metric_of = {p.item.id: get_metric(p.item.metric) for p in prepared}
    item_of = {p.item.id: p.item for p in prepared}
    scores = {
        r: {i: (metric_of[i](o.text, item_of[i]) if o.finish_reason != "error" else 0.0) for i, o in outs.items()}
        for r, outs in outputs.items()
    }
    summaries = {r: {**_summarise(outputs[r], scores[r], prepared), "batch_size": runs.batches.get(r)} for r in st.runners}
    comparison: dict[str, Any] | None = None
    stats: dict[str, Any] = {}
    cand_scores = {"overall": summaries[cand]["score"], **{f"slice:{s}": v["score"] for s, v in summaries[cand]["slices"].items()}}
    if "baseline" in outputs and cand != "baseline":
        groups: dict[str, list[Any]] = defaultdict(list)
        for p in prepared:
            i = p.item.id
            if i in scores["baseline"] and i in scores[cand]:
                groups["overall"].append(p)
                groups[f"slice:{p.item.slice}"].append(p)
        for scope, ps in groups.items():
            stats[scope] = G.paired_stats(
                [scores["baseline"][p.item.id] for p in ps],
                [scores[cand][p.item.id] for p in ps],
                binary=all(metric_of[p.item.id].binary for p in ps),
                agree=[outputs["baseline"][p.item.id].text.strip() == outputs[cand][p.item.id].text.strip() for p in ps],
                confidence=e.gate.confidence,
                samples=e.gate.bootstrap_samples,
                seed=e.gate.seed,
            )
        comparison = {
            "overall": stats["overall"].to_json() if "overall" in stats else None,
            "slices": {k.split(":", 1)[1]: v.to_json() for k, v in stats.items() if k.startswith("slice:")},
        }
    return _Scores(scores, summaries, stats, comparison, cand_scores)


def _worst_regressions(e: Any, st: _Setup, runs: _Runs, sc: _Scores) -> list[dict[str, Any]]:
    """Up to ``eval.worst_regressions`` items where the candidate scored below the baseline, worst first."""
    scores, outputs, cand = sc.scores, runs.outputs, st.cand
    worst: list[dict[str, Any]] = []
    regress = sorted(
        (p for p in st.prepared if p.item.id in scores["baseline"] and p.item.id in scores[cand]),
        key=lambda p: scores[cand][p.item.id] - scores["baseline"][p.item.id],
    )
    for p in regress[: e.worst_regressions]:
        i = p.item.id
        if scores["baseline"][i] - scores[cand][i] <= 0:
            break
        worst.append(
            {
                "id": i,
                "slice": p.item.slice,
                "prompt": p.item.prompt_text(),
                "reference": p.item.reference,
                "baseline": outputs["baseline"][i].text,
                "candidate": outputs[cand][i].text,
                "baseline_score": scores["baseline"][i],
                "candidate_score": scores[cand][i],
            }
        )
    return worst


def _speculative(ctx: StageContext, st: _Setup, runs: _Runs) -> dict[str, Any] | None:
    """``eval.draft_model_path``: the draft model's acceptance of the target's outputs, else None.

    Raises:
        InputError: the draft's tokenizer differs from the target's.
    """
    from .runners import choose_batch, draft_acceptance, load_hf_model, load_tokenizer

    e = ctx.cfg.eval
    if not e.draft_model_path:
        return None
    target_runner = "baseline" if "baseline" in runs.outputs else st.cand
    draft_dir = ctx.external["draft_model"]
    draft_tok = load_tokenizer(draft_dir)
    if draft_tok.get_vocab() != st.tokenizer.get_vocab():
        raise InputError(
            f"eval.draft_model_path={e.draft_model_path!r}: its tokenizer differs from the target's. "
            "Fix: use a draft model trained with the same tokenizer (speculative decoding needs a shared vocabulary)."
        )
    draft = load_hf_model(draft_dir)
    with ctx.progress("evaluate: draft acceptance", total=None) as adv:
        acc = draft_acceptance(
            draft,
            st.prepared,
            runs.outputs[target_runner],
            k=e.draft_tokens,
            pad_id=st.pad_id,
            stop_ids=st.stop_ids,
            batch_size=choose_batch(e.batch_size, "cpu", None, 1, len(st.prepared), "float32")[0],  # the draft runs on the CPU
            advance=adv,
        )
    return _speculative_summary(acc, st.prepared, e, target_runner)


def _pairwise_agreement(runners: list[str], outputs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Output agreement between every pair of runners (e.g. engine vs simulated checks the engine's numerics)."""
    pairwise = {}
    for a_i, a in enumerate(runners):
        for b in runners[a_i + 1 :]:
            common = [i for i in outputs[a] if i in outputs[b]]
            if common:
                pairwise[f"{a}~{b}"] = sum(outputs[a][i].text.strip() == outputs[b][i].text.strip() for i in common) / len(common)
    return pairwise


def _report(
    ctx: StageContext,
    st: _Setup,
    runs: _Runs,
    sc: _Scores,
    verdict: dict[str, Any],
    worst: list[dict[str, Any]],
    speculative: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``eval_report.json`` document (schema :data:`REPORT_SCHEMA`)."""
    from .runners import reference_dtype

    cfg, e = ctx.cfg, ctx.cfg.eval
    outputs, limits = runs.outputs, st.limits
    too_long = [p.item.id for p in st.prepared if p.skipped]
    ref_dtype = reference_dtype(ctx.external["reference_checkpoint"], e.reference_dtype, st.device) if "baseline" in outputs else None
    pairwise = _pairwise_agreement(st.runners, outputs)
    return {
        "schema": REPORT_SCHEMA,
        "eval_set": {
            "name": e.name,
            "path": str(st.eval_path),
            "sha256": sha256_file(st.eval_path),
            "items": len(st.items),
            "evaluated": st.n_run,
            "limit": e.limit,
            "format": st.eval_format,  # how the file was read; a foreign format's mapping (pipeline/data/foreign.py)
        },
        "recipe": cfg.quant.recipe,
        "target": target_name(cfg, st.build_art) if st.build_art is not None else None,
        "candidate": st.cand,
        "baseline": "baseline" if "baseline" in outputs else None,
        "notes": st.notes,
        "stop": {"eos_token_ids": st.stop_ids, "stop_strings": list(e.stop)},
        "decoding": ExportArtifact(ctx.inputs["export"].path).decoding().to_json(),  # what every runner applied
        "limits": {k: limits.get(k) for k in ("max_input_len", "max_seq_len", "max_batch_size")},
        "runners": sc.summaries,
        "comparison": sc.comparison,
        "pairwise_agreement": pairwise,
        "gate": verdict,
        "fidelity": runs.fidelity,
        "rope_scaling": _rope_scaling(ctx.inputs["export"].path),
        "reference": {"checkpoint": str(ctx.external.get("reference_checkpoint")), "dtype": ref_dtype, "requested": e.reference_dtype}
        if "baseline" in outputs
        else None,
        "skipped": {"too_long": too_long, "max_input_len": int(limits["max_input_len"])},
        "device": st.device,
        "worst_regressions": worst,
        "speculative": speculative,
    }


def _write_outputs(path: Any, st: _Setup, runs: _Runs, sc: _Scores) -> None:
    """``outputs.jsonl``: one line per skipped item, else one per (item, runner) with text, ids and score (latencies:
    the manifest's ``measurements``)."""
    with open(path, "w", encoding="utf-8") as f:
        for p in st.prepared:
            base = {"id": p.item.id, "slice": p.item.slice, "metric": p.item.metric, "prompt_tokens": len(p.input_ids)}
            if p.skipped:
                f.write(json.dumps({**base, "skipped": p.skipped}, ensure_ascii=False) + "\n")
                continue
            for r in st.runners:
                o = runs.outputs[r].get(p.item.id)
                if o is not None:
                    row = {
                        **base,
                        "runner": r,
                        "text": o.text,
                        "output_ids": o.output_ids,
                        "finish_reason": o.finish_reason,
                        "score": sc.scores[r][p.item.id],
                        "error": o.error,
                    }
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _stage_result(st: _Setup, runs: _Runs, sc: _Scores, verdict: dict[str, Any]) -> EvalResult:
    """The stage result: the gate verdict, the console headline and counts."""
    ov = sc.stats.get("overall")
    headline = {
        "score": round(sc.summaries[st.cand]["score"], 4),
        "baseline": round(ov.baseline, 4) if ov else None,
        "drop": round(ov.drop, 4) if ov else None,
        "agreement": round(ov.agreement, 4) if ov and ov.agreement is not None else None,
        "gate": verdict["verdict"] if verdict["passed"] else verdict["verdict"].upper(),
        "runner": st.cand,
    }
    fo = (runs.fidelity or {}).get("overall") or {}
    if fo.get("positions"):
        headline["kld"] = round(fo["kld"]["mean"], 6)
        headline["top1"] = round(fo["top1"], 4)
    if verdict["bound"]:
        headline["drop_ub"] = round(verdict["bound"]["upper"], 4)
    return EvalResult(
        gate=gate_verdict(verdict, fo),
        headline=headline,
        skipped_too_long=sum(1 for p in st.prepared if p.skipped),
        evaluated=st.n_run,
        candidate=st.cand,
        report=EvalArtifact.REPORT_JSON,
    )


def gate_summary(verdict: dict[str, Any], fidelity_overall: dict[str, Any]) -> dict[str, Any]:
    """The JSON of :func:`gate_verdict` (the evaluate result's ``gate``)."""
    return gate_verdict(verdict, fidelity_overall).to_json()


def gate_verdict(verdict: dict[str, Any], fidelity_overall: dict[str, Any]) -> GateVerdict:
    """The gate record of the evaluate result (:class:`~pipeline.core.contracts.evaluate.GateVerdict`, shown by
    ``report.print_gate``, kept in summary.json and the release manifest) from ``gate.judge``'s verdict and the
    overall fidelity summary (``fidelity.summarize``)."""
    fo = fidelity_overall
    b = verdict["bound"]
    return GateVerdict(
        passed=bool(verdict["passed"]),
        reason=str(verdict["reason"]),
        verdict=verdict["verdict"],
        non_inferiority=verdict["non_inferiority"],
        mode=verdict["mode"],
        fix=verdict.get("fix"),
        failed_checks=tuple(FailedCheck.from_json(c) for c in verdict["failed_checks"]),
        bound=GateBound(b["drop"], b["upper"], b["allowance"]) if b else None,
        scopes=dict(verdict["scopes"]),
        fidelity=GateFidelity(fo["kld"]["mean"], fo["kld"]["se"], fo["top1"], fo["ln_ppl_ratio"], fo["positions"])
        if fo.get("positions")
        else None,
    )


def _heldout_samples(ctx: StageContext, tokenizer: Any) -> list[list[int]]:
    """Calibration samples calibration did not use: the ``eval.fidelity_heldout`` samples after the first
    ``calibration.calib_size`` in the calibration set's seeded order (``pipeline.data.calibration.load_calibration``)."""
    import dataclasses

    n = ctx.cfg.eval.fidelity_heldout
    path = ctx.external.get("calibration")
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


def _speculative_summary(acc: dict[str, dict[str, int]], prepared: list[Any], e: Any, target_runner: str) -> dict[str, Any]:
    by_slice: dict[str, dict[str, int]] = defaultdict(lambda: {"proposed": 0, "accepted": 0, "steps": 0, "tokens": 0})
    slice_of = {p.item.id: p.item.slice for p in prepared}
    tot = {"proposed": 0, "accepted": 0, "steps": 0, "tokens": 0}
    for i, a in acc.items():
        for k in tot:
            by_slice[slice_of[i]][k] += a[k]
            tot[k] += a[k]
    rate = lambda d: d["accepted"] / d["proposed"] if d["proposed"] else 0.0  # noqa: E731
    return {
        "draft_model": str(e.draft_model_path),
        "k": e.draft_tokens,
        "target_runner": target_runner,
        "acceptance_rate": rate(tot),
        "mean_tokens_per_step": tot["tokens"] / tot["steps"] if tot["steps"] else 0.0,
        "proposed": tot["proposed"],
        "accepted": tot["accepted"],
        "slices": {s: {**v, "acceptance_rate": rate(v)} for s, v in sorted(by_slice.items())},
    }


def _external(cfg: Any) -> dict[str, Any]:
    from ..core.config import resolve_path
    from ..data.evalset import read_eval_set

    # Parse the eval set now: the runner resolves every stage's external inputs before the first stage
    # runs, so a malformed eval set fails in milliseconds, not after quantization and the build.
    path = resolve_path(cfg.eval.eval_set)
    ext: dict[str, Any] = {"eval_set": cfg.eval.eval_set}
    if path is not None and path.is_file():
        # a task YAML's documents are part of the eval set: each data file's content digest enters this key too
        for k, f in enumerate(read_eval_set(path, limit=cfg.eval.limit).data_files):
            ext[f"eval_data_{k}"] = str(f)
    if cfg.model.path is not None and "baseline" in cfg.eval.runners:
        # the baseline's independent reference: the user's checkpoint (its content digest enters this key; the
        # runner memoises digests per process, so the export stage's digest of the same folder is reused)
        ext["reference_checkpoint"] = cfg.model.path
    if cfg.eval.draft_model_path:
        ext["draft_model"] = cfg.eval.draft_model_path
    if _heldout_wanted(cfg):
        ext["calibration"] = cfg.calibration.path
    return ext


def _heldout_wanted(cfg: Any) -> bool:
    return bool(cfg.eval.fidelity and cfg.eval.fidelity_heldout and cfg.calibration.path)


def _key_extras(cfg: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Every field outside the ``eval`` group that evaluate reads (tests/contracts/test_gate_key_reads.py records the reads
    of a real run and fails on any field that is neither here, in ``eval``'s cache fields, nor in ``RUNTIME_READS``)."""
    from ..core.targets import resolve_target

    m, b = cfg.model, cfg.build
    return {
        "recipe": cfg.quant.recipe,
        "gate": "v2",
        "model": {
            "extra_stop_token_ids": list(m.extra_stop_token_ids or []),
            "apply_chat_template": m.apply_chat_template,
            "allow_pickle": m.allow_pickle,
        },
        # the build artifact's limits win when there is one; these are the fallback (baseline + simulated runs)
        "build": {"max_input_len": b.max_input_len, "max_seq_len": b.max_seq_len, "max_batch_size": b.max_batch_size},
        # the target the run resolves to (target=auto and its explicit name share a key, as the build stage's do)
        "target": resolve_target(cfg).name,
        # the calibration hold-out (fidelity) depends on the calibration set's order and size
        "calibration": key_fields(cfg.calibration) if _heldout_wanted(cfg) else None,
    }


def _key_config(cfg: Any) -> dict[str, Any]:
    """The ``eval`` group's cache fields as the run resolves them: ``reference_dtype=auto`` as the dtype it stands for
    on this host (float32 on the CPU: the key of a CPU run is the one it had before ``auto``), and ``device: cuda`` when
    the runners run on CUDA (absent on the CPU, for the same reason; ``eval.device`` itself is a runtime field)."""
    from ..core.config import resolve_path
    from .runners import device_kind, reference_dtype

    ev = key_fields(cfg.eval)
    kind = device_kind(cfg.eval.device)
    if ev.get("reference_dtype") == "auto":
        ev["reference_dtype"] = reference_dtype(resolve_path(cfg.model.path) if cfg.model.path else None, "auto", kind)
    if kind != "cpu":
        ev["device"] = kind
    return {"eval": ev}


# Fields evaluate reads that never change its report: paths whose content is digested as an external input,
# and how the work is scheduled.
RUNTIME_READS = (
    "model.path",
    "eval.eval_set",
    "eval.draft_model_path",
    "eval.batch_size",
    "eval.torch_threads",
    "eval.device",
    "calibration.path",
    "calibration.max_device_memory_gb",
    "calibration.max_host_memory_gb",
)


def _dry_run(ctx: StageContext) -> dict[str, Any]:
    from ..data.evalset import load_eval_set

    items = load_eval_set(ctx.external["eval_set"], limit=ctx.cfg.eval.limit)
    runners, cand, notes = resolve_runners(ctx.cfg, ctx.inputs.get("build"))
    ctx.console.print(f"evaluate: {len(items)} items, runners {runners}, candidate {cand} {notes or ''}")
    return {"headline": {"items": len(items), "runners": ",".join(runners), "candidate": cand}}


def _select_deps(cfg: Any) -> tuple[str, ...]:
    # The engine is only an input when the engine runner is asked for; baseline + simulated runs
    # (e.g. fp8 / int8_sq sweeps on a CPU-only host) need no build.
    return ("export", "quantize", "build") if "engine" in cfg.eval.runners else ("export", "quantize")


STAGE = Stage(
    name="evaluate",
    checks=checks,
    deps=("export", "quantize", "build"),
    config_groups=("eval",),
    libraries=("transformers", "torch", "tokenizers", "nvidia-modelopt", "onnxruntime-genai", "rouge-score", "scipy", "numpy"),
    run=evaluate,
    version="2",
    external_inputs=_external,
    key_extras=_key_extras,
    key_config=_key_config,
    runtime_reads=RUNTIME_READS,
    dry_run=_dry_run,
    select_deps=_select_deps,
)


def _rope_scaling(export_dir: Any) -> dict[str, Any] | None:
    """The exported checkpoint's RoPE scaling (:func:`pipeline.facts.rope.normalise_rope`), None for plain RoPE or an
    unreadable config: a fidelity failure of a scaled checkpoint is reported with it (report.rope_note)."""
    from ..facts.rope import normalise_rope

    try:
        return normalise_rope(json.loads((ExportArtifact(export_dir).hf_dir / "config.json").read_text(encoding="utf-8")))[1]
    except (OSError, ValueError):
        return None
