"""Eval report writers: JSON (schema ``pipeline.eval_report/v1``), Markdown, self-contained HTML
(matplotlib PNGs embedded as base64) and the console table (rich).

``eval_report.json`` top-level keys (stable for CI):

- ``schema``: ``"pipeline.eval_report/v1"``
- ``eval_set``: {name, path, sha256, items, evaluated, limit, format} (``format``: how the file was read, a foreign
  format's mapping: ``pipeline.data.evalset.EvalSet.format``)
- ``recipe``, ``target``, ``candidate`` (runner judged by the gate), ``baseline`` (``"baseline"`` or null)
- ``runners``: {name: {score, slices: {slice: {score, n}}, n, skipped_too_long, errors,
  finish_reasons: {eos, stop, length, error}, batch_size}} (wall time, items per second and latencies are the artifact
  manifest's ``measurements``, not here: this file's bytes enter the content digest)
- ``comparison``: {"overall": PairedStats, "slices": {slice: PairedStats}} (candidate vs baseline;
  PairedStats = {n, baseline, candidate, drop, upper, confidence, method, discordant, agreement})
- ``pairwise_agreement``: {"<runner a>~<runner b>": fraction of items with identical output text}
- ``gate``: {passed, verdict (pass | inconclusive | fail), mode (release | exploratory), reason, checks: [{scope, check,
  value, threshold, verdict, passed, detail, upper, items_needed}], allowed_drop, confidence, bound, fidelity_thresholds}
- ``fidelity``: null, {candidate, unavailable}, or {candidate, overall, slices: {slice: ...}, items, sequence}; overall/slice = {positions, kld {mean, se, median, p90, p95, p99, p99_9, max, min}, top1, top1_se,
  ppl_base, ppl_cand, ln_ppl_ratio, ln_ppl_ratio_se} (``fidelity.py``)
- ``decoding``: the decoding policy every runner applied (``pipeline.core.decoding``, ``decoding.json`` of the export):
  {schema, repetition_penalty, sampling (the model's recommended values; not used by the gate), ignored, source,
  gate: "greedy"}
- ``reference``: {checkpoint, dtype, requested}: the baseline's source checkpoint and compute dtype
- ``device``: where the baseline and simulated runners ran (the resolved ``eval.device``: ``cpu`` | ``cuda:N``)
- ``skipped``: {"too_long": [ids], "max_input_len": int}
- ``worst_regressions``: [{id, slice, prompt, reference, baseline, candidate, baseline_score, candidate_score}]
- ``rope_scaling``: null or the checkpoint's normalised RoPE scaling (``pipeline.facts.rope.normalise_rope``)
- ``speculative``: null or {draft_model, k, acceptance_rate, mean_accepted_per_step, slices: {slice: {acceptance_rate, proposed, accepted}}}
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from ..core.contracts.evaluate import VERDICTS, EvalArtifact, EvalReport, FidelitySummary, RunnerScores
from ..core.markdown import md_cell

SCHEMA = "pipeline.eval_report/v1"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _pp(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} pp"


def _kld(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def rope_note(rep: EvalReport) -> str | None:
    """One line when a fidelity check (``max_kld`` / ``min_top1``) failed and the checkpoint has RoPE scaling: an engine
    that applies the scaling otherwise than transformers shifts every position's encoding (docs/build.md)."""
    failed = [c.check for c in rep.gate.checks if c.check in ("max_kld", "min_top1") and not c.passed]
    if not rep.rope_type or not failed:
        return None
    return (
        f"the checkpoint has rope_scaling type {rep.rope_type!r} and {'/'.join(failed)} failed: check that target "
        f"{rep.target} applies that scaling as transformers does (docs/build.md, RoPE scaling)"
    )


