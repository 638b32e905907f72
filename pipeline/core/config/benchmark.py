"""``benchmark`` config group: load generation and measurement (benchmark stage, ``make bench``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List

from .common import Problem, choice, runtime


@dataclass
class LengthDist:
    kind: str = "fixed"
    """fixed | uniform | normal | lognormal."""
    mean: float = 32.0
    """Mean length in tokens."""
    spread: float = 0.0
    """uniform: half-width; normal: std; lognormal: sigma of log."""
    min: int = 1
    """Shortest length in tokens (draws below are clipped to it)."""
    max: int = 256
    """Longest length in tokens (draws above are clipped to it)."""


@dataclass
class BenchmarkConfig:
    name: str = "default"
    """Label of the benchmark preset, recorded in the benchmark report."""
    modes: List[str] = field(default_factory=lambda: ["engine", "triton", "baseline"])
    """Where to send load: engine (in-process) | triton (gRPC streaming to the packaged server) | baseline (transformers)
    | builder_int4 (onnxruntime-genai's own int4 build of the export checkpoint, a speed reference; pipeline.benchmark.reference)."""
    concurrency: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """Closed-loop levels: that many clients, each sending its next request when the last one finished."""
    baseline_concurrency: List[int] = field(default_factory=lambda: [1])
    """Levels for the transformers baseline (it serves one request at a time; higher levels only queue)."""
    reference_concurrency: List[int] = field(default_factory=lambda: [1])
    """Levels for reference engines (mode builder_int4: onnxruntime-genai's own int4 build of the same checkpoint)."""
    request_rates: List[float] = field(default_factory=list)
    """Open-loop Poisson arrival rates in requests/s (empty = only the concurrency sweep)."""
    dataset: str = "eval"
    """eval (prompts from the business eval set) | synthetic (lengths from the distributions below)."""
    input_len: LengthDist = field(default_factory=lambda: LengthDist(mean=32))
    """Prompt lengths in tokens for ``dataset: synthetic``."""
    output_len: LengthDist = field(default_factory=lambda: LengthDist(mean=32))
    """Requested output lengths in tokens (``max_tokens`` per request)."""
    ignore_eos: bool = True
    """Generate exactly the requested output length (comparable TPOT across runs)."""
    num_requests: int = 32
    """Requests per concurrency level (after warm-up)."""
    warmup_requests: int = 4
    """Requests sent before each mode's measurement and not counted (fills caches, loads kernels)."""
    max_duration_s: float = 120.0
    """Hard bound per level; a level stops early when it runs out of time."""
    seed: int = 0
    """Seed of the workload (prompt choice, lengths, Poisson arrivals); each level and repeat derives its own."""
    fail_on_errors: bool = True
    """Fail the stage (exit 1) when any measured request failed; the results are still written to results_dir."""
    server_ready_timeout_s: float = runtime(180.0)
    """triton mode: seconds to wait for the started server to report ready before failing."""
    repeats: int = 1
    """Run every level this many times (fresh seeded workload each); compare reports the spread."""
    per_hop: bool = True
    """triton mode: ask every request for the deployment's perf metrics (``return_perf_metrics``) and report where the
    time goes hop by hop (docs/benchmark.md). The four extra outputs per streamed response cost about 3 % of Triton
    TPOT on the default model; ``false`` measures without them."""
    targets: List[str] = field(default_factory=list)
    """Ratios this benchmark is held to (names in ``pipeline.benchmark.core.TARGETS``); empty = all. The others are still
    reported, marked as not a target for this benchmark."""
    results_dir: str = runtime("bench/results")
    """Folder the JSON, Markdown and plot results are written to (besides the benchmark artifact)."""


#: highest concurrency level: the load generator starts one client thread per request in flight (a huge level failed
#: with "can't start new thread" mid-run); 1024 is above any level the CPU target serves usefully
MAX_CONCURRENCY = 1024


def validate(cfg: BenchmarkConfig, prefix: str = "benchmark") -> list[Problem]:
    problems: list[Problem] = []
    for m in cfg.modes:
        choice(problems, f"{prefix}.modes", m, ("engine", "triton", "baseline", "builder_int4"))
    choice(problems, f"{prefix}.dataset", cfg.dataset, ("eval", "synthetic"))
    for name, d in (("input_len", cfg.input_len), ("output_len", cfg.output_len)):
        choice(problems, f"{prefix}.{name}.kind", d.kind, ("fixed", "uniform", "normal", "lognormal"))
    if any(c < 1 for c in cfg.concurrency):
        problems.append(
            Problem(f"{prefix}.concurrency", list(cfg.concurrency), "every level must be >= 1.", "e.g. benchmark.concurrency=[1,2,4,8]")
        )
    if any(c < 1 for c in cfg.baseline_concurrency):
        problems.append(
            Problem(
                f"{prefix}.baseline_concurrency",
                list(cfg.baseline_concurrency),
                "every level must be >= 1.",
                "e.g. benchmark.baseline_concurrency=[1]",
            )
        )
    if any(not math.isfinite(r) or r <= 0 for r in cfg.request_rates):
        problems.append(
            Problem(
                f"{prefix}.request_rates",
                list(cfg.request_rates),
                "every rate must be a finite number > 0 requests/s (inf would send every request at once: use a concurrency level).",
                "e.g. benchmark.request_rates=[1.0,4.0]",
            )
        )
    for f in ("concurrency", "baseline_concurrency", "reference_concurrency"):
        levels = list(getattr(cfg, f))
        if any(c > MAX_CONCURRENCY for c in levels):
            problems.append(
                Problem(
                    f"{prefix}.{f}",
                    levels,
                    f"at most {MAX_CONCURRENCY}: the load generator runs one client thread per request in flight.",
                    f"e.g. benchmark.{f}=[1,8,64]",
                )
            )
    for f in ("num_requests", "repeats"):
        if getattr(cfg, f) < 1:
            problems.append(Problem(f"{prefix}.{f}", getattr(cfg, f), "must be >= 1.", f"e.g. benchmark.{f}=1"))
    if cfg.warmup_requests < 0:
        problems.append(Problem(f"{prefix}.warmup_requests", cfg.warmup_requests, "must be >= 0.", "e.g. benchmark.warmup_requests=2"))
    if cfg.max_duration_s <= 0:
        problems.append(
            Problem(f"{prefix}.max_duration_s", cfg.max_duration_s, "must be > 0 seconds.", "e.g. benchmark.max_duration_s=120")
        )
    if not cfg.modes:
        problems.append(Problem(f"{prefix}.modes", list(cfg.modes), "at least one mode is needed.", "e.g. benchmark.modes=[engine]"))
    for name, d in (("input_len", cfg.input_len), ("output_len", cfg.output_len)):
        if d.min < 1 or d.max < d.min:
            problems.append(
                Problem(
                    f"{prefix}.{name}",
                    f"min={d.min}, max={d.max}",
                    "needs 1 <= min <= max.",
                    f"e.g. benchmark.{name}.min=1 benchmark.{name}.max=256",
                )
            )
        if d.spread < 0:
            problems.append(Problem(f"{prefix}.{name}.spread", d.spread, "must be >= 0.", f"e.g. benchmark.{name}.spread=0"))
    return problems
