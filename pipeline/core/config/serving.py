"""TensorRT-LLM serving knobs (``package.runtime``) and the speculative-decoding acceptance gate (``package.speculative``).

Field names are the TensorRT-LLM Triton backend's own ``tensorrt_llm/config.pbtxt`` parameter names (TensorRT-LLM
1.2.x, ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``; the full table with defaults
is ``docs/reference/tensorrt_llm_backend_parameters.md``). ``None`` means: take the value the build decided
(``build_info.json`` ``runtime``) or, when the build decides nothing, leave the parameter out so the backend uses its
own default. Only the ``tensorrt_llm`` target reads these fields; cross-field checks that need the build and the
model (speculative mode vs choices, attention window vs ``max_seq_len``) live in
``pipeline.build.targets.tensorrt_llm.builder.TensorRTLLMTarget.check_config``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .common import Problem, choice

DECODING_MODES = ("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle")
"""Values the backend accepts for ``decoding_mode`` (TensorRT-LLM backend docs/model_config.md)."""
GUIDED_DECODING_BACKENDS = ("xgrammar",)
ENCODER_FEATURE_TYPES = ("TYPE_FP16", "TYPE_BF16", "TYPE_FP32")


@dataclass
class RuntimeConfig:
    """``tensorrt_llm`` model parameters a user tunes at serving time (same names as the backend)."""

    # KV cache
    max_tokens_in_paged_kv_cache: Optional[int] = None
    """KV-cache capacity cap in tokens; with ``kv_cache_free_gpu_mem_fraction`` the smaller wins. None = no cap."""
    kv_cache_free_gpu_mem_fraction: Optional[float] = None
    """Share of free GPU memory (after weights/activations) for the KV cache, (0, 1]. None = the build's value."""
    kv_cache_host_memory_bytes: Optional[int] = None
    """Host memory for offloaded KV blocks (bytes); only used with KV-cache reuse. None = no offload."""
    kv_cache_onboard_blocks: Optional[bool] = None
    """Copy offloaded blocks back to GPU before use (backend default true). None = backend default."""
    cross_kv_cache_fraction: Optional[float] = None
    """Encoder-decoder engines only: share of the KV cache for cross attention (backend default 0.5)."""
    max_attention_window_size: Optional[int] = None
    """Attention window in tokens (sliding-window models). None = the model's ``sliding_window`` when it is smaller
    than ``build.max_seq_len`` (decided by the build), else full attention."""
    sink_token_length: Optional[int] = None
    """Attention-sink tokens kept with a sliding window (StreamingLLM style). None = none."""
    # kernels / scheduling
    multi_block_mode: Optional[bool] = None
    """Split long-context generation attention over several CUDA blocks (backend default true)."""
    enable_context_fmha_fp32_acc: Optional[bool] = None
    """FP32 accumulation in context FMHA (backend default false; more accurate, slower)."""
    enable_trt_overlap: Optional[bool] = None
    """Experimental, with CUDA graph mode (backend default false)."""
    gpu_weights_percent: Optional[float] = None
    """Weight streaming: share of weights kept on GPU (needs an engine built with weight streaming)."""
    # housekeeping
    cancellation_check_period_ms: Optional[int] = None
    """How often the backend checks for cancelled requests (backend default 100 ms)."""
    stats_check_period_ms: Optional[int] = None
    """How often the backend publishes statistics (backend default 100 ms)."""
    iter_stats_max_iterations: Optional[int] = None
    """Iterations of statistics kept (backend default: the executor's, 1000)."""
    request_stats_max_iterations: Optional[int] = None
    """Iterations of per-request statistics kept (backend default: the executor's, 0 = off)."""
    normalize_log_probs: bool = True
    """Normalize ``output_log_probs`` (backend default true)."""
    # placement
    gpu_device_ids: Optional[str] = None
    """GPUs per model instance, e.g. ``"0,1"``; ``;`` separates instances (``"0,1;2,3"``). None = all visible GPUs."""
    participant_ids: Optional[str] = None
    """MPI ranks of each instance in orchestrator mode without process spawning, e.g. ``"1,2;3,4"``."""
    num_nodes: Optional[int] = None
    """Nodes the engine spans (multi-node MPI; backend default 1)."""
    # features
    guided_decoding_backend: Optional[str] = None
    """``xgrammar`` turns on guided decoding (JSON schema / regex / grammar) with the packaged tokenizer."""
    xgrammar_tokenizer_info_path: Optional[str] = None
    """Optional xgrammar tokenizer-info JSON (absolute path inside the serving container)."""
    lora_cache_optimal_adapter_size: Optional[int] = None
    """LoRA cache: the adapter size (LoRA rank) one cache page is sized to hold (backend default 8)."""
    lora_cache_max_adapter_size: Optional[int] = None
    """LoRA cache: the largest adapter size (LoRA rank) a page must fit one row of (backend default 64)."""
    lora_cache_gpu_memory_fraction: Optional[float] = None
    """LoRA cache: share (0..1) of the GPU memory left after weights and KV cache used for adapters (backend
    default 0.05)."""
    lora_cache_host_memory_bytes: Optional[int] = None
    """LoRA cache: host memory for adapters, in bytes (backend default 1 GiB)."""
    lora_prefetch_dir: Optional[str] = None
    """Folder of LoRA adapters loaded at startup (absolute path inside the serving container; backend default none)."""
    encoder_model_path: Optional[str] = None
    """Encoder-decoder engines: encoder engine folder (absolute path inside the serving container)."""
    encoder_input_features_data_type: str = "TYPE_FP16"
    """Data type of ``encoder_input_features`` (TYPE_BF16 for mllama, TYPE_FP16 otherwise)."""
    # speculative decoding (the mode and draft length come from build.speculative)
    decoding_mode: Optional[str] = None
    """None = derived from the build (speculative mode, else top_k_top_p / beam_search by beam width)."""
    medusa_choices: Optional[str] = None
    """Medusa tree, e.g. ``"{0, 0, 0}, {0, 1}"``; required for a Medusa engine."""
    eagle_choices: Optional[str] = None
    """EAGLE static tree in the same notation; None = the engine's dynamic tree."""
    lookahead_window_size: Optional[int] = None
    """Lookahead decoding W: tokens guessed ahead per step (lookahead window); required for a lookahead engine."""
    lookahead_ngram_size: Optional[int] = None
    """Lookahead decoding N: length of the n-grams kept as candidates; required for a lookahead engine."""
    lookahead_verification_set_size: Optional[int] = None
    """Lookahead decoding G: candidate n-grams verified per step; required for a lookahead engine (W, N, G all set)."""
    speculative_decoding_fast_logits: Optional[bool] = None
    """Draft-model mode: pass draft logits between the two models without a copy through the BLS."""


