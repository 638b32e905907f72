"""Build targets, registered by name and imported lazily.

| name | what it builds | where it runs |
|---|---|---|
| ``onnxruntime_genai`` | a real ONNX Runtime GenAI engine (model builder + continuous-batching ``og.Engine``) | CPU (or CUDA EP) |
| ``tensorrt_llm`` | a TensorRT-LLM 1.2.x engine with ``trtllm-build`` (``target.backend=tensorrt``), or the LLM-API options of the PyTorch backend (``target.backend=pytorch``) | NVIDIA GPU host |

``target=auto`` resolves to ``tensorrt_llm`` when the ``tensorrt_llm`` package is installed *and* an
NVIDIA GPU is visible, else to ``onnxruntime_genai``; :func:`resolve_target` says which and why.
Importing this package imports neither torch nor any target library.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import PipelineConfig
    from ..config.common import Problem
    from .base import Target

TARGETS: dict[str, str] = {
    "onnxruntime_genai": "pipeline.targets.onnxruntime_genai",
    "tensorrt_llm": "pipeline.targets.tensorrt_llm",
}
"""name -> module defining ``TARGET`` (imported on first use)."""

_CACHE: dict[str, "Target"] = {}


def known_targets() -> list[str]:
    return list(TARGETS)


def get_target(name: str) -> "Target":
    """The registered target called ``name``.

    Raises:
        InputError: unknown name; the message lists the known targets (and ``auto``).
    """
    from ..errors import InputError

    if name not in TARGETS:
        raise InputError(f"target.name={name!r}: unknown target. Known targets: {known_targets() + ['auto']}. "
                         "Fix: pass target=onnxruntime_genai (CPU) or target=tensorrt_llm (NVIDIA GPU).")
    if name not in _CACHE:
        _CACHE[name] = importlib.import_module(TARGETS[name]).TARGET
    return _CACHE[name]


def tensorrt_llm_installed() -> bool:
    """True when the ``tensorrt_llm`` package can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("tensorrt_llm") is not None
    except (ImportError, ValueError):
        return False


def resolve_target(cfg: "PipelineConfig") -> tuple[str, str]:
    """``(name, reason)`` of the target a run uses.

    ``auto``: ``tensorrt_llm`` when it is installed and ``nvidia-smi``/torch sees a GPU, else
    ``onnxruntime_genai``. An explicit name is returned as is (validated by :func:`get_target`).
    """
    name = cfg.target.name
    if name != "auto":
        get_target(name)
        return name, f"target.name={name} was set explicitly"
    from ..hostinfo import gpus

    trt = tensorrt_llm_installed()
    g = gpus()
    if trt and g:
        return "tensorrt_llm", f"target=auto: tensorrt_llm is installed and a GPU is visible ({g[0]['name']}, SM {g[0]['compute_capability']})"
    why = []
    if not trt:
        why.append("tensorrt_llm is not installed")
    if not g:
        why.append("no NVIDIA GPU is visible")
    return "onnxruntime_genai", "target=auto: " + " and ".join(why) + " -> onnxruntime_genai (CPU engine)"


def needs_build(cfg: "PipelineConfig") -> bool:
    """Whether the configured stages include the build stage or a stage that consumes an engine."""
    if any(s in cfg.stages for s in ("build", "package", "benchmark")):
        return True
    return "evaluate" in cfg.stages and "engine" in cfg.eval.runners


def config_problems(cfg: "PipelineConfig") -> list["Problem"]:
    """The resolved target's config-time checks (called from ``pipeline.config.validate``)."""
    from ..config.common import Problem
    from ..errors import InputError

    if not needs_build(cfg) or cfg.model.path is None:
        return []  # shapes-only model presets (planner) never reach a build
    try:
        name, _ = resolve_target(cfg)
    except InputError as e:
        return [Problem("target.name", cfg.target.name, str(e))]
    return list(get_target(name).check_config(cfg))


__all__ = ["TARGETS", "config_problems", "get_target", "known_targets", "needs_build", "resolve_target", "tensorrt_llm_installed"]
