"""Release provenance: an in-toto Statement (v1) with a SLSA Build Provenance v1 predicate, written as JSON.

Formats (written by hand as JSON, the specs are small; the ``in-toto`` package's API is about layouts and links,
not statements):

- in-toto attestation framework v1, ``spec/v1/statement.md``: ``{"_type": "https://in-toto.io/Statement/v1",
  "subject": [ResourceDescriptor], "predicateType": URI, "predicate": {...}}``; a subject is
  ``{"name", "digest": {"sha256": hex}}`` (``spec/v1/resource_descriptor.md``).
- SLSA v1.0 "Build Provenance" (slsa.dev/spec/v1.0/provenance): ``predicateType
  "https://slsa.dev/provenance/v1"``, ``predicate = {buildDefinition: {buildType, externalParameters,
  internalParameters, resolvedDependencies}, runDetails: {builder: {id, version}, metadata: {invocationId},
  byproducts}}``.

What this tool records (``release/provenance.intoto.json``):

- ``subject``: the archive ``<name>.tar.gz``, ``release_manifest.json`` and every file inside the archive
  (``<name>/model_repository/...``, ``<name>/release_manifest.json``, ``<name>/parity_expected.jsonl``), each with
  its sha256;
- ``externalParameters``: the resolved config (every group, redacted by ``pipeline.core.store.redact``);
- ``resolvedDependencies``: one entry per external input of every upstream stage (``checkpoint`` of export,
  ``calibration`` of quantize, ``eval_set`` / ``reference_checkpoint`` of evaluate, ...) with its content digest
  (never its path), and one per upstream artifact (``artifact:<stage>``, its output digest);
- ``internalParameters``: library versions, host facts (``pipeline.core.hostinfo.host``: platform, CPU, memory, GPUs;
  no user names, no environment variables) and ``distributions``, the exact version of every Python distribution the
  pipeline ran with (``pipeline.core.hostinfo.installed_distributions``; ``make env`` installs them from
  ``constraints.txt``);
- ``builder``: ``{"id": BUILDER_ID, "version": {"pipeline": <version>}}``; ``metadata.invocationId``: the sha256
  of the package stage's (redacted) key document, i.e. its cache key;
- ``byproducts``: the evaluation gate verdict and the serving parity record, as ``annotations``.

When the release is signed with a key, ``provenance.intoto.dsse.json`` holds the statement in a DSSE envelope signed
by the same key (:func:`pipeline.release.signing.dsse_sign`); the statement file itself is also covered by
``release.sig``.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.contracts.manifest import ArtifactManifest, StatementRecord
from ..core.contracts.package import PackageArtifact
from ..errors import InputError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:pipeline:buildtype:triton-release:v1"
"""This tool's build type (SLSA ``buildDefinition.buildType``): export -> quantize -> build -> evaluate -> package."""
BUILDER_ID = "urn:pipeline:builder"
"""SLSA ``runDetails.builder.id`` (the tool; its version is in ``builder.version.pipeline``)."""


def _sha256_stream(f: Any) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def archive_subjects(archive: Path) -> list[dict[str, Any]]:
    """``[{"name": member name, "digest": {"sha256": hex}}]`` for every regular file inside the ``.tar.gz``, sorted."""
    out = []
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar:
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None, "a regular member has content"
                out.append({"name": m.name, "digest": {"sha256": _sha256_stream(f)}})
    return sorted(out, key=lambda s: s["name"])


def _upstream(artifacts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """SLSA ``resolvedDependencies``: every upstream artifact (``artifact:<stage>``, output digest) and every external
    input of it (``<stage>:<name>``, content digest), found through the manifests' ``inputs`` (no paths recorded)."""
    deps: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, ArtifactManifest]] = [(stage, a.doc) for stage, a in artifacts.items()]
    while todo:
        stage, mf = todo.pop()
        name = f"artifact:{stage}"
        if name in deps:
            continue
        deps[name] = {"name": name, "digest": {"sha256": str(mf.output_digest)}}
        for ext, rec in mf.external.items():
            deps[f"{stage}:{ext}"] = {"name": f"{stage}:{ext}", "digest": {"sha256": str(rec.digest)}}
        for up, rec in mf.inputs.items():
            try:
                up_mf = ArtifactManifest.from_json(json.loads((Path(str(rec.path)) / "manifest.json").read_text(encoding="utf-8")))
            except (OSError, ValueError):
                up_mf = ArtifactManifest(output_digest=rec.digest)
            todo.append((up, up_mf))
    return [deps[k] for k in sorted(deps)]


