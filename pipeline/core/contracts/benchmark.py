"""The benchmark stage's artifact: file names and readers of ``artifacts/benchmark/<key>/``."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ..artifacts import StageArtifact


class BenchmarkArtifact(StageArtifact):
    """Benchmark stage output (schema ``pipeline.benchmark/v1``)."""

    RESULT_JSON: ClassVar[str] = "benchmark.json"
    RESULT_MD: ClassVar[str] = "benchmark.md"
    FILES: ClassVar[tuple[str, ...]] = ("benchmark.json", "benchmark.md")

    @property
    def result_path(self) -> Path:
        return self.path / self.RESULT_JSON
