"""The benchmark stage's artifact: file names and readers of ``artifacts/benchmark/<key>/``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class BenchmarkArtifact:
    """Benchmark stage output (schema ``pipeline.benchmark/v1``)."""

    path: Path
    RESULT_JSON: ClassVar[str] = "benchmark.json"
    RESULT_MD: ClassVar[str] = "benchmark.md"
    FILES: ClassVar[tuple[str, ...]] = ("benchmark.json", "benchmark.md")

    @property
    def result_path(self) -> Path:
        return self.path / self.RESULT_JSON
