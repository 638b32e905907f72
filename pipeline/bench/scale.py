"""``make bench-scale``: what each stage costs as the model grows (docs/memory.md).

For each shape of the ladder (:data:`LADDER`, deterministic random Llama weights, :mod:`pipeline.bench.shapes`) it
first asks the planner for the stages' predicted peak memory (:mod:`pipeline.core.sizing`): a shape the host cannot
hold is reported as refused, with the planner's figure, and not run. Otherwise it runs ``pipeline`` (one process, the
same calibration settings for every shape, int4 AWQ on the onnxruntime-genai target) and reads, per stage, the wall
time and the peak RSS the run summary records (:mod:`pipeline.core.memory`: the pipeline process and the engine builder
process), and reports bytes per parameter and seconds per billion parameters. ``FULL_CHAIN`` shapes also run
evaluate (``eval.limit``) and package.

Writes ``<out>/scale.json`` (every figure, the targets with met/missed) and ``<out>/scale.png`` (peak RSS and
quantize time against parameter count), then prints the table.

    python -m pipeline.bench.scale [--shapes llama80m,llama400m,llama1b,llama3b] [--out bench/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.contracts.bench import ScaleShape, ScaleStage
from ..core.contracts.build import BuildArtifact
from ..core.contracts.manifest import ArtifactManifest, QuantizeMeasurements, RunSummaryRecord, SummaryStage
from ..core.contracts.quantize import QuantizeArtifact, QuantizeResult
from .shapes import ROOT, SHAPES, make_shape, parameter_count

LADDER = ("llama80m", "llama400m", "llama1b", "llama3b")
#: the same calibration for every shape (seconds per parameter are compared across the ladder)
RUN_ARGS = [
    "quant=int4_awq",
    "target=onnxruntime_genai",
    "calibration.calib_size=32",
    "calibration.min_samples=16",
    "calibration.calib_max_seq_length=128",
    "progress=false",
]
HEAVY = ["export", "quantize", "build"]
#: shapes that also go through evaluate and package (random weights: the gate fails, exit 3 is expected)
FULL_CHAIN = {"llama1b"}
FULL_ARGS = [
    "eval.limit=8",
    "eval.gate.mode=exploratory",  # 8 items can never pass the release gate: refused before any work in release mode
    "eval.max_new_tokens=16",
    "package.allow_failed_gate=true",
    "package.parity=false",
]
#: targets of the issue this benchmark answers (docs/memory.md)
PEAK_OVER_FP32_MAX = 1.5
QUANT_S_PER_PARAM_RATIO_MAX = 1.2


def _pipeline() -> list[str]:
    exe = Path(sys.executable).with_name("pipeline")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pipeline.cli"]


def predict(shape_dir: Path, stages: list[str]) -> dict[str, Any]:
    """The planner's per-stage prediction and refusals for ``shape_dir`` (no work done)."""
    from ..core.config import compose
    from ..core.sizing import stage_refusals
    from ..planner import plan

    p = plan(compose([f"model.path={shape_dir}", *RUN_ARGS]))  # the run itself validates (run_shape)
    assert p.stages is not None  # plan() always predicts the stages
    return {**p.to_json()["stages"], "refusals": stage_refusals(p.stages.predicted, stages, p.stages.host_total_bytes)}


def stage_records(run_dir: Path) -> list[SummaryStage]:
    """The stages of the run's ``summary.json`` (none when it wrote none)."""
    p = run_dir / "summary.json"
    return RunSummaryRecord.from_json(json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}).stages


def quantize_record(path: Path) -> tuple[QuantizeResult, QuantizeMeasurements]:
    """A quantize artifact's result and measurements (its ``manifest.json``; empty when it has none)."""
    man = path / "manifest.json"
    m = ArtifactManifest.from_json(json.loads(man.read_text(encoding="utf-8")) if man.is_file() else {})
    return QuantizeResult.from_json(m.result), QuantizeMeasurements.from_json(m.measurements)


