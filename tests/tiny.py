"""Tiny, real Hugging Face checkpoints for tests: real architecture configs shrunk to a few layers.

``make_checkpoint(dir, arch)`` writes config.json, model.safetensors (seeded random weights),
generation_config.json and a byte-level BPE tokenizer trained on a few sentences, all loadable
by transformers and by onnxruntime-genai's model builder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ARCHS = ("llama", "mistral", "qwen2", "phi3")

_CORPUS = [
    "Where is my order ORD-12345? It was due on 2024-03-05.",
    "I want a refund for the damaged item.",
    "Please cancel order ORD-99871 and refund 129.50 dollars.",
    "我的订单 ORD-55555 什么时候到？",
    "Change the shipping address to 12 Main Street.",
    "The quick brown fox jumps over the lazy dog 0123456789.",
] * 4

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def make_tokenizer(out: Path, vocab_size: int = 320) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
    fast.save_pretrained(str(out))


def hf_config(arch: str, **overrides: Any):
    import transformers as tf

    common = dict(vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                  tie_word_embeddings=False)
    if arch == "llama":
        cfg = tf.LlamaConfig(**common)
    elif arch == "mistral":
        cfg = tf.MistralConfig(**common, sliding_window=None)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**common)
    elif arch == "phi3":
        c = dict(common)
        c["num_key_value_heads"] = 4  # Phi-3 mini uses MHA
        cfg = tf.Phi3Config(**c)
    else:
        raise ValueError(f"unknown arch {arch!r}; known: {ARCHS}")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def make_checkpoint(out: Path, arch: str = "llama", *, seed: int = 0, dtype: str = "float32", tokenizer: bool = True, **overrides: Any) -> Path:
    """Write a tiny seeded random-weight checkpoint of ``arch`` to ``out`` and return ``out``."""
    import torch
    import transformers as tf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(arch, **overrides)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    # random init of a tiny model gives near-uniform logits; widen them so greedy decoding is stable
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(str(out), safe_serialization=True)
    if tokenizer:
        make_tokenizer(out, vocab_size=min(cfg.vocab_size, 320))
    return out


def read_json(p: Path) -> dict:
    return json.loads(Path(p).read_text())
