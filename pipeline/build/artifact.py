"""The build stage's artifact: file names and readers of ``artifacts/build/<key>/``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from ..core.artifacts import _read_json


@dataclasses.dataclass(frozen=True)
class BuildArtifact:
    """Build stage output: the engine folder, ``build_info.json`` and the builder's log."""

    path: Path
    ENGINE_DIR: ClassVar[str] = "engine"
    BUILD_INFO: ClassVar[str] = "build_info.json"
    BUILD_LOG: ClassVar[str] = "build.log"
    ENGINE_LIMITS: ClassVar[str] = "engine_limits.json"
    """Inside ``engine/`` (onnxruntime_genai): the limits its runtime config has no key for."""
    LLM_API_OPTIONS: ClassVar[str] = "llm_api_options.yaml"
    """Inside ``engine/`` (tensorrt_llm, PyTorch backend): the ``LLM()`` keyword arguments, next to ``engine/hf/``."""
    DRAFT_ENGINE_DIR: ClassVar[str] = "draft_engine"
    """Next to ``engine/`` (tensorrt_llm, draft-model speculative decoding): the draft model's engine."""
    DRAFT_BUILD_LOG: ClassVar[str] = "build_draft.log"
    """trtllm-build's log of the draft engine."""
    FILES: ClassVar[tuple[str, ...]] = (
        "engine/",
        "build_info.json",
        "build.log",
        "engine_limits.json",
        "llm_api_options.yaml",
        "draft_engine/",
        "build_draft.log",
    )
    LIMIT_KEYS: ClassVar[tuple[str, ...]] = ("max_input_len", "max_seq_len", "max_batch_size")

    @property
    def engine_dir(self) -> Path:
        return self.path / self.ENGINE_DIR

    @property
    def build_info_path(self) -> Path:
        return self.path / self.BUILD_INFO

    @property
    def build_log_path(self) -> Path:
        return self.path / self.BUILD_LOG

    def build_info(self) -> dict[str, Any]:
        """``build_info.json`` (``{}`` when absent). Raises :class:`InputError` when it is corrupt."""
        return _read_json(self.build_info_path, "rebuild with the build stage (force=true stages=[build])")

    def limits(self, result: dict[str, Any] | None = None, build_cfg: Any = None) -> dict[str, Any]:
        """Engine limits (``max_input_len``, ``max_seq_len``, ``max_batch_size``, tokens): ``build_info.json``
        ``limits``, else the manifest ``result`` ``limits``, each missing key from ``build_cfg`` (``cfg.build``)."""
        limits = dict(self.build_info().get("limits") or {})
        if not limits and result:
            limits = dict(result.get("limits") or {})
        if build_cfg is not None:
            for k in self.LIMIT_KEYS:
                limits.setdefault(k, getattr(build_cfg, k))
        return limits


def target_of(build_art: Any, default: str) -> str:
    """The target a build artifact (a :class:`pipeline.core.store.Artifact` or ``None``) was built for:
    ``build_info.json`` ``target``, else its manifest headline's, else ``default`` (the configured name)."""
    if build_art is None:
        return default
    bi = BuildArtifact(build_art.path).build_info()
    head = build_art.result.get("headline") or {}
    return str(bi.get("target") or head.get("target") or default)
