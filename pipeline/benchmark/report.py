"""Benchmark outputs: ``benchmark.json`` (schema ``pipeline.benchmark/v1``), a Markdown table and plots."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from ..core.contracts.benchmark import BenchmarkArtifact, BenchmarkDocument, Distribution
from ..core.markdown import md_table
from ..core.store import write_json_atomic

log = logging.getLogger("pipeline.benchmark")

PLOTS = ("latency_vs_concurrency.png", "throughput_vs_concurrency.png", "ttft_tpot_distributions.png")


def _f(v: Any, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def markdown(doc: dict[str, Any]) -> str:
    """The human-readable report: one row per mode × level (repeat 0), then the headline ratios."""
    d = BenchmarkDocument.from_json(doc)
    lines = [f"# Benchmark `{doc['name']}` ({doc['created_utc']})", ""]
    lines += _md_setup(doc, d)
    lines += _md_runs(doc, d)
    lines += _md_roofline(doc, d)
    lines += _md_serving_path(doc)
    lines += _md_spread(doc)
    lines += _md_ratios(d)
    lines += [
        "",
        "TTFT = send → first token; TPOT = (last − first token) / (tokens − 1); ITL = gaps between tokens; "
        "latency = send → last token; out tok/s = output tokens / (first send → last completion). "
        "Roofline = achieved decode tokens/s ÷ memory-bandwidth bound (docs/benchmark.md).",
        "",
    ]
    return "\n".join(lines)


def _md_setup(doc: dict[str, Any], d: BenchmarkDocument) -> list[str]:
    """:func:`markdown`: target, dataset, seeds, host, load and bandwidth."""
    lines: list[str] = []
    host = d.host
    lines.append(_md_model(d))
    lines.append(
        f"Target `{d.target}`, quant `{d.quant_recipe}`, dataset `{doc['dataset']['kind']}` "
        f"({doc['dataset']['requests_per_level']} requests/level, digest `{doc['dataset']['digest'][:12]}`), "
        f"seed {doc['seeds']['base']}, repeats {d.repeats}, ignore_eos {d.ignore_eos}."
    )
    lines.append(
        f"Host: {host.cpu} × {host.cpu_count} CPUs, GPUs: {[g['name'] for g in host.gpus or []] or 'none'}. "
        f"Load average (1 min) {host.loadavg_1m_start} at start, {host.loadavg_1m_end} at end. "
        f"Memory bandwidth {doc['roofline']['bandwidth_gbs']:.1f} GB/s ({doc['roofline']['bandwidth_source']})."
    )
    lines.append("")
    return lines


def _md_model(d: BenchmarkDocument) -> str:
    """:func:`markdown`: the model measured, from what ``benchmark.json`` ``model`` records (its name, the export
    artifact's digest, i.e. of the exported checkpoint, and that checkpoint's folder)."""
    said = [f"export digest `{str(d.export_digest)[:12]}`" if d.export_digest else "", f"checkpoint `{d.hf_dir}`" if d.hf_dir else ""]
    detail = ", ".join(x for x in said if x)
    return f"Model `{d.model_name or 'unknown'}`" + (f" ({detail})." if detail else ".")


def _md_runs(doc: dict[str, Any], d: BenchmarkDocument) -> list[str]:
    """:func:`markdown`: one table row per mode × level of repeat 0."""
    lines: list[str] = []
    if (d.repeats or 1) > 1:
        lines += ["Repeat 0 of each level (the spread over repeats follows below):", ""]
    rows = []
    for r in doc["runs"]:
        if r["repeat"] != 0:
            continue
        mt = r["metrics"]
        lvl = f"c={r['concurrency']}" if r["kind"] == "concurrency" else f"{r['request_rate']:g} req/s"
        rows.append(
            (
                r["mode"],
                lvl,
                mt["requests"]["completed"],
                mt["requests"]["errors"],
                _slash(mt["time_to_first_token"], ("avg", "p50", "p90", "p99"), 1),
                _slash(mt["time_per_output_token"], ("avg", "p50", "p90", "p99")),
                _f(Distribution.from_json(mt["inter_token_latency"]).p99),
                _slash(mt["request_latency"], ("p50", "p90", "p99"), 1),
                _f(mt["output_token_throughput"]["avg"], 1),
                _f(mt["request_throughput"]["avg"]),
                _f(mt["prefill_decode"]["prefill_share"]),
                _f(r["roofline"]["fraction"] if r["roofline"] else None, 3),
            )
        )
    header = "mode|level|req|err|TTFT avg / p50 / p90 / p99 (ms)|TPOT avg / p50 / p90 / p99 (ms)|ITL p99 (ms)|"
    header += "latency p50 / p90 / p99 (ms)|out tok/s|req/s|prefill share|roofline"
    return lines + md_table(header.split("|"), rows)


def _slash(stats: dict[str, Any], keys: tuple[str, ...], nd: int = 2) -> str:
    """``avg / p50 / ...`` of one metric's statistics, each as :func:`_f`."""
    return " / ".join(_f(stats.get(k), nd) for k in keys)


