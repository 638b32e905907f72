"""Package stage: Triton model repository + reproducible release archive + release manifest.

Inputs: ``export`` (tokenizer, ``model_info.json``), ``build`` (``engine/``, ``build_info.json``), ``evaluate``
(gate verdict).  Writes (``docs/artifacts.md``)::

    model_repository/            ensemble, preprocessing, <engine model>, postprocessing (docs/package.md)
    release/<model>-<recipe>-<version>.tar.gz, release/release_manifest.json, release/SHA256SUMS
    release_manifest.json

Refuses (``GateFailed``, exit 3) an artifact whose evaluation gate failed unless ``package.allow_failed_gate=true``,
which is recorded in the manifest.  The repository is validated (:mod:`pipeline.package.validate`) before any
release file is written; a problem raises ``InputError`` (exit 2) or ``PreflightError`` (exit 4, version mismatch).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.contracts.build import BuildArtifact, BuildInfo
from ..core.contracts.evaluate import EvalResult
from ..core.contracts.export import ExportArtifact, ModelInfo
from ..core.contracts.package import PackageArtifact, PackageResult, ReleaseArchive, ReleaseGate
from ..core.stage import Stage, StageContext
from ..errors import GateFailed, InputError

if TYPE_CHECKING:
    from .repository import Settings

LIBRARIES = ("tritonclient", "protobuf", "onnxruntime-genai", "tokenizers")


def model_info(export_dir: Path) -> ModelInfo:
    """``model_info.json`` of the export artifact (:meth:`pipeline.core.contracts.export.ExportArtifact.model_info`)."""
    return ExportArtifact(export_dir).model_info()


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


def _gate(ctx: StageContext) -> dict[str, Any]:
    """The release manifest's ``evaluation.gate`` (:class:`~pipeline.core.contracts.package.ReleaseGate`) from the evaluate
    input's verdict. Raises :class:`GateFailed` (exit 3) for a verdict that did not pass, unless
    ``package.allow_failed_gate``."""
    ev = ctx.inputs.get("evaluate")
    gate = ev.result_as(EvalResult).gate if ev is not None else None
    if gate is not None and gate.passed:
        return ReleaseGate(gate, override=False).to_json()
    reason = _first_scopes(gate.reason if gate is not None else "no evaluation verdict")
    if not ctx.cfg.package.allow_failed_gate and gate is not None and gate.inconclusive:
        fix = gate.fix or (
            "the gate is INCONCLUSIVE, not failed: the eval set is too small to show non-inferiority. Fix: a larger "
            "eval set (eval.eval_set), an explicit allowance (eval.gate.max_drop / eval.gate.slice_max_drop), or "
            "eval.gate.mode=exploratory"
        )
        # the gate's fix already explains the verdict scope by scope: the reason is then not repeated
        fix = _first_scopes(fix).rstrip(". ")
        if "package.allow_failed_gate" not in fix:
            fix += "; or override explicitly with package.allow_failed_gate=true (recorded in release_manifest.json)"
        why = "" if gate.fix else f" ({reason})"
        raise GateFailed(f"package: refusing to package an artifact whose evaluation gate is inconclusive{why}: {fix}.")
    if not ctx.cfg.package.allow_failed_gate:
        raise GateFailed(
            f"package: refusing to package an artifact whose evaluation gate failed ({reason}). "
            f"Fix: improve the candidate (recipe, calibration), or override explicitly with package.allow_failed_gate=true "
            f"(recorded in release_manifest.json)."
        )
    ctx.log.warning(
        "packaging despite %s evaluation gate (%s): package.allow_failed_gate=true",
        "an inconclusive" if gate is not None and gate.inconclusive else "a failed",
        reason,
    )
    verdict = "was inconclusive" if gate is not None and gate.inconclusive else "failed"
    return ReleaseGate(
        gate, override=True, override_note=f"package.allow_failed_gate=true: packaged although the evaluation gate {verdict}"
    ).to_json()


def _first_scopes(text: str, keep: int = 1) -> str:
    """A gate reason or fix with only its first ``keep`` slice scopes (the gate lists every scope, "; slice:<name>"
    after "; slice:<name>"; the evaluate stage has printed them all and eval_report.json keeps them). Every
    ``overall`` part is kept, wherever it stands (a failed ``overall min_top1`` after the slices' ``max_drop`` is the
    reason the gate failed), and so is the text after the last elided part's ". Fix:"."""
    parts = re.split(r"; (?=(?:overall|slice:\S+) )", text)
    elided = [i for i, p in enumerate(parts) if p.startswith("slice:")][keep:]
    if not elided:
        return text
    m = re.search(r"\. Fix: .*$", parts[-1], re.S) if elided[-1] == len(parts) - 1 else None
    kept = "; ".join(p for i, p in enumerate(parts) if i not in elided)
    return f"{kept}; and {len(elided)} more slice(s) (eval_report.json)" + (m.group(0) if m else "")