def build_statement(
    release_dir: Path,
    archive: Path,
    *,
    config: Mapping[str, Any],
    upstream: Mapping[str, Any],
    invocation_id: str,
    versions: Mapping[str, Any],
    host: Mapping[str, Any],
    gate: Mapping[str, Any],
    parity: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The in-toto Statement of the release in ``release_dir`` (see module doc).

    Args:
        release_dir: ``release/`` with ``archive`` and ``release_manifest.json`` already written.
        config: the resolved, redacted config (plain JSON types).
        upstream: ``{stage: pipeline.core.store.Artifact}``: the package stage's inputs.
        invocation_id: the package stage's cache key (sha256 of its key document).
        versions, host: library versions and host facts (``pipeline.core.hostinfo``).
        gate, parity: the gate record of the release manifest and the parity record.
    """
    from .. import __version__
    from ..core.hostinfo import installed_distributions
    from ..core.store import sha256_file

    manifest = release_dir / PackageArtifact.RELEASE_MANIFEST
    subjects = [
        {"name": archive.name, "digest": {"sha256": sha256_file(archive)}},
        {"name": manifest.name, "digest": {"sha256": sha256_file(manifest)}},
        *archive_subjects(archive),
    ]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"config": dict(config)},
                "internalParameters": {"versions": dict(versions), "host": dict(host), "distributions": installed_distributions()},
                "resolvedDependencies": _upstream(upstream),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"pipeline": __version__}},
                "metadata": {"invocationId": invocation_id},
                "byproducts": [
                    {"name": "evaluation gate", "mediaType": "application/json", "annotations": dict(gate)},
                    *([{"name": "serving parity", "mediaType": "application/json", "annotations": dict(parity)}] if parity else []),
                ],
            },
        },
    }


def check_statement(statement_path: Path, release_dir: Path, extracted: Path) -> dict[str, Any]:
    """Check the statement at ``statement_path``: its types, and every subject's sha256 against the file in
    ``release_dir`` (archive, manifest) or, for a subject inside the archive, under ``extracted`` (the unpacked
    archive; every unpacked file must be a subject). Returns the statement.

    Raises:
        InputError: unreadable, wrong ``_type`` / ``predicateType``, a subject whose file is missing or differs, or
            an unpacked file no subject names (the message names the file).
    """
    from .archive import check_sha256

    try:
        st = json.loads(statement_path.read_text(encoding="utf-8"))
        record = StatementRecord.from_json(st)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{statement_path}: not a readable in-toto Statement ({e}). Fix: download the release again.") from None
    if record.statement_type != STATEMENT_TYPE or record.predicate_type != PREDICATE_TYPE:
        raise InputError(
            f"{statement_path}: _type {record.statement_type!r} / predicateType {record.predicate_type!r}, expected "
            f"{STATEMENT_TYPE!r} / {PREDICATE_TYPE!r}. Fix: download the release again."
        )
    inside = {p.relative_to(extracted).as_posix() for p in extracted.rglob("*") if p.is_file()}
    for name, want in sorted(record.subjects.items()):
        if name.startswith("/") or ".." in name.split("/"):
            raise InputError(
                f"{statement_path}: subject {name!r} points outside the release; refusing it. Fix: download the release again."
            )
        f = (extracted / name) if "/" in name else release_dir / name  # archive members are "<name>/...": never flat
        check_sha256(f, want, f"{statement_path.name} (subject {name!r})")
    extra = sorted(inside - set(record.subjects))
    if extra:
        raise InputError(
            f"{extracted / extra[0]}: in the archive but not a subject of {statement_path.name}. Fix: download the release again."
        )
    return st


__all__ = ["BUILDER_ID", "BUILD_TYPE", "PREDICATE_TYPE", "STATEMENT_TYPE", "archive_subjects", "build_statement", "check_statement"]
