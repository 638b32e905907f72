"""``release_manifest.json`` (schema ``pipeline.release_manifest/v1``, :func:`release_manifest`): model, quant and build
settings, the gate and what it judged, the serving layout, parity, migration, signing, versions and the digests of
every source and repository file. :data:`LIBRARIES`: the packaging libraries whose versions it records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.contracts.build import BuildInfo
from ..core.contracts.export import ModelInfo
from ..core.contracts.package import PackageArtifact
from ..core.stage import StageContext

LIBRARIES = ("tritonclient", "protobuf", "onnxruntime-genai", "tokenizers")


def release_manifest(
    ctx: StageContext,
    name: str,
    settings: Any,
    bi: BuildInfo,
    mi: ModelInfo,
    gate: dict[str, Any],
    speculative: dict[str, Any] | None,
    info: dict[str, Any],
    parity: dict[str, Any],
    serving_image: str | None,
    limits: dict[str, Any],
    engine_dir: Path,
) -> dict[str, Any]:
    """``release_manifest.json`` (schema ``pipeline.release_manifest/v1``) before redaction: model, quant and build
    settings, gate, serving layout, parity, versions and the digests of every source and repository file."""
    from ..core.config.common import key_fields
    from ..core.hostinfo import library_versions
    from ..core.store import digest_files, tree_files
    from ..release.signing import signer_identity

    cfg, pc = ctx.cfg, ctx.cfg.package
    build, export = ctx.inputs["build"], ctx.inputs["export"]
    assert ctx.out is not None
    repo = ctx.out / "model_repository"
    repo_files = tree_files(repo)
    return {
        "schema": "pipeline.release_manifest/v1",
        "name": name,
        "version": pc.version,
        "model": {
            "name": cfg.model.name,
            "architecture": mi.architecture,
            "num_parameters": mi.num_parameters,
            "dtype": mi.dtype,
            "eos_token_ids": list(mi.eos_token_ids),
            "pad_token_id": mi.pad_token_id,
        },
        "quant": key_fields(cfg.quant),
        "build": {
            "target": settings.target,
            "backend": settings.backend if settings.target == "tensorrt_llm" else None,
            "limits": dict(bi.limits or limits),
            "knobs": key_fields(cfg.build),
            "execution_provider": settings.execution_provider if settings.target == "onnxruntime_genai" else None,
        },
        "evaluation": {
            "gate": gate,
            "headline": (ctx.inputs["evaluate"].result.headline or None) if "evaluate" in ctx.inputs else None,
            **_evaluated_what(ctx, settings, bi),
        },
        "decoding": settings.decoding,  # the policy evaluate applied and the served model applies (pipeline.core.decoding)
        "speculative": speculative,
        "serving": {
            "layout": info["layout"],
            "models": info["models"],
            "ensemble": "ensemble",  # llmapi layout: the adapter over the LLM-API model (pipeline/package/llmapi_adapter.py)
            "engine_model": settings.engine_model,
            "decoupled": settings.decoupled,
            "triton_max_batch_size": 0 if info["layout"] == "llmapi" else settings.triton_max_batch_size,
            "servers": info["servers"] if info["layout"] == "llmapi" else None,  # the stage writes them for this layout
            "exclude_input_in_output": settings.exclude_input_in_output,
            "end_id": settings.end_id,
            "pad_id": settings.pad_id,
            "serving_image": serving_image if settings.target == "tensorrt_llm" else None,
        },
        "parity": parity,
        "migration": _migration(ctx),
        "signing": signer_identity(pc),
        "provenance": PackageArtifact.PROVENANCE if pc.archive else None,
        "versions": {"engine": dict(bi.versions), "packaging": library_versions(LIBRARIES)},
        "sources": {
            "export": export.digest,
            "build": build.digest,
            "evaluate": ctx.inputs["evaluate"].digest if "evaluate" in ctx.inputs else None,
            "engine": digest_files(tree_files(engine_dir)),
            "model_repository": digest_files(repo_files),
        },
        "repository_files": {rel: m["sha256"] for rel, m in sorted(repo_files.items())},  # checked by `pipeline serve x.tar.gz`
    }


def _evaluated_what(ctx: StageContext, settings: Any, bi: BuildInfo) -> dict[str, Any]:
    """The manifest's record of *what* the gate judged: the evaluate stage's candidate runner and why it was chosen,
    and, for a TensorRT-LLM package built on a host without a GPU (``target=tensorrt_llm_pytorch target.gpu=...``),
    that the served engine has not run yet: the GPU host runs the served-parity command (``parity.command``)."""
    from ..core.contracts.evaluate import EvalArtifact

    out: dict[str, Any] = {"candidate": None, "candidate_note": None, "gpu_host_check": None}
    ev = ctx.upstream("evaluate")
    if ev is not None and EvalArtifact(ev.path).report_path.is_file():
        rep = EvalArtifact(ev.path).report()
        out["candidate"], out["candidate_note"] = rep.candidate, rep.candidate_note
    out["warning"] = simulated_candidate_warning(out["candidate"])
    if settings.target == "tensorrt_llm" and not bi.gpus:
        from ..serve.parity import command_for

        judged = "ModelOpt's simulated-quantization model (PyTorch, CPU)" if out["candidate"] == "simulated" else out["candidate"]
        out["gpu_host_check"] = (
            f"packaged on a host without a GPU for target.gpu={ctx.cfg.target.gpu}: the gate judged {judged}; TensorRT-LLM "
            f"has not run this checkpoint. On the GPU host, serve the package and run `{command_for()}`."
        )
    return out


def simulated_candidate_warning(candidate: str | None) -> str | None:
    """The warning of a package whose gate judged ModelOpt's simulated model (``eval.candidate=auto`` on a host that
    cannot run the engine: the documented TensorRT-LLM forward path without a GPU), not the engine it ships; None
    otherwise.  An explicit ``eval.candidate=simulated`` never gets here (:mod:`pipeline.package.checks` refuses it)."""
    if candidate != "simulated":
        return None
    return (
        "the release gate judged ModelOpt's simulated-quantization model, not the engine this package ships "
        "(eval.candidate=auto could not run the engine here); the engine has not been measured against the eval set. "
        "Fix: run the served-parity check on a host that runs the engine, or evaluate with eval.candidate=engine there."
    )


def _migration(ctx: StageContext) -> dict[str, Any] | None:
    """``pipeline migrate``: the engine release this package replaces (``pipeline.package.migrate.migration_record``)."""
    if not ctx.cfg.package.migrated_from:
        return None
    from ..core.config.common import key_fields
    from .migrate import migration_record

    return migration_record(
        ctx.cfg.package.migrated_from,
        export_digest=ctx.inputs["export"].digest,
        build_dir=ctx.inputs["build"].path,
        quant=key_fields(ctx.cfg.quant),
    )
