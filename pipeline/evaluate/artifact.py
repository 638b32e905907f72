"""The evaluate stage's artifact: file names and readers of ``artifacts/evaluate/<key>/``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class EvalArtifact:
    """Evaluate stage output: the report (schema ``pipeline.eval_report/v1``) and every generated answer."""

    path: Path
    REPORT_JSON: ClassVar[str] = "eval_report.json"
    REPORT_MD: ClassVar[str] = "eval_report.md"
    REPORT_HTML: ClassVar[str] = "eval_report.html"
    OUTPUTS: ClassVar[str] = "outputs.jsonl"
    JUNIT_XML: ClassVar[str] = "eval_junit.xml"
    """The gate as JUnit XML, one testcase per check (``pipeline.evaluate.junit``)."""
    FILES: ClassVar[tuple[str, ...]] = ("eval_report.json", "eval_report.md", "eval_report.html", "outputs.jsonl", "eval_junit.xml")

    @property
    def report_path(self) -> Path:
        return self.path / self.REPORT_JSON

    @property
    def outputs_path(self) -> Path:
        return self.path / self.OUTPUTS
