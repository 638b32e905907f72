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
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
    fast.save_pretrained(str(out))


def hf_config(arch: str, **overrides: Any):
    import transformers as tf

    common = dict(
        vocab_size=384,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
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
        if k == "rope_theta" and isinstance(getattr(cfg, "rope_parameters", None), dict):
            cfg.rope_parameters["rope_theta"] = v  # transformers 5 reads rope_parameters
    return cfg


def make_checkpoint(
    out: Path, arch: str = "llama", *, seed: int = 0, dtype: str = "float32", tokenizer: bool = True, **overrides: Any
) -> Path:
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


# --------------------------------------------------------------------------------------------------------------------
# Model families: each tiny checkpoint copies the *shape* of the real family's files (config fields, tokenizer kind,
# special tokens, chat template, eos list, pad), not its size.  ``make_family(out, name)`` builds one.
# --------------------------------------------------------------------------------------------------------------------

_FAMILY_CORPUS = _CORPUS + [
    "Hello world, how are you today? I'm fine, thanks.",
    "订单已经发货了，请耐心等待。谢谢！",
    "Refund 42.00 USD to card ending 1234 on 2024-12-31.",
]

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)


def _added(content: str, **kw: Any):
    from tokenizers import AddedToken

    return AddedToken(content, normalized=False, special=kw.pop("special", True), **kw)


QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _bytelevel_tokenizer(specials: list[str], vocab_size: int = 300, qwen: bool = False):
    """GPT-2/Llama-3/Qwen2-style byte-level BPE: the 256-byte alphabet plus a few merges, specials appended.
    ``qwen``: Qwen2's NFC normalizer and split regex (single digits) before a regex-free ByteLevel, as in its tokenizer.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    if qwen:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_FAMILY_CORPUS, trainer=trainer)
    tok.add_special_tokens([_added(s) for s in specials])
    return tok


def _spm_tokenizer(*, legacy: bool, n_pieces: int = 96, extra_specials: tuple = ()):
    """Llama-2 / Mistral / Phi-3 style SentencePiece BPE **with byte fallback**, as transformers' LlamaConverter writes it.

    ids 0..2 = ``<unk> <s> </s>``, 3..258 = ``<0x00>..<0xFF>``, then the learned pieces (a small alphabet, so most CJK
    characters and every emoji go through the byte pieces).  ``legacy``: the ``Prepend("▁") + Replace`` normalizer
    (Llama-2, Phi-3); otherwise the ``Metaspace(prepend_scheme="first", split=False)`` pre-tokenizer (non-legacy
    conversion, Mistral).  Decoder ``Replace("▁", " "), ByteFallback, Fuse, Strip(1 leading space)``.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    learner.train_from_iterator(_FAMILY_CORPUS, trainer=trainers.BpeTrainer(vocab_size=n_pieces, limit_alphabet=60, show_progress=False))
    spec = json.loads(learner.to_str())["model"]
    vocab: dict[str, int] = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(spec["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([_added("<unk>"), _added("<s>"), _added("</s>")])
    tok.add_special_tokens([_added(s, rstrip=rs) for s, rs in extra_specials])
    return tok


#: family -> how its tokenizer and config look.  ``arch``: tests/tiny ARCHS entry.
FAMILIES: dict[str, dict[str, Any]] = {
    # Llama-2: SentencePiece byte fallback (legacy normalizer), BOS added by the tokenizer and the template, no pad.
    "llama2": dict(
        arch="llama",
        tokenizer="spm_legacy",
        template=LLAMA2_TEMPLATE,
        bos="<s>",
        eos="</s>",
        pad=None,
        tokenizer_class="LlamaTokenizer",
        add_bos_token=True,
        legacy=True,
    ),
    # Llama-3: byte-level BPE, BOS from the tokenizer's post-processor and the template, eos list, no pad.
    "llama3": dict(
        arch="llama",
        tokenizer="bytelevel",
        template=LLAMA3_TEMPLATE,
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        pad=None,
        specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        eos_list=["<|end_of_text|>", "<|eot_id|>"],
        tokenizer_class="PreTrainedTokenizerFast",
        post_bos=True,
        clean_up_tokenization_spaces=True,
        config=dict(rope_theta=500000.0),
    ),
    # Mistral-7B-v0.1 style: non-legacy SentencePiece (Metaspace), BOS from the template.
    "mistral": dict(
        arch="mistral",
        tokenizer="spm_metaspace",
        template=MISTRAL_TEMPLATE,
        bos="<s>",
        eos="</s>",
        pad=None,
        tokenizer_class="LlamaTokenizer",
        add_bos_token=True,
        legacy=False,
    ),
    # Qwen2/2.5: byte-level BPE, ChatML, no BOS (config.json still names one), pad = <|endoftext|>, qkv bias.
    "qwen2": dict(
        arch="qwen2",
        tokenizer="bytelevel",
        template=QWEN2_TEMPLATE,
        bos=None,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        config_bos="<|endoftext|>",
        eos_list=["<|im_end|>", "<|endoftext|>"],
        tokenizer_class="Qwen2Tokenizer",
        config=dict(rope_theta=1000000.0),
    ),
    # Phi-3-mini: Llama SentencePiece (legacy) + <|user|>/<|assistant|>/<|end|> (rstrip), no BOS in the template.
    "phi3": dict(
        arch="phi3",
        tokenizer="spm_legacy",
        template=PHI3_TEMPLATE,
        bos="<s>",
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        extra_specials=[("<|endoftext|>", False), ("<|assistant|>", True), ("<|end|>", True), ("<|system|>", True), ("<|user|>", True)],
        eos_list=["<|endoftext|>", "<|end|>"],
        tokenizer_class="LlamaTokenizer",
        add_bos_token=False,
        legacy=False,
        # Phi-3-mini-4k: original_max_position_embeddings == max_position_embeddings (no LongRoPE),
        # sliding_window = positions - 1 (2047 of 4096 there)
        config=dict(original_max_position_embeddings=512, sliding_window=511),
    ),
}
#: variants: family name -> (base family, config overrides)
FAMILY_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral_window": ("mistral", dict(sliding_window=16)),
    "qwen2_tied": ("qwen2", dict(tie_word_embeddings=True)),
}


def family_spec(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(family spec, config overrides) of a family or variant name."""
    if name in FAMILY_VARIANTS:
        base, over = FAMILY_VARIANTS[name]
        return FAMILIES[base], dict(over)
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; known: {sorted(FAMILIES) + sorted(FAMILY_VARIANTS)}")
    return FAMILIES[name], {}


def make_family_tokenizer(out: Path, name: str) -> dict[str, Any]:
    """Write the family's tokenizer files to ``out``; returns ``{"bos_id", "eos_ids", "pad_id", "size"}``."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    spec, _ = family_spec(name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if spec["tokenizer"] == "bytelevel":
        tok = _bytelevel_tokenizer(spec["specials"], qwen=spec["tokenizer_class"] == "Qwen2Tokenizer")
    else:
        tok = _spm_tokenizer(legacy=spec["tokenizer"] == "spm_legacy", extra_specials=tuple(spec.get("extra_specials", ())))
    bos = spec.get("bos")
    if bos and (spec.get("post_bos") or spec.get("add_bos_token")):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    kw = {k: spec[k] for k in ("bos", "eos", "pad") if spec.get(k)}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, **{f"{k}_token": v for k, v in kw.items()}, unk_token="<unk>" if spec["tokenizer"] != "bytelevel" else None
    )
    fast.chat_template = spec["template"]
    fast.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = read_json(cfg_path)
    cfg["tokenizer_class"] = spec["tokenizer_class"]
    cfg["clean_up_tokenization_spaces"] = bool(spec.get("clean_up_tokenization_spaces", False))
    for k in ("add_bos_token", "legacy"):
        if k in spec:
            cfg[k] = spec[k]
    if spec["tokenizer"] != "bytelevel":
        cfg.setdefault("add_eos_token", False)
    if bos is None:
        cfg["bos_token"] = None
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tid = tok.token_to_id
    return {
        "bos_id": tid(spec.get("config_bos") or bos) if (spec.get("config_bos") or bos) else None,
        "eos_ids": [tid(e) for e in spec.get("eos_list", [spec["eos"]])],
        "pad_id": tid(spec["pad"]) if spec.get("pad") else None,
        "size": tok.get_vocab_size(with_added_tokens=True),
    }


def make_family(out: Path, name: str, *, seed: int = 0, dtype: str = "float32", **overrides: Any) -> Path:
    """A tiny random-weight checkpoint of family ``name`` (see :data:`FAMILIES`, :data:`FAMILY_VARIANTS`) in ``out``."""
    spec, over = family_spec(name)
    out = Path(out)
    ids = make_family_tokenizer(out, name)
    cfg = dict(max_position_embeddings=512)  # room for the cpu_default build (max_seq_len 384)
    cfg.update(spec.get("config", {}))
    cfg.update(over)
    cfg.update(overrides)
    eos = ids["eos_ids"]
    cfg.update(bos_token_id=ids["bos_id"], eos_token_id=eos if len(eos) > 1 else eos[0], pad_token_id=ids["pad_id"])
    make_checkpoint(out, spec["arch"], seed=seed, dtype=dtype, tokenizer=False, **cfg)
    gen = read_json(out / "generation_config.json")
    gen["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    if ids["pad_id"] is None:
        gen.pop("pad_token_id", None)
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return out


def without_chat_template(src: Path, dst: Path) -> Path:
    """A copy of the checkpoint ``src`` at ``dst`` with no chat template (none in tokenizer_config.json, no
    chat_template.* file)."""
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    for f in dst.glob("chat_template.*"):
        f.unlink()
    return dst