def run_shape(shape: str, shape_dir: Path, work: Path, stages: list[str], extra: list[str]) -> dict[str, Any]:
    """Run the pipeline on ``shape_dir`` and collect per-stage time and memory from its run summary."""
    from ..core.memory import run_sampled

    run_dir = work / f"run-{shape}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        *_pipeline(),
        f"model.path={shape_dir}",
        f"model.name={shape}",
        f"store_dir={work / 'store'}",
        f"hydra.run.dir={run_dir}",
        f"stages=[{','.join(stages)}]",
        "force=true",  # a benchmark measures: every stage runs, none is a cache hit
        *RUN_ARGS,
        *extra,
    ]
    t0 = time.time()
    with open(work / f"{shape}.log", "w", encoding="utf-8") as log:
        code, peak = run_sampled(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    per_stage: dict[str, Any] = {}
    for s in stage_records(run_dir):
        row = {"status": s.status, "seconds": round(s.seconds, 1), "peak_rss_bytes": s.process_peak_rss_bytes}
        if s.stage == "build" and s.path:
            bi = BuildArtifact(Path(s.path)).build_info()
            if bi.recorded:
                row["builder_peak_rss_bytes"] = bi.builder_peak_rss_bytes
        if s.stage == "quantize" and s.path and QuantizeArtifact(Path(s.path)).report_path.is_file():
            res, m = quantize_record(Path(s.path))  # the manifest's measurements: kept out of the digested report
            row["steps_peak_rss_bytes"] = m.peak_rss_bytes
            row["steps_s"] = {k: round(v, 1) for k, v in m.timings_s.items()}
            row["placement"] = {**res.placement, **m.placement}  # the result's placement is the report's
        per_stage[s.stage] = row
    return {"exit_code": code, "wall_s": round(time.time() - t0, 1), "process_peak_rss_bytes": peak, "stages": per_stage, "command": cmd}


@dataclasses.dataclass(frozen=True)
class ScaleRow:
    """A shape's line of ``scale.json`` ``rows``: parameters, fp32 weight bytes, the heaviest peak RSS of export,
    quantize and build (bytes; over the fp32 weights; per parameter), the quantize time (s; per billion parameters)."""

    shape: str
    parameters: int
    fp32_weight_bytes: int
    heavy_peak_rss_bytes: int | None
    peak_over_fp32: float | None
    peak_bytes_per_parameter: float | None
    quantize_s: float | None
    quantize_s_per_billion_parameters: float | None


def _row(shape: str, res: ScaleShape) -> ScaleRow:
    n = parameter_count(shape)
    fp32 = 4 * n
    peaks = [v for s in HEAVY for v in (res.stage(s).peak_rss_bytes, res.stage(s).builder_peak_rss_bytes) if v]
    peak, q_s = max(peaks, default=None), res.stage("quantize").seconds
    per_b = round(q_s / (n / 1e9), 1) if q_s else None
    return ScaleRow(shape, n, fp32, peak, round(peak / fp32, 3) if peak else None, round(peak / n, 2) if peak else None, q_s, per_b)


def _targets(rows: dict[str, ScaleRow], results: dict[str, ScaleShape]) -> list[dict[str, Any]]:
    out = []
    for shape in ("llama400m", "llama1b"):
        r = rows.get(shape)
        if r and r.peak_over_fp32 is not None:
            out.append(
                {
                    "target": f"{shape}: peak RSS of export+quantize+build <= {PEAK_OVER_FP32_MAX} x fp32 weights",
                    "value": r.peak_over_fp32,
                    "met": r.peak_over_fp32 <= PEAK_OVER_FP32_MAX,
                }
            )
    if "llama1b" in results:
        ok = all(results["llama1b"].stage(s).status in ("ran", "cached") for s in ("export", "quantize", "build", "evaluate", "package"))
        out.append({"target": "llama1b: export -> quantize -> build -> evaluate -> package on this host", "value": ok, "met": ok})
    if "llama3b" in results:
        r3 = results["llama3b"]
        ok = bool(r3.refused) or all(r3.stage(s).status == "ran" for s in HEAVY)
        out.append(
            {
                "target": "llama3b: export -> quantize -> build within the host, or refused by the planner",
                "value": "not run (planned only)" if r3.planned_only else ok,
                "met": None if r3.planned_only else ok,
            }
        )
    small, big = (rows.get(s) for s in ("llama80m", "llama1b"))
    a, b = (r.quantize_s_per_billion_parameters if r else None for r in (small, big))
    if a and b:
        out.append(
            {
                "target": f"quantize seconds per parameter, llama1b / llama80m <= {QUANT_S_PER_PARAM_RATIO_MAX}",
                "value": round(b / a, 3),
                "met": b / a <= QUANT_S_PER_PARAM_RATIO_MAX,
            }
        )
    return out


def plot(rows: list[ScaleRow], path: Path) -> None:
    """Peak RSS (GB) and quantize seconds against parameters (log-log), with the 1.5 x fp32 line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if r.heavy_peak_rss_bytes]
    if not ran:
        return
    x = [r.parameters / 1e9 for r in ran]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.loglog(x, [(r.heavy_peak_rss_bytes or 0) / 1e9 for r in ran], "o-", label="peak RSS (export, quantize, build)")
    a1.loglog(x, [PEAK_OVER_FP32_MAX * r.fp32_weight_bytes / 1e9 for r in ran], "--", label=f"{PEAK_OVER_FP32_MAX} x fp32 weights")
    a1.loglog(x, [r.fp32_weight_bytes / 1e9 for r in ran], ":", label="fp32 weights")
    a1.set_xlabel("parameters (billions)")
    a1.set_ylabel("GB")
    a1.legend(fontsize=8)
    a1.set_title("host memory")
    q = [r for r in ran if r.quantize_s]
    a2.loglog([r.parameters / 1e9 for r in q], [r.quantize_s for r in q], "o-")
    a2.set_xlabel("parameters (billions)")
    a2.set_ylabel("seconds")
    a2.set_title("quantize (int4 AWQ, 32 x 128 calibration tokens, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(LADDER), help=f"comma-separated, from {list(LADDER)}")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--models", type=Path, default=ROOT / "bench" / "models")
    ap.add_argument("--work", type=Path, default=ROOT / "artifacts" / "bench-scale")
    ap.add_argument(
        "--plan-only",
        default="",
        help="comma-separated shapes to plan but not run (recorded as predicted, not measured: e.g. a shape whose run "
        "takes longer than the session that runs the benchmark)",
    )
    ap.add_argument("--merge", type=Path, default=None, help="an earlier scale.json whose shapes not run now are kept")
    a = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    shapes = [s for s in a.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        print(f"bench-scale: unknown shape(s) {bad}; known: {sorted(SHAPES)}", file=sys.stderr)
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    plan_only = {s for s in a.plan_only.split(",") if s}
    if a.merge is not None and a.merge.is_file():
        results.update({k: v for k, v in json.loads(a.merge.read_text(encoding="utf-8"))["results"].items() if k not in shapes})
    for shape in shapes:
        stages = HEAVY + (["evaluate", "package"] if shape in FULL_CHAIN else [])
        cfg_dir = a.models / shape
        # the planner reads the shape's config.json only: write it first, the weights after a plan that fits
        pred = _predict_shape(shape, cfg_dir, a.work, stages)
        if shape in plan_only:
            results[shape] = {"planned_only": True, "prediction": pred}
            print(f"{shape}: planned only (--plan-only): {json.dumps(pred['predicted'])}", flush=True)
            continue
        if pred["refusals"]:
            results[shape] = {"refused": pred["refusals"], "prediction": pred}
            print(f"{shape}: refused by the planner: {' | '.join(pred['refusals'])}", flush=True)
            continue
        print(f"{shape}: {parameter_count(shape) / 1e6:.0f} M parameters, stages {stages} ...", flush=True)
        make_shape(shape, cfg_dir)
        res = run_shape(shape, cfg_dir, a.work, stages, FULL_ARGS if shape in FULL_CHAIN else [])
        res["prediction"] = pred
        results[shape] = res
    parsed = {s: ScaleShape.from_json(r) for s, r in results.items()}
    rows = {s: _row(s, r) for s, r in parsed.items() if r.stages is not None}
    doc = {
        "schema": "pipeline.bench_scale/v1",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": _host(),
        "settings": RUN_ARGS,
        "rows": [dataclasses.asdict(r) for r in rows.values()],
        "targets": _targets(rows, parsed),
        "results": results,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "scale.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (a.out / "scale.md").write_text(markdown(doc), encoding="utf-8")
    plot(list(rows.values()), a.out / "scale.png")
    _print(doc)
    return 0


def _predict_shape(shape: str, cfg_dir: Path, work: Path, stages: list[str]) -> dict[str, Any]:
    """The planner's verdict from the shape's config.json alone (written to a scratch folder: no weights yet)."""
    import transformers as tf

    probe = work / f"plan-{shape}"
    probe.mkdir(parents=True, exist_ok=True)
    tf.LlamaConfig(**SHAPES[shape]).save_pretrained(str(probe))
    return predict(probe, stages)


_STAGES = ("export", "quantize", "build", "evaluate", "package")


def _stage_cell(v: ScaleStage, unit: str, sep: str) -> str:
    """A stage's cell of the results tables: ``<seconds> s<sep><peak RSS><unit>``, then the builder process's peak
    in parentheses when recorded; ``-`` when the stage did not run."""
    if v.status is None:
        return "-"
    extra = f" ({_gb(v.builder_peak_rss_bytes)}{unit})" if v.builder_peak_rss_bytes else ""
    return f"{v.seconds:.0f} s{sep}{_gb(v.peak_rss_bytes)}{unit}{extra}"


def markdown(doc: dict[str, Any]) -> str:
    """The results table and the targets in Markdown (``scale.md``; docs/results.md and docs/memory.md quote it)."""
    head = "| shape | parameters | fp32 weights | export | quantize | build (builder process) | evaluate | package | peak / fp32 | bytes / parameter | quantize s / B params |"
    lines = [head, "|" + "---|" * 11]
    for shape, res in ((k, ScaleShape.from_json(v)) for k, v in doc["results"].items()):
        n = parameter_count(shape)
        if res.planned_only or res.refused is not None:
            pq = res.predicted
            what = "refused by the planner: " + res.refused[0] if res.refused is not None else "not run; planner predicts"
            lines.append(
                f"| {shape} | {n / 1e9:.2f} B | {_gb(4 * n)} GB | {what} export {_gb(pq['export']['host_bytes'])} GB, "
                f"quantize {_gb(pq['quantize']['host_bytes'])} GB, build {_gb(pq['build']['host_bytes'])} GB | | | | | | | |"
            )
            continue
        row = next(r for r in doc["rows"] if r["shape"] == shape)
        lines.append(
            f"| {shape} | {n / 1e9:.2f} B | {_gb(4 * n)} GB | "
            + " | ".join(_stage_cell(res.stage(s), " GB", ", ") for s in _STAGES)
            + f" | {row['peak_over_fp32']} | {row['peak_bytes_per_parameter']} | {row['quantize_s_per_billion_parameters']} |"
        )
    lines.append("")
    for tg in doc["targets"]:
        verdict = "n/a" if tg["met"] is None else ("met" if tg["met"] else "**missed**")
        lines.append(f"- {verdict}: {tg['target']} ({tg['value']})")
    return "\n".join(lines) + "\n"


def _host() -> dict[str, Any]:
    from ..core.hostinfo import host
    from ..core.sizing import host_memory

    return {**host(), "memory": host_memory()}


def _gb(b: Any) -> str:
    return f"{b / 1e9:.2f}" if isinstance(b, (int, float)) else "-"


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="bench-scale: int4 AWQ on onnxruntime-genai (CPU), per stage: seconds / peak RSS GB")
    for c in (
        "shape",
        "params",
        "fp32 GB",
        "export",
        "quantize",
        "build (builder)",
        "evaluate",
        "package",
        "peak / fp32",
        "B/param",
        "quant s/B",
    ):
        t.add_column(c)
    for shape, res in ((k, ScaleShape.from_json(v)) for k, v in doc["results"].items()):
        if res.planned_only:
            pq = res.predicted
            t.add_row(
                shape,
                f"{parameter_count(shape) / 1e9:.2f} B",
                _gb(4 * parameter_count(shape)),
                *(f"predicted {_gb(pq[s]['host_bytes'])}" for s in ("export", "quantize", "build")),
                "not run",
            )
            continue
        if res.refused is not None:
            t.add_row(shape, f"{parameter_count(shape) / 1e9:.2f} B", _gb(4 * parameter_count(shape)), "refused: " + res.refused[0][:60])
            continue
        row = next(r for r in doc["rows"] if r["shape"] == shape)
        t.add_row(
            shape,
            f"{row['parameters'] / 1e9:.2f} B",
            _gb(row["fp32_weight_bytes"]),
            *(_stage_cell(res.stage(s), "", " / ") for s in _STAGES),
            str(row["peak_over_fp32"]),
            str(row["peak_bytes_per_parameter"]),
            str(row["quantize_s_per_billion_parameters"]),
        )
    Console(width=200).print(t)
    for tg in doc["targets"]:
        verdict = "n/a   " if tg["met"] is None else ("met   " if tg["met"] else "MISSED")
        print(f"{verdict}  {tg['target']}: {tg['value']}")


if __name__ == "__main__":
    sys.exit(main())
