"""What the evaluate stage writes and returns: the ``eval_report.json`` document (:func:`build_report`, schema
:data:`REPORT_SCHEMA`; rendered by :mod:`pipeline.evaluate.report`), ``outputs.jsonl`` (:func:`write_outputs`), the stage
result (:func:`stage_result`) and its gate record (:func:`gate_verdict`)."""

from __future__ import annotations

import json
from typing import Any

from ..core.contracts.evaluate import EvalArtifact, EvalResult, FailedCheck, FidelityStats, GateBound, GateFidelity, GateVerdict
from ..core.contracts.export import ExportArtifact
from ..core.stage import StageContext
from ..core.store import sha256_file
from .inputs import Setup, target_name
from .running import Runs
from .scoring import Scores, pairwise_agreement

REPORT_SCHEMA = "pipeline.eval_report/v1"


def build_report(
    ctx: StageContext,
    st: Setup,
    runs: Runs,
    sc: Scores,
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
    pairwise = pairwise_agreement(st.runners, outputs)
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
        "warnings": list(st.warnings),
        "stop": {"eos_token_ids": st.stop_ids, "stop_strings": list(e.stop)},
        "decoding": ExportArtifact(ctx.inputs["export"].path).decoding().to_json(),  # what every runner applied
        "limits": {k: limits.get(k) for k in ("max_input_len", "max_seq_len", "max_batch_size")},
        "runners": sc.summaries,
        "comparison": sc.comparison,
        "pairwise_agreement": pairwise,
        "gate": verdict,
        "fidelity": runs.fidelity,
        "rope_scaling": _rope_scaling(ctx.inputs["export"].path),
        "reference": {"checkpoint": str(ctx.external_path("reference_checkpoint")), "dtype": ref_dtype, "requested": e.reference_dtype}
        if "baseline" in outputs
        else None,
        "skipped": {"too_long": too_long, "max_input_len": int(limits["max_input_len"])},
        "device": st.device,
        "worst_regressions": worst,
        "speculative": speculative,
    }


def write_outputs(path: Any, st: Setup, runs: Runs, sc: Scores) -> None:
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


def stage_result(st: Setup, runs: Runs, sc: Scores, verdict: dict[str, Any]) -> EvalResult:
    """The stage result: the gate verdict, the console headline and counts."""
    ov = sc.overall
    headline = {
        "score": round(sc.summaries[st.cand]["score"], 4),
        "baseline": round(ov.baseline, 4) if ov else None,
        "drop": round(ov.drop, 4) if ov else None,
        "agreement": round(ov.agreement, 4) if ov and ov.agreement is not None else None,
        "gate": verdict["verdict"] if verdict["passed"] else verdict["verdict"].upper(),
        "runner": st.cand,
    }
    fo = runs.fidelity_overall
    if fo.positions:
        headline["kld"] = float(f"{fo.kld.mean:.4g}")  # 4 significant digits: round(x, 6) made a KLD of 2e-12 "kld=0"
        headline["top1"] = round(fo.top1, 4)
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
    return gate_verdict(verdict, FidelityStats.from_json(fidelity_overall)).to_json()


def gate_verdict(verdict: dict[str, Any], fo: FidelityStats) -> GateVerdict:
    """The gate record of the evaluate result (:class:`~pipeline.core.contracts.evaluate.GateVerdict`, shown by
    ``report.print_gate``, kept in summary.json and the release manifest) from ``gate.judge``'s verdict and the
    overall fidelity summary ``fo`` (``fidelity.summarize``)."""
    b = verdict["bound"]
    return GateVerdict(
        passed=bool(verdict["passed"]),
        reason=str(verdict["reason"]),
        verdict=verdict["verdict"],
        non_inferiority=verdict["non_inferiority"],
        mode=verdict["mode"],
        fix=verdict["fix"],
        failed_checks=tuple(FailedCheck.from_json(c) for c in verdict["failed_checks"]),
        bound=GateBound(b["drop"], b["upper"], b["allowance"]) if b else None,
        scopes=dict(verdict["scopes"]),
        fidelity=GateFidelity(fo.kld.mean, fo.kld.se, fo.top1, fo.ln_ppl_ratio, fo.positions) if fo.positions else None,
    )


def _rope_scaling(export_dir: Any) -> dict[str, Any] | None:
    """The exported checkpoint's RoPE scaling (:func:`pipeline.facts.rope.normalise_rope`), None for plain RoPE or an
    unreadable config: a fidelity failure of a scaled checkpoint is reported with it (report.rope_note)."""
    from ..facts.rope import normalise_rope

    try:
        return normalise_rope(json.loads((ExportArtifact(export_dir).hf_dir / "config.json").read_text(encoding="utf-8")))[1]
    except (OSError, ValueError):
        return None