def fidelity_markdown(rep: EvalReport) -> list[str]:
    """The llama.cpp-style KL-divergence block (overall) as Markdown lines; [] without fidelity."""
    f = rep.fidelity
    if f is None:
        return []
    if f.unavailable:
        return [f"Fidelity: not measured ({f.unavailable}).", ""]
    o, h = f.overall, f.calibration_heldout
    if not o.positions:
        return []
    k = o.kld
    return [
        f"### Fidelity ({f.candidate} vs baseline, teacher-forced over {o.positions} answer tokens of {f.items} items)",
        "",
        "| statistic | value |",
        "|---|---|",
        f"| mean KLD (nats) | {k.mean:.4g} ± {k.se:.4g} |",
        f"| median / p90 / p95 KLD | {k.median:.4g} / {k.p90:.4g} / {k.p95:.4g} |",
        f"| p99 / p99.9 / max KLD | {k.p99:.4g} / {k.p99_9:.4g} / {k.max:.4g} |",
        f"| same top token | {100 * o.top1:.2f} ± {100 * o.top1_se:.2f} % |",
        f"| ln(PPL_cand / PPL_base) | {o.ln_ppl_ratio:+.4g} ± {o.ln_ppl_ratio_se:.2g} (PPL {o.ppl_base:.4f} -> {o.ppl_cand:.4f}) |",
        *(
            [
                f"| calibration hold-out ({h.samples} samples, {h.positions} tokens): mean KLD / top-1 / ln PPL ratio | "
                f"{h.kld.mean:.4g} ± {h.kld.se:.2g} / {100 * h.top1:.2f} % / {h.ln_ppl_ratio:+.4g} |"
            ]
            if h.positions
            else []
        ),
        "",
    ]


def slice_rows(rep: EvalReport) -> list[dict[str, Any]]:
    """One row per scope (overall first, then slices): baseline, candidate, drop, upper bound, agreement,
    verdict (the scope's worst check), mean KLD and top-1 agreement."""
    cand = rep.runners.get(rep.candidate or "", RunnerScores())
    worst: dict[str, str] = {}
    for c in rep.gate.checks:
        worst[c.scope] = max(worst.get(c.scope, "pass"), c.verdict, key=VERDICTS.index)
    fid = rep.fidelity or FidelitySummary()
    rows = []
    scopes = [("overall", rep.comparison.overall, cand.score, cand.n)]
    for s, v in sorted(cand.slices.items()):
        scopes.append((s, rep.comparison.slices.get(s), v.score, v.n))
    for name, st, score, n in scopes:
        scope = "overall" if name == "overall" else f"slice:{name}"
        f = fid.overall if name == "overall" else fid.slices.get(name)
        kld, top1 = (f.kld.mean, f.top1) if f and f.positions else (None, None)
        rows.append(
            {
                "scope": name,
                "n": n,
                "baseline": st.baseline if st else None,
                "candidate": score,
                "drop": st.drop if st else None,
                "upper": st.upper if st else None,
                "agreement": st.agreement if st else None,
                "verdict": worst.get(scope, "pass"),
                "passed": worst.get(scope, "pass") == "pass",
                "kld": kld,
                "top1": top1,
            }
        )
    return rows


