"""The benchmark tools' results (pipeline/bench/): ``scale.json`` of ``make bench-scale``, built as a dict and written
by the tool, read back here (its tables, ``--merge``).
Parsing here is the one place they are read by their JSON keys; a field a document lacks is None (a section: empty)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .result import from_fields, json_object


def _named(cls: Any, d: Any) -> dict[str, Any]:
    """A section of named records (``stages``), each parsed by ``cls.from_json``."""
    return {k: cls.from_json(v) for k, v in json_object(d).items()}


@dataclasses.dataclass(frozen=True)
class ScaleStage:
    """``scale.json`` ``results.<shape>.stages.<stage>``: status, wall time (s), peak RSS and (build) the builder's."""

    status: Any = None
    seconds: Any = None
    peak_rss_bytes: Any = None
    builder_peak_rss_bytes: Any = None

    @classmethod
    def from_json(cls, d: Any) -> ScaleStage:
        return from_fields(cls, json_object(d))


@dataclasses.dataclass(frozen=True)
class ScaleShape:
    """``scale.json`` ``results.<shape>``: a shape that ran (``stages``; None when it did not), was planned only or was
    refused by the planner (its refusals); ``predicted``: the planner's per-stage prediction."""

    planned_only: bool = False
    refused: list[str] | None = None
    predicted: dict[str, Any] = dataclasses.field(default_factory=dict)
    stages: dict[str, ScaleStage] | None = None

    def stage(self, name: str) -> ScaleStage:
        """The record of stage ``name`` (every field None when it did not run)."""
        return (self.stages or {}).get(name) or ScaleStage()

    @classmethod
    def from_json(cls, d: Any) -> ScaleShape:
        doc = json_object(d)
        stages = _named(ScaleStage, doc["stages"]) if "stages" in doc else None
        return cls(
            bool(doc.get("planned_only")), doc.get("refused"), json_object(json_object(doc.get("prediction")).get("predicted")), stages
        )
