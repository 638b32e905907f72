"""The benchmark stage's artifact: file names and readers of ``artifacts/benchmark/<key>/``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ..artifacts import PathOf, StageArtifact
from .result import Record, StageResult, from_fields, json_object


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
class Distribution(Record):
    """A metric's statistics in a level's ``metrics`` (pipeline/benchmark/metrics.py); None without a sample."""

    avg: Any = None
    p50: Any = None
    p99: Any = None


@dataclasses.dataclass(frozen=True)
class BenchHost:
    """``benchmark.json`` ``host``: the CPU, CPU count, GPUs and the 1-minute load average at start and end."""

    cpu: Any = None
    cpu_count: Any = None
    gpus: Any = None
    loadavg_1m_start: Any = None
    loadavg_1m_end: Any = None


@dataclasses.dataclass(frozen=True)
class BenchRatio:
    """A ``benchmark.json`` ``ratios`` entry; documents older than ``judged`` judged every ratio. ``why``: why a
    measured value was not judged (``met`` None; e.g. a roofline fraction above 1), None otherwise."""

    value: Any = None
    target: Any = None
    met: Any = None
    judged: Any = True
    definition: Any = None
    why: Any = None


@dataclasses.dataclass(frozen=True)
class BenchmarkDocument:
    """``benchmark.json`` as ``pipeline benchmark compare`` and ``show`` read it: its ``schema``, ``config`` (the
    benchmark knobs: ``repeats``, ``ignore_eos`` ...), ``model`` (the model facts: ``target``, ``quant_recipe`` ...),
    ``host``, ``roofline`` (the bandwidth and the engines' weight facts) and ``ratios`` by name."""

    schema: Any = None
    config: Any = dataclasses.field(default_factory=dict)
    model: Any = dataclasses.field(default_factory=dict)
    host: BenchHost = BenchHost()
    roofline: dict[str, Any] = dataclasses.field(default_factory=dict)
    ratios: dict[str, BenchRatio] = dataclasses.field(default_factory=dict)
    repeats: Any = None
    ignore_eos: Any = None
    target: Any = None
    quant_recipe: Any = "-"
    model_name: Any = None
    """``model.model_name``: the model measured (``model.name`` of the run)."""
    export_digest: Any = None
    """``model.artifacts.export.digest``: the export artifact's digest (of the exported checkpoint)."""
    hf_dir: Any = None
    """``model.hf_dir``: the exported checkpoint folder the run measured."""

    @property
    def host_cpu(self) -> Any:
        return self.host.cpu

    def weight_bytes_per_step(self, mode: str) -> Any:
        """Weight bytes read per decode step by ``mode``'s engine (its ``per_mode`` facts, else the build's engine)."""
        return (json_object(self.roofline.get("per_mode")).get(mode) or self.roofline).get("weight_bytes_per_step")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BenchmarkDocument:
        config, model, ratios = d.get("config", {}), d.get("model", {}), json_object(d.get("ratios"))
        cfg, mdl = json_object(config), json_object(model)
        host, roofline = from_fields(BenchHost, json_object(d.get("host"))), json_object(d.get("roofline"))
        rs = {k: from_fields(BenchRatio, json_object(v)) for k, v in ratios.items()}
        derived = (cfg.get("repeats"), cfg.get("ignore_eos"), mdl.get("target"), mdl.get("quant_recipe", "-"))
        export = json_object(json_object(mdl.get("artifacts")).get("export")).get("digest")
        measured = (mdl.get("model_name"), export, mdl.get("hf_dir"))
        return cls(d.get("schema"), config, model, host, roofline, rs, *derived, *measured)
