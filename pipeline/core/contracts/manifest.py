"""An artifact's ``manifest.json`` and a run's ``summary.json`` as their readers outside the store see them.

The store writes and verifies ``manifest.json`` (pipeline/core/store.py); the runner, ``pipeline serve`` and the
package stage read a few of its fields through :class:`ArtifactManifest` (``Artifact.doc``).  The multirun comparison
reads each job's ``summary.json`` through :class:`RunSummaryRecord`; the summary's ``gate`` section is
:class:`RunGate`.  Parsing here is the one place these documents are read by their JSON keys."""

from __future__ import annotations

import dataclasses
from typing import Any

from .evaluate import GateVerdict
from .package import ParityRecord
from .result import Record, json_object


@dataclasses.dataclass(frozen=True)
class InputRecord(Record):
    """``manifest.json`` ``inputs.<stage>``: the upstream artifact this one was computed from, or ``external.<name>``:
    an external input file (``path``, ``digest``) (None where the record lacks a field)."""

    path: Any = None
    digest: Any = None
    key: Any = None
    production: Any = None


@dataclasses.dataclass(frozen=True)
class ArtifactManifest:
    """The fields of an artifact's ``manifest.json`` (the store checks ``schema``, ``complete``, ``key`` and
    ``outputs`` before it trusts an artifact, pipeline/core/store.py ``ArtifactStore.inspect``).

    Attributes:
        schema / complete: ``pipeline.manifest/v1`` and ``true`` once the store published the artifact.
        key: the artifact's cache key.
        output_digest: its content digest.
        outputs: every file it holds (relative POSIX path), with its recorded sha256 and size (None: not an object).
        external: the external input files it was computed from (path, digest), by name.
        created: when it was published (ISO 8601 UTC).
        production: the id of the run that produced it.
        pending: a dry run's provisional artifact (not built).
        memory: the stage's measured peak memory (``ran`` only).
        inputs: the upstream artifacts it was computed from, by stage.
        config: the (redacted) config of its key document.
        key_document: the (redacted) key document its cache key is the digest of.
        result: the stage's result (its stage's class parses it: ``QuantizeResult.from_json`` ...).
        measurements: what the run measured (the quantize stage's: :class:`QuantizeMeasurements`).
        generation_key: the digest of the part of its key document its stage's costly work depends on
            (``Stage.generation_key``; None for a stage without one or an artifact written before it was recorded).
    """

    key: Any = None
    created: Any = None
    production: Any = None
    pending: bool = False
    memory: Any = None
    inputs: dict[str, InputRecord] = dataclasses.field(default_factory=dict)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    key_document: dict[str, Any] = dataclasses.field(default_factory=dict)
    schema: Any = None
    complete: bool = False
    output_digest: Any = None
    outputs: dict[str, OutputRecord] | None = dataclasses.field(default_factory=dict)
    external: dict[str, InputRecord] = dataclasses.field(default_factory=dict)
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    measurements: dict[str, Any] = dataclasses.field(default_factory=dict)
    generation_key: Any = None

    def config_group(self, name: str) -> Any:
        """The recorded config group ``name`` (``package`` ...); None when the manifest has none."""
        return self.config.get(name)

    def input(self, stage: str) -> InputRecord:
        """The record of the upstream ``stage`` (every field None when the manifest has none)."""
        return self.inputs.get(stage) or InputRecord()

    @classmethod
    def from_json(cls, d: Any) -> ArtifactManifest:
        doc = json_object(d)
        inputs, external, outputs = json_object(doc.get("inputs")), json_object(doc.get("external")), doc.get("outputs", {})
        return cls(
            key=doc.get("key"),
            created=doc.get("created"),
            production=doc.get("production"),
            pending=bool(doc.get("pending")),
            memory=doc.get("memory"),
            inputs={k: InputRecord.from_json(v) for k, v in inputs.items()},
            config=json_object(doc.get("config")),
            key_document=json_object(doc.get("key_document")),
            schema=doc.get("schema"),
            complete=bool(doc.get("complete")),
            output_digest=doc.get("output_digest"),
            outputs={k: OutputRecord.from_json(v) for k, v in outputs.items()} if isinstance(outputs, dict) else None,
            external={k: InputRecord.from_json(v) for k, v in external.items()},
            result=json_object(doc.get("result")),
            measurements=json_object(doc.get("measurements")),
            generation_key=doc.get("generation_key"),
        )


