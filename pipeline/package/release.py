"""The release of a package: its name (:func:`release_name`) and ``release/`` (:func:`release_archive`): the
``<name>.tar.gz`` archive (repository, manifest, parity records, servers), the manifest copy, the provenance statement,
the SBOM, ``SHA256SUMS`` and, when signing, the signature. :func:`invocation_id` is the provenance's ``invocationId``
and the repository's ``pipeline_package_id``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..core.contracts.package import PackageArtifact, ReleaseArchive, ReleaseManifest
from ..core.stage import StageContext


def release_name(cfg: Any) -> str:
    """``<model>-<recipe>[-kv<kv_cache_dtype>]-<version>`` (``tiny-int4_awq-1``, ``tiny-int8_sq-kvfp8-1``): two recipes
    of one model never share an archive name (a fresh-user trial got three different ``tq-1.tar.gz``).  In the
    characters ``[A-Za-z0-9._-]`` (others become ``-``), never starting with ``-`` or ``.`` (``tar xzf -x.tar.gz``
    reads an option). A model name with no such character (``模型``) becomes ``model-`` plus the first 8 hex digits of
    its sha256, so two such names do not share a file name."""
    import hashlib

    from ..core.store import redact_text

    def slug(v: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", v).strip("-.")

    raw = redact_text(cfg.model.name)
    name = slug(raw) or f"model-{hashlib.sha256(raw.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    q = cfg.quant
    variant = slug(str(q.recipe)) + (f"-kv{slug(str(q.kv_cache_dtype))}" if q.kv_cache_dtype not in (None, "none") else "")
    return f"{name}-{variant}-{slug(redact_text(str(cfg.package.version))) or 'v'}"


def invocation_id(ctx: StageContext) -> str:
    """This package stage's invocation id: the cache key of its key document. It is the provenance's
    ``invocationId`` and the repository's ``pipeline_package_id`` (:func:`pipeline.package.repository.stamp_package_id`)."""
    from ..core.contracts.manifest import ArtifactManifest
    from ..core.store import cache_key

    return cache_key(ArtifactManifest.from_json(ctx.manifest).key_document)


def release_archive(ctx: StageContext, repo: Path, name: str, manifest: dict[str, Any]) -> ReleaseArchive:
    """``release/<name>.tar.gz`` (repository, manifest, parity records) with its manifest copy, the provenance
    statement, SHA256SUMS and, when ``package.sign`` is on, the signature ``release.sig`` over all of them; returns
    the result fields ``archive``, ``archive_sha256``, ``provenance`` and ``signature`` (null when unsigned)."""
    from ..core.store import write_json_atomic
    from ..release.archive import make_archive, write_sha256sums
    from ..release.signing import method, sign_release

    out = ctx.out
    assert out is not None
    rel = out / PackageArtifact.RELEASE_DIR
    rel.mkdir()
    write_json_atomic(rel / PackageArtifact.RELEASE_MANIFEST, manifest)
    archive = rel / f"{name}.tar.gz"
    members = [
        (repo, f"{name}/{PackageArtifact.MODEL_REPOSITORY}"),
        (out / PackageArtifact.RELEASE_MANIFEST, f"{name}/{PackageArtifact.RELEASE_MANIFEST}"),
    ]
    members += _parity_members(out, name)
    if (out / "servers").is_dir():  # PyTorch backend: trtllm-serve / trtllm-bench / AIPerf files (llmapi_options)
        members.append((out / "servers", f"{name}/servers"))
    sha = make_archive(archive, members)
    listed = [
        archive,
        rel / PackageArtifact.RELEASE_MANIFEST,
        *_provenance(ctx, rel, archive, manifest),
        *_sbom(rel, archive, sha, manifest),
    ]
    write_sha256sums(rel / PackageArtifact.SHA256SUMS, listed)
    signed = sign_release(rel, ctx.cfg.package) if method(ctx.cfg.package) else None
    return ReleaseArchive(
        archive=f"release/{archive.name}",
        archive_sha256=sha,
        provenance=f"release/{PackageArtifact.PROVENANCE}",
        signature=f"release/{PackageArtifact.SIGNATURE}" if signed else None,
        signed_by=signed,
    )


def _sbom(rel: Path, archive: Path, sha: str, manifest: dict[str, Any]) -> list[Path]:
    """``release/sbom.cdx.json``: CycloneDX SBOM of the serving environment (pipeline/package/sbom.py); [] when that
    environment cannot be inspected on this host."""
    from ..core.store import write_json_atomic
    from .sbom import build_sbom, serving_components

    comps = serving_components(str(manifest["build"]["target"]), ReleaseManifest.from_json(manifest).serving_image)
    if comps is None:
        return []
    write_json_atomic(rel / PackageArtifact.SBOM, build_sbom(archive.name.removesuffix(".tar.gz"), sha, comps))
    return [rel / PackageArtifact.SBOM]


def _provenance(ctx: StageContext, rel: Path, archive: Path, manifest: dict[str, Any]) -> list[Path]:
    """``release/provenance.intoto.json`` (in-toto Statement, SLSA v1 predicate: pipeline/release/provenance.py) and,
    when signing with a key or certificate, its DSSE envelope ``provenance.intoto.dsse.json``; returns the files."""
    import dataclasses

    from ..core.hostinfo import host
    from ..core.store import redact, write_json_atomic
    from ..release.provenance import build_statement
    from ..release.signing import dsse_sign, method

    config = redact(json.loads(json.dumps(dataclasses.asdict(ctx.cfg), default=str)))
    config.pop("store_dir", None)  # where the artifacts are kept, not what they hold: a rebuild elsewhere has the same statement
    statement = build_statement(
        rel,
        archive,
        config=config,
        upstream=ctx.inputs,
        invocation_id=invocation_id(ctx),
        versions=manifest["versions"],
        host=host(),
        gate=manifest["evaluation"]["gate"],
        parity=manifest["parity"],
    )
    files = [rel / PackageArtifact.PROVENANCE]
    write_json_atomic(files[0], statement)
    if method(ctx.cfg.package) in ("key", "certificate"):
        files.append(rel / PackageArtifact.PROVENANCE_DSSE)
        write_json_atomic(files[1], dsse_sign(files[0].read_bytes(), ctx.cfg.package))
    return files


def _parity_members(out: Path, name: str) -> list[tuple[Path, str]]:
    """The parity requests + expected answers travel in the release, so the check can run on the serving host."""
    from ..serve.parity import EXPECTED_FILE

    return [(out / EXPECTED_FILE, f"{name}/{EXPECTED_FILE}")] if (out / EXPECTED_FILE).is_file() else []
