"""The build stage's artifact: file names and readers of ``artifacts/build/<key>/``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ..artifacts import FolderName, PathOf, StageArtifact, _read_json
from .result import Record, StageResult, json_object


class BuildArtifact(StageArtifact):
    """Build stage output: the engine folder, ``build_info.json`` and the builder's log."""

    ENGINE_DIR: ClassVar[str] = FolderName("engine")
    BUILD_INFO: ClassVar[str] = "build_info.json"
    BUILD_LOG: ClassVar[str] = "build.log"
    ENGINE_LIMITS: ClassVar[str] = "engine_limits.json"
    """Inside ``engine/`` (onnxruntime_genai): the limits its runtime config has no key for."""
    LLM_API_OPTIONS: ClassVar[str] = "llm_api_options.yaml"
    """Inside ``engine/`` (tensorrt_llm, PyTorch backend): the ``LLM()`` keyword arguments, next to ``engine/hf/``."""
    DRAFT_ENGINE_DIR: ClassVar[str] = FolderName("draft_engine")
    """Next to ``engine/`` (tensorrt_llm, draft-model speculative decoding): the draft model's engine."""
    DRAFT_BUILD_LOG: ClassVar[str] = "build_draft.log"
    """trtllm-build's log of the draft engine."""
    LIMIT_KEYS: ClassVar[tuple[str, ...]] = ("max_input_len", "max_seq_len", "max_batch_size")
    MEASUREMENTS: ClassVar[tuple[str, ...]] = ("build_s", "builder_peak_rss_bytes")
    """Measurements of the build run: recorded in ``manifest.json`` ``measurements``, not in ``build_info.json`` (whose
    bytes enter the artifact's content digest; a rebuild from the same inputs must have the same digest)."""

    engine_dir = PathOf(ENGINE_DIR)
    build_info_path = PathOf(BUILD_INFO)
    build_log_path = PathOf(BUILD_LOG)

    def build_info(self) -> BuildInfo:
        """``build_info.json`` as a :class:`BuildInfo` (``recorded`` False when the file is absent).

        Raises:
            InputError: the folder does not exist, the file is corrupt or a field has the wrong type.
        """
        fix = "rebuild with the build stage (force=true stages=[build])"
        self.require_folder("build")
        doc = _read_json(self.build_info_path, fix)
        if doc:  # the run's measurements live in the manifest (older artifacts: in build_info.json itself)
            measured = self.measurements()
            doc = {**{k: measured[k] for k in self.MEASUREMENTS if k in measured}, **doc}
        return BuildInfo.from_json(doc, source=self.build_info_path)

    def measurements(self) -> dict[str, Any]:
        """``manifest.json`` ``measurements``: what the run measured (wall times, peak memory), kept out of the files
        whose bytes make the artifact's content digest (pipeline/core/store.py); ``{}`` when not recorded."""
        try:
            doc = json.loads((self.path / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return json_object(json_object(doc).get("measurements"))

    def limits(self, result: BuildResult | Mapping[str, Any] | None = None, build_cfg: Any = None) -> dict[str, Any]:
        """Engine limits (``max_input_len``, ``max_seq_len``, ``max_batch_size``, tokens): ``build_info.json``
        ``limits``, else the stage result's ``limits`` (a :class:`BuildResult` or its JSON, the manifest's ``result``),
        each missing key from ``build_cfg`` (``cfg.build``)."""
        limits: dict[str, Any] = dict(self.build_info().limits)
        if not limits and result:
            res = BuildResult.from_json(result) if isinstance(result, Mapping) else result
            limits = dict(res.limits)
        if build_cfg is not None:
            for k in self.LIMIT_KEYS:
                limits.setdefault(k, getattr(build_cfg, k))
        return limits

    def engine_limits(self, result: BuildResult | Mapping[str, Any] | None = None, build_cfg: Any = None) -> EngineLimits:
        """:meth:`limits`, typed."""
        return EngineLimits.from_json(self.limits(result, build_cfg))


@dataclasses.dataclass(frozen=True)
class EngineLimits(Record):
    """The engine's limits (:meth:`BuildArtifact.limits`) as attributes; None where not recorded."""

    max_input_len: Any = None
    max_seq_len: Any = None
    max_batch_size: Any = None
    max_num_tokens: Any = None
    max_beam_width: Any = None


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """``build_info.json``: what the build stage built and decided (docs/build.md lists every field).

    Attributes:
        target: ``onnxruntime_genai`` | ``tensorrt_llm`` (None: not recorded).
        backend: the engine's backend (``onnxruntime_genai``; TensorRT-LLM ``tensorrt`` engine or ``pytorch``).
        execution_provider: onnxruntime-genai's (``cpu`` | ``cuda``); None for TensorRT-LLM.
        target_reason: why the build chose its target (``target=auto``).
        limits: the engine's limits in tokens and sequences (``max_input_len``, ``max_seq_len``, ``max_batch_size``;
            TensorRT-LLM also ``max_num_tokens``, ``max_beam_width``).
        versions: library -> version on the build host (``tensorrt_llm``, ``tensorrt``, ``onnxruntime-genai`` ...).
        gpus: the build host's GPUs (``pipeline.core.hostinfo.gpus`` records); empty on a CPU build.
        engine_bytes / build_s / builder_peak_rss_bytes: size of ``engine/`` (bytes), build wall time (s), the
            builder process's peak RSS (bytes; onnxruntime-genai's model builder only).
        knobs: the build settings recorded (target-specific: TensorRT-LLM ``build_config``, onnxruntime-genai
            ``extra_options`` ...).
        runtime: TensorRT-LLM: the runtime knobs the build decided (window, speculative decoding, CUDA graphs, KV).
        document: the whole file, for the target-specific sections recorded verbatim (``quantized_weights``,
            ``command``, ``graph_fixes``, ``llm_api_options`` ...).
    """

    target: str | None = None
    backend: str | None = None
    execution_provider: str | None = None
    target_reason: str | None = None
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    gpus: tuple[dict[str, Any], ...] = ()
    engine_bytes: int | None = None
    build_s: float | None = None
    builder_peak_rss_bytes: int | None = None
    knobs: dict[str, Any] = dataclasses.field(default_factory=dict)
    runtime: dict[str, Any] = dataclasses.field(default_factory=dict)
    document: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any], source: Path | str = "build_info.json") -> BuildInfo:
        """The document ``d`` (``{}``: nothing recorded); an older ``target: {"name": ...}`` is read as its name.

        Raises:
            InputError: a field has the wrong type, or a limit below 1 or a size or time below 0 (names ``source``,
                the field, the value, what was expected and the fix).
        """
        from ..artifacts import DocumentFields

        f = DocumentFields(source, "rebuild with the build stage (force=true stages=[build])")
        target = d.get("target")
        if isinstance(target, dict):
            target = target.get("name")
        f.get("target", target, str)
        host = f.get("host", d.get("host"), dict) or {}
        gpus = f.get("host.gpus", host.get("gpus"), list) or []
        for i, g in enumerate(gpus):
            f.get(f"host.gpus[{i}]", g, dict)
        limits = f.get("limits", d.get("limits"), dict) or {}
        for k, v in limits.items():  # tokens / sequences / beams: each recorded, and at least one
            if v is None:
                raise f.error(f"limits.{k}", v, "a positive integer")
            f.get(f"limits.{k}", v, int, minimum=1)
        versions = f.get("versions", d.get("versions"), dict) or {}
        return cls(
            target=target,
            backend=f.get("backend", d.get("backend"), str),
            execution_provider=f.get("execution_provider", d.get("execution_provider"), str),
            target_reason=f.get("target_reason", d.get("target_reason"), str),
            limits=dict(limits),
            versions={str(k): str(v) for k, v in versions.items() if v is not None},
            gpus=tuple(gpus),
            engine_bytes=f.get("engine_bytes", d.get("engine_bytes"), int, minimum=0),
            build_s=f.get("build_s", d.get("build_s"), (int, float), minimum=0),
            builder_peak_rss_bytes=f.get("builder_peak_rss_bytes", d.get("builder_peak_rss_bytes"), int, minimum=0),
            knobs=dict(f.get("knobs", d.get("knobs"), dict) or {}),
            runtime=dict(f.get("runtime", d.get("runtime"), dict) or {}),
            document=dict(d),
        )

    @property
    def recorded(self) -> bool:
        """Whether there was a ``build_info.json`` with anything in it."""
        return bool(self.document)

    def knob(self, name: str) -> Any:
        """A build or runtime knob by its build-config name (``pipeline/core/config/build.py``): ``knobs`` over
        ``runtime``; None when the build did not record it."""
        return self.knobs.get(name, self.runtime.get(name))

    @property
    def speculative(self) -> dict[str, Any]:
        """TensorRT-LLM: ``{"mode", "max_draft_len", "draft_model_path", "draft_engine"}`` of the build (empty when
        none was recorded)."""
        return dict(self.runtime.get("speculative") or {})

    @property
    def max_attention_window_size(self) -> int | None:
        """TensorRT-LLM: the sliding window the build decided (tokens); None for full attention."""
        v = self.runtime.get("max_attention_window_size")
        return int(v) if v is not None else None

    @property
    def tensorrt_llm_version(self) -> str | None:
        """The TensorRT-LLM the engine was built with (``versions``, under its import or its distribution name)."""
        return self.versions.get("tensorrt_llm") or self.versions.get("tensorrt-llm")

    @property
    def tensorrt_version(self) -> str | None:
        """The TensorRT the engine was built with (``tensorrt`` or its CUDA-specific distribution names)."""
        return self.versions.get("tensorrt") or self.versions.get("tensorrt-cu13") or self.versions.get("tensorrt-cu12")

    @property
    def kv_cache_free_gpu_mem_fraction(self) -> float | None:
        """TensorRT-LLM: the KV cache's share of free GPU memory the build recorded (0-1)."""
        v = self.runtime.get("kv_cache_free_gpu_mem_fraction")
        return float(v) if v is not None else None