def gate_table_markdown(rep: EvalReport) -> list[str]:
    """The per-scope gate table (:func:`slice_rows`) as Markdown lines: the table of ``eval_report.md`` and the one
    a run appends to ``$GITHUB_STEP_SUMMARY`` (``pipeline.evaluate.junit.append_step_summary``)."""
    lines = [
        "| scope | n | baseline | candidate | drop | upper bound | agreement | mean KLD | top-1 | gate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in slice_rows(rep):
        v = r["verdict"] if r["verdict"] == "pass" else f"**{r['verdict'].upper()}**"
        lines.append(
            f"| {md_cell(r['scope'])} | {r['n']} | {_pct(r['baseline'])} | {_pct(r['candidate'])} | {_pp(r['drop'])} | {_pp(r['upper'])} | "
            f"{_pct(r['agreement'])} | {_kld(r['kld'])} | {_pct(r['top1'])} | {v} |"
        )
    return lines


def to_markdown(rep: EvalReport) -> str:
    g = rep.gate
    lines = [
        f"## Evaluation: {rep.eval_set.name} - gate **{g.verdict.upper()}** ({g.mode} mode)",
        "",
        f"recipe `{rep.recipe}`, target `{rep.target}`, candidate runner `{rep.candidate}`, "
        f"{rep.eval_set.evaluated} items evaluated ({len(rep.skipped.too_long)} skipped: too long > "
        f"{rep.skipped.max_input_len} tokens). Non-inferiority: allowed drop {_pp(g.allowed_drop)} overall, "
        f"{_pp(g.slice_allowed_drop)} per slice; a scope passes when the one-sided {g.confidence:.0%} upper bound "
        f"of the drop is within it.",
        "",
    ]
    if g.mode == "exploratory":
        lines += ["> **EXPLORATORY RUN**: an inconclusive verdict did not fail this run; it is not releasable.", ""]
    lines += gate_table_markdown(rep)
    lines += ["", f"**Gate:** {g.reason}", ""]
    if note := rope_note(rep):
        lines += [f"**RoPE scaling:** {note}", ""]
    if dec := rep.decoding:
        lines += [
            f"**Decoding:** greedy, repetition_penalty {dec.repetition_penalty} in every runner "
            f"(from {dec.source}); the model's sampling defaults {dec.sampling} are not used by the gate",
            "",
        ]
    lines += fidelity_markdown(rep)
    lines += [
        "### Runners",
        "",
        "| runner | score | items | skipped (too long) | errors | eos / stop / length | batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rep.runners.items():
        fr = r.finish_reasons
        lines.append(
            f"| {name} | {_pct(r.score)} | {r.n} | {r.skipped_too_long} | {r.errors} | "
            f"{fr.eos} / {fr.stop} / {fr.length} | {r.batch_size or '-'} |"
        )
    if rep.warnings:
        lines += ["", *(f"- warning: {md_cell(w)}" for w in rep.warnings)]
    if rep.pairwise_agreement:
        lines += ["", "Output agreement between runners: " + ", ".join(f"{k} {_pct(v)}" for k, v in rep.pairwise_agreement.items())]
    sp = rep.speculative
    if sp:
        lines += [
            "",
            f"### Speculative decoding readiness (draft `{sp['draft_model']}`, k={sp['k']})",
            "",
            f"acceptance rate {_pct(sp['acceptance_rate'])}, mean tokens per target step {sp['mean_tokens_per_step']:.2f}",
            "",
            "| slice | acceptance | proposed | accepted |",
            "|---|---|---|---|",
        ]
        for s, v in sorted(sp["slices"].items()):
            lines.append(f"| {s} | {_pct(v['acceptance_rate'])} | {v['proposed']} | {v['accepted']} |")
    if rep.worst_regressions:
        lines += ["", "### Worst regressions", "", "| id | slice | reference | baseline | candidate |", "|---|---|---|---|---|"]
        for w in rep.worst_regressions[:10]:
            cell = lambda s: md_cell(s)[:80]  # noqa: E731
            lines.append(f"| {w['id']} | {w['slice']} | {cell(w['reference'])} | {cell(w['baseline'])} | {cell(w['candidate'])} |")
    return "\n".join(lines) + "\n"


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plots(rep: EvalReport) -> dict[str, str]:
    """base64 PNGs: per-slice score (every runner), per-slice agreement (latencies are measurements of the run: the
    manifest's ``measurements``, not part of this content-digested report)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out: dict[str, str] = {}
    runners = list(rep.runners)
    slices = sorted({s for r in rep.runners.values() for s in r.slices})
    if slices:
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(slices) + 2), 3.6))
        w = 0.8 / max(1, len(runners))
        x = np.arange(len(slices))
        for i, (name, r) in enumerate(rep.runners.items()):
            ax.bar(x + i * w - 0.4 + w / 2, [(r.slices[s].score or 0) if s in r.slices else 0 for s in slices], w, label=name)
        ax.set_xticks(x, slices, rotation=20)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("score")
        ax.set_title("score per slice")
        ax.legend()
        out["scores"] = _png(fig)
    if comp := rep.comparison.slices:
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(slices) + 2), 3.2))
        names = sorted(comp)
        ax.bar(names, [comp[s].agreement or 0 for s in names], color="tab:green")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f"{rep.candidate} == baseline")
        ax.set_title("output agreement with the baseline per slice")
        ax.tick_params(axis="x", rotation=20)
        out["agreement"] = _png(fig)
    return out


def to_html(rep: EvalReport) -> str:
    e = html.escape
    g = rep.gate
    imgs = plots(rep)
    color = "#1a7f37" if g.passed else "#cf222e"
    verdict = g.verdict.upper()
    rows = []
    for r in slice_rows(rep):
        rows.append(
            f"<tr class='{'' if r['passed'] else 'fail'}'><td>{e(r['scope'])}</td><td>{r['n']}</td><td>{_pct(r['baseline'])}</td>"
            f"<td>{_pct(r['candidate'])}</td><td>{_pp(r['drop'])}</td><td>{_pp(r['upper'])}</td><td>{_pct(r['agreement'])}</td>"
            f"<td>{_kld(r['kld'])}</td><td>{_pct(r['top1'])}</td><td>{e(r['verdict'])}</td></tr>"
        )
    fid_md = fidelity_markdown(rep)
    fid_html = "".join(
        f"<tr><td>{e(c.split('|')[1].strip())}</td><td>{e(c.split('|')[2].strip())}</td></tr>"
        for c in fid_md
        if c.startswith("| ") and not c.startswith("| statistic")
    )
    fid_html = (
        f"<h2>{e(fid_md[0].lstrip('# '))}</h2><table>{fid_html}</table>" if fid_html else (f"<p>{e(fid_md[0])}</p>" if fid_md else "")
    )
    mode = (
        "<p><b>EXPLORATORY RUN</b>: an inconclusive verdict did not fail this run; it is not releasable.</p>"
        if g.mode == "exploratory"
        else ""
    )
    worst = []
    for w in rep.worst_regressions:
        worst.append(
            f"<tr><td>{e(w['id'])}<br><small>{e(w['slice'])}</small></td><td><pre>{e(str(w['prompt']))}</pre></td>"
            f"<td><pre>{e(json.dumps(w['reference'], ensure_ascii=False))}</pre></td>"
            f"<td><pre>{e(w['baseline'])}</pre><small>score {w['baseline_score']:.2f}</small></td>"
            f"<td><pre>{e(w['candidate'])}</pre><small>score {w['candidate_score']:.2f}</small></td></tr>"
        )
    img_html = "".join(f"<figure><img alt='{k}' src='data:image/png;base64,{v}'></figure>" for k, v in imgs.items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>eval report {e(str(rep.eval_set.name))}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}tr.fail td{{background:#ffebe9}}
pre{{white-space:pre-wrap;margin:0;max-width:320px}}.verdict{{color:#fff;background:{color};padding:4px 10px;border-radius:4px}}
figure{{display:inline-block;margin:0 1em 1em 0}}</style></head><body>
<h1>Evaluation {e(str(rep.eval_set.name))} <span class="verdict">gate {verdict}</span></h1>{mode}
<p>recipe <code>{e(str(rep.recipe))}</code>, target <code>{e(str(rep.target))}</code>, candidate runner <code>{e(str(rep.candidate))}</code>;
{rep.eval_set.evaluated} items evaluated, {len(rep.skipped.too_long)} skipped (too long).</p>
<p><b>Gate:</b> {e(g.reason)}</p>
<table><tr><th>scope</th><th>n</th><th>baseline</th><th>candidate</th><th>drop</th><th>{g.confidence:.0%} upper bound of drop</th><th>agreement</th><th>mean KLD</th><th>top-1</th><th>gate</th></tr>
{"".join(rows)}</table>
{fid_html}
{img_html}
<h2>Worst regressions</h2>
<table><tr><th>id</th><th>prompt</th><th>reference</th><th>baseline</th><th>candidate</th></tr>{"".join(worst) or "<tr><td colspan=5>none</td></tr>"}</table>
</body></html>
"""


def print_console(rep: EvalReport, console: Any, *, in_run: bool = False) -> None:
    """Per-slice table (scores in %, drops and CI in percentage points) and the gate verdict.  An inconclusive gate
    prints its fix (the scopes, the items needed and what to do, :func:`pipeline.evaluate.gate.inconclusive_fix`);
    ``in_run`` (the evaluate stage of a run) prints the reason instead, since the run's end prints the fix once (the
    run summary's gate section, or the package stage's refusal: :func:`pipeline.report.print_summary`)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    g = rep.gate
    t = Table(
        title=f"evaluate: {rep.eval_set.name} ({rep.candidate} vs baseline, recipe {rep.recipe})",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    t.add_column("scope", no_wrap=True)
    for c in ("n", "base%", "cand%", "drop", "UB (pp)", "agree%", "KLD", "top1%", "gate"):
        t.add_column(c, no_wrap=True, justify="right" if c != "gate" else "left")
    f1 = lambda x: "-" if x is None else f"{100 * x:.1f}"  # noqa: E731
    d1 = lambda x: "-" if x is None else f"{100 * x:+.1f}"  # noqa: E731
    style = {"pass": "[green]pass[/]", "inconclusive": "[bold yellow]INCONCLUSIVE[/]", "fail": "[bold red]FAIL[/]"}
    for r in slice_rows(rep):
        t.add_row(
            Text(r["scope"]),  # slice names are the user's data: never markup or emoji codes
            str(r["n"]),
            f1(r["baseline"]),
            f1(r["candidate"]),
            d1(r["drop"]),
            d1(r["upper"]),
            f1(r["agreement"]),
            _kld(r["kld"]),
            f1(r["top1"]),
            style[r["verdict"]],
        )
    console.print(t)
    f = rep.fidelity or FidelitySummary()
    o, h = f.overall, f.calibration_heldout
    if o.positions:
        k = o.kld
        console.print(
            f"fidelity ({o.positions} teacher-forced tokens): mean KLD {k.mean:.4g} ± {k.se:.2g} nats, median "
            f"{k.median:.3g}, p99 {k.p99:.3g}, max {k.max:.3g}; same top token {100 * o.top1:.2f}%; "
            f"ln(PPL ratio) {o.ln_ppl_ratio:+.5f} ± {o.ln_ppl_ratio_se:.5f}"
        )
        if h.positions:
            console.print(
                f"fidelity on {h.samples} held-out calibration samples ({h.positions} tokens): mean KLD "
                f"{h.kld.mean:.4g} ± {h.kld.se:.2g}, same top token {100 * h.top1:.2f}%, "
                f"ln(PPL ratio) {h.ln_ppl_ratio:+.5f}"
            )
    elif f.unavailable:
        console.print(Text.assemble(("fidelity not measured: ", "yellow"), str(f.unavailable)))
    if too_long := rep.skipped.too_long:
        console.print(f"[yellow]skipped: too long[/] {len(too_long)} item(s) > {rep.skipped.max_input_len} tokens")
    if g.passed:
        console.print(Text.assemble(("gate passed", "bold green"), f" ({g.reason})"))
    elif g.verdict == "inconclusive" and g.mode == "exploratory":
        console.print(Text.assemble(("EXPLORATORY RUN - gate INCONCLUSIVE, NOT RELEASABLE: ", "bold yellow"), g.reason))
    elif g.verdict == "inconclusive":
        said = f"{g.reason} (what to do: at the end of the run)" if in_run and g.fix else g.fix or g.reason
        console.print(Text.assemble(("gate INCONCLUSIVE (not failed; not releasable): ", "bold yellow"), said))
    else:
        console.print(Text.assemble(("gate FAILED: ", "bold red"), g.reason))
    if note := rope_note(rep):
        console.print(Text.assemble(("RoPE scaling: ", "yellow"), note))
    print_warnings(rep, console)


def print_warnings(rep: EvalReport, console: Any) -> None:
    """The report's ``warnings``, one ``warning: ...`` line each: the end of :func:`print_console` (a fresh run) and
    what a cache hit of the stage prints (``pipeline.report.print_cached_eval_warnings``)."""
    from rich.text import Text

    for w in rep.warnings:
        console.print(Text.assemble(("warning: ", "yellow"), w))


def write_all(out: Path, rep: dict[str, Any]) -> EvalReport:
    """Write ``eval_report.json`` (the document ``rep``), ``.md`` and ``.html``; returns the report read typed."""
    from ..core.store import write_json_atomic

    E = EvalArtifact
    write_json_atomic(out / E.REPORT_JSON, rep)
    report = EvalReport.from_json(rep, source=out / E.REPORT_JSON)
    (out / E.REPORT_MD).write_text(to_markdown(report), encoding="utf-8")
    (out / E.REPORT_HTML).write_text(to_html(report), encoding="utf-8")
    return report