@dataclass
class SpeculativeGateConfig:
    """Acceptance-first rule for speculative decoding: measure, then enable."""

    min_acceptance_rate: float = 0.5
    """Minimum draft acceptance rate (accepted / proposed draft tokens, greedy) on the business eval set, overall
    and on every slice. 0.5 with k=4 draft tokens gives ~1.94 expected tokens per target step (Leviathan et al.
    2023, eq. 1: (1 - a^(k+1)) / (1 - a)); below it the draft's own cost eats most of the gain."""
    min_slice_acceptance_rate: Optional[float] = None
    """Per-slice minimum; None = ``min_acceptance_rate``."""
    allow_low_acceptance: bool = False
    """Package a speculative mode whose acceptance is below the threshold or was not measured (recorded in the
    release manifest as an override). Off by default."""


_IDS = re.compile(r"^\d+(,\d+)*(;\d+(,\d+)*)*$")
_CHOICES = re.compile(r"^\s*\{\s*\d+(\s*,\s*\d+)*\s*\}(\s*,\s*\{\s*\d+(\s*,\s*\d+)*\s*\})*\s*$")


def validate(cfg: RuntimeConfig, prefix: str = "package.runtime") -> list[Problem]:
    """Field-level checks (types, ranges, formats); every problem names the field, the value and the fix."""
    p: list[Problem] = []
    for f in (
        "max_tokens_in_paged_kv_cache",
        "cancellation_check_period_ms",
        "stats_check_period_ms",
        "iter_stats_max_iterations",
        "num_nodes",
        "max_attention_window_size",
        "lookahead_window_size",
        "lookahead_ngram_size",
        "lookahead_verification_set_size",
        "lora_cache_optimal_adapter_size",
        "lora_cache_max_adapter_size",
    ):
        v = getattr(cfg, f)
        if v is not None and v < 1:
            p.append(Problem(f"{prefix}.{f}", v, "must be >= 1 or null.", f"remove {prefix}.{f} to use the default"))
    for f in ("kv_cache_host_memory_bytes", "request_stats_max_iterations", "sink_token_length", "lora_cache_host_memory_bytes"):
        v = getattr(cfg, f)
        if v is not None and v < 0:
            p.append(Problem(f"{prefix}.{f}", v, "must be >= 0 or null.", f"remove {prefix}.{f} to use the default"))
    for f in ("kv_cache_free_gpu_mem_fraction", "gpu_weights_percent", "lora_cache_gpu_memory_fraction"):
        v = getattr(cfg, f)
        if v is not None and not 0.0 < v <= 1.0:
            p.append(Problem(f"{prefix}.{f}", v, "must be in (0, 1] or null.", f"e.g. {prefix}.{f}=0.9"))
    if cfg.cross_kv_cache_fraction is not None and not 0.0 < cfg.cross_kv_cache_fraction < 1.0:
        p.append(
            Problem(
                f"{prefix}.cross_kv_cache_fraction",
                cfg.cross_kv_cache_fraction,
                "must be in (0, 1) or null.",
                f"e.g. {prefix}.cross_kv_cache_fraction=0.5",
            )
        )
    for f in ("gpu_device_ids", "participant_ids"):
        v = getattr(cfg, f)
        if v is not None and not _IDS.match(str(v)):
            p.append(
                Problem(
                    f"{prefix}.{f}", v, "must be comma-separated integers, ';' between instances.", f"e.g. {prefix}.{f}='0,1' or '0,1;2,3'"
                )
            )
    for f in ("medusa_choices", "eagle_choices"):
        v = getattr(cfg, f)
        if v is not None and not _CHOICES.match(str(v)):
            p.append(Problem(f"{prefix}.{f}", v, "must be a list of index paths in braces.", f"e.g. {prefix}.{f}='{{0}}, {{0, 0}}, {{1}}'"))
    if cfg.decoding_mode is not None:
        choice(p, f"{prefix}.decoding_mode", cfg.decoding_mode, DECODING_MODES, "or leave it null to derive it from the build")
    if cfg.guided_decoding_backend is not None:
        choice(p, f"{prefix}.guided_decoding_backend", cfg.guided_decoding_backend, GUIDED_DECODING_BACKENDS, "or null (off)")
    choice(p, f"{prefix}.encoder_input_features_data_type", cfg.encoder_input_features_data_type, ENCODER_FEATURE_TYPES)
    if cfg.cross_kv_cache_fraction is not None and not cfg.encoder_model_path:
        p.append(
            Problem(
                f"{prefix}.cross_kv_cache_fraction",
                cfg.cross_kv_cache_fraction,
                "only applies to encoder-decoder engines, and no encoder_model_path is set.",
                f"set {prefix}.encoder_model_path or remove cross_kv_cache_fraction",
            )
        )
    if cfg.xgrammar_tokenizer_info_path and cfg.guided_decoding_backend != "xgrammar":
        p.append(
            Problem(
                f"{prefix}.xgrammar_tokenizer_info_path",
                cfg.xgrammar_tokenizer_info_path,
                "is only read with guided_decoding_backend=xgrammar.",
                f"set {prefix}.guided_decoding_backend=xgrammar",
            )
        )
    for f in ("encoder_model_path", "xgrammar_tokenizer_info_path", "lora_prefetch_dir"):
        v = getattr(cfg, f)
        if v and not str(v).startswith("/"):
            p.append(
                Problem(f"{prefix}.{f}", v, "must be an absolute path inside the serving container.", f"e.g. {prefix}.{f}=/models/...")
            )
    return p


def validate_speculative(cfg: SpeculativeGateConfig, prefix: str = "package.speculative") -> list[Problem]:
    p: list[Problem] = []
    for f in ("min_acceptance_rate", "min_slice_acceptance_rate"):
        v = getattr(cfg, f)
        if v is not None and not 0.0 <= v <= 1.0:
            p.append(Problem(f"{prefix}.{f}", v, "must be in [0, 1].", f"e.g. {prefix}.{f}=0.5"))
    return p
