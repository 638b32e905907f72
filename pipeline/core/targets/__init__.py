"""Build targets, registered by name and imported lazily.

| name | what it builds | where it runs |
|---|---|---|
| ``onnxruntime_genai`` | a real ONNX Runtime GenAI engine (model builder + continuous-batching ``og.Engine``) | CPU (or CUDA EP) |
| ``tensorrt_llm`` | a TensorRT-LLM 1.2.x engine with ``trtllm-build`` (``target.backend=tensorrt``), or the LLM-API options of the PyTorch backend (``target.backend=pytorch``) | NVIDIA GPU host |

Each target declares what it can do (:class:`~pipeline.core.targets.base.Capabilities`: recipes, KV-cache dtypes,
beam search, logits, sliding window, streaming, max batch); :func:`capabilities` is the one place the planner,
config validation, preflight and the evaluate stage ask. The registry names: ``onnxruntime_genai``,
``tensorrt_llm`` (engine path) and ``tensorrt_llm_pytorch`` (``target=tensorrt_llm target.backend=pytorch``).

``target=auto`` resolves (:func:`resolve_target`, the only resolver; the planner uses it too) to ``tensorrt_llm``
when ``target.gpu`` names a GPU, or when the ``tensorrt_llm`` package is installed *and* an NVIDIA GPU is
visible (then the PyTorch backend for a TensorRT-LLM without engine builder, >= 1.3, and engines for 1.2.x); else
to ``onnxruntime_genai``. Importing this package imports neither torch nor any target library.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..registry import Registry

if TYPE_CHECKING:
    from ..config import PipelineConfig
    from ..config.common import Problem
    from .base import Capabilities, Target

TARGETS: Registry[str] = Registry(
    "target",
    {
        "onnxruntime_genai": "pipeline.build.targets.onnxruntime_genai.builder",
        "tensorrt_llm": "pipeline.build.targets.tensorrt_llm.builder",
    },
)
"""name -> module defining ``TARGET`` (imported on first use)."""

_CACHE: dict[str, Target] = {}


def known_targets() -> list[str]:
    return list(TARGETS)


def get_target(name: str) -> Target:
    """The registered target called ``name``.

    Raises:
        InputError: unknown name; the message lists the known targets (and ``auto``).
    """
    from ...errors import InputError

    if name not in TARGETS:
        raise InputError(f"target.name={name!r}: unknown target. Known targets: {known_targets() + ['auto']}. Fix: pass {_suggest(name)}.")
    if name not in _CACHE:
        _CACHE[name] = importlib.import_module(TARGETS[name]).TARGET
    return _CACHE[name]


def _suggest(name: str) -> str:
    """``target=<the registered name closest to name>``, else the two built-in targets."""
    close = TARGETS.closest(name)
    return f"target={close}" if close else "target=onnxruntime_genai (CPU) or target=tensorrt_llm (NVIDIA GPU)"


def register(target: Target, *, replace: bool = False) -> Target:
    """Add a build target (an object with the :class:`~pipeline.core.targets.base.Target` interface; its ``name`` is
    what ``target.name`` selects) to :data:`TARGETS`; returns it. ``ValueError`` when the name is taken, unless
    ``replace``. The target lives in this process: register it before composing and running (``pipeline.run``)."""
    TARGETS.register(target.name, type(target).__module__, replace=replace)
    _CACHE[target.name] = target
    return target


def name_problems(cfg: PipelineConfig) -> list[Problem]:
    """``target.name`` is ``auto`` or a registered target (:data:`TARGETS`); the fix names the closest one."""
    from ..config.common import Problem

    name = cfg.target.name
    if name == "auto" or name in TARGETS:
        return []
    from ..config import CONFIG_DIR

    if (CONFIG_DIR / "target" / f"{name}.yaml").is_file():
        fix = f"use the preset target={name} (it sets target.name and target.backend), not target.name={name}"
    else:
        fix = f"pick {_suggest(str(name))}"
    return [Problem("target.name", name, f"must be one of {['auto', *TARGETS]}.", fix)]


def tensorrt_llm_installed() -> bool:
    """True when the ``tensorrt_llm`` package can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("tensorrt_llm") is not None
    except (ImportError, ValueError):
        return False


class Resolution(NamedTuple):
    """The target a run uses (``name`` in :data:`TARGETS`) and why (printed and recorded in build_info.json)."""

    name: str
    reason: str


