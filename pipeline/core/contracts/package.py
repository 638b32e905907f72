"""The package stage's artifact: file names and readers of ``artifacts/package/<key>/``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

from ..artifacts import FolderName, PathOf, StageArtifact
from .build import EngineLimits
from .evaluate import GateVerdict
from .result import Record, StageResult, from_fields, json_object


class PackageArtifact(StageArtifact):
    """Package stage output: the Triton model repository, the release manifest and the release folder.  Its names
    (``FILES``) are the top level's, those inside ``release/`` (``SHA256SUMS``, the signature, the provenance, the SBOM)
    and, for a PyTorch-backend package, those inside ``servers/`` (the trtllm-serve options and command, the benchmark
    commands)."""

    MODEL_REPOSITORY: ClassVar[str] = FolderName("model_repository")
    RELEASE_MANIFEST: ClassVar[str] = "release_manifest.json"
    RELEASE_DIR: ClassVar[str] = FolderName("release")
    ARCHIVE_SUFFIXES: ClassVar[tuple[str, ...]] = (".tar.gz", ".tgz", ".tar")
    """How a release archive a user passes may end (``pipeline serve <archive>`` unpacks it; ``--parity`` needs it
    unpacked)."""
    SHA256SUMS: ClassVar[str] = "SHA256SUMS"
    SIGNATURE: ClassVar[str] = "release.sig"
    """Inside ``release/``: the model-signing signature of every other file there (``package.sign``)."""
    PROVENANCE: ClassVar[str] = "provenance.intoto.json"
    """Inside ``release/``: the in-toto Statement with the SLSA v1 provenance predicate (pipeline/release/provenance.py)."""
    PROVENANCE_DSSE: ClassVar[str] = "provenance.intoto.dsse.json"
    """Inside ``release/``, when signed with a key: the provenance statement in a signed DSSE envelope."""
    SBOM: ClassVar[str] = "sbom.cdx.json"
    """Inside ``release/``: CycloneDX SBOM of the serving environment (pipeline/package/sbom.py)."""
    #: PyTorch-backend packages: the non-Triton server files, in ``servers/`` (pipeline/package/llmapi_options.py)
    SERVE_YAML: ClassVar[str] = "trtllm_serve.yaml"
    SERVE_SCRIPT: ClassVar[str] = "trtllm_serve.sh"
    BENCH_JSON: ClassVar[str] = "benchmark.json"

    model_repository = PathOf(MODEL_REPOSITORY)
    release_manifest_path = PathOf(RELEASE_MANIFEST)
    release_dir = PathOf(RELEASE_DIR)

    def read_release_manifest(self) -> dict[str, Any]:
        """The release manifest of this package (the artifact's copy, else the one in ``release/``); ``{}`` when there
        is none (a bare model repository)."""
        for p in (self.release_manifest_path, self.release_dir / self.RELEASE_MANIFEST):
            if p.is_file():
                return json.loads(p.read_text(encoding="utf-8"))
        return {}

    def parity_record(self, result: PackageResult | None = None) -> dict[str, Any] | None:
        """The serving-parity record (docs/package.md "Serving parity": status, matched, total, note, command): the
        stage result's ``parity`` when given, else the release manifest's (packages written before the result kept
        it); None when neither has one."""
        p = result.parity if result is not None else None
        if not isinstance(p, dict):
            try:
                p = self.read_release_manifest().get("parity")
            except (OSError, ValueError):
                p = None
        return p if isinstance(p, dict) else None


@dataclasses.dataclass(frozen=True)
class ParityRecord:
    """The serving-parity record (docs/package.md "Serving parity") as its readers see it: ``status``, ``matched``,
    ``total``, ``note``, ``disabled_by``, why it was ``not run here`` (``reason``), the ``first_mismatch`` (None where
    the record lacks one) and the ``command`` that runs it ("" where it lacks one)."""

    status: Any = None
    matched: Any = None
    total: Any = None
    note: Any = None
    disabled_by: Any = None
    reason: Any = None
    first_mismatch: Any = None
    command: Any = ""

    @classmethod
    def from_json(cls, d: Any) -> ParityRecord | None:
        """The record of ``d``; None when ``d`` is not one (absent: parity was not checked)."""
        return from_fields(cls, d) if isinstance(d, dict) else None


@dataclasses.dataclass(frozen=True)
class ReleaseSigning:
    """``release_manifest.json`` ``signing``: how the release was signed (``method``) and the public key's sha256."""

    method: Any = None
    public_key_sha256: Any = ""

    @classmethod
    def from_json(cls, d: Any) -> ReleaseSigning | None:
        """None for an unsigned release (no ``signing``, or an empty one)."""
        return from_fields(cls, d) if isinstance(d, dict) and d else None


@dataclasses.dataclass(frozen=True)
class ReleaseManifest:
    """``release_manifest.json`` as ``pipeline serve`` and the package stage read it (None where the document lacks a field).

    Attributes:
        name: the release's name.
        version: the release version (``package.version``).
        target: ``build.target``, the engine's target.
        serving_image: ``serving.serving_image``, the container that serves it.
        parity: the serving-parity record.
        signing: how it was signed; None when unsigned.
        backend: ``build.backend`` (TensorRT-LLM ``tensorrt`` | ``pytorch``).
        layout: ``serving.layout``, the repository's layout.
        engine_versions: ``versions.engine``, the build host's library versions.
        export_digest: ``sources.export``, the export artifact's digest.
        quant: ``quant``, the recipe fields (``{}`` without).
        provenance: ``provenance``, the provenance statement's file name (None without one).
        repository_files: ``repository_files``, the model repository's files and their sha256.
        repository_digest: ``sources.model_repository``, the model repository's content digest.
        model_name: ``model.name``.
        repetition_penalty: ``decoding.repetition_penalty``, the checkpoint's decoding-policy penalty.
        sampling: ``decoding.sampling``, the model's recommended sampling values (``{}`` without).
        limits: ``build.limits``, the engine's limits.
    """

    name: Any = None
    version: Any = None
    target: Any = None
    serving_image: Any = None
    parity: ParityRecord | None = None
    signing: ReleaseSigning | None = None
    backend: Any = None
    layout: Any = None
    engine_versions: Any = None
    export_digest: Any = None
    quant: dict[str, Any] = dataclasses.field(default_factory=dict)
    provenance: Any = None
    repository_files: Any = None
    repository_digest: Any = None
    model_name: Any = None
    repetition_penalty: Any = None
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    limits: EngineLimits = dataclasses.field(default_factory=EngineLimits)

    @property
    def min_p(self) -> Any:
        """``decoding.sampling.min_p``, the model's recommended min-p (None without)."""
        return self.sampling.get("min_p")

    @property
    def quant_recipe(self) -> Any:
        return self.quant.get("recipe")

    @property
    def kv_cache_dtype(self) -> Any:
        return self.quant.get("kv_cache_dtype")

    @classmethod
    def from_json(cls, d: Any) -> ReleaseManifest:
        doc = json_object(d)
        build, serving, sources = json_object(doc.get("build")), json_object(doc.get("serving")), json_object(doc.get("sources"))
        decoding = json_object(doc.get("decoding"))
        return cls(
            name=doc.get("name"),
            version=doc.get("version"),
            target=build.get("target"),
            serving_image=serving.get("serving_image"),
            parity=ParityRecord.from_json(doc.get("parity") or {}),  # absent: a record of Nones
            signing=ReleaseSigning.from_json(doc.get("signing")),
            backend=build.get("backend"),
            layout=serving.get("layout"),
            engine_versions=json_object(doc.get("versions")).get("engine"),
            export_digest=sources.get("export"),
            quant=json_object(doc.get("quant")),
            provenance=doc.get("provenance"),
            repository_files=doc.get("repository_files"),
            repository_digest=sources.get("model_repository"),
            model_name=json_object(doc.get("model")).get("name"),
            repetition_penalty=decoding.get("repetition_penalty"),
            sampling=json_object(decoding.get("sampling")),
            limits=EngineLimits.from_json(json_object(build.get("limits"))),
        )


@dataclasses.dataclass(frozen=True)
class ProvenanceStatement:
    """``release/provenance.intoto.json`` (pipeline/release/provenance.py) as ``pipeline migrate`` reads it: the resolved
    config the release was made with (``predicate.buildDefinition.externalParameters.config``; None without one) and
    that config's ``target.gpu`` (None without)."""

    config: dict[str, Any] | None = None
    target_gpu: Any = None

    @classmethod
    def from_json(cls, d: Any) -> ProvenanceStatement:
        build = json_object(json_object(json_object(d).get("predicate")).get("buildDefinition"))
        config = json_object(build.get("externalParameters")).get("config")
        if not isinstance(config, dict):
            return cls()
        return cls(config, json_object(config.get("target")).get("gpu"))


@dataclasses.dataclass(frozen=True)
class ReleaseArchive:
    """The release folder of a package (``package.archive=true``): ``release/<name>.tar.gz`` and its checksum, the
    provenance statement and, when ``package.sign`` is on, the signature and who signed (None when unsigned)."""

    archive: str
    archive_sha256: str
    provenance: str
    signature: str | None = None
    signed_by: Any = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackageResult(StageResult):
    """The package stage's result (``manifest.json`` ``result``).

    Attributes:
        headline: ``target``, ``models`` (count), ``archive`` (``-`` without one), ``gate`` (``pass`` | ``override``),
            ``served == evaluated`` (``matched/total``, or the parity status).
        repository: the model repository's folder in the artifact (``model_repository``).
        models: the repository's model names.
        target: the engine's target.
        decoupled: the repository streams (Triton decoupled mode).
        gate_override: ``package.allow_failed_gate`` overrode a gate that did not pass.
        parity: the serving-parity record (docs/package.md "Serving parity").
        release: the release archive; None without one (its fields are then absent from the JSON).
    """

    repository: str | None = None
    models: list[str] = dataclasses.field(default_factory=list)
    target: str | None = None
    decoupled: bool | None = None
    gate_override: bool | None = None
    parity: dict[str, Any] | None = None
    release: ReleaseArchive | None = None

    @property
    def archive(self) -> str | None:
        return self.release.archive if self.release is not None else None

    @property
    def archive_sha256(self) -> str | None:
        return self.release.archive_sha256 if self.release is not None else None

    def to_json(self) -> dict[str, Any]:
        """The result dict, the release archive's fields at the top level (``archive``, ``archive_sha256`` ...)."""
        d = super().to_json()
        release = d.pop("release")
        return d | (release or {})

    @classmethod
    def from_json(cls, d: Any) -> PackageResult:
        doc = d if isinstance(d, dict) else {}
        base = super().from_json({k: v for k, v in doc.items() if k != "release"})
        if not isinstance(doc.get("archive"), str):
            return base
        sig = doc.get("signature")
        release = ReleaseArchive(
            doc["archive"],
            str(doc.get("archive_sha256") or ""),
            str(doc.get("provenance") or ""),
            sig if isinstance(sig, str) else None,
            doc.get("signed_by"),
        )
        return dataclasses.replace(base, release=release)

    @classmethod
    def _parse_field(cls, name: str, value: Any) -> Any:
        if name == "parity":
            return value if isinstance(value, dict) else None
        return super()._parse_field(name, value)


@dataclasses.dataclass(frozen=True)
class ReleaseGate:
    """``release_manifest.json`` ``evaluation.gate``: the evaluate stage's verdict (None when the release was packaged
    without one) and whether ``package.allow_failed_gate`` overrode it.  The JSON is the verdict's record
    (:meth:`GateVerdict.to_json`) plus ``override`` (and ``override_note`` when overridden)."""

    verdict: GateVerdict | None
    override: bool
    override_note: str | None = None

    @property
    def passed(self) -> bool:
        return self.verdict is not None and self.verdict.passed

    @property
    def vouches(self) -> bool:
        """The gate passed and was not overridden: the release is one the evaluation vouches for."""
        return self.passed and not self.override

    @property
    def verdict_name(self) -> str:
        """``pass`` / ``inconclusive`` / ``fail`` (``fail`` without a verdict)."""
        return self.verdict.verdict if self.verdict is not None else "fail"

    @property
    def reason(self) -> str:
        return self.verdict.reason if self.verdict is not None else "no evaluation verdict"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = self.verdict.to_json() if self.verdict is not None else {"passed": False}
        d["override"] = self.override
        if self.override_note:
            d["override_note"] = self.override_note
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> ReleaseGate | None:
        """The gate of a release manifest's ``evaluation.gate``; None when the manifest has none."""
        if not isinstance(d, dict) or not d:
            return None
        return cls(
            GateVerdict.from_json(
                {k: v for k, v in d.items() if k not in ("override", "override_note")} if "verdict" in d or "reason" in d else None
            ),
            bool(d.get("override")),
            d.get("override_note"),
        )

    @classmethod
    def of_manifest(cls, manifest: dict[str, Any]) -> ReleaseGate | None:
        """The gate of a parsed ``release_manifest.json`` (None when it has no evaluation)."""
        ev = manifest.get("evaluation") if isinstance(manifest, dict) else None
        return cls.from_json(ev.get("gate") if isinstance(ev, dict) else None)


PACKAGE_ID_PARAMETER = "pipeline_package_id"
"""A ``parameters`` entry of the repository's ``ensemble/config.pbtxt``: the package stage's invocation id (the
provenance's ``invocationId``), also recorded in ``parity_expected.jsonl``, so ``pipeline client --parity`` can tell a
server that serves another package (Triton reports model-config parameters over gRPC; files it does not)."""


@dataclasses.dataclass(frozen=True)
class ServingRecord(Record):
    """``runs/serving/<host>_<grpc port>.json``: the record ``pipeline serve`` keeps while its server runs (serve/registry.py)."""

    grpc_url: str = ""
    http_url: str = ""
    repository: str = ""
    pid: int = -1
    started: str = ""


@dataclasses.dataclass(frozen=True)
class ParityExpectedMeta(Record):
    """``parity_expected.jsonl``'s first line ``meta`` (serve/parity.py); ``package_id`` is None in older files."""

    sample: Any = None
    of: Any = None
    seed: Any = None
    modes: Any = None
    package_id: Any = None


@dataclasses.dataclass(frozen=True)
class ParityRequest(Record):
    """A request line of ``parity_expected.jsonl`` (``messages`` only where the chat template applies)."""

    id: Any = None
    text_input: Any = None
    max_tokens: Any = None
    stop_strings: Any = None
    expected: Any = None
    prompt: Any = None
    messages: Any = None


@dataclasses.dataclass(frozen=True)
class EvaluatedAnswer(Record):
    """A line of the evaluate artifact's ``outputs.jsonl`` as the parity check reads it (a skipped item has no runner)."""

    id: Any = None
    runner: Any = None
    text: Any = None
    skipped: Any = None
