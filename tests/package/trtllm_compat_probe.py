"""Run by the compat venv's python (transformers 4.57.x, no torch, no pipeline): load what a tensorrt_llm_pytorch package
ships as the TensorRT-LLM PyTorch backend does, and print what was read as one JSON line.

Usage: python trtllm_compat_probe.py <checkpoint dir> <tokenizer dir> <conversation JSON>
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _tokenizer(d: str, conversation: list) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    ids = tok.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
    return {
        "class": type(tok).__name__,
        "has_chat_template": bool(tok.chat_template),
        "rendered": tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True),
        "ids": list(ids["input_ids"] if isinstance(ids, dict) else ids),
        "special_tokens": list(tok.all_special_tokens),
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "len": len(tok),
    }


def _generation(d: str) -> dict:
    from transformers import GenerationConfig

    g = GenerationConfig.from_pretrained(d)
    return {k: getattr(g, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def _headers(d: str) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            for name in st.keys():
                s = st.get_slice(name)
                out[name] = [s.get_dtype(), list(s.get_shape())]
    return out


def _config(d: str) -> dict:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(d)
    qc = getattr(cfg, "quantization_config", None) or {}
    return {
        "class": type(cfg).__name__,
        "rope_theta": getattr(cfg, "rope_theta", None),
        "rope_scaling": getattr(cfg, "rope_scaling", None),
        "dtype": str(getattr(cfg, "torch_dtype", None)),
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "eos_token_id": cfg.eos_token_id,
        "quant_algo": qc.get("quant_algo") if isinstance(qc, dict) else None,
    }


def _each(fn: Callable[..., dict], *args: Any) -> dict:
    """``fn(*args)``, or ``{"error": ...}``: one file that does not load must not hide what the others give."""
    try:
        return fn(*args)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main() -> None:
    import transformers

    ckpt, tokdir, conversation = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    report = {
        "transformers": transformers.__version__,
        "config": _each(_config, ckpt),
        "checkpoint_tokenizer": _each(_tokenizer, ckpt, conversation),
        "tokenizer": _each(_tokenizer, tokdir, conversation),
        "checkpoint_generation": _each(_generation, ckpt),
        "tokenizer_generation": _each(_generation, tokdir),
        "headers": _each(_headers, ckpt),
    }
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
