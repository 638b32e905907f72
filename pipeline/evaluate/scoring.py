"""Scoring the runners' outputs (:func:`score_outputs`): each output scored by its item's metric (an engine error scores
0), per-runner and per-slice summaries, and the candidate-vs-baseline paired statistics the gate judges
(:func:`pipeline.evaluate.gate.paired_stats`); the worst regressions and the runners' pairwise output agreement."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter, defaultdict
from typing import Any

from .inputs import Setup
from .running import Runs


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


@dataclasses.dataclass
class Scores:
    """Per-runner scores and summaries, and the candidate-vs-baseline paired statistics (``scope -> PairedStats``)."""

    scores: dict[str, dict[str, float]]
    summaries: dict[str, dict[str, Any]]
    stats: dict[str, Any]
    comparison: dict[str, Any] | None
    cand_scores: dict[str, float]
    overall: Any = None
    """The overall candidate-vs-baseline :class:`~pipeline.evaluate.gate.PairedStats` (None without a baseline)."""


def score_outputs(e: Any, st: Setup, runs: Runs) -> Scores:
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
    overall = None
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
        overall = stats["overall"] if "overall" in stats else None
        comparison = {
            "overall": overall.to_json() if overall else None,
            "slices": {k.split(":", 1)[1]: v.to_json() for k, v in stats.items() if k.startswith("slice:")},
        }
    return Scores(scores, summaries, stats, comparison, cand_scores, overall)


def worst_regressions(e: Any, st: Setup, runs: Runs, sc: Scores) -> list[dict[str, Any]]:
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


def pairwise_agreement(runners: list[str], outputs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Output agreement between every pair of runners (e.g. engine vs simulated checks the engine's numerics)."""
    pairwise = {}
    for a_i, a in enumerate(runners):
        for b in runners[a_i + 1 :]:
            common = [i for i in outputs[a] if i in outputs[b]]
            if common:
                pairwise[f"{a}~{b}"] = sum(outputs[a][i].text.strip() == outputs[b][i].text.strip() for i in common) / len(common)
    return pairwise
