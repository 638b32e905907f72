"""The ``tensorrt_llm`` target: TensorRT-LLM 1.2.x engines (``trtllm-build``) or PyTorch-backend options.

Production target for NVIDIA GPU hosts.  It cannot run on a machine without TensorRT-LLM and a GPU:
there, :meth:`TensorRTLLMTarget.preflight` stops the build (exit code 4) with the fix and the exact
command it would run; ``dry_run=true`` prints that command without failing.  Nothing here pretends
an engine was built: a build succeeds only when ``trtllm-build`` exits 0 *and* wrote
``rank*.engine`` + ``config.json``.

Facts used (TensorRT-LLM 1.2.x upstream files named in brackets; summarised in docs/reference/tensorrt_llm.md):

* engine path = TensorRT-LLM ``>=1.2.0,<=1.2.1`` (release notes: 1.2.1 is the last stable with ``trtllm-build``;
  the TensorRT backend is removed on main after July 2026); Python 3.10/3.12 wheels only (installation docs).
* flags and choices of ``trtllm-build`` (``commands/build.py``, ``plugin/plugin.py``): in-flight batching needs paged KV
  (``--kv_cache_type paged``), ``--remove_input_padding enable`` and the GPT attention plugin, which
  this target always sets; ``--multiple_profiles enable`` cannot be combined with ``--opt_num_tokens``.
* ``max_seq_len`` default = ``max_position_embeddings`` x rope factor (``builder.py``); speculative
  decoding adds ``max_draft_len`` to it.
* GPU support per format (``docs/source/reference/support-matrix.md``): FP8 and W4A8-AWQ need SM >= 8.9; INT8-SQ, INT8/INT4 weight-only and
  INT4-AWQ need SM >= 8.0; BF16 needs SM 8.0.
* CUDA Graphs are a runtime setting for engines (``llmapi/llm_args.py`` ExtendedRuntimePerfKnobConfig, Triton ``cuda_graph_mode``/``cuda_graph_cache_size``),
  recorded in ``build_info.json`` for the package stage; the PyTorch backend takes ``cuda_graph_config``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ....core.artifacts import TOKENIZER_COPY_FILES
from ....core.config.common import Problem
from ....core.config.target import DEFAULT_SERVING_IMAGE
from ....core.contracts.build import BuildArtifact
from ....core.contracts.quantize import QuantizeArtifact
from ....core.targets.base import Capabilities, Target
from ....errors import InputError, PipelineError, PreflightError
from ....facts.recipes import KV_CACHE_FORMATS, RECIPES
from ....facts.trtllm import PYTORCH_ALTERNATIVE, PYTORCH_KV_CACHE_DTYPES, PYTORCH_REFUSED_RECIPES, llmapi_unsupported

log = logging.getLogger("pipeline.build.targets.tensorrt_llm.builder")

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

# trtllm-build flag facts (tensorrt_llm/commands/build.py, plugin/plugin.py)
FLAG_CHOICES: dict[str, tuple[str, ...]] = {
    "--kv_cache_type": ("continuous", "paged", "disabled"),
    "--gpt_attention_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "disable"),
    "--gemm_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"),
    "--remove_input_padding": ("enable", "disable"),
    "--context_fmha": ("enable", "disable"),
    "--use_paged_context_fmha": ("enable", "disable"),
    "--use_fused_mlp": ("enable", "disable"),
    "--multiple_profiles": ("enable", "disable"),
    "--speculative_decoding_mode": ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"),
    "--logits_dtype": ("float16", "float32"),
    "--log_level": ("internal_error", "error", "warning", "info", "verbose", "debug", "trace"),
}
INT_FLAGS = (
    "--max_batch_size",
    "--max_input_len",
    "--max_seq_len",
    "--max_beam_width",
    "--max_num_tokens",
    "--opt_num_tokens",
    "--tokens_per_block",
    "--max_draft_len",
    "--workers",
)
PATH_FLAGS = ("--checkpoint_dir", "--output_dir", "--input_timing_cache", "--output_timing_cache")
KNOWN_FLAGS = tuple(FLAG_CHOICES) + INT_FLAGS + PATH_FLAGS

RECIPE_QUANT_ALGO = {r.name: r.quant_algo for r in RECIPES.values()}
"""quant.recipe -> the checkpoint's ``quantization.quant_algo`` (a view of :data:`pipeline.facts.recipes.RECIPES`)."""
# Minimum compute capability per recipe / KV dtype, as (major, minor): views of the one table, pipeline/facts/recipes.py.
RECIPE_MIN_SM = {r.name: divmod(r.min_sm, 10) for r in RECIPES.values()}
KV_MIN_SM = {k.name: divmod(k.min_sm, 10) for k in KV_CACHE_FORMATS.values()}
SPEC_MODES = {
    "draft_tokens_external": "draft_tokens_external",
    "medusa": "medusa",
    "eagle": "eagle",
    "lookahead_decoding": "lookahead_decoding",
}
SCHEDULER_POLICY = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}


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


