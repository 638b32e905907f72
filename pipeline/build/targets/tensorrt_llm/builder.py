"""The ``tensorrt_llm`` target: TensorRT-LLM 1.2.x engines (``trtllm-build``) or PyTorch-backend options.

Production target for NVIDIA GPU hosts.  It cannot run on a machine without TensorRT-LLM and a GPU:
there, :meth:`TensorRTLLMTarget.preflight` stops the build (exit code 4) with the fix and the exact
command it would run; ``dry_run=true`` prints that command without failing.  Nothing here pretends
an engine was built: a build succeeds only when ``trtllm-build`` exits 0 *and* wrote
``rank*.engine`` + ``config.json``.

Rule: this module is the target the registry loads by name (:data:`pipeline.core.targets.TARGETS`: ``TARGET``,
:func:`installed_version`, :func:`has_engine_builder`): its capabilities and the :class:`TensorRTLLMTarget`
interface, which puts together the package's modules, one job each:

* :mod:`.versions`: the installed TensorRT-LLM and the versions each backend accepts;
* :mod:`.checks`: config-time rules (trtllm-build flags, speculative decoding, ``package.runtime``, serving image);
* :mod:`.preflight`: host checks (package, ``trtllm-build``, GPU compute capability);
* :mod:`.engine`: the ``trtllm-build`` command line and running it;
* :mod:`.runtime`: runtime knobs and LLM-API options recorded for the package stage;
* :mod:`.runner`: the engine runner for evaluate/benchmark.

Facts used (TensorRT-LLM 1.2.x upstream files, summarised in docs/reference/tensorrt_llm.md) are named in each module.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ....core.config.common import Problem
from ....core.contracts.build import BuildArtifact
from ....core.contracts.quantize import QuantizeArtifact
from ....core.targets.base import Capabilities, Target
from ....errors import PreflightError
from ....facts.recipes import RECIPES
from ....facts.trtllm import PYTORCH_KV_CACHE_DTYPES, PYTORCH_REFUSED_RECIPES
from . import engine, versions
from .checks import config_problems
from .preflight import KV_MIN_SM, preflight
from .runtime import llm_api_options, runtime_knobs
from .versions import INSTALL_FIX, has_engine_builder, installed_version

log = logging.getLogger("pipeline.build.targets.tensorrt_llm.builder")

RECIPE_QUANT_ALGO = {r.name: r.quant_algo for r in RECIPES.values()}
"""quant.recipe -> the checkpoint's ``quantization.quant_algo`` (a view of :data:`pipeline.facts.recipes.RECIPES`)."""


def _capabilities(name: str) -> Capabilities:
    """Capabilities of the engine path (``tensorrt_llm``) or the PyTorch backend (``tensorrt_llm_pytorch``).

    Recipes: the engine path runs every recipe of :data:`pipeline.facts.recipes.RECIPES` (each names the checkpoint
    ``quant_algo`` ModelOpt writes for it; the minimum compute capability is checked in preflight); the PyTorch backend
    refuses :data:`PYTORCH_REFUSED_RECIPES` and INT8 KV (:data:`PYTORCH_KV_CACHE_DTYPES`).
    """
    pytorch = name == "tensorrt_llm_pytorch"
    refused = dict(PYTORCH_REFUSED_RECIPES) if pytorch else {}
    return Capabilities(
        name=name,
        device="gpu",
        recipes=tuple(r for r in RECIPES if r not in refused),
        refused_recipes=refused,
        kv_cache_dtypes=PYTORCH_KV_CACHE_DTYPES if pytorch else tuple(KV_MIN_SM),
        beam_search=True,  # trtllm-build --max_beam_width; the evaluate/benchmark runner itself decodes greedily
        logits=True,  # context/generation logits (build.gather_context_logits; pipeline.build.targets.tensorrt_llm.runner)
        sliding_window=True,  # max_attention_window_size (package.runtime; sliding_window() below)
        streaming=True,  # decoupled Triton model / LLM API streaming
        max_batch_size=None,
    )