def resolve_target(cfg: PipelineConfig, *, gpus: Callable[[], list[dict[str, Any]]] | None = None) -> Resolution:
    """``(name, reason)`` of the target a run uses; the one resolver (build, preflight, planner, families).

    ``auto``: ``tensorrt_llm`` when ``target.gpu`` names a GPU (a plan or build for that GPU), or when
    ``tensorrt_llm`` is installed and ``nvidia-smi``/torch sees a GPU; else ``onnxruntime_genai``. With TensorRT-LLM
    installed and a GPU visible, auto also settles ``cfg.target.backend`` by the installed version
    (:func:`pipeline.build.targets.tensorrt_llm.builder.has_engine_builder`): ``pytorch`` (the forward path,
    ``tensorrt_llm_pytorch``) when it has no engine builder (>= 1.3, main), ``tensorrt`` (engines) for 1.2.x, and
    says why in the reason (printed by the build stage, recorded in ``build_info.json`` ``target_reason`` and the run
    summary). An explicit name is returned as is (validated by :func:`get_target`).

    Args:
        gpus: the GPU probe (default :func:`pipeline.core.hostinfo.gpus`; tests inject one).
    Raises:
        InputError: unknown ``target.name``.
    """
    name = cfg.target.name
    if name != "auto":
        get_target(name)
        return Resolution(name, f"target.name={name} was set explicitly")
    if cfg.target.gpu:
        return Resolution("tensorrt_llm", f"target=auto: target.gpu={cfg.target.gpu} names an NVIDIA GPU -> tensorrt_llm")
    if gpus is None:
        from ..hostinfo import gpus
    assert gpus is not None
    trt = tensorrt_llm_installed()
    g = gpus()
    if trt and g:
        trt_module = importlib.import_module(TARGETS["tensorrt_llm"])  # the registered implementation, by name
        v = trt_module.installed_version()
        seen = f"a GPU is visible ({g[0]['name']}, SM {g[0]['compute_capability']})"
        engines = trt_module.has_engine_builder(v)
        if engines is False:
            cfg.target.backend = "pytorch"
            return Resolution(
                "tensorrt_llm",
                f"target=auto: tensorrt_llm {v} is installed and {seen}; {v} has no engine builder (removed after 1.2) "
                "-> tensorrt_llm_pytorch (PyTorch backend, the forward path)",
            )
        if engines:
            cfg.target.backend = "tensorrt"
            return Resolution(
                "tensorrt_llm",
                f"target=auto: tensorrt_llm {v} is installed and {seen}; 1.2.x has the engine builder -> tensorrt_llm (engines)",
            )
        return Resolution(
            "tensorrt_llm",
            f"target=auto: tensorrt_llm ({v or 'version unknown'}) is installed and {seen} -> tensorrt_llm, "
            f"target.backend={cfg.target.backend} as configured",
        )
    why = []
    if not trt:
        why.append("tensorrt_llm is not installed")
    if not g:
        why.append("no NVIDIA GPU is visible")
    return Resolution("onnxruntime_genai", "target=auto: " + " and ".join(why) + " -> onnxruntime_genai (CPU engine)")


def capabilities(cfg: PipelineConfig) -> Capabilities:
    """What the target ``cfg`` resolves to can do (its backend's capabilities for ``tensorrt_llm``).

    Raises:
        InputError: unknown ``target.name``.
    """
    return get_target(resolve_target(cfg).name).capabilities(cfg)


def all_capabilities() -> dict[str, Capabilities]:
    """Registry name -> capabilities, for every target and backend (docs/build.md table, tests)."""
    from types import SimpleNamespace

    out: dict[str, Capabilities] = {}
    for name in TARGETS:
        t = get_target(name)
        for backend in ("tensorrt", "pytorch") if name == "tensorrt_llm" else ("default",):
            c = t.capabilities(SimpleNamespace(target=SimpleNamespace(backend=backend)))  # type: ignore[arg-type]
            out[c.name] = c
    return out


def capabilities_table() -> str:
    """The Markdown table of :func:`all_capabilities` that docs/build.md carries (a test keeps them equal)."""

    def yn(b: bool) -> str:
        return "yes" if b else "no"

    rows = [
        "| target | recipes | refused (reason in `pipeline.core.targets.capabilities`) | KV cache | beam search | logits | "
        "sliding window | streaming | max batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in all_capabilities().values():
        rows.append(
            f"| `{c.name}` | {', '.join(c.recipes)} | {', '.join(sorted(c.refused_recipes)) or '-'} | "
            f"{', '.join(c.kv_cache_dtypes)} | {yn(c.beam_search)} | {yn(c.logits)} | {yn(c.sliding_window)} | "
            f"{yn(c.streaming)} | {c.max_batch_size or 'no limit'} |"
        )
    return "\n".join(rows)


def needs_build(cfg: PipelineConfig) -> bool:
    """Whether the configured stages include the build stage or a stage that consumes an engine."""
    if any(s in cfg.stages for s in ("build", "package", "benchmark")):
        return True
    return "evaluate" in cfg.stages and "engine" in cfg.eval.runners


def config_problems(cfg: PipelineConfig) -> list[Problem]:
    """The resolved target's config-time checks (called from ``pipeline.validation.validate``)."""
    from ...errors import InputError
    from ..config.common import Problem

    if not needs_build(cfg) or (cfg.model.path is None and cfg.target.name == "auto" and not cfg.target.gpu):
        return []  # a shapes-only preset with target=auto and no target.gpu: `plan --gpus` resolves one per GPU
    try:
        name, _ = resolve_target(cfg)
    except InputError as e:
        return [Problem("target.name", cfg.target.name, str(e))]
    return list(get_target(name).check_config(cfg))


__all__ = [
    "TARGETS",
    "Resolution",
    "all_capabilities",
    "capabilities",
    "capabilities_table",
    "config_problems",
    "get_target",
    "known_targets",
    "name_problems",
    "needs_build",
    "register",
    "resolve_target",
    "tensorrt_llm_installed",
]