def _md_roofline(doc: dict[str, Any], d: BenchmarkDocument) -> list[str]:
    """:func:`markdown`: the decode roofline table at concurrency 1 (when measured)."""
    lines: list[str] = []
    c1 = [r for r in doc["runs"] if r["repeat"] == 0 and r["kind"] == "concurrency" and r["concurrency"] == 1 and r["roofline"]]
    if c1:
        bw = doc["roofline"]["bandwidth_gbs"]
        lines += [
            "",
            f"Decode roofline at concurrency 1 (host bandwidth {bw:.1f} GB/s, {doc['roofline']['bandwidth_source']}): "
            "bytes read per decode step = weights (every initializer except Gather-ed embedding tables) + KV cache at the "
            "mean context; bound = bandwidth / bytes per step.",
            "",
        ]
        rows = []
        for r in c1:
            rf = r["roofline"]
            w = d.weight_bytes_per_step(r["mode"])
            kv, bound, got = rf["kv_bytes_per_seq"] * rf["batch"] / 1e6, rf["bound_tokens_per_s"], rf["achieved_decode_tokens_per_s"]
            rows.append((f"`{r['mode']}`", _f(w / 1e6 if w else None, 2), _f(kv, 2), _f(bound, 0), _f(got, 0), _f(rf["fraction"], 3)))
        header = ("mode", "weight MB/step", "KV MB/step", "bound tok/s", "achieved tok/s", "fraction of bound")
        lines += md_table(header, rows)
    if any(r["roofline"] and r["roofline"]["fraction"] > 1 for r in doc["runs"]):
        lines += [
            "",
            "A roofline fraction above 1 is not a roofline result: the bound assumes every weight byte comes from memory "
            "each step, and weights this small stay in the CPU's caches (or the mode's TPOT is timed by the client over "
            "a coalesced stream). Judge it on a model larger than the caches.",
        ]
    return lines


def _md_serving_path(doc: dict[str, Any]) -> list[str]:
    """:func:`markdown`: per-hop timing of the Triton mode (means over repeats of each hop's per-level average)."""
    rows = [s for s in doc["summary"] if "serving_path.request_hop.avg" in s["spread"]]
    if not rows:
        return []
    engine = {s["key"].split("/", 1)[1]: s["spread"] for s in doc["summary"] if s["mode"] == "engine"}
    lines = [
        "",
        "Where the Triton path's time goes (ms, mean over repeats of each level's average; the deployment's own "
        "timestamps, `return_perf_metrics`). TTFT = client + request hop + queue + prefill + first-token delivery; "
        "the client's TPOT differs from the server's by the change of the delivery lag. On the CPU target, prefill "
        "includes waiting inside og.Engine for a running static batch (docs/benchmark.md).",
        "",
    ]
    table = []
    for s in rows:
        lvl = s["key"].split("/", 1)[1]
        spreads = {"level": s["spread"], "engine": engine.get(lvl) or {}}
        table.append([lvl, *(_f(v["mean"], 2) if (v := spreads[m].get(k)) else "-" for m, k in _SERVING_PATH_COLUMNS.values())])
    return lines + md_table(["level", *_SERVING_PATH_COLUMNS], table)


_SERVING_PATH_COLUMNS = {
    "client": ("level", "serving_path.client.avg"),
    "request hop": ("level", "serving_path.request_hop.avg"),
    "queue": ("level", "serving_path.queue.avg"),
    "prefill": ("level", "serving_path.prefill.avg"),
    "first-token delivery": ("level", "serving_path.first_token_delivery.avg"),
    "TTFT": ("level", "time_to_first_token.avg"),
    "TPOT client": ("level", "time_per_output_token.avg"),
    "TPOT in server": ("level", "serving_path.server_time_per_output_token.avg"),
    "TPOT engine mode": ("engine", "time_per_output_token.avg"),
    "last-token delivery": ("level", "serving_path.last_token_delivery.avg"),
}
"""Columns of :func:`_md_serving_path` after the level: header -> (whose summary: the Triton level's, or the engine
mode's at that level; key of its ``spread``)."""


def _md_spread(doc: dict[str, Any]) -> list[str]:
    """:func:`markdown`: mean ± std over repeats (when there are several)."""
    lines: list[str] = []
    if any(s["repeats"] > 1 for s in doc["summary"]):
        lines += [
            "",
            "Spread over repeats (mean ± std, n):",
            "",
        ]
        cols = {
            "TPOT avg (ms)": "time_per_output_token.avg",
            "TTFT p50 (ms)": "time_to_first_token.p50",
            "out tok/s": "output_token_throughput.avg",
        }
        rows = [
            [s["key"], *(f"{v['mean']:.2f} ± {v['std']:.2f} (n={v['n']})" if (v := s["spread"].get(k)) else "-" for k in cols.values())]
            for s in doc["summary"]
        ]
        lines += md_table(["mode/level", *cols], rows)
    return lines


