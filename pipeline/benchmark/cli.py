"""``pipeline benchmark ...``: compare benchmark results.

    pipeline benchmark compare A.json B.json [--metric PATH ...] [--json OUT]
    pipeline benchmark show A.json

``compare`` matches every (mode, level) present in both results and prints B / A per headline
metric with the spread over repeated runs (``benchmark.repeats``): ``ratio ± spread`` where the
spread is first-order error propagation of the two relative standard deviations,
``ratio × sqrt((sA/mA)² + (sB/mB)²)``. A ratio whose distance from 1 is within twice that spread
is marked ``~`` (not distinguishable from noise); when both results ran one repeat there is no spread, and a ratio
other than exactly 1 is ``not judged: 1 repeat, ...`` (:data:`NO_REPEATS`); a metric whose direction says nothing about speed
(:data:`~.metrics.UNJUDGED`: the prefill share) is compared but ``not judged``. It also lists every config/model
field that differs, so a comparison that changed more than one variable is visible at once.

Exit codes: 0 compared; 2 bad input (missing file, wrong schema, nothing in common).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

from ..core.contracts.benchmark import BenchmarkDocument
from ..errors import EXIT_INPUT, InputError
from .metrics import COMPARED, HEADLINE


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, A value, B value) for every benchmark knob / model fact that differs."""
    da, db = BenchmarkDocument.from_json(a), BenchmarkDocument.from_json(b)
    fa = {
        **_flatten(da.config, "benchmark."),
        **_flatten({k: v for k, v in da.model.items() if k not in ("hf_dir", "engine_dir", "model_repository")}, "model."),
    }
    fb = {
        **_flatten(db.config, "benchmark."),
        **_flatten({k: v for k, v in db.model.items() if k not in ("hf_dir", "engine_dir", "model_repository")}, "model."),
    }
    fa["host.cpu"], fb["host.cpu"] = da.host_cpu, db.host_cpu
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k) and k != "benchmark.results_dir"]


def variables(diffs: Sequence[Sequence[Any]]) -> list[str]:
    """The independent variables among :func:`differences`: every differing field except the preset's name and the
    artifacts' keys and digests, which follow from the config and model fields that differ (a ``package.*`` change
    also changes the package artifact's key). Artifacts that differ with nothing else differing count as one variable
    (e.g. a rebuild with changed code)."""
    fields = [str(d[0]) for d in diffs]
    out = [f for f in fields if not f.startswith(("benchmark.name", "model.artifacts."))]
    if not out and any(f.startswith("model.artifacts.") for f in fields):
        out = ["model.artifacts"]
    return out


NO_REPEATS = "not judged: 1 repeat, no spread; run benchmark.repeats>=3"
"""The verdict of a metric whose two results each ran one repeat (a ratio that is not exactly 1)."""


