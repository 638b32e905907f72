"""The benchmark stage's artifact: file names and readers of ``artifacts/benchmark/<key>/``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ..artifacts import PathOf, StageArtifact
from .result import StageResult


class BenchmarkArtifact(StageArtifact):
    """Benchmark stage output (schema ``pipeline.benchmark/v1``)."""

    RESULT_JSON: ClassVar[str] = "benchmark.json"
    RESULT_MD: ClassVar[str] = "benchmark.md"

    result_path = PathOf(RESULT_JSON)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchmarkResult(StageResult):
    """The benchmark stage's result (``manifest.json`` ``result``).

    Attributes:
        headline: ``benchmark.json`` ``headline`` (pipeline/benchmark/core.py ``headline``).
        ratios: each ``benchmark.json`` ratio's value, by name (``failed_requests`` ...).
        results: the copies written to ``benchmark.results_dir`` (empty when it is null).
    """

    ratios: dict[str, Any] = dataclasses.field(default_factory=dict)
    results: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class BenchmarkDocument:
    """``benchmark.json`` as ``pipeline benchmark compare`` reads it.

    Attributes:
        config: ``config``, the benchmark knobs.
        model: ``model``, the model facts (recipe, target, paths ...).
        host_cpu: ``host.cpu``, the benchmark host's CPU.
    """

    config: Any = dataclasses.field(default_factory=dict)
    model: Any = dataclasses.field(default_factory=dict)
    host_cpu: Any = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BenchmarkDocument:
        return cls(d.get("config", {}), d.get("model", {}), d.get("host", {}).get("cpu"))
