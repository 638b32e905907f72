"""Model shapes from a Hugging Face ``config.json``: parameter counts and the linear layers.

Only the decoder-only transformer families the pipeline supports are described (Llama, Mistral,
Qwen2, Phi-3 and look-alikes): attention with GQA (``num_key_value_heads``), a gated (SwiGLU)
MLP, RMSNorm, untied or tied embeddings.  Field names follow ``transformers`` ``PretrainedConfig``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError

# rope types whose factor TensorRT-LLM does NOT multiply into the default max_seq_len
# (tensorrt_llm/builder.py, summarised in docs/reference/tensorrt_llm.md §2): for these,
# max_position_embeddings already is the extended length (e.g. Llama 3.1: 131072).
_ROPE_NO_FACTOR = ("su", "longrope", "llama3")


def rope_scale(config: dict[str, Any]) -> tuple[str | None, float]:
    """``(rope_type, factor)`` of a ``config.json`` dict's RoPE scaling in any spelling (legacy ``rope_scaling`` with
    ``type`` or ``rope_type``, transformers 5 ``rope_parameters``: :func:`pipeline.facts.rope.normalise_rope`);
    ``(None, 1.0)`` for plain RoPE or a malformed scaling (the export stage names it)."""
    from .rope import normalise_rope

    try:
        _, rope = normalise_rope(config)
        factor = float((rope or {}).get("factor") or 1.0)
    except (InputError, TypeError, ValueError):
        return None, 1.0
    return (str(rope["rope_type"]) if rope else None), (factor if factor > 0 else 1.0)


def position_limit(max_positions: int, rope_type: str | None, factor: float) -> int:
    """Longest sequence (tokens) the position encoding supports: ``max_positions`` x the rope ``factor``, except for
    the rope types whose config already states the extended length (TensorRT-LLM builder rule, ``tensorrt_llm/
    builder.py``)."""
    if rope_type in _ROPE_NO_FACTOR or factor <= 1.0:
        return max_positions
    return int(max_positions * factor)


#: bytes per element of each dtype name the planner and the memory model use
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}


@dataclasses.dataclass(frozen=True)
class Linear:
    """One linear layer: HF module name, (in, out) features, decoder layer index (-1 = lm_head),
    ``split``: how tensor parallelism shards it (``col`` splits out, ``row`` splits in, ``kv`` = column
    split of K/V heads that are replicated when TP exceeds the KV-head count, ``vocab`` = lm_head)."""

    name: str
    in_features: int
    out_features: int
    layer: int
    split: str
    bias: bool = False


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Shape facts of a checkpoint (all counts are integers; ``rope_factor`` a float)."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    rope_type: str | None
    rope_factor: float
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    torch_dtype: str | None
    sliding_window: int | None = None

    @classmethod
    def from_hf_config(cls, d: dict[str, Any], source: str = "config.json") -> ModelShape:
        """Parse a config.json dict. Raises :class:`InputError` naming the missing/invalid field."""
        if not isinstance(d, dict):
            raise InputError(f"{source}: expected a JSON object, got {type(d).__name__}")
        if "hidden_size" not in d and isinstance(d.get("text_config"), dict):  # multimodal wrappers
            d = {**d["text_config"], "architectures": d.get("architectures")}

        def need(k: str) -> int:
            v = d.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{source}: field {k!r} must be a positive integer, got {v!r}. Fix the config.json (or model.hf_config).")
            return v

        hidden, heads, layers, vocab = need("hidden_size"), need("num_attention_heads"), need("num_hidden_layers"), need("vocab_size")
        kv = d.get("num_key_value_heads") or heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1:
            raise InputError(f"{source}: num_key_value_heads must be a positive integer, got {kv!r}")
        head_dim = d.get("head_dim") or hidden // heads
        if not isinstance(head_dim, int) or head_dim < 1:
            raise InputError(f"{source}: head_dim must be a positive integer, got {head_dim!r}")
        inter = d.get("intermediate_size") or 4 * hidden
        if not isinstance(inter, int) or inter < 1:
            raise InputError(f"{source}: intermediate_size must be a positive integer, got {inter!r}")
        maxpos = d.get("max_position_embeddings") or 2048  # TensorRT-LLM's fallback when unknown (tensorrt_llm/builder.py)
        if not isinstance(maxpos, int) or maxpos < 1:
            raise InputError(f"{source}: max_position_embeddings must be a positive integer, got {maxpos!r}")
        rope_type, factor = rope_scale(d)
        archs = d.get("architectures") or ["unknown"]
        sw = d.get("sliding_window") if d.get("use_sliding_window", True) else None
        model_type = str(d.get("model_type") or "unknown")
        return cls(
            architecture=str(archs[0]) if isinstance(archs, list) and archs else str(archs),
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            max_positions=maxpos,
            rope_type=str(rope_type) if rope_type else None,
            rope_factor=factor,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases (modeling_qwen2); others follow attention_bias
            attention_bias=bool(d.get("attention_bias", model_type == "qwen2")),
            mlp_bias=bool(d.get("mlp_bias", False)),
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
            sliding_window=sw if isinstance(sw, int) else None,
        )

    @property
    def max_seq_len_limit(self) -> int:
        """Longest sequence the position encoding supports (:func:`position_limit`)."""
        return position_limit(self.max_positions, self.rope_type, self.rope_factor)

    def linears(self) -> Iterator[Linear]:
        """Every linear layer of the decoder (HF module names) plus ``lm_head`` (tied or not)."""
        h, hd, q, kv, i = self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads, self.intermediate_size
        fused = self.model_type == "phi3"  # Phi-3 fuses qkv_proj and gate_up_proj
        for L in range(self.num_layers):
            p = f"model.layers.{L}"
            if fused:
                yield Linear(f"{p}.self_attn.qkv_proj", h, (q + 2 * kv) * hd, L, "qkv", self.attention_bias)
            else:
                yield Linear(f"{p}.self_attn.q_proj", h, q * hd, L, "col", self.attention_bias)
                yield Linear(f"{p}.self_attn.k_proj", h, kv * hd, L, "kv", self.attention_bias)
                yield Linear(f"{p}.self_attn.v_proj", h, kv * hd, L, "kv", self.attention_bias)
            yield Linear(f"{p}.self_attn.o_proj", q * hd, h, L, "row", False)
            if fused:
                yield Linear(f"{p}.mlp.gate_up_proj", h, 2 * i, L, "col", self.mlp_bias)
            else:
                yield Linear(f"{p}.mlp.gate_proj", h, i, L, "col", self.mlp_bias)
                yield Linear(f"{p}.mlp.up_proj", h, i, L, "col", self.mlp_bias)
            yield Linear(f"{p}.mlp.down_proj", i, h, L, "row", self.mlp_bias)
        yield Linear("lm_head", h, self.vocab_size, -1, "vocab", False)

    @property
    def num_parameters(self) -> int:
        """Parameter count as ``transformers`` reports it (tied lm_head counted once)."""
        n = self.vocab_size * self.hidden_size  # embed_tokens
        for lin in self.linears():
            if lin.name == "lm_head" and self.tie_word_embeddings:
                continue
            n += lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0)
        n += (2 * self.num_layers + 1) * self.hidden_size  # RMSNorm weights
        return n

    def kv_bytes_per_token(self, kv_bytes: float, tp: int = 1, layers: int | None = None) -> int:
        """2 (K and V) x layers x KV heads per rank x head_dim x bytes per element.

        Source: TensorRT-LLM docs/source/legacy/reference/memory.md (docs/reference/tensorrt_llm.md §5), checked against its
        log example (Llama-7B, FP8 KV: 256 KiB per token).  KV heads are split by TP and replicated
        when TP exceeds their count (each rank keeps at least one)."""
        n_layers = self.num_layers if layers is None else layers
        return int(2 * n_layers * kv_heads_per_rank(self.num_kv_heads, tp) * self.head_dim * kv_bytes)


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    return max(1, math.ceil(kv_heads / tp))


def read_config_json(path: Path) -> dict[str, Any]:
    """Parse ``path`` (a config.json). Raises :class:`InputError` naming the file."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{path}: not found. Point model.path at a Hugging Face checkpoint folder with a config.json, "
            f"or use a shapes-only preset (model=llama31_8b)."
        ) from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read it as JSON ({e}). Fix or replace the file.") from None
