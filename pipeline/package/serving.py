"""How the packaged model is served: the repository settings with the model's label and the checkpoint's decoding
policy (:func:`serving_settings`), the serving image's TensorRT-LLM version (:func:`image_trtllm`), a PyTorch-backend
package's ``servers/`` files (:func:`write_server_files`), the acceptance-first speculative decision
(:func:`speculative_decision`) and the served-parity check (:func:`served_parity`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.contracts.build import BuildInfo, SpeculativeBuild
from ..core.contracts.export import ExportArtifact, ModelInfo
from ..core.stage import StageContext

if TYPE_CHECKING:
    from .repository import Settings


def speculative_decision(ctx: StageContext, build_info: BuildInfo) -> dict[str, Any] | None:
    """Acceptance-first decision for a speculative build (``pipeline.package.trtllm_config.decide_speculative``)."""
    from .trtllm_config import decide_speculative, read_measurement, speculative_of

    if build_info.target != "tensorrt_llm":
        return None
    sp = SpeculativeBuild.from_json(speculative_of(build_info, ctx.cfg.build))
    ev = ctx.upstream("evaluate")
    dec = decide_speculative(
        sp.mode,
        read_measurement(ev.path if ev is not None else None),
        ctx.cfg.package.speculative,
        draft_model_path=sp.draft_model_path,
        max_draft_len=sp.max_draft_len,
    )
    if dec.override:
        ctx.log.warning("speculative decoding enabled by override: %s", dec.reason)
    return dec.to_json()


def serving_settings(ctx: StageContext, bi: BuildInfo, mi: ModelInfo) -> Settings:
    """The repository settings (:func:`pipeline.package.repository.settings_from_build`) with the model's label and
    the checkpoint's decoding policy; warns when the TensorRT-LLM ensemble cannot apply that policy by default."""
    from ..core.store import redact_text
    from .repository import settings_from_build

    cfg = ctx.cfg
    settings = settings_from_build(bi, mi, cfg.package, cfg.build, cfg.target)
    settings.model_name = redact_text(cfg.model.name)  # a label written into the repository, not a path
    policy = ExportArtifact(ctx.inputs["export"].path).decoding()
    settings.decoding = policy.to_json()
    if settings.target == "tensorrt_llm" and policy.repetition_penalty != 1.0:
        # NVIDIA's ensemble has no default for it: only requests that send it (the OpenAI endpoint does) get the policy
        settings.decoding["served_default"] = "sent by pipeline serve --openai only; gRPC clients must send repetition_penalty"
        ctx.log.warning(
            "decoding policy: repetition_penalty=%s is applied by evaluate, but the TensorRT-LLM ensemble applies it only "
            "when a request sends it (the OpenAI endpoint does; gRPC clients must send repetition_penalty)",
            settings.decoding["repetition_penalty"],
        )
    return settings


def image_trtllm(image: str | None) -> str | None:
    """The TensorRT-LLM version of the serving image ``image`` (:func:`pipeline.facts.versions.image_versions`)."""
    from ..facts import versions as V

    img = V.image_versions(image or "")
    return str(img["tensorrt_llm"]) if img else None


def write_server_files(ctx: StageContext, repo: Path, settings: Any, engine_dir: Path, image: str | None) -> dict[str, Any]:
    """``servers/`` of a PyTorch-backend package (:func:`pipeline.package.llmapi_options.write_servers`), preflighted
    for the serving image's TensorRT-LLM; the manifest's ``serving.servers``."""
    from .llmapi_options import write_servers

    assert ctx.out is not None
    version = image_trtllm(image)
    return {
        **write_servers(ctx.out, repo, settings, engine_dir, bench_cfg=ctx.cfg.benchmark, trtllm_version=version),
        "tensorrt_llm": version,
    }


def served_parity(ctx: StageContext, repo: Path, target: str, package_id: str) -> dict[str, Any]:
    """Serving parity (``pipeline.serve.parity``): served answers == evaluated answers, or GateFailed (exit 3)."""
    from ..serve.parity import run_parity

    assert ctx.out is not None
    return run_parity(ctx.out, repo, ctx.inputs["evaluate"].path, target=target, cfg=ctx.cfg, log=ctx.log, package_id=package_id)
