"""``benchmark`` config group: load generation and measurement (benchmark stage, ``make bench``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from .common import Problem, choice, runtime


@dataclass
class LengthDist:
    kind: str = "fixed"
    """fixed | uniform | normal | lognormal."""
    mean: float = 32.0
    spread: float = 0.0
    """uniform: half-width; normal: std; lognormal: sigma of log."""
    min: int = 1
    max: int = 256


@dataclass
class BenchmarkConfig:
    name: str = "default"
    modes: List[str] = field(default_factory=lambda: ["engine", "triton", "baseline"])
    """Where to send load: engine (in-process) | triton (gRPC streaming to the packaged server) | baseline (transformers)."""
    concurrency: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    request_rates: List[float] = field(default_factory=list)
    """Open-loop Poisson arrival rates in requests/s (empty = only the concurrency sweep)."""
    dataset: str = "eval"
    """eval (prompts from the business eval set) | synthetic (lengths from the distributions below)."""
    input_len: LengthDist = field(default_factory=lambda: LengthDist(mean=32))
    output_len: LengthDist = field(default_factory=lambda: LengthDist(mean=32))
    ignore_eos: bool = True
    """Generate exactly the requested output length (comparable TPOT across runs)."""
    num_requests: int = 32
    """Requests per concurrency level (after warm-up)."""
    warmup_requests: int = 4
    max_duration_s: float = 120.0
    """Hard bound per level; a level stops early when it runs out of time."""
    seed: int = 0
    repeats: int = 1
    results_dir: str = runtime("bench/results", doc="where JSON, Markdown and plots go")


def validate(cfg: BenchmarkConfig, prefix: str = "benchmark") -> list[Problem]:
    problems: list[Problem] = []
    for m in cfg.modes:
        choice(problems, f"{prefix}.modes", m, ("engine", "triton", "baseline"))
    choice(problems, f"{prefix}.dataset", cfg.dataset, ("eval", "synthetic"))
    for name, d in (("input_len", cfg.input_len), ("output_len", cfg.output_len)):
        choice(problems, f"{prefix}.{name}.kind", d.kind, ("fixed", "uniform", "normal", "lognormal"))
    if any(c < 1 for c in cfg.concurrency):
        problems.append(Problem(f"{prefix}.concurrency", list(cfg.concurrency), "every level must be >= 1.", "e.g. benchmark.concurrency=[1,2,4,8]"))
    return problems
