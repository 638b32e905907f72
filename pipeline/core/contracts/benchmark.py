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
