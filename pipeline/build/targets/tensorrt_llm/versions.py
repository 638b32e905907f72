"""Which TensorRT-LLM is installed, and which versions each backend of the ``tensorrt_llm`` target accepts.

Rule: the one place that reads the installed version (without importing ``tensorrt_llm``, which initialises CUDA) and
compares versions. Every reader in this package calls ``versions.installed_version()`` through the module, so one
``monkeypatch.setattr(versions, "installed_version", ...)`` reaches them all; ``builder`` re-exports
:func:`installed_version` and :func:`has_engine_builder` for the target registry (:mod:`pipeline.core.targets`).

Facts (TensorRT-LLM release notes and installation docs; summarised in docs/reference/tensorrt_llm.md): engine path =
TensorRT-LLM ``>=1.2.0,<=1.2.1`` (release notes: 1.2.1 is the last stable with ``trtllm-build``; the TensorRT backend
is removed on main after July 2026); Python 3.10/3.12 wheels only (installation docs).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ....core.config.target import DEFAULT_SERVING_IMAGE

ENGINE_VERSIONS = ((1, 2, 0), (1, 2, 1))
"""Inclusive TensorRT-LLM range for the TensorRT engine path (trtllm-build)."""
PYTORCH_MIN_VERSION = (1, 2, 0)
NGC_IMAGE = DEFAULT_SERVING_IMAGE
INSTALL_FIX = (
    "install TensorRT-LLM 1.2.1 on an NVIDIA GPU host with Python 3.10 or 3.12: "
    "`pip install 'tensorrt-llm==1.2.1' --extra-index-url https://pypi.nvidia.com/` "
    f"(or this project's `tensorrt_llm` optional extra), or run the pipeline inside the NGC container {NGC_IMAGE} "
    "(TensorRT-LLM 1.2.1); there is no wheel for Python 3.11"
)


def _ver_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        num = "".join(ch for ch in part if ch.isdigit()) or "0"
        out.append(int(num))
        if not part.isdigit():
            break
    return tuple(out + [0] * (3 - len(out)))


def installed_version() -> str | None:
    """Installed TensorRT-LLM version, ``"unknown"`` when importable without package metadata, or None (checked
    without importing tensorrt_llm)."""
    from ....core.hostinfo import installed_version as _installed

    v = _installed("tensorrt-llm")
    if v is not None:
        return v
    try:
        spec = importlib.util.find_spec("tensorrt_llm")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    return _source_version(spec.origin) or "unknown"


def _source_version(origin: str | None) -> str | None:
    """``__version__ = "..."`` from the package's ``version.py`` (where upstream defines it) or ``__init__.py``, read
    as text (importing tensorrt_llm initialises CUDA); None when neither has it."""
    import re

    if not origin:
        return None
    root = Path(origin).parent
    for f in (root / "version.py", Path(origin)):
        try:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read_text(encoding="utf-8", errors="replace"), re.M)
        except OSError:
            continue
        if m:
            return m.group(1)
    return None


def has_engine_builder(version: str | None) -> bool | None:
    """Whether TensorRT-LLM ``version`` still has the engine builder (``trtllm-build``): the 1.2.x line does (the
    :data:`ENGINE_VERSIONS` range), 1.3 release candidates and main do not (the TensorRT backend was removed after 1.2:
    PRs #15907, #15918; docs legacy/tensorrt-backend-removal). None for an unknown version."""
    if not version or version == "unknown":
        return None
    vt = _ver_tuple(version)
    if vt[:2] >= (1, 3):
        return False
    return ENGINE_VERSIONS[0] <= vt <= ENGINE_VERSIONS[1]


def accepts_version(backend: str, version: str) -> bool:
    """Whether the TensorRT-LLM ``version`` serves this backend: engines 1.2.0-1.2.1 (:data:`ENGINE_VERSIONS`), the
    PyTorch backend >= 1.2.0 (:data:`PYTORCH_MIN_VERSION`)."""
    vt = _ver_tuple(version)
    if backend == "tensorrt":
        return ENGINE_VERSIONS[0] <= vt <= ENGINE_VERSIONS[1]
    return vt >= PYTORCH_MIN_VERSION