class TensorRTLLMTarget:
    name = "tensorrt_llm"

    def capabilities(self, cfg: Any = None) -> Capabilities:
        """The engine path's capabilities, or the PyTorch backend's when ``cfg.target.backend=pytorch``."""
        if cfg is not None and cfg.target.backend == "pytorch":
            return _capabilities("tensorrt_llm_pytorch")
        return _capabilities("tensorrt_llm")

    # ------------------------------------------------------------------ config time
    def check_config(self, cfg: Any) -> list[Problem]:
        """Cross-field rules of trtllm-build / BuildConfig (commands/build.py, builder.py); no heavy imports
        (:func:`.checks.config_problems`)."""
        return config_problems(cfg, self.capabilities(cfg))

    def available(self) -> tuple[bool, str]:
        v = versions.installed_version()
        if v is None:
            return False, "tensorrt_llm is not installed"
        return True, f"tensorrt_llm {v}"

    def plan(self, cfg: Any, checkpoint: Path | None, export_dir: Path | None, out: Path | None) -> dict[str, Any]:
        if cfg.target.backend == "pytorch":
            return {"command": None, "llm_api_options": llm_api_options(cfg), "runtime_knobs": runtime_knobs(cfg)}
        return {
            "command": engine.command(cfg, checkpoint or "<quantize artifact>", out or "<build artifact>"),
            "build_config": engine.build_config_dict(cfg),
            "runtime_knobs": runtime_knobs(cfg),
        }

    def preflight(self, cfg: Any, checkpoint: Path, out: Path | None = None) -> None:
        """Check, before any GPU work (:func:`.preflight.preflight`): package + version, trtllm-build, GPU compute capability.

        Raises:
            PreflightError: every failed check with its fix, plus the exact command that would run.
        """
        preflight(cfg, checkpoint, out)

    # ------------------------------------------------------------------ build
    def _versions(self) -> dict[str, Any]:
        from ....core.hostinfo import library_versions

        v = library_versions(("tensorrt-llm", "tensorrt", "tensorrt-cu12", "tensorrt-cu13", "torch", "nvidia-modelopt"))
        cuda = None
        torch = sys.modules.get("torch")
        if torch is None:
            try:
                import torch
            except ImportError:
                torch = None
        if torch is not None:
            cuda = getattr(torch.version, "cuda", None)
        v["cuda"] = cuda
        return v

    def build(
        self, cfg: Any, checkpoint: Path, out: Path, log: Any = None, *, export_dir: Path | None = None, progress: Any = None
    ) -> dict[str, Any]:
        """Run ``trtllm-build`` (or write the PyTorch-backend options) into ``out/engine``; return build_info.

        The full trtllm-build output is kept in ``out/build.log``.
        Raises: PipelineError with the log tail when trtllm-build fails or writes no engine.
        """
        lg = log or globals()["log"]
        from ....core.hostinfo import gpus

        self.preflight(cfg, checkpoint, out)
        t0 = time.time()
        out = Path(out)
        engine_dir = BuildArtifact(out).engine_dir
        engine_dir.mkdir(parents=True, exist_ok=True)
        logf = BuildArtifact(out).build_log_path
        hf = QuantizeArtifact(Path(checkpoint)).hf_dir
        info: dict[str, Any] = {
            "schema": "pipeline.build_info/v1",
            "target": self.name,
            "backend": cfg.target.backend,
            "recipe": cfg.quant.recipe,
            "kv_cache": cfg.quant.kv_cache_dtype,
        }
        if cfg.target.backend == "pytorch":
            import yaml

            opts = llm_api_options(cfg)
            (engine_dir / BuildArtifact.LLM_API_OPTIONS).write_text(yaml.safe_dump(opts, sort_keys=False), encoding="utf-8")
            shutil.copytree(hf, engine_dir / "hf")
            logf.write_text(
                "PyTorch backend: no engine build; wrote llm_api_options.yaml and copied the HF checkpoint.\n", encoding="utf-8"
            )
            info.update(command=None, llm_api_options=opts)
        else:
            info.update(engine.run_trtllm_build(cfg, checkpoint, out, lg))
        g = gpus()
        b = cfg.build
        info.update(
            {
                "versions": self._versions(),
                "host": {
                    "kind": "gpu",
                    "gpus": g,
                    "gpu": g[0]["name"] if g else None,
                    "compute_capability": g[0]["compute_capability"] if g else None,
                },
                "knobs": {"build_config": engine.build_config_dict(cfg), "workers": b.workers, "target_gpu": cfg.target.gpu},
                "runtime": runtime_knobs(cfg),
                "limits": {
                    "max_batch_size": b.max_batch_size,
                    "max_input_len": b.max_input_len,
                    "max_seq_len": b.max_seq_len,
                    "max_num_tokens": b.max_num_tokens,
                    "max_beam_width": b.max_beam_width,
                },
                "engine_bytes": sum(f.stat().st_size for f in engine_dir.rglob("*") if f.is_file()),
                "build_s": round(time.time() - t0, 3),
            }
        )
        return info

    def load_runner(self, engine_dir: Path, **kw: Any) -> Any:
        """The engine runner for evaluate/benchmark: TensorRT-LLM 1.2.x ``ModelRunnerCpp`` (engine path) or the LLM API
        (PyTorch backend), imported lazily (``pipeline.build.targets.tensorrt_llm.runner``).

        Raises:
            PreflightError: TensorRT-LLM is not importable on this machine (exit 4), with the fix.
        """
        if versions.installed_version() is None:
            raise PreflightError(
                f"running a TensorRT-LLM engine needs TensorRT-LLM and a GPU. Fix: {INSTALL_FIX}; "
                "or evaluate the simulated model without packaging it (eval.candidate=simulated eval.runners=[baseline,simulated] stages=[export,quantize,evaluate])."
            )
        from .runner import load_runner

        return load_runner(Path(engine_dir), **kw)


TARGET: Target = TensorRTLLMTarget()

__all__ = ["RECIPE_QUANT_ALGO", "TARGET", "TensorRTLLMTarget", "has_engine_builder", "installed_version"]
