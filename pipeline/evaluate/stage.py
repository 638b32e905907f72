"""Evaluate stage: run the business eval set through the baseline (the *source* checkpoint in the reference
dtype, never the export) and the candidate (the built engine, or the ModelOpt simulated-quantization model),
score it, measure teacher-forced fidelity (``evaluate/fidelity.py``), apply the non-inferiority release gate
(``evaluate/gate.py``) and write the report (``eval_report.json`` / ``.md`` / ``.html``, ``outputs.jsonl``).

A failed gate does not raise: the artifact (with its report) is published and the result carries
``gate = {"passed": False, "reason": ...}``; the runner then exits 3 and the package stage refuses it.

This module is the adapter (``STAGE``); each step lives in its own module: :mod:`.inputs` (the eval set tokenized
under the engine's limits, the runners chosen), :mod:`.running` (generation and the teacher-forced fidelity passes),
:mod:`.scoring` (metrics and paired statistics), :mod:`.gate` (the verdict), :mod:`.draft` (speculative acceptance),
:mod:`.results` (``eval_report.json``, ``outputs.jsonl``, the stage result), :mod:`.report` (rendering) and
:mod:`.key` (what the cache key covers).
"""

from __future__ import annotations

import os
from typing import Any

from ..core.contracts.evaluate import EvalArtifact, EvalResult
from ..core.stage import Stage, StageContext
from .checks import checks
from .draft import speculative_section
from .inputs import resolve_runners, setup
from .key import RUNTIME_READS, external_inputs, generation_key, key_config, key_extras
from .results import build_report, stage_result, write_outputs
from .running import measurements, run_runners, stored_runs
from .scoring import score_outputs, worst_regressions


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


def _evaluate(ctx: StageContext) -> EvalResult:
    from . import gate as G
    from . import report as R
    from .junit import write_junit

    cfg, e = ctx.cfg, ctx.cfg.eval
    st = setup(ctx)
    stored = stored_runs(ctx, st)  # eval.gate changed only: the answers of ctx.prior
    runs = stored.runs if stored is not None else run_runners(ctx, st)
    sc = score_outputs(e, st, runs)
    verdict = G.judge(
        e.gate,
        cfg.quant.recipe,
        sc.stats,
        sc.cand_scores,
        runs.fidelity_overall,
        cand_errors=int(sc.summaries[st.cand]["errors"]),
    )
    worst = worst_regressions(e, st, runs, sc) if sc.comparison else []
    speculative = stored.speculative if stored is not None else speculative_section(ctx, st, runs)
    rep = build_report(ctx, st, runs, sc, verdict, worst, speculative)
    out = ctx.out
    assert out is not None
    write_outputs(EvalArtifact(out).outputs_path, st, runs, sc)
    report = R.write_all(out, rep)
    ctx.manifest["measurements"] = stored.measurements if stored is not None else measurements(runs)
    write_junit(out / EvalArtifact.JUNIT_XML, report)
    R.print_console(report, ctx.console, in_run=True)  # the inconclusive fix: once, at the end of the run
    return stage_result(st, runs, sc, verdict)


def _dry_run(ctx: StageContext) -> dict[str, Any]:
    from ..data.evalset import load_eval_set

    items = load_eval_set(ctx.external["eval_set"], limit=ctx.cfg.eval.limit)
    runners, cand, notes = resolve_runners(ctx.cfg, ctx.upstream("build"))
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
    external_inputs=external_inputs,
    key_extras=key_extras,
    key_config=key_config,
    runtime_reads=RUNTIME_READS,
    dry_run=_dry_run,
    select_deps=_select_deps,
    generation_key=generation_key,
)
