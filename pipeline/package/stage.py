"""Package stage: Triton model repository + reproducible release archive + release manifest.

Inputs: ``export`` (tokenizer, ``model_info.json``), ``build`` (``engine/``, ``build_info.json``), ``evaluate``
(gate verdict).  Writes (``docs/artifacts.md``)::

    model_repository/            ensemble, preprocessing, <engine model>, postprocessing (docs/package.md)
    release/<model>-<recipe>-<version>.tar.gz, release/release_manifest.json, release/SHA256SUMS
    release_manifest.json

Refuses (``GateFailed``, exit 3) an artifact whose evaluation gate failed unless ``package.allow_failed_gate=true``,
which is recorded in the manifest.  The repository is validated (:mod:`pipeline.package.validate`) before any
release file is written; a problem raises ``InputError`` (exit 2) or ``PreflightError`` (exit 4, version mismatch).

This module is the adapter (``STAGE``) and the order of the steps (:func:`package`); each step lives in its own module:
:mod:`.gate` (the refusal), :mod:`.serving` (settings, servers, speculative decision, served parity),
:mod:`.repository` and :mod:`.validate` (the Triton repository), :mod:`.manifest` (``release_manifest.json``) and
:mod:`.release` (the release name, archive, provenance, SBOM and signature).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..core.contracts.build import BuildArtifact
from ..core.contracts.export import ExportArtifact, ModelInfo
from ..core.contracts.package import PackageArtifact, PackageResult, ParityRecord
from ..core.stage import Stage, StageContext
from ..errors import InputError
from .checks import checks
from .gate import release_gate
from .manifest import LIBRARIES, release_manifest
from .release import invocation_id, release_archive, release_name
from .serving import image_trtllm, served_parity, serving_settings, speculative_decision, write_server_files


def model_info(export_dir: Path) -> ModelInfo:
    """``model_info.json`` of the export artifact (:meth:`pipeline.core.contracts.export.ExportArtifact.model_info`)."""
    return ExportArtifact(export_dir).model_info()


def package(ctx: StageContext) -> PackageResult:
    """Generate, validate and release (see module docstring). Returns the stage result."""
    from ..core.store import redact, write_json_atomic
    from .repository import generate_repository
    from .validate import check_repository

    cfg, pc = ctx.cfg, ctx.cfg.package
    assert ctx.out is not None
    gate = release_gate(ctx)
    build, export = ctx.inputs["build"], ctx.inputs["export"]
    bi = BuildArtifact(build.path).build_info()
    if not bi.recorded:
        raise InputError(f"{build.path}/build_info.json is missing. Fix: rebuild with the build stage.")
    engine_dir = BuildArtifact(build.path).engine_dir
    if not engine_dir.is_dir():
        raise InputError(f"{engine_dir} is missing: the build artifact has no engine. Fix: rebuild with the build stage.")
    mi = model_info(export.path)
    settings = serving_settings(ctx, bi, mi)
    speculative = speculative_decision(ctx, bi)
    repo = ctx.out / "model_repository"
    package_id = invocation_id(ctx)
    serving_image = pc.serving_image or cfg.target.serving_image
    with ctx.progress("package: model repository", total=3) as advance:
        info = generate_repository(
            repo,
            settings,
            engine_dir=engine_dir,
            tokenizer_dirs=[export.path / "hf", engine_dir],
            trtllm_version=image_trtllm(serving_image),
            package_id=package_id,
        )
        advance(1)
        if info["layout"] == "llmapi":  # trtllm-serve + trtllm-bench/AIPerf files from the same LLM-API options
            info["servers"] = write_server_files(ctx, repo, settings, engine_dir, serving_image)
        limits = {
            "max_batch_size": settings.engine_max_batch_size,
            "max_input_len": settings.max_input_len,
            "max_seq_len": settings.max_seq_len,
            "max_beam_width": settings.max_beam_width,
        }
        check_repository(repo, limits=limits, target=settings.target, build_info=bi, serving_image=serving_image, streaming=pc.decoupled)
        advance(1)
        parity = served_parity(ctx, repo, settings.target, package_id)
        # serving the staged repository must not change it: bytecode caches would make the archive depend on when
        # it was served (the server runs with PYTHONDONTWRITEBYTECODE=1; this also covers a stub that ignores it)
        for cache in sorted(repo.rglob("__pycache__"), reverse=True):
            shutil.rmtree(cache)
        name = release_name(cfg)
        manifest = release_manifest(ctx, name, settings, bi, mi, gate, speculative, info, parity, serving_image, limits, engine_dir)
        if manifest["evaluation"]["warning"]:
            ctx.console.print(f"[bold red]warning:[/] package: {manifest['evaluation']['warning']}")
        manifest = redact(manifest)  # the one redaction (pipeline.core.store.redact) at every place the config is written
        write_json_atomic(ctx.out / PackageArtifact.RELEASE_MANIFEST, manifest)
        release = release_archive(ctx, repo, name, manifest) if pc.archive else None
        advance(1)
    p = ParityRecord.from_json(parity) or ParityRecord()
    headline = {
        "target": settings.target,
        "models": len(info["models"]),
        "archive": release.archive if release is not None else "-",
        "gate": "override" if gate["override"] else "pass",
        "served == evaluated": f"{p.matched}/{p.total}" if p.total is not None else p.status,
    }
    return PackageResult(
        headline=headline,
        repository=PackageArtifact.MODEL_REPOSITORY,
        models=info["models"],
        target=settings.target,
        decoupled=settings.decoupled,
        gate_override=gate["override"],
        parity=parity,
        release=release,
    )


def _key_extras(cfg: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    from ..core.store import digest_path
    from ..release.signing import signer_identity
    from .repository import MODELS_SRC, TEMPLATES

    # the templates and the Python-backend model code are part of the output bytes
    return {
        "templates": digest_path(TEMPLATES),
        "serving_models": digest_path(MODELS_SRC),
        "llmapi_adapter": digest_path(Path(__file__).resolve().with_name("llmapi_adapter.py")),  # tensor_map.json
        "serving_image": cfg.package.serving_image or cfg.target.serving_image,
        "model_name": cfg.model.name,
        "signing": signer_identity(cfg.package),  # method + the signer's public key digest, never the key's path
        "migrated_from": _migrated_from_digest(cfg.package.migrated_from),  # the engine release's manifest, not its path
    }


def _migrated_from_digest(release_dir: str | None) -> str | None:
    from ..core.store import sha256_file

    if not release_dir:
        return None
    p = Path(release_dir) / PackageArtifact.RELEASE_MANIFEST
    return sha256_file(p) if p.is_file() else None


def _dry_run(ctx: StageContext) -> dict[str, Any]:
    ctx.console.print(
        f"package: would write model_repository/ and release/{release_name(ctx.cfg)}.tar.gz "
        f"(decoupled={ctx.cfg.package.decoupled}, max_batch_size={ctx.cfg.package.max_batch_size or 'engine'})"
    )
    return {"headline": {"archive": f"release/{release_name(ctx.cfg)}.tar.gz"}}


STAGE = Stage(
    name="package",
    checks=checks,
    deps=("export", "build", "evaluate"),
    config_groups=("package", "quant", "parallel", "build"),  # the manifest records quant recipe and build knobs
    libraries=LIBRARIES,
    run=package,
    version="2",  # 2: release/ holds the provenance statement, the SBOM and (package.sign) the signature
    key_extras=_key_extras,
    dry_run=_dry_run,
)