def model_hf_config(cfg: Any) -> dict[str, Any] | None:
    """The model's config.json (``model.path``) or inline ``model.hf_config``; None when unreadable."""
    if cfg.model.hf_config:
        return dict(cfg.model.hf_config)
    if cfg.model.path:
        from ....core.config import resolve_path

        p = resolve_path(cfg.model.path)
        for f in (p / "config.json", p / "hf" / "config.json") if p else ():
            if f.is_file():
                try:
                    return json.loads(f.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    return None
    return None


def max_positions(hf: dict[str, Any]) -> tuple[int | None, str]:
    """``(limit, explanation)``: max_position_embeddings x rope factor (factor not applied for su/longrope/llama3; tensorrt_llm/builder.py)."""
    mpe = hf.get("max_position_embeddings")
    if not mpe:
        return None, "max_position_embeddings unknown"
    rs = hf.get("rope_scaling") or {}
    rtype = rs.get("rope_type") or rs.get("type")
    factor = float(rs.get("factor") or 1.0)
    if rtype in ("su", "longrope", "llama3") or factor < 1:
        factor = 1.0
    return int(mpe * factor), f"max_position_embeddings {mpe} x rope factor {factor:g}"


def en(flag: bool) -> str:
    return "enable" if flag else "disable"


def build_args(cfg: Any, checkpoint_dir: Path | str, output_dir: Path | str, timing_cache: Path | str) -> list[str]:
    """The ``trtllm-build`` arguments for this config (without the executable).

    Paged KV, remove_input_padding, context FMHA and the GPT attention plugin are always on (in-flight
    batching requires them, plugin/plugin.py, docs/source/legacy/reference/memory.md).  The timing cache is read and written at the same path.
    """
    b = cfg.build
    a: list[str] = [
        "--checkpoint_dir",
        str(checkpoint_dir),
        "--output_dir",
        str(output_dir),
        "--max_batch_size",
        str(b.max_batch_size),
        "--max_input_len",
        str(b.max_input_len),
        "--max_seq_len",
        str(b.max_seq_len),
        "--max_num_tokens",
        str(b.max_num_tokens),
        "--max_beam_width",
        str(b.max_beam_width),
        "--kv_cache_type",
        "paged",
        "--gpt_attention_plugin",
        "auto",
        "--remove_input_padding",
        "enable",
        "--context_fmha",
        "enable",
        "--tokens_per_block",
        str(b.tokens_per_block),
        "--use_paged_context_fmha",
        en(b.use_paged_context_fmha),
        "--use_fused_mlp",
        en(b.use_fused_mlp),
        "--multiple_profiles",
        en(b.multiple_profiles),
        "--gemm_plugin",
        b.gemm_plugin,
    ]
    if b.opt_num_tokens:
        a += ["--opt_num_tokens", str(b.opt_num_tokens)]
    if b.logits_dtype:
        a += ["--logits_dtype", b.logits_dtype]
    if b.gather_context_logits:
        a += ["--gather_context_logits"]  # a store_true flag (commands/build.py)
    if b.speculative.mode != "none":
        a += ["--speculative_decoding_mode", SPEC_MODES[b.speculative.mode], "--max_draft_len", str(b.speculative.max_draft_len)]
    a += [
        "--input_timing_cache",
        str(timing_cache),
        "--output_timing_cache",
        str(timing_cache),
        "--workers",
        str(b.workers),
        "--log_level",
        "info",
    ]
    return a


def build_config_dict(cfg: Any) -> dict[str, Any]:
    """The TensorRT-LLM ``BuildConfig`` fields (tensorrt_llm/builder.py) this build sets; recorded in build_info.json."""
    b = cfg.build
    return {
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_batch_size": b.max_batch_size,
        "max_beam_width": b.max_beam_width,
        "max_num_tokens": b.max_num_tokens,
        "opt_num_tokens": b.opt_num_tokens,
        "kv_cache_type": "PAGED",
        "max_draft_len": b.speculative.max_draft_len if b.speculative.mode != "none" else 0,
        "speculative_decoding_mode": SPEC_MODES.get(b.speculative.mode, "NONE") if b.speculative.mode != "none" else "NONE",
        "plugin_config": {
            "gpt_attention_plugin": "auto",
            "gemm_plugin": None if b.gemm_plugin == "disable" else b.gemm_plugin,
            "remove_input_padding": True,
            "context_fmha": True,
            "paged_kv_cache": True,
            "tokens_per_block": b.tokens_per_block,
            "use_paged_context_fmha": b.use_paged_context_fmha,
            "use_fused_mlp": b.use_fused_mlp,
            "multiple_profiles": b.multiple_profiles,
        },
        "logits_dtype": b.logits_dtype,
        "gather_context_logits": b.gather_context_logits,
    }


def sliding_window(hf: dict[str, Any] | None) -> int | None:
    """The model's attention window in tokens (``sliding_window`` of Mistral-style configs), or None.

    Qwen2-style configs carry ``sliding_window`` with ``use_sliding_window: false`` (full attention): None then.
    """
    if not hf:
        return None
    w = hf.get("sliding_window")
    if w in (None, 0) or hf.get("use_sliding_window") is False:
        return None
    try:
        return int(w)
    except (TypeError, ValueError):
        return None


def attention_window(cfg: Any) -> int | None:
    """The ``max_attention_window_size`` the build decides: ``package.runtime.max_attention_window_size`` when set,
    else the model's sliding window when it is smaller than ``build.max_seq_len`` (a window >= max_seq_len is full
    attention for every sequence the engine accepts, so nothing is passed)."""
    rt = getattr(getattr(cfg, "package", None), "runtime", None)
    if rt is not None and rt.max_attention_window_size is not None:
        return int(rt.max_attention_window_size)
    w = sliding_window(model_hf_config(cfg))
    return w if w is not None and w < cfg.build.max_seq_len else None


def runtime_knobs(cfg: Any) -> dict[str, Any]:
    """Runtime settings for the package stage (Triton tensorrt_llm config.pbtxt / ExtendedRuntimePerfKnobConfig; tensorrtllm_backend docs/model_config.md):
    the build's KV/scheduler/CUDA-graph knobs, the attention window and the speculative-decoding setup."""
    b, sp = cfg.build, cfg.build.speculative
    out = {
        "cuda_graph_mode": b.cuda_graph_mode,
        "cuda_graph_cache_size": b.cuda_graph_cache_size,
        "kv_cache_free_gpu_mem_fraction": b.kv_cache_free_gpu_mem_fraction,
        "enable_kv_cache_reuse": b.enable_kv_cache_reuse,
        "batch_scheduler_policy": b.batch_scheduler_policy,
        "enable_chunked_context": b.enable_chunked_context,
        "batching_strategy": "inflight_fused_batching",
        "max_beam_width": b.max_beam_width,
        "speculative": {
            "mode": sp.mode,
            "max_draft_len": sp.max_draft_len if sp.mode != "none" else 0,
            "draft_model_path": sp.draft_model_path if sp.mode != "none" else None,
        },
    }
    w = attention_window(cfg)
    if w is not None:
        out["max_attention_window_size"] = w
    return out


def llm_api_options(cfg: Any) -> dict[str, Any]:
    """``llm_api_options.yaml`` for the PyTorch backend (``trtllm-serve``/``trtllm-bench`` ``--extra_llm_api_options``).

    Keys are ``LLM()`` arguments (tensorrt_llm/llmapi/llm_args.py): ``cuda_graph_config`` (batch sizes), ``kv_cache_config``,
    ``scheduler_config``, limits, chunked prefill, speculative decoding.
    """
    b = cfg.build
    doc: dict[str, Any] = {
        "max_batch_size": b.max_batch_size,
        "max_num_tokens": b.max_num_tokens,
        "max_seq_len": b.max_seq_len,
        "max_input_len": b.max_input_len,
        "max_beam_width": b.max_beam_width,
        "enable_chunked_prefill": b.enable_chunked_context,
        "cuda_graph_config": (
            {
                "batch_sizes": sorted(set(int(x) for x in b.cuda_graph_batch_sizes if 1 <= int(x) <= b.max_batch_size)),
                "enable_padding": True,
            }
            if b.cuda_graph_mode
            else None
        ),
        "kv_cache_config": {
            "free_gpu_memory_fraction": b.kv_cache_free_gpu_mem_fraction,
            "enable_block_reuse": b.enable_kv_cache_reuse,
            "tokens_per_block": b.tokens_per_block,
        },
        "scheduler_config": {"capacity_scheduler_policy": SCHEDULER_POLICY[b.batch_scheduler_policy]},
    }
    if cfg.quant.kv_cache_dtype != "none":
        doc["kv_cache_config"]["dtype"] = cfg.quant.kv_cache_dtype
    sp = b.speculative
    if sp.mode == "draft_tokens_external":
        doc["speculative_config"] = {
            "decoding_type": "DraftTarget",
            "max_draft_len": sp.max_draft_len,
            "speculative_model_dir": sp.draft_model_path,
        }
    elif sp.mode == "eagle":
        doc["speculative_config"] = {
            "decoding_type": "Eagle",
            "max_draft_len": sp.max_draft_len,
            "speculative_model_dir": sp.draft_model_path,
        }
    elif sp.mode == "medusa":
        doc["speculative_config"] = {
            "decoding_type": "Medusa",
            "max_draft_len": sp.max_draft_len,
            "speculative_model_dir": sp.draft_model_path,
        }
    elif sp.mode == "lookahead_decoding":
        doc["speculative_config"] = {"decoding_type": "Lookahead", "max_draft_len": sp.max_draft_len}
    return {k: v for k, v in doc.items() if v is not None}


def default_timing_cache(cfg: Any) -> Path:
    """``build.timing_cache`` or ``<store_dir>/_trtllm_timing_cache/<gpu>-trtllm<ver>.cache`` (persists across builds)."""
    if cfg.build.timing_cache:
        from ....core.config import resolve_path

        return Path(resolve_path(cfg.build.timing_cache) or cfg.build.timing_cache)
    from ....core.config import resolve_path
    from ....core.hostinfo import gpus

    g = gpus()
    gpu = (cfg.target.gpu or (g[0]["name"] if g else "gpu")).lower().replace(" ", "_")
    ver = installed_version() or "none"
    return Path(resolve_path(cfg.store_dir) or cfg.store_dir) / "_trtllm_timing_cache" / f"{gpu}-trtllm{ver}.cache"


def runtime_problems(cfg: Any) -> list[Problem]:
    """Cross-field checks of ``package.runtime`` against the build and the model (speculative mode vs its settings,
    attention window vs max_seq_len and the model's window, KV offload vs reuse, acceptance measurement)."""
    pk = getattr(cfg, "package", None)
    rt = getattr(pk, "runtime", None)
    if rt is None:
        return []
    p = _window_problems(cfg, rt)
    p += _speculative_runtime_problems(cfg, rt)
    p += _kv_and_backend_problems(cfg, rt)
    if cfg.build.speculative.mode == "draft_tokens_external":
        p += _draft_problems(cfg)
    return p


_PRE = "package.runtime."


def _window_problems(cfg: Any, rt: Any) -> list[Problem]:
    """:func:`runtime_problems`: ``max_attention_window_size`` within ``build.max_seq_len`` and the model's window."""
    b, pre = cfg.build, _PRE
    p: list[Problem] = []
    w = rt.max_attention_window_size
    if w is not None and w > b.max_seq_len:
        p.append(
            Problem(
                pre + "max_attention_window_size",
                w,
                f"is larger than build.max_seq_len={b.max_seq_len}: no sequence can use it.",
                f"set it <= {b.max_seq_len} or leave it null (full attention, or the model's own sliding window)",
            )
        )
    mw = sliding_window(model_hf_config(cfg))
    if w is not None and mw is not None and w > mw:
        p.append(
            Problem(
                pre + "max_attention_window_size",
                w,
                f"is larger than the model's sliding_window={mw}: attention would reach tokens the model never attended to in training.",
                f"set it <= {mw} or leave it null",
            )
        )
    return p


def _speculative_runtime_problems(cfg: Any, rt: Any) -> list[Problem]:
    """:func:`runtime_problems`: Medusa/EAGLE/lookahead knobs and ``decoding_mode`` against ``build.speculative.mode``."""
    b, sp, pre = cfg.build, cfg.build.speculative, _PRE
    p: list[Problem] = []
    spec_mode = {"medusa": "medusa", "eagle": "eagle", "lookahead_decoding": "lookahead"}.get(sp.mode)
    engine = cfg.target.backend == "tensorrt"  # the PyTorch backend takes these through speculative_config instead
    if engine and sp.mode == "medusa" and not rt.medusa_choices:
        p.append(
            Problem(
                pre + "medusa_choices",
                None,
                "a Medusa engine (build.speculative.mode=medusa) needs the Medusa tree its heads "
                "were trained for; the backend's built-in tree belongs to one specific model.",
                "set package.runtime.medusa_choices='{0}, {0, 0}, {1}, ...' (the tree from the Medusa checkpoint)",
            )
        )
    if engine and sp.mode == "lookahead_decoding":
        for f in ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"):
            if getattr(rt, f) is None:
                p.append(
                    Problem(
                        pre + f,
                        None,
                        "a lookahead engine needs the (window, ngram, verification set) sizes.",
                        "set package.runtime.lookahead_window_size, lookahead_ngram_size and lookahead_verification_set_size",
                    )
                )
    for f, m in (
        ("medusa_choices", "medusa"),
        ("eagle_choices", "eagle"),
        ("lookahead_window_size", "lookahead_decoding"),
        ("lookahead_ngram_size", "lookahead_decoding"),
        ("lookahead_verification_set_size", "lookahead_decoding"),
    ):
        if getattr(rt, f) is not None and sp.mode != m:
            p.append(
                Problem(
                    pre + f,
                    getattr(rt, f),
                    f"is only used by a {m} engine; build.speculative.mode={sp.mode}.",
                    f"remove it or set build.speculative.mode={m}",
                )
            )
    if rt.decoding_mode is not None:
        if spec_mode and rt.decoding_mode != spec_mode:
            p.append(
                Problem(
                    pre + "decoding_mode",
                    rt.decoding_mode,
                    f"contradicts build.speculative.mode={sp.mode}.",
                    f"set it to {spec_mode} or null",
                )
            )
        if rt.decoding_mode in ("medusa", "eagle", "lookahead", "redrafter") and rt.decoding_mode != spec_mode:
            p.append(
                Problem(
                    pre + "decoding_mode",
                    rt.decoding_mode,
                    "needs an engine built for that speculative mode.",
                    "set build.speculative.mode accordingly or leave decoding_mode null",
                )
            )
        if rt.decoding_mode == "beam_search" and b.max_beam_width < 2:
            p.append(Problem(pre + "decoding_mode", rt.decoding_mode, "needs build.max_beam_width >= 2.", "raise build.max_beam_width"))
    return p


def _kv_and_backend_problems(cfg: Any, rt: Any) -> list[Problem]:
    """:func:`runtime_problems`: KV-cache host offload, draft fast logits, knobs the PyTorch-backend package lacks."""
    b, sp, pre = cfg.build, cfg.build.speculative, _PRE
    p: list[Problem] = []
    if rt.kv_cache_host_memory_bytes and not b.enable_kv_cache_reuse:
        p.append(
            Problem(
                pre + "kv_cache_host_memory_bytes",
                rt.kv_cache_host_memory_bytes,
                "host offload of KV blocks only works with KV-cache reuse.",
                "set build.enable_kv_cache_reuse=true",
            )
        )
    if rt.kv_cache_onboard_blocks is not None and not rt.kv_cache_host_memory_bytes:
        p.append(
            Problem(
                pre + "kv_cache_onboard_blocks",
                rt.kv_cache_onboard_blocks,
                "only applies with kv_cache_host_memory_bytes > 0.",
                "set package.runtime.kv_cache_host_memory_bytes or remove kv_cache_onboard_blocks",
            )
        )
    if rt.speculative_decoding_fast_logits and sp.mode != "draft_tokens_external":
        p.append(
            Problem(
                pre + "speculative_decoding_fast_logits",
                True,
                "only applies to draft-model speculative decoding.",
                "remove it or set build.speculative.mode=draft_tokens_external",
            )
        )
    if cfg.target.backend == "pytorch":
        for f in llmapi_unsupported(rt):
            p.append(
                Problem(
                    pre + f,
                    getattr(rt, f),
                    "has no equivalent in the PyTorch-backend (LLM API) package.",
                    "remove it, or build an engine with target.backend=tensorrt",
                )
            )
    return p


def _draft_problems(cfg: Any) -> list[Problem]:
    """:func:`runtime_problems` for ``build.speculative.mode=draft_tokens_external``: the draft checkpoint, the
    evaluated draft = the packaged one, and its acceptance measured before packaging."""
    sp, pk = cfg.build.speculative, getattr(cfg, "package", None)
    p: list[Problem] = []
    if cfg.target.backend == "tensorrt" and not sp.draft_model_path and not sp.draft_trtllm_checkpoint:
        p.append(
            Problem(
                "build.speculative.draft_model_path",
                None,
                "draft-model speculative decoding needs the draft checkpoint.",
                "set build.speculative.draft_model_path=/path/to/draft (HF checkpoint with trtllm_checkpoint/)",
            )
        )
    if (
        cfg.eval.draft_model_path
        and sp.draft_model_path
        and Path(str(cfg.eval.draft_model_path)).resolve() != Path(str(sp.draft_model_path)).resolve()
    ):
        p.append(
            Problem(
                "eval.draft_model_path",
                cfg.eval.draft_model_path,
                f"measures another draft than the one the build packages (build.speculative.draft_model_path={sp.draft_model_path}).",
                "set both to the same draft checkpoint",
            )
        )
    if cfg.eval.draft_model_path and cfg.eval.draft_tokens != sp.max_draft_len:
        p.append(
            Problem(
                "eval.draft_tokens",
                cfg.eval.draft_tokens,
                f"measures acceptance with k={cfg.eval.draft_tokens} draft tokens, "
                f"but the engine drafts build.speculative.max_draft_len={sp.max_draft_len}.",
                f"set eval.draft_tokens={sp.max_draft_len}",
            )
        )
    gate = getattr(pk, "speculative", None)
    if "package" in cfg.stages and not cfg.eval.draft_model_path and not (gate is not None and gate.allow_low_acceptance):
        p.append(
            Problem(
                "eval.draft_model_path",
                None,
                "the package stage enables a draft model only after its acceptance rate was measured on the eval set.",
                f"set eval.draft_model_path={sp.draft_model_path or '<the draft HF checkpoint>'} "
                "(or package.speculative.allow_low_acceptance=true)",
            )
        )
    return p


def _build_flag_problems(cfg: Any) -> list[Problem]:
    """:meth:`TensorRTLLMTarget.check_config`: trtllm-build flag combinations and limits (KV cache, plugins, FMHA,
    max_input_len / max_num_tokens)."""
    b = cfg.build
    p: list[Problem] = []
    if cfg.target.backend == "tensorrt":
        if b.kv_cache_type != "paged":
            p.append(
                Problem(
                    "build.kv_cache_type",
                    b.kv_cache_type,
                    "in-flight batching needs the paged KV cache.",
                    "set build.kv_cache_type=paged",
                )
            )
        if b.multiple_profiles and b.opt_num_tokens:
            p.append(
                Problem(
                    "build.opt_num_tokens",
                    b.opt_num_tokens,
                    "trtllm-build refuses --opt_num_tokens together with --multiple_profiles enable (RuntimeError).",
                    "drop build.opt_num_tokens or set build.multiple_profiles=false",
                )
            )
    if b.gemm_plugin not in FLAG_CHOICES["--gemm_plugin"]:
        p.append(Problem("build.gemm_plugin", b.gemm_plugin, f"must be one of {list(FLAG_CHOICES['--gemm_plugin'])}."))
    if b.gemm_plugin == "fp8" and cfg.quant.recipe not in ("fp8",):
        p.append(
            Problem(
                "build.gemm_plugin",
                b.gemm_plugin,
                "the fp8 GEMM plugin needs an FP8 checkpoint.",
                "use quant=fp8 or build.gemm_plugin=auto",
            )
        )
    if b.logits_dtype not in (None,) + FLAG_CHOICES["--logits_dtype"]:
        p.append(Problem("build.logits_dtype", b.logits_dtype, f"must be null or one of {list(FLAG_CHOICES['--logits_dtype'])}."))
    if b.enable_chunked_context and not b.use_paged_context_fmha:
        p.append(
            Problem(
                "build.enable_chunked_context",
                True,
                "chunked context needs paged context FMHA.",
                "set build.use_paged_context_fmha=true",
            )
        )
    if b.enable_kv_cache_reuse and not b.use_paged_context_fmha:
        p.append(
            Problem(
                "build.enable_kv_cache_reuse", True, "KV-cache reuse needs paged context FMHA.", "set build.use_paged_context_fmha=true"
            )
        )
    if b.max_input_len > b.max_seq_len:
        p.append(
            Problem(
                "build.max_input_len",
                b.max_input_len,
                f"exceeds build.max_seq_len={b.max_seq_len} (trtllm-build would clip it).",
                f"set build.max_input_len<={b.max_seq_len}",
            )
        )
    if b.max_num_tokens < b.max_input_len and not b.enable_chunked_context:
        p.append(
            Problem(
                "build.max_num_tokens",
                b.max_num_tokens,
                f"a prompt of max_input_len={b.max_input_len} tokens does not fit one engine step without chunked context.",
                f"set build.max_num_tokens>={b.max_input_len} or build.enable_chunked_context=true",
            )
        )
    return p


def _speculative_build_problems(cfg: Any) -> list[Problem]:
    """:meth:`TensorRTLLMTarget.check_config`: speculative decoding vs draft length, checkpoint, context logits and
    beam width; CUDA-graph batch sizes."""
    b, sp = cfg.build, cfg.build.speculative
    p: list[Problem] = []
    if sp.mode == "none" and sp.max_draft_len:
        p.append(
            Problem(
                "build.speculative.max_draft_len",
                sp.max_draft_len,
                "is set but build.speculative.mode=none.",
                "set build.speculative.mode or max_draft_len=0",
            )
        )
    if sp.mode != "none" and sp.max_draft_len < 1:
        p.append(
            Problem(
                "build.speculative.max_draft_len",
                sp.max_draft_len,
                f"speculative mode {sp.mode} needs max_draft_len >= 1.",
                "e.g. build.speculative.max_draft_len=4",
            )
        )
    if sp.mode in ("draft_tokens_external", "eagle", "medusa") and cfg.target.backend == "pytorch" and not sp.draft_model_path:
        p.append(
            Problem(
                "build.speculative.draft_model_path",
                None,
                f"speculative mode {sp.mode} needs the draft/head checkpoint.",
                "set build.speculative.draft_model_path=/path/to/checkpoint",
            )
        )
    if sp.mode != "none" and b.gather_context_logits:
        p.append(
            Problem(
                "build.gather_context_logits",
                True,
                "trtllm-build refuses --gather_context_logits with speculative decoding (max_draft_len > 0).",
                "build the speculative engine without it (fidelity metrics need a separate non-speculative build)",
            )
        )
    if sp.mode != "none" and b.max_beam_width != 1:
        p.append(
            Problem("build.max_beam_width", b.max_beam_width, "speculative decoding runs with beam width 1.", "set build.max_beam_width=1")
        )
    if b.cuda_graph_mode and any(int(x) < 1 for x in b.cuda_graph_batch_sizes):
        p.append(
            Problem(
                "build.cuda_graph_batch_sizes",
                list(b.cuda_graph_batch_sizes),
                "CUDA-graph batch sizes must be >= 1 (sizes above max_batch_size are dropped).",
                "e.g. build.cuda_graph_batch_sizes=[1,2,4,8]",
            )
        )
    return p


def accepts_version(backend: str, version: str) -> bool:
    """Whether the TensorRT-LLM ``version`` serves this backend: engines 1.2.0-1.2.1 (:data:`ENGINE_VERSIONS`), the
    PyTorch backend >= 1.2.0 (:data:`PYTORCH_MIN_VERSION`)."""
    vt = _ver_tuple(version)
    if backend == "tensorrt":
        return ENGINE_VERSIONS[0] <= vt <= ENGINE_VERSIONS[1]
    return vt >= PYTORCH_MIN_VERSION


def serving_image_problems(cfg: Any) -> list[Problem]:
    """Config time: the serving image (``package.serving_image`` or ``target.serving_image``) is a known tag of
    :data:`pipeline.facts.versions.TRTLLM_IMAGES` whose TensorRT-LLM version the backend accepts."""
    from ....facts import versions as V

    pk = getattr(cfg, "package", None)
    field = "package.serving_image" if getattr(pk, "serving_image", None) else "target.serving_image"
    image = (getattr(pk, "serving_image", None) or cfg.target.serving_image or "").strip()
    img = V.image_versions(image)
    backend = cfg.target.backend
    ok_tags = [t for t, (v, _, _) in V.TRTLLM_IMAGES.items() if accepts_version(backend, v)]
    fix = f"use nvcr.io/nvidia/tritonserver:<tag>-trtllm-python-py3 with tag in {ok_tags}" + (
        "" if ok_tags else " (none known: add the tag with its source to pipeline/facts/versions.py)"
    )
    if img is None:
        return [Problem(field, image, f"is not a known TensorRT-LLM serving image; known tag=TensorRT-LLM: {V.table_text()}.", fix)]
    path = "the legacy engine path (1.2.0-1.2.1)" if backend == "tensorrt" else "the PyTorch backend (>= 1.2.0)"
    if not accepts_version(backend, str(img["tensorrt_llm"])):
        return [Problem(field, image, f"ships TensorRT-LLM {img['tensorrt_llm']}, which {path} does not accept ({V.SOURCE}).", fix)]
    return []


def _version_fails(cfg: Any, exe: str) -> list[str]:
    """:meth:`TensorRTLLMTarget.preflight`: the installed TensorRT-LLM against the backend's range, and trtllm-build.

    The PyTorch backend accepts a host without TensorRT-LLM (it builds nothing); an installed one must be >= 1.2.0.
    """
    backend = cfg.target.backend
    fails: list[str] = []
    v = installed_version()
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
    """:meth:`TensorRTLLMTarget.preflight`: the GPU the package is for (the local one; for the PyTorch backend without
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


class TensorRTLLMTarget:
    name = "tensorrt_llm"

    def capabilities(self, cfg: Any = None) -> Capabilities:
        """The engine path's capabilities, or the PyTorch backend's when ``cfg.target.backend=pytorch``."""
        if cfg is not None and cfg.target.backend == "pytorch":
            return _capabilities("tensorrt_llm_pytorch")
        return _capabilities("tensorrt_llm")

    # ------------------------------------------------------------------ config time
    def check_config(self, cfg: Any) -> list[Problem]:
        """Cross-field rules of trtllm-build / BuildConfig (commands/build.py, builder.py); no heavy imports."""
        p = _build_flag_problems(cfg) + _speculative_build_problems(cfg)
        caps = self.capabilities(cfg)
        refusal = caps.recipe_refusal(cfg.quant.recipe)
        if refusal is not None:
            p.append(
                Problem(
                    "quant.recipe",
                    cfg.quant.recipe,
                    f"target {caps.name} cannot build this recipe: {refusal}.",
                    PYTORCH_ALTERNATIVE.format(recipe=cfg.quant.recipe)
                    if cfg.quant.recipe in PYTORCH_REFUSED_RECIPES and caps.name == "tensorrt_llm_pytorch"
                    else f"use quant=<one of {list(caps.recipes)}>",
                )
            )
        if cfg.quant.kv_cache_dtype not in caps.kv_cache_dtypes:
            p.append(
                Problem(
                    "quant.kv_cache_dtype",
                    cfg.quant.kv_cache_dtype,
                    f"target {caps.name} deploys KV caches {list(caps.kv_cache_dtypes)}.",
                    "set quant.kv_cache_dtype=fp8 (Ada/Hopper) or none, or use the legacy engine path target=tensorrt_llm "
                    "(TensorRT-LLM 1.2.x, INT8 KV)"
                    if caps.name == "tensorrt_llm_pytorch"
                    else "set quant.kv_cache_dtype=none",
                )
            )
        p += runtime_problems(cfg)
        p += serving_image_problems(cfg)
        # max_seq_len (+ draft) vs the model's positions: pipeline/build/checks.py (one rule, one place)
        return p

    def available(self) -> tuple[bool, str]:
        v = installed_version()
        if v is None:
            return False, "tensorrt_llm is not installed"
        return True, f"tensorrt_llm {v}"

    # ------------------------------------------------------------------ commands
    def trtllm_build_exe(self, cfg: Any) -> str:
        return cfg.target.trtllm_build

    def command(self, cfg: Any, checkpoint: Path | str, out: Path | str) -> list[str]:
        """The exact command :meth:`build` runs (backend tensorrt)."""
        T = QuantizeArtifact.TRTLLM_CHECKPOINT
        ckpt = QuantizeArtifact(Path(checkpoint)).trtllm_checkpoint if not str(checkpoint).endswith(T) else Path(checkpoint)
        return [self.trtllm_build_exe(cfg)] + build_args(cfg, ckpt, BuildArtifact(Path(out)).engine_dir, default_timing_cache(cfg))

    def plan(self, cfg: Any, checkpoint: Path | None, export_dir: Path | None, out: Path | None) -> dict[str, Any]:
        if cfg.target.backend == "pytorch":
            return {"command": None, "llm_api_options": llm_api_options(cfg), "runtime_knobs": runtime_knobs(cfg)}
        return {
            "command": self.command(cfg, checkpoint or "<quantize artifact>", out or "<build artifact>"),
            "build_config": build_config_dict(cfg),
            "runtime_knobs": runtime_knobs(cfg),
        }

    # ------------------------------------------------------------------ preflight
    def preflight(self, cfg: Any, checkpoint: Path, out: Path | None = None) -> None:
        """Check, before any GPU work: package + version, trtllm-build, GPU compute capability, memory plan.

        Engine path (``target.backend=tensorrt``): TensorRT-LLM 1.2.x, ``trtllm-build`` and a local GPU are required
        (an engine is compiled for the GPU it is built on). PyTorch backend: nothing is compiled, the build stage only
        writes the LLM-API options next to the unified HF checkpoint, so neither TensorRT-LLM nor a GPU is needed here;
        without a local GPU the GPU named by ``target.gpu`` (planner catalogue) is checked instead.

        Raises:
            PreflightError: every failed check with its fix, plus the exact command that would run.
        """
        backend = cfg.target.backend
        fails = _version_fails(cfg, self.trtllm_build_exe(cfg))
        fails += _gpu_fails(cfg)
        # The memory plan is not checked here: the runner refuses a plan that cannot work before any stage runs
        # (pipeline.planner.plan_for_run, exit 4), and the planner reads the targets, not the other way round.
        if fails:
            cmd = (
                shlex.join(self.command(cfg, checkpoint, out or "<build artifact>"))
                if backend == "tensorrt"
                else "(PyTorch backend: no trtllm-build)"
            )
            msg = "target tensorrt_llm cannot build on this machine:\n" + "\n".join(f"  - {f}" for f in fails)
            raise PreflightError(msg + f"\nCommand it would run:\n  {cmd}")
        ck = QuantizeArtifact(Path(checkpoint)).trtllm_checkpoint
        if backend == "tensorrt" and not (ck / "config.json").is_file():
            raise InputError(
                f"{ck}: no TensorRT-LLM checkpoint (config.json + rank*.safetensors). The quantize stage writes it; re-run it."
            )

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
        engine = BuildArtifact(out).engine_dir
        engine.mkdir(parents=True, exist_ok=True)
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
            (engine / BuildArtifact.LLM_API_OPTIONS).write_text(yaml.safe_dump(opts, sort_keys=False), encoding="utf-8")
            shutil.copytree(hf, engine / "hf")
            logf.write_text(
                "PyTorch backend: no engine build; wrote llm_api_options.yaml and copied the HF checkpoint.\n", encoding="utf-8"
            )
            info.update(command=None, llm_api_options=opts)
        else:
            info.update(self._run_trtllm_build(cfg, checkpoint, out, lg))
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
                "knobs": {"build_config": build_config_dict(cfg), "workers": b.workers, "target_gpu": cfg.target.gpu},
                "runtime": runtime_knobs(cfg),
                "limits": {
                    "max_batch_size": b.max_batch_size,
                    "max_input_len": b.max_input_len,
                    "max_seq_len": b.max_seq_len,
                    "max_num_tokens": b.max_num_tokens,
                    "max_beam_width": b.max_beam_width,
                },
                "engine_bytes": sum(f.stat().st_size for f in engine.rglob("*") if f.is_file()),
                "build_s": round(time.time() - t0, 3),
            }
        )
        return info

    def _run_trtllm_build(self, cfg: Any, checkpoint: Path, out: Path, lg: Any) -> dict[str, Any]:
        """Run ``trtllm-build`` (and the draft engine's, draft-model mode) with its output in ``out/build.log``; copy the
        tokenizer next to the engine. Returns the build_info fields ``command``, ``timing_cache``, ``ranks`` (``draft``).

        Raises: PipelineError with the log tail when trtllm-build fails or writes no engine.
        """
        engine, logf, hf = BuildArtifact(out).engine_dir, BuildArtifact(out).build_log_path, Path(checkpoint) / "hf"
        fields: dict[str, Any] = {}
        cmd = self.command(cfg, checkpoint, out)
        tc = default_timing_cache(cfg)
        tc.parent.mkdir(parents=True, exist_ok=True)
        lg.info("running: %s", shlex.join(cmd))
        with open(logf, "w", encoding="utf-8") as fh:
            fh.write(f"$ {shlex.join(cmd)}\n")
            fh.flush()
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False)
        tail = "".join(logf.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-30:])
        if proc.returncode != 0:
            raise PipelineError(f"trtllm-build failed (exit {proc.returncode}); full log {logf}; last lines:\n{tail}")
        ranks = sorted(engine.glob("rank*.engine"))
        if not ranks or not (engine / "config.json").is_file():
            raise PipelineError(
                f"trtllm-build exited 0 but wrote no engine (rank*.engine + config.json) into {engine}; log {logf}:\n{tail}"
            )
        if cfg.build.speculative.mode == "draft_tokens_external":
            fields["draft"] = self._build_draft(cfg, out, lg)
        for f in TOKENIZER_COPY_FILES:
            if (hf / f).is_file():  # trtllm-build does not copy the tokenizer (builder.py Engine.save)
                shutil.copy2(hf / f, engine / f)
        fields.update(command=cmd, timing_cache=str(tc), ranks=[r.name for r in ranks])
        return fields

    def draft_command(self, cfg: Any, out: Path | str) -> list[str]:
        """trtllm-build command of the draft engine (draft-model mode): same limits, no speculative flags, into
        ``out/draft_engine`` (:attr:`BuildArtifact.DRAFT_ENGINE_DIR`)."""
        from ....core.config import resolve_path

        sp = cfg.build.speculative
        ck = sp.draft_trtllm_checkpoint or (
            str(QuantizeArtifact(Path(sp.draft_model_path)).trtllm_checkpoint) if sp.draft_model_path else None
        )
        if ck is None:
            raise InputError(
                "build.speculative.draft_model_path is not set. Fix: set it to the draft checkpoint (HF + trtllm_checkpoint/)."
            )
        args = build_args(cfg, Path(resolve_path(ck) or ck), Path(out) / BuildArtifact.DRAFT_ENGINE_DIR, default_timing_cache(cfg))
        i = args.index("--speculative_decoding_mode")
        del args[i : i + 4]  # --speculative_decoding_mode X --max_draft_len N: the draft is a plain model
        return [self.trtllm_build_exe(cfg)] + args

    def _build_draft(self, cfg: Any, out: Path, lg: Any) -> dict[str, Any]:
        cmd = self.draft_command(cfg, out)
        ck = Path(cmd[cmd.index("--checkpoint_dir") + 1])
        if not (ck / "config.json").is_file():
            raise InputError(
                f"{ck}: no TensorRT-LLM checkpoint of the draft (config.json + rank*.safetensors). Fix: quantize/convert the "
                "draft (e.g. `pipeline model.path=<draft> stages=[export,quantize]`) and point build.speculative.draft_trtllm_checkpoint at it."
            )
        logf = out / BuildArtifact.DRAFT_BUILD_LOG
        lg.info("running (draft): %s", shlex.join(cmd))
        with open(logf, "w", encoding="utf-8") as fh:
            fh.write(f"$ {shlex.join(cmd)}\n")
            fh.flush()
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False)
        tail = "".join(logf.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-30:])
        eng = out / BuildArtifact.DRAFT_ENGINE_DIR
        if proc.returncode != 0 or not sorted(eng.glob("rank*.engine")) or not (eng / "config.json").is_file():
            raise PipelineError(
                f"trtllm-build of the draft engine failed (exit {proc.returncode}) or wrote no engine into {eng}; log {logf}:\n{tail}"
            )
        return {
            "command": cmd,
            "engine": BuildArtifact.DRAFT_ENGINE_DIR,
            "checkpoint": str(ck),
            "draft_model_path": cfg.build.speculative.draft_model_path,
        }

    def load_runner(self, engine_dir: Path, **kw: Any) -> Any:
        """The engine runner for evaluate/benchmark: TensorRT-LLM 1.2.x ``ModelRunnerCpp`` (engine path) or the LLM API
        (PyTorch backend), imported lazily (``pipeline.build.targets.tensorrt_llm.runner``).

        Raises:
            PreflightError: TensorRT-LLM is not importable on this machine (exit 4), with the fix.
        """
        if installed_version() is None:
            raise PreflightError(
                f"running a TensorRT-LLM engine needs TensorRT-LLM and a GPU. Fix: {INSTALL_FIX}; "
                "or evaluate the simulated model (eval.candidate=simulated)."
            )
        from .runner import load_runner

        return load_runner(Path(engine_dir), **kw)


TARGET: Target = TensorRTLLMTarget()
