"""``build`` config group: engine limits and build/runtime knobs (build stage).

Names follow TensorRT-LLM's ``BuildConfig`` / ``trtllm-build`` flags (see
TensorRT-LLM ``tensorrt_llm/commands/build.py`` and ``tensorrt_llm/builder.py``; docs/reference/tensorrt_llm.md §2) so a preset reads the same for both targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from .common import Problem, choice, runtime


@dataclass
class SpeculativeConfig:
    mode: str = "none"
    """none | draft_tokens_external (draft model) | medusa | eagle | lookahead_decoding."""
    max_draft_len: int = 0
    """Draft tokens per step; added to max_seq_len by trtllm-build."""
    draft_model_path: Optional[str] = runtime(None)
    """Hugging Face checkpoint folder of the draft model (mode draft_tokens_external); its acceptance rate is
    measured with eval.draft_model_path set to the same folder. A path: its content, not the string, is keyed."""
    draft_trtllm_checkpoint: Optional[str] = runtime(None)
    """TensorRT-LLM checkpoint of the draft (config.json + rank*.safetensors) its engine is built from;
    ``None`` = ``<draft_model_path>/trtllm_checkpoint``."""


@dataclass
class BuildConfig:
    name: str = "default"
    """Label of the build preset (latency, throughput, ...); recorded in benchmark reports as ``build_preset``."""
    max_batch_size: int = 8
    """Largest number of sequences scheduled together (in-flight batching slots)."""
    max_input_len: int = 256
    """Longest prompt in tokens."""
    max_seq_len: int = 384
    """Longest prompt + generated tokens per sequence."""
    max_num_tokens: int = 2048
    """Max tokens in one engine step after padding removal (context + generation)."""
    opt_num_tokens: Optional[int] = None
    """Token count (tokens per engine step) TensorRT optimises its kernels for (trtllm-build ``--opt_num_tokens``);
    ``None`` = TensorRT-LLM's choice. Not combinable with ``multiple_profiles``."""
    max_beam_width: int = 1
    """Largest beam width the engine serves (trtllm-build ``--max_beam_width``); 1 = greedy/sampling only.
    onnxruntime_genai builds refuse anything but 1."""
    tokens_per_block: int = 32
    """Paged KV-cache block size in tokens (power of two; TensorRT-LLM 1.x default 32)."""
    kv_cache_type: str = "paged"
    """paged (required for in-flight batching) | continuous | disabled."""
    use_paged_context_fmha: bool = True
    """Fused multi-head attention over the paged KV cache in the context phase (trtllm-build
    ``--use_paged_context_fmha``); needed for chunked context and KV-cache reuse."""
    use_fused_mlp: bool = True
    """Fuse the gate and up projections of the gated MLP into one GEMM (trtllm-build ``--use_fused_mlp``)."""
    gemm_plugin: str = "auto"
    """auto | float16 | bfloat16 | float32 | fp8 | disable."""
    multiple_profiles: bool = False
    """Build several TensorRT optimisation profiles over the token-count range (trtllm-build ``--multiple_profiles``):
    faster at varied batch shapes, longer build."""
    enable_chunked_context: bool = False
    """Split long prompts into chunks of max_num_tokens (needs paged context FMHA)."""
    logits_dtype: Optional[str] = None
    """float16 | float32 dtype of the engine's output logits (trtllm-build ``--logits_dtype``); ``None`` = the
    builder's default."""
    gather_context_logits: bool = False
    """trtllm-build --gather_context_logits: the engine returns prompt logits (teacher-forced fidelity metrics in
    evaluate); not combinable with speculative decoding (max_draft_len > 0)."""
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    """Speculative decoding: mode, draft length and the draft model."""
    # Runtime knobs recorded in build_info.json and used by the package stage (CUDA Graphs are a
    # runtime setting in the TensorRT-LLM 1.2 engine line, not a build flag).
    cuda_graph_mode: bool = True
    """Capture the generation step as CUDA Graphs at serving time (Triton TensorRT-LLM backend ``cuda_graph_mode``)."""
    cuda_graph_cache_size: int = 0
    """Number of CUDA Graphs kept (backend ``cuda_graph_cache_size``); 0 = the backend's default."""
    cuda_graph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """Batch sizes (sequences) CUDA Graphs are captured for; the packaged runtime config gets their maximum as
    ``cuda_graph_max_batch_size``."""
    kv_cache_free_gpu_mem_fraction: float = 0.9
    """Share (0..1) of the GPU memory left free after loading weights and activations that the paged KV-cache pool
    takes (TensorRT-LLM ``KvCacheConfig.free_gpu_memory_fraction``)."""
    enable_kv_cache_reuse: bool = False
    """Reuse cached KV blocks of a shared prompt prefix across requests (TensorRT-LLM ``enable_block_reuse``)."""
    batch_scheduler_policy: str = "guaranteed_no_evict"
    """guaranteed_no_evict | max_utilization."""
    timing_cache: Optional[str] = runtime(None)
    """Persisted TensorRT timing-cache file, read and updated by each build (speeds up rebuilds; never changes the
    engine's numerics); ``None`` = ``<store_dir>/_trtllm_timing_cache/<gpu>-trtllm<version>.cache``."""
    workers: int = runtime(1)
    """Ranks trtllm-build builds in parallel (``--workers``); changes build time only."""


def validate(cfg: BuildConfig, prefix: str = "build") -> list[Problem]:
    problems: list[Problem] = []
    for f in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width", "tokens_per_block"):
        v = getattr(cfg, f)
        if v < 1:
            problems.append(Problem(f"{prefix}.{f}", v, "must be >= 1.", f"set {prefix}.{f} to a positive integer"))
    t = cfg.tokens_per_block
    if t >= 1 and t & (t - 1):
        p2 = 1 << (t.bit_length() - 1)
        problems.append(Problem(f"{prefix}.tokens_per_block", t, "must be a power of two.", f"use {p2} or {p2 * 2}"))
    choice(problems, f"{prefix}.kv_cache_type", cfg.kv_cache_type, ("paged", "continuous", "disabled"))
    choice(problems, f"{prefix}.batch_scheduler_policy", cfg.batch_scheduler_policy, ("guaranteed_no_evict", "max_utilization"))
    choice(problems, f"{prefix}.gemm_plugin", cfg.gemm_plugin, ("auto", "float16", "bfloat16", "float32", "fp8", "disable"))
    choice(
        problems,
        f"{prefix}.speculative.mode",
        cfg.speculative.mode,
        ("none", "draft_tokens_external", "medusa", "eagle", "lookahead_decoding"),
    )
    if not 0.0 < cfg.kv_cache_free_gpu_mem_fraction <= 1.0:
        problems.append(
            Problem(f"{prefix}.kv_cache_free_gpu_mem_fraction", cfg.kv_cache_free_gpu_mem_fraction, "must be in (0, 1].", "use 0.9")
        )
    return problems