def target_of(build_art: Any, default: str) -> str:
    """The target a build artifact (a :class:`pipeline.core.store.Artifact` or ``None``) was built for:
    ``build_info.json`` ``target``, else its manifest headline's, else ``default`` (the configured name)."""
    if build_art is None:
        return default
    bi = BuildArtifact(build_art.path).build_info()
    return str(bi.target or build_art.result.headline.get("target") or default)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildResult(StageResult):
    """The build stage's result (``manifest.json`` ``result``).

    Attributes:
        headline: ``target``, ``engine_mb`` (size of ``engine/``, MB).
        limits: the engine's limits (``build_info.json`` ``limits``).
        target: the resolved build target (``onnxruntime_genai`` | ``tensorrt_llm``).
        backend: the engine's backend (``build_info.json`` ``backend``).
        target_reason: why the target was chosen (``target=auto``).
    """

    limits: dict[str, Any] = dataclasses.field(default_factory=dict)
    target: str | None = None
    backend: str | None = None
    target_reason: str | None = None


@dataclasses.dataclass(frozen=True)
class BuildPlan(Record):
    """What a target's ``plan`` says its build would do (dry runs): the build command (None: no engine is built) and,
    for TensorRT-LLM's PyTorch backend, the ``LLM()`` options it would write (None otherwise)."""

    command: list[Any] | None = None
    llm_api_options: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class SpeculativeBuild(Record):
    """TensorRT-LLM: the build's speculative decoding (:attr:`BuildInfo.speculative`, else ``build.speculative``): its
    ``mode`` (``none``: not recorded), the draft length and the draft model (None where not recorded)."""

    mode: str = "none"
    max_draft_len: int | None = None
    draft_model_path: str | None = None