def _md_ratios(d: BenchmarkDocument) -> list[str]:
    """:func:`markdown`: the target ratios table."""
    from .core import beyond_ceiling

    rows = []
    for k, v in d.ratios.items():
        why = v.why or beyond_ceiling(k, v.value)  # a document written before CEILINGS said "met" for these
        met = {True: "yes", False: "**no**", None: "not measured"}[v.met] if v.judged else "(not a target here)"
        met = f"not judged: {why}" if why else met
        rows.append((k, _f(v.value, 3) if isinstance(v.value, float) else _f(v.value), v.target, met, v.definition))
    return ["", *md_table(("ratio", "value", "target", "met", "definition"), rows)]


def plots(doc: dict[str, Any], out_dir: Path) -> list[str]:
    """Write the three PNGs of :data:`PLOTS` into ``out_dir``; returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in doc["runs"] if r["kind"] == "concurrency" and r["repeat"] == 0]
    by_mode = {
        m: sorted((r for r in runs if r["mode"] == m), key=lambda r: r["concurrency"]) for m in dict.fromkeys(r["mode"] for r in runs)
    }

    def concurrency_axis(ax: Any, ylabel: str) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)

    def save(fig: Any, name: str) -> str:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        return name

    # 1. latency percentiles vs concurrency
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (metric, title) in zip(
        axes, (("time_to_first_token", "TTFT"), ("time_per_output_token", "TPOT"), ("request_latency", "request latency"))
    ):
        for mode, rs in by_mode.items():
            xs = [r["concurrency"] for r in rs]
            for p, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                ys = [r["metrics"][metric].get(p, float("nan")) for r in rs]
                ax.plot(xs, ys, style, marker="o", label=f"{mode} {p}")
        concurrency_axis(ax, "ms")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    written = [save(fig, PLOTS[0])]
    # 2. throughput vs concurrency
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, rs in by_mode.items():
        xs = [r["concurrency"] for r in rs]
        axes[0].plot(xs, [r["metrics"]["output_token_throughput"]["avg"] for r in rs], marker="o", label=mode)
        axes[1].plot(xs, [r["metrics"]["request_throughput"]["avg"] for r in rs], marker="o", label=mode)
    for ax, yl in zip(axes, ("output tokens/s", "requests/s")):
        concurrency_axis(ax, yl)
        ax.legend(fontsize=8)
    written.append(save(fig, PLOTS[1]))
    # 3. TTFT / TPOT distributions at concurrency 1 and the highest level of each mode
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, rs in by_mode.items():
        for r in {id(x): x for x in (rs[0], rs[-1])}.values():
            ok = [q for q in r["requests"] if "ttft_ms" in q]
            lab = f"{mode} c={r['concurrency']}"
            axes[0].hist([q["ttft_ms"] for q in ok], bins=20, alpha=0.5, label=lab)
            axes[1].hist([q["tpot_ms"] for q in ok if q["tpot_ms"] is not None], bins=20, alpha=0.5, label=lab)
    for ax, xl in zip(axes, ("TTFT (ms)", "TPOT (ms)")):
        ax.set_xlabel(xl)
        ax.set_ylabel("requests")
        ax.legend(fontsize=7)
    written.append(save(fig, PLOTS[2]))
    return written


def write_outputs(doc: dict[str, Any], out_dir: Path, *, make_plots: bool = True) -> dict[str, str]:
    """Write ``benchmark.json``, ``benchmark.md`` and the plots into ``out_dir``; returns {kind: path}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": str(out_dir / BenchmarkArtifact.RESULT_JSON), "md": str(out_dir / BenchmarkArtifact.RESULT_MD)}
    write_json_atomic(out_dir / BenchmarkArtifact.RESULT_JSON, doc)
    (out_dir / BenchmarkArtifact.RESULT_MD).write_text(markdown(doc), encoding="utf-8")
    if make_plots:
        try:
            for name in plots(doc, out_dir):
                paths[name] = str(out_dir / name)
        except Exception as e:
            log.warning("could not draw the benchmark plots: %s", e)
    return paths


def load(path: str | Path) -> dict[str, Any]:
    """Read a benchmark JSON and check its schema.

    Raises:
        InputError: missing file, invalid JSON or another schema.
    """
    from ..errors import InputError

    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{p}: no such benchmark result. Fix: pass a benchmark.json written by the benchmark stage (bench/results/*.json)."
        ) from None
    except ValueError as e:
        raise InputError(f"{p}: not valid JSON ({e}).") from None
    schema = BenchmarkDocument.from_json(doc).schema if isinstance(doc, dict) else type(doc).__name__
    if schema != "pipeline.benchmark/v1":
        raise InputError(f"{p}: schema is {schema!r}, expected 'pipeline.benchmark/v1'.")
    return doc