@dataclasses.dataclass(frozen=True)
class OutputRecord(Record):
    """``manifest.json`` ``outputs.<file>``: the file's recorded sha256 and size in bytes (None where the record lacks
    a field)."""

    sha256: Any = None
    bytes: Any = None


@dataclasses.dataclass(frozen=True)
class StatementRecord:
    """A release's in-toto Statement as this project writes it (``release/provenance.intoto.json``,
    pipeline/release/provenance.py): its ``_type``, its ``predicateType`` and each subject's sha256 by name."""

    subjects: dict[str, str]
    statement_type: Any = None
    predicate_type: Any = None

    @classmethod
    def from_json(cls, d: Any) -> StatementRecord:
        """KeyError / TypeError for a document without ``subject`` or a subject without ``name`` / ``digest.sha256``."""
        subjects = {str(s["name"]): str(s["digest"]["sha256"]) for s in d["subject"]}
        return cls(subjects, d.get("_type"), d.get("predicateType"))


@dataclasses.dataclass(frozen=True)
class DsseEnvelope:
    """The DSSE envelope of a release's provenance statement as this project signs it
    (``release/provenance.intoto.dsse.json``, pipeline/release/signing.py ``dsse_sign``): the base64 payload, the base64
    signatures and the payload type."""

    payload: Any
    signatures: list[Any]
    payload_type: Any = None

    @classmethod
    def from_json(cls, d: Any) -> DsseEnvelope:
        """KeyError / TypeError for a document without ``payload`` or ``signatures``, or a signature without ``sig``."""
        return cls(d["payload"], [s["sig"] for s in d["signatures"]], d.get("payloadType"))


@dataclasses.dataclass(frozen=True)
class QuantizeMeasurements:
    """A quantize artifact's ``manifest.json`` ``measurements`` (pipeline/quantize/run.py): each step's wall time (s)
    and peak RSS (bytes), and the placement's fields that name the free memory (``budget_bytes``, ``reason``)."""

    timings_s: dict[str, float] = dataclasses.field(default_factory=dict)
    peak_rss_bytes: Any = None
    placement: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Any) -> QuantizeMeasurements:
        doc = json_object(d)
        return cls(json_object(doc.get("timings_s")), doc.get("peak_rss_bytes"), json_object(doc.get("placement")))


@dataclasses.dataclass(frozen=True)
class RunGate:
    """``summary.json`` ``gate``: the evaluate stage's verdict and the package stage's serving-parity record (None
    when the run had none)."""

    evaluate: GateVerdict | None = None
    parity: ParityRecord | None = None

    @classmethod
    def from_json(cls, d: Any) -> RunGate:
        doc = json_object(d)
        return cls(GateVerdict.from_json(doc.get("evaluate")), ParityRecord.from_json(doc.get("parity")))


@dataclasses.dataclass(frozen=True)
class SummaryStage:
    """``summary.json`` ``stages[]``: the stage's name and its headline numbers; its status, wall time (s), artifact
    path and, for a stage that ran, its peak memory (``memory``: the pipeline process's RSS, each GPU's
    ``max_memory_allocated`` by ``cuda:N``, bytes)."""

    stage: str
    headline: dict[str, Any]
    status: Any = None
    seconds: Any = None
    path: Any = None
    process_peak_rss_bytes: Any = None
    gpu_peak_bytes: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, st: dict[str, Any]) -> SummaryStage:
        """Raises KeyError for a stage without ``stage``."""
        mem = json_object(st.get("memory"))
        peaks = (mem.get("process_peak_rss_bytes"), json_object(mem.get("gpu_peak_bytes")))
        return cls(st["stage"], st.get("headline") or {}, st.get("status"), st.get("seconds"), st.get("path"), *peaks)


@dataclasses.dataclass(frozen=True)
class RunSummaryRecord:
    """A job's ``summary.json`` as the multirun comparison reads it (pipeline/report.py ``RunSummary`` writes it)."""

    overrides: list[str] = dataclasses.field(default_factory=list)
    exit_code: Any = None
    stages: list[SummaryStage] = dataclasses.field(default_factory=list)
    error: Any = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunSummaryRecord:
        """Raises AttributeError for a document that is not an object and KeyError for a stage without ``stage``."""
        stages = [SummaryStage.from_json(st) for st in d.get("stages", [])]
        return cls(d.get("overrides", []), d.get("exit_code"), stages, d.get("error"))
