"""The benchmark tools' results (pipeline/bench/): ``gpu.json`` of ``make gpu-check``, ``scale.json`` of ``make
bench-scale``, built as dicts and written by the tools, read back here (their tables, comparisons, ``--merge``).
Parsing here is the one place they are read by their JSON keys; a field a document lacks is None (a section: empty)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .result import Record, from_fields, json_object


def _named(cls: Any, d: Any) -> dict[str, Any]:
    """A section of named records (``runs``, ``compare``, ``stages``), each parsed by ``cls.from_json``."""
    return {k: cls.from_json(v) for k, v in json_object(d).items()}


@dataclasses.dataclass(frozen=True)
class GpuPrediction(Record):
    """``gpu.json`` ``shapes.<shape>.runs.<placement>.predicted``: the planner's quantize host and GPU bytes, offload."""

    host_bytes: Any = None
    gpu_bytes: Any = None
    offload: Any = None


@dataclasses.dataclass(frozen=True)
class GpuQuantize:
    """``...runs.<placement>.quantize``: the run's quantize wall time (s), per billion parameters, host and GPU peak
    (bytes), artifact path; ``offload`` and ``resumed_at_layer`` of its ``placement``."""

    seconds: Any = None
    s_per_b_params: Any = None
    host_peak_bytes: Any = None
    gpu_peak_bytes: Any = None
    path: Any = None
    offload: Any = None
    resumed_at_layer: Any = None

    @classmethod
    def from_json(cls, d: Any) -> GpuQuantize:
        doc = json_object(d)
        return from_fields(cls, {**doc, **json_object(doc.get("placement"))})


@dataclasses.dataclass(frozen=True)
class GpuRun:
    """``...runs.<placement>``: why it was ``skipped``, or its exit code, wall time (s), after how many layers it was
    killed (``resume``), its ``quantize`` row and the planner's prediction."""

    skipped: Any = None
    exit_code: Any = None
    wall_s: Any = None
    killed_after_layers: Any = None
    quantize: GpuQuantize = GpuQuantize()
    predicted: GpuPrediction = GpuPrediction()

    @classmethod
    def from_json(cls, d: Any) -> GpuRun:
        doc = json_object(d)
        q, p = GpuQuantize.from_json(doc.get("quantize")), GpuPrediction.from_json(doc.get("predicted"))
        return dataclasses.replace(from_fields(cls, doc), quantize=q, predicted=p)


@dataclasses.dataclass(frozen=True)
class GpuComparison:
    """``gpu.json`` ``shapes.<shape>.compare.<pair>``: whether the bytes are ``identical`` (else the ``agreement``'s
    ``kld`` and ``same_top1``, or its ``error``), or why the pair was ``skipped``."""

    identical: Any = None
    skipped: Any = None
    kld: Any = None
    same_top1: Any = None
    error: Any = None

    @classmethod
    def from_json(cls, d: Any) -> GpuComparison:
        doc = json_object(d)
        return from_fields(cls, {**json_object(doc.get("agreement")), **doc})


@dataclasses.dataclass(frozen=True)
class GpuShape:
    """``gpu.json`` ``shapes.<shape>``: its parameters and weight bytes, each placement's run, the comparisons."""

    parameters: Any = None
    weights_bytes: Any = None
    runs: dict[str, GpuRun] = dataclasses.field(default_factory=dict)
    compare: dict[str, GpuComparison] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Any) -> GpuShape:
        doc = json_object(d)
        return dataclasses.replace(
            from_fields(cls, doc), runs=_named(GpuRun, doc.get("runs")), compare=_named(GpuComparison, doc.get("compare"))
        )

    @staticmethod
    def section(d: Any) -> dict[str, Any]:
        """``gpu.json`` ``shapes`` as written (a ``--merge`` run writes the other shapes back unchanged)."""
        return json_object(json_object(d).get("shapes"))


@dataclasses.dataclass(frozen=True)
class ScaleStage(Record):
    """``scale.json`` ``results.<shape>.stages.<stage>``: status, wall time (s), peak RSS and (build) the builder's."""

    status: Any = None
    seconds: Any = None
    peak_rss_bytes: Any = None
    builder_peak_rss_bytes: Any = None


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
