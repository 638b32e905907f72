"""Config-time rules of the ``tensorrt_llm`` target (:meth:`~.builder.TensorRTLLMTarget.check_config`).

Rule: every cross-field check of ``build``, ``quant``, ``package.runtime`` and the serving image that the target can
decide from the config alone (no host, no heavy import) lives here and returns :class:`Problem` s; host checks are
:mod:`.preflight`. ``max_seq_len`` (+ draft) against the model's positions, ``max_input_len`` against ``max_seq_len``,
``max_num_tokens`` against ``max_input_len`` and chunked context's paged FMHA hold for every target: they are
pipeline/build/checks.py (one rule, one place).

Facts: trtllm-build flag combinations (TensorRT-LLM 1.2.x ``commands/build.py``, ``builder.py``), the runtime knobs of
the Triton ``tensorrt_llm`` model (tensorrtllm_backend docs/model_config.md) and of the LLM API (``llmapi/llm_args.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ....core.config.common import Problem, problems_where
from ....core.targets.base import Capabilities
from ....facts.trtllm import PYTORCH_ALTERNATIVE, PYTORCH_REFUSED_RECIPES, SPECULATIVE_RUNTIME_FIELDS, llmapi_unsupported
from .engine import FLAG_CHOICES
from .runtime import model_hf_config, sliding_window
from .versions import accepts_version


def config_problems(cfg: Any, caps: Capabilities) -> list[Problem]:
    """Cross-field rules of trtllm-build / BuildConfig (commands/build.py, builder.py), the recipe and KV cache against
    ``caps`` (the backend's capabilities), ``package.runtime`` and the serving image; no heavy imports."""
    p = _build_flag_problems(cfg) + _speculative_build_problems(cfg)
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
    return p + runtime_problems(cfg) + serving_image_problems(cfg)


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
    for f, m in SPECULATIVE_RUNTIME_FIELDS.items():
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
    """:func:`config_problems`: trtllm-build flag combinations and limits (KV cache, plugins, FMHA)."""
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
    if b.enable_kv_cache_reuse and not b.use_paged_context_fmha:
        p.append(
            Problem(
                "build.enable_kv_cache_reuse", True, "KV-cache reuse needs paged context FMHA.", "set build.use_paged_context_fmha=true"
            )
        )
    return p


def _speculative_build_problems(cfg: Any) -> list[Problem]:
    """:func:`config_problems`: speculative decoding vs draft length, checkpoint, context logits and
    beam width; CUDA-graph batch sizes."""
    b, sp = cfg.build, cfg.build.speculative
    return problems_where(
        (
            sp.mode == "none" and sp.max_draft_len,
            "build.speculative.max_draft_len",
            sp.max_draft_len,
            "is set but build.speculative.mode=none.",
            "set build.speculative.mode or max_draft_len=0",
        ),
        (
            sp.mode != "none" and sp.max_draft_len < 1,
            "build.speculative.max_draft_len",
            sp.max_draft_len,
            f"speculative mode {sp.mode} needs max_draft_len >= 1.",
            "e.g. build.speculative.max_draft_len=4",
        ),
        (
            sp.mode in ("draft_tokens_external", "eagle", "medusa") and cfg.target.backend == "pytorch" and not sp.draft_model_path,
            "build.speculative.draft_model_path",
            None,
            f"speculative mode {sp.mode} needs the draft/head checkpoint.",
            "set build.speculative.draft_model_path=/path/to/checkpoint",
        ),
        (
            sp.mode != "none" and b.gather_context_logits,
            "build.gather_context_logits",
            True,
            "trtllm-build refuses --gather_context_logits with speculative decoding (max_draft_len > 0).",
            "build the speculative engine without it (fidelity metrics need a separate non-speculative build)",
        ),
        (
            sp.mode != "none" and b.max_beam_width != 1,
            "build.max_beam_width",
            b.max_beam_width,
            "speculative decoding runs with beam width 1.",
            "set build.max_beam_width=1",
        ),
        (
            b.cuda_graph_mode and any(int(x) < 1 for x in b.cuda_graph_batch_sizes),
            "build.cuda_graph_batch_sizes",
            list(b.cuda_graph_batch_sizes),
            "CUDA-graph batch sizes must be >= 1 (sizes above max_batch_size are dropped).",
            "e.g. build.cuda_graph_batch_sizes=[1,2,4,8]",
        ),
    )


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