def _speculative(ctx: StageContext, build_info: BuildInfo) -> dict[str, Any] | None:
    """Acceptance-first decision for a speculative build (``pipeline.package.trtllm_config.decide_speculative``)."""
    from .trtllm_config import decide_speculative, read_measurement, speculative_of

    if build_info.target != "tensorrt_llm":
        return None
    sp = speculative_of(build_info, ctx.cfg.build)
    ev = ctx.inputs.get("evaluate")
    dec = decide_speculative(
        sp["mode"],
        read_measurement(ev.path if ev is not None else None),
        ctx.cfg.package.speculative,
        draft_model_path=sp.get("draft_model_path"),
        max_draft_len=sp.get("max_draft_len"),
    )
    if dec.override:
        ctx.log.warning("speculative decoding enabled by override: %s", dec.reason)
    return dec.to_json()


def package(ctx: StageContext) -> PackageResult:
    """Generate, validate and release (see module docstring). Returns the stage result."""
    from ..core.store import redact, write_json_atomic
    from .repository import generate_repository
    from .validate import check_repository

    cfg, pc = ctx.cfg, ctx.cfg.package
    assert ctx.out is not None
    gate = _gate(ctx)
    build, export = ctx.inputs["build"], ctx.inputs["export"]
    bi = BuildArtifact(build.path).build_info()
    if not bi.recorded:
        raise InputError(f"{build.path}/build_info.json is missing. Fix: rebuild with the build stage.")
    engine_dir = BuildArtifact(build.path).engine_dir
    if not engine_dir.is_dir():
        raise InputError(f"{engine_dir} is missing: the build artifact has no engine. Fix: rebuild with the build stage.")
    mi = model_info(export.path)
    settings = _settings(ctx, bi, mi)
    speculative = _speculative(ctx, bi)
    repo = ctx.out / "model_repository"
    package_id = _invocation_id(ctx)
    serving_image = pc.serving_image or cfg.target.serving_image
    with ctx.progress("package: model repository", total=3) as advance:
        info = generate_repository(
            repo,
            settings,
            engine_dir=engine_dir,
            tokenizer_dirs=[export.path / "hf", engine_dir],
            trtllm_version=_image_trtllm(serving_image),
            package_id=package_id,
        )
        advance(1)
        if info["layout"] == "llmapi":  # trtllm-serve + trtllm-bench/AIPerf files from the same LLM-API options
            info["servers"] = _servers(ctx, repo, settings, engine_dir, serving_image)
        limits = {
            "max_batch_size": settings.engine_max_batch_size,
            "max_input_len": settings.max_input_len,
            "max_seq_len": settings.max_seq_len,
            "max_beam_width": settings.max_beam_width,
        }
        check_repository(repo, limits=limits, target=settings.target, build_info=bi, serving_image=serving_image, streaming=pc.decoupled)
        advance(1)
        parity = _parity(ctx, repo, settings.target, package_id)
        # serving the staged repository must not change it: bytecode caches would make the archive depend on when
        # it was served (the server runs with PYTHONDONTWRITEBYTECODE=1; this also covers a stub that ignores it)
        for cache in sorted(repo.rglob("__pycache__"), reverse=True):
            shutil.rmtree(cache)
        name = release_name(cfg)
        manifest = _release_manifest(ctx, name, settings, bi, mi, gate, speculative, info, parity, serving_image, limits, engine_dir)
        manifest = redact(manifest)  # the one redaction (pipeline.core.store.redact) at every place the config is written
        write_json_atomic(ctx.out / PackageArtifact.RELEASE_MANIFEST, manifest)
        release = _release_archive(ctx, repo, name, manifest) if pc.archive else None
        advance(1)
    headline = {
        "target": settings.target,
        "models": len(info["models"]),
        "archive": release.archive if release is not None else "-",
        "gate": "override" if gate["override"] else "pass",
        "served == evaluated": f"{parity['matched']}/{parity['total']}" if parity.get("total") is not None else parity["status"],
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


def _invocation_id(ctx: StageContext) -> str:
    """This package stage's invocation id: the cache key of its key document. It is the provenance's
    ``invocationId`` and the repository's ``pipeline_package_id`` (:func:`pipeline.package.repository.stamp_package_id`)."""
    from ..core.store import cache_key

    return cache_key(ctx.manifest.get("key_document") or {})


def _settings(ctx: StageContext, bi: BuildInfo, mi: ModelInfo) -> Settings:
    """The repository settings (:func:`pipeline.package.repository.settings_from_build`) with the model's label and
    the checkpoint's decoding policy; warns when the TensorRT-LLM ensemble cannot apply that policy by default."""
    from ..core.store import redact_text
    from .repository import settings_from_build

    cfg = ctx.cfg
    settings = settings_from_build(bi, mi, cfg.package, cfg.build, cfg.target)
    settings.model_name = redact_text(cfg.model.name)  # a label written into the repository, not a path
    settings.decoding = ExportArtifact(ctx.inputs["export"].path).decoding().to_json()
    if settings.target == "tensorrt_llm" and settings.decoding.get("repetition_penalty", 1.0) != 1.0:
        # NVIDIA's ensemble has no default for it: only requests that send it (the OpenAI endpoint does) get the policy
        settings.decoding["served_default"] = "sent by pipeline serve --openai only; gRPC clients must send repetition_penalty"
        ctx.log.warning(
            "decoding policy: repetition_penalty=%s is applied by evaluate, but the TensorRT-LLM ensemble applies it only "
            "when a request sends it (the OpenAI endpoint does; gRPC clients must send repetition_penalty)",
            settings.decoding["repetition_penalty"],
        )
    return settings


def _image_trtllm(image: str | None) -> str | None:
    """The TensorRT-LLM version of the serving image ``image`` (:func:`pipeline.facts.versions.image_versions`)."""
    from ..facts import versions as V

    img = V.image_versions(image or "")
    return str(img["tensorrt_llm"]) if img else None


def _servers(ctx: StageContext, repo: Path, settings: Any, engine_dir: Path, image: str | None) -> dict[str, Any]:
    """``servers/`` of a PyTorch-backend package (:func:`pipeline.package.llmapi_options.write_servers`), preflighted
    for the serving image's TensorRT-LLM; the manifest's ``serving.servers``."""
    from .llmapi_options import write_servers

    assert ctx.out is not None
    version = _image_trtllm(image)
    return {
        **write_servers(ctx.out, repo, settings, engine_dir, bench_cfg=ctx.cfg.benchmark, trtllm_version=version),
        "tensorrt_llm": version,
    }


def _release_manifest(
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
            "servers": info.get("servers"),
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
    ev = ctx.inputs.get("evaluate")
    if ev is not None and EvalArtifact(ev.path).report_path.is_file():
        rep = EvalArtifact(ev.path).report()
        out["candidate"], out["candidate_note"] = rep.candidate, rep.candidate_note
    if settings.target == "tensorrt_llm" and not bi.gpus:
        from ..serve.parity import command_for

        judged = "ModelOpt's simulated-quantization model (PyTorch, CPU)" if out["candidate"] == "simulated" else out["candidate"]
        out["gpu_host_check"] = (
            f"packaged on a host without a GPU for target.gpu={ctx.cfg.target.gpu}: the gate judged {judged}; TensorRT-LLM "
            f"has not run this checkpoint. On the GPU host, serve the package and run `{command_for()}`."
        )
    return out


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


def _release_archive(ctx: StageContext, repo: Path, name: str, manifest: dict[str, Any]) -> ReleaseArchive:
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

    comps = serving_components(str(manifest["build"]["target"]), (manifest.get("serving") or {}).get("serving_image"))
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
        invocation_id=_invocation_id(ctx),
        versions=manifest.get("versions") or {},
        host=host(),
        gate=manifest["evaluation"]["gate"],
        parity=manifest.get("parity"),
    )
    files = [rel / PackageArtifact.PROVENANCE]
    write_json_atomic(files[0], statement)
    if method(ctx.cfg.package) in ("key", "certificate"):
        files.append(rel / PackageArtifact.PROVENANCE_DSSE)
        write_json_atomic(files[1], dsse_sign(files[0].read_bytes(), ctx.cfg.package))
    return files


def _parity(ctx: StageContext, repo: Path, target: str, package_id: str) -> dict[str, Any]:
    """Serving parity (``pipeline.serve.parity``): served answers == evaluated answers, or GateFailed (exit 3)."""
    from ..serve.parity import run_parity

    assert ctx.out is not None
    return run_parity(ctx.out, repo, ctx.inputs["evaluate"].path, target=target, cfg=ctx.cfg, log=ctx.log, package_id=package_id)


def _parity_members(out: Path, name: str) -> list[tuple[Path, str]]:
    """The parity requests + expected answers travel in the release, so the check can run on the serving host."""
    from ..serve.parity import EXPECTED_FILE

    return [(out / EXPECTED_FILE, f"{name}/{EXPECTED_FILE}")] if (out / EXPECTED_FILE).is_file() else []


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
    deps=("export", "build", "evaluate"),
    config_groups=("package", "quant", "parallel", "build"),  # the manifest records quant recipe and build knobs
    libraries=LIBRARIES,
    run=package,
    version="2",  # 2: release/ holds the provenance statement, the SBOM and (package.sign) the signature
    key_extras=_key_extras,
    dry_run=_dry_run,
)