def compare(a: dict[str, Any], b: dict[str, Any], metrics: Sequence[str] | None = None) -> dict[str, Any]:
    """The comparison document: ``{rows: [{level, metric, a, b, ratio, spread, verdict}], differences}``.

    Raises:
        InputError: the two results share no (mode, level).
    """
    sa = {s["key"]: s for s in a["summary"]}
    sb = {s["key"]: s for s in b["summary"]}
    common = [k for k in sa if k in sb]
    if not common:
        raise InputError(
            f"the two results have no (mode, level) in common: A has {sorted(sa)}, B has {sorted(sb)}. "
            "Fix: compare runs of the same benchmark.modes / benchmark.concurrency."
        )
    wanted = list(metrics) if metrics else list(COMPARED)
    unknown = [m for m in wanted if m not in COMPARED]
    if unknown:
        raise InputError(f"--metric {unknown}: unknown; known: {list(COMPARED)}")
    rows = []
    for key in common:
        for m in wanted:
            va, vb = sa[key]["spread"].get(m), sb[key]["spread"].get(m)
            if not va or not vb:
                continue
            ma, mb = va["mean"], vb["mean"]
            ratio = mb / ma if ma else (1.0 if mb == ma else math.inf)
            rel = 0.0
            if ma and mb:
                rel = math.sqrt((va["std"] / ma) ** 2 + (vb["std"] / mb) ** 2)
            spread = abs(ratio) * rel if math.isfinite(ratio) else None
            noisy = va["n"] > 1 or vb["n"] > 1
            if m not in HEADLINE:  # metrics.UNJUDGED: a share, whose direction says nothing about speed
                verdict = "not judged"
            elif not math.isfinite(ratio) or ratio == 1.0:
                verdict = "="
            elif not noisy:  # no spread on either side: a difference cannot be told from noise
                verdict = NO_REPEATS
            elif spread is not None and abs(ratio - 1.0) <= 2 * spread:
                verdict = "~"
            else:
                better = (ratio < 1.0) if HEADLINE[m] == "lower" else (ratio > 1.0)
                verdict = "better" if better else "worse"
            rows.append(
                {
                    "level": key,
                    "metric": m,
                    "a": ma,
                    "b": mb,
                    "a_n": va["n"],
                    "b_n": vb["n"],
                    "ratio": ratio,
                    "spread": spread,
                    "verdict": verdict,
                }
            )
    return {
        "schema": "pipeline.benchmark_compare/v1",
        "rows": rows,
        "differences": [list(d) for d in differences(a, b)],
        "only_in_a": [k for k in sa if k not in sb],
        "only_in_b": [k for k in sb if k not in sa],
    }


def _print(doc: dict[str, Any], path_a: str, path_b: str) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:
        con = Console(width=170)  # CI logs: never truncate metric names
    diffs = doc["differences"]
    if diffs:
        t = Table(title="what differs (A → B)")
        for c in ("field", "A", "B"):
            t.add_column(c)
        for k, x, y in diffs:
            t.add_row(k, str(x), str(y))
        con.print(t)
        if len(variables(diffs)) > 1:
            con.print("[yellow]more than one variable differs: the ratios below mix their effects.[/]")
    else:
        con.print("same benchmark knobs and model facts (a repeat of the same experiment).")
    t = Table(title=f"B / A   (A = {path_a}, B = {path_b})")
    for c in ("level", "metric", "A", "B", "B/A", "± spread", ""):
        t.add_column(c, justify="right" if c in ("A", "B", "B/A", "± spread") else "left")
    style = {"better": "green", "worse": "red", "~": "dim", "=": "dim", "not judged": "dim", NO_REPEATS: "dim"}
    for r in doc["rows"]:
        sp = "-" if r["spread"] is None or (r["a_n"] == 1 and r["b_n"] == 1) else f"{r['spread']:.3f}"
        t.add_row(
            r["level"], r["metric"], f"{r['a']:.4g}", f"{r['b']:.4g}", f"{r['ratio']:.3f}", sp, f"[{style[r['verdict']]}]{r['verdict']}[/]"
        )
    con.print(t)
    for side in ("only_in_a", "only_in_b"):
        if doc[side]:
            con.print(f"{side.replace('_', ' ')}: {', '.join(doc[side])}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pipeline benchmark", description="Compare or show benchmark results (pipeline.benchmark/v1 JSON).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="B / A per metric and level, with the spread over repeats")
    c.add_argument("a", help="baseline result (benchmark.json)")
    c.add_argument("b", help="candidate result (benchmark.json)")
    c.add_argument("--metric", action="append", help=f"only these metrics (repeatable); default: all of {len(COMPARED)} headline metrics")
    c.add_argument("--json", help="also write the comparison document here")
    s = sub.add_parser("show", help="print a result's Markdown report")
    s.add_argument("a")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    from .report import load, markdown

    try:
        if args.cmd == "show":
            print(markdown(load(args.a)))
            return 0
        doc = compare(load(args.a), load(args.b), args.metric)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT
    _print(doc, args.a, args.b)
    if args.json:
        from pathlib import Path

        from ..core.store import write_json_atomic

        write_json_atomic(Path(args.json), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
