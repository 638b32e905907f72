"""Preflight of the ``tensorrt_llm`` target: can this host build (or package) what the config asks, before any GPU work.

Rule: host checks only (the installed TensorRT-LLM, ``trtllm-build``, the GPU's compute capability); every failure
is collected and raised at once as a :class:`PreflightError` (exit code 4) with its fix and the exact command it would
run. Config-only rules are :mod:`.checks`.

Facts: GPU support per format (TensorRT-LLM ``docs/source/reference/support-matrix.md``, kept in the one table
pipeline/facts/recipes.py): FP8 and W4A8-AWQ need SM >= 8.9; INT8-SQ, INT8/INT4 weight-only and INT4-AWQ need
SM >= 8.0; BF16 needs SM 8.0.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from ....core.contracts.quantize import QuantizeArtifact
from ....errors import InputError, PreflightError
from ....facts.recipes import KV_CACHE_FORMATS, RECIPES
from . import versions
from .engine import command
from .versions import INSTALL_FIX, NGC_IMAGE, accepts_version

# Minimum compute capability per recipe / KV dtype, as (major, minor): views of the one table, pipeline/facts/recipes.py.
RECIPE_MIN_SM = {r.name: divmod(r.min_sm, 10) for r in RECIPES.values()}
KV_MIN_SM = {k.name: divmod(k.min_sm, 10) for k in KV_CACHE_FORMATS.values()}


def _version_fails(cfg: Any, exe: str) -> list[str]:
    """:func:`preflight`: the installed TensorRT-LLM against the backend's range, and trtllm-build.

    The PyTorch backend accepts a host without TensorRT-LLM (it builds nothing); an installed one must be >= 1.2.0.
    """
    backend = cfg.target.backend
    fails: list[str] = []
    v = versions.installed_version()
    if v is None and backend == "tensorrt":
        fails.append(f"the tensorrt_llm package is not installed (Python {sys.version.split()[0]}). Fix: {INSTALL_FIX}.")
    elif v is not None and v != "unknown":
        if backend == "tensorrt" and not accepts_version("tensorrt", v):
            fails.append(
                f"tensorrt_llm {v} is outside the supported engine-path range 1.2.0-1.2.1 (trtllm-build was removed after 1.2.x). "
                f"Fix: pip install 'tensorrt-llm==1.2.1' --extra-index-url https://pypi.nvidia.com/ , or use {NGC_IMAGE}; "
                "or target=tensorrt_llm_pytorch for newer releases."
            )
        if backend == "pytorch" and not accepts_version("pytorch", v):
            fails.append(
                f"tensorrt_llm {v} is older than 1.2.0. Fix: pip install 'tensorrt-llm==1.2.1' --extra-index-url https://pypi.nvidia.com/"
            )
    if backend == "tensorrt" and shutil.which(exe) is None and not (os.path.isabs(exe) and os.access(exe, os.X_OK)):
        fails.append(
            f"`{exe}` (target.trtllm_build) is not on PATH. Fix: it ships with the tensorrt-llm 1.2.x wheel "
            "(install as above); or point target.trtllm_build=/path/to/trtllm-build."
        )
    return fails


def _gpu_fails(cfg: Any) -> list[str]:
    """:func:`preflight`: the GPU the package is for (the local one; for the PyTorch backend without
    one, ``target.gpu`` from the planner catalogue) against the recipe's and KV cache's minimum compute capability."""
    from ....core.hostinfo import gpus

    g = gpus()
    if g:
        name, cc_s = str(g[0]["name"]), str(g[0]["compute_capability"])
    elif cfg.target.backend == "pytorch" and cfg.target.gpu:
        from ....facts.gpus import lookup

        try:
            gpu = lookup(cfg.target.gpu)
        except KeyError as e:
            return [
                f"target.gpu={cfg.target.gpu!r}: {e.args[0]}. Fix: name a GPU of the catalogue (`pipeline plan --gpus all` lists them)."
            ]
        name, cc_s = f"{gpu.name} (target.gpu={gpu.key}, not present on this host)", gpu.compute_capability
    elif cfg.target.backend == "pytorch":
        return [
            "no NVIDIA GPU is visible and target.gpu is not set, so the GPU this package is for is unknown. "
            "Fix: name it, e.g. target.gpu=h100_sxm (the PyTorch backend packages on a CPU host for a named GPU)."
        ]
    else:
        return [
            f"no NVIDIA GPU is visible (nvidia-smi found none). Fix: run on a GPU host / inside {NGC_IMAGE} with --gpus all, "
            "build for CPU with target=onnxruntime_genai, or package for a named GPU without a build with "
            "target=tensorrt_llm_pytorch target.gpu=<gpu>."
        ]
    try:
        cc = tuple(int(x) for x in cc_s.split(".")[:2])
    except ValueError:
        cc = (0, 0)
    need = max(RECIPE_MIN_SM.get(cfg.quant.recipe, (8, 0)), KV_MIN_SM.get(cfg.quant.kv_cache_dtype, (7, 5)))
    if cfg.quant.export_dtype == "bfloat16":
        need = max(need, (8, 0))
    if cc < need:
        return [
            f"GPU {name} has compute capability {cc[0]}.{cc[1]}; quant={cfg.quant.recipe} kv_cache_dtype={cfg.quant.kv_cache_dtype} "
            f"needs SM >= {need[0]}.{need[1]} (FP8/W4A8 need Ada/Hopper, SM 8.9+). "
            "Fix: use quant=int4_awq or int8_sq on Ampere, or a newer GPU."
        ]
    return []


def preflight(cfg: Any, checkpoint: Path, out: Path | None = None) -> None:
    """Check, before any GPU work: package + version, trtllm-build, GPU compute capability.

    Engine path (``target.backend=tensorrt``): TensorRT-LLM 1.2.x, ``trtllm-build`` and a local GPU are required
    (an engine is compiled for the GPU it is built on). PyTorch backend: nothing is compiled, the build stage only
    writes the LLM-API options next to the unified HF checkpoint, so neither TensorRT-LLM nor a GPU is needed here;
    without a local GPU the GPU named by ``target.gpu`` (planner catalogue) is checked instead.

    Raises:
        PreflightError: every failed check with its fix, plus the exact command that would run.
        InputError: the engine path without the quantize stage's TensorRT-LLM checkpoint.
    """
    backend = cfg.target.backend
    fails = _version_fails(cfg, cfg.target.trtllm_build)
    fails += _gpu_fails(cfg)
    # The memory plan is not checked here: the runner refuses a plan that cannot work before any stage runs
    # (pipeline.planner.plan_for_run, exit 4), and the planner reads the targets, not the other way round.
    if fails:
        cmd = (
            shlex.join(command(cfg, checkpoint, out or "<build artifact>"))
            if backend == "tensorrt"
            else "(PyTorch backend: no trtllm-build)"
        )
        msg = "target tensorrt_llm cannot build on this machine:\n" + "\n".join(f"  - {f}" for f in fails)
        raise PreflightError(msg + f"\nCommand it would run:\n  {cmd}")
    ck = QuantizeArtifact(Path(checkpoint)).trtllm_checkpoint
    if backend == "tensorrt" and not (ck / "config.json").is_file():
        raise InputError(f"{ck}: no TensorRT-LLM checkpoint (config.json + rank*.safetensors). The quantize stage writes it; re-run it.")
