"""Standard benchmark shapes: checkpoints with real architectures and deterministic random weights.

``llama80m`` is the memory-bound shape of ``make bench``: a Llama with 12 layers, hidden 768, intermediate 2048,
12 attention heads / 4 KV heads (GQA), vocabulary 3072 (the default model's tokenizer), about 80 M parameters
(75.5 M in the decoder layers + 2 x 2.4 M embedding / LM head). The weights are drawn from N(0, 0.02²) with a fixed
torch seed, so every run of the script writes the same tensors; they are generated on demand, never committed.

    python -m pipeline.bench.shapes llama80m bench/models/llama80m     # writes the checkpoint (skips if present)

Random weights give near-uniform next-token distributions: the shape is for speed (``benchmark.ignore_eos=true``
generates the requested length), not for quality; its release gate is meaningless and ``make bench`` packages it
with ``package.allow_failed_gate=true``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..artifacts import REQUIRED_TOKENIZER_FILES, TOKENIZER_COPY_FILES

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_SOURCE = ROOT / "models" / "support-llama"

SHAPES: dict[str, dict[str, Any]] = {
    "llama80m": {
        "num_hidden_layers": 12,
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "vocab_size": 3072,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "tie_word_embeddings": False,
    },
}
"""Shape name -> ``transformers.LlamaConfig`` fields."""
SEED = 1234
INIT_STD = 0.02


def parameter_count(shape: str) -> int:
    """Parameters of ``shape`` (decoder layers + embedding + LM head + norms), from its config alone."""
    c = SHAPES[shape]
    h, i, L, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h
    return L * per_layer + v * h * (1 if c["tie_word_embeddings"] else 2) + h


def make_shape(shape: str, out: Path, *, seed: int = SEED, force: bool = False) -> Path:
    """Write the ``shape`` checkpoint (config.json, model.safetensors, tokenizer files) into ``out``.

    Deterministic: same ``seed`` -> same weights (torch CPU generator). Skips the work when ``out`` already holds
    this shape and seed (``bench_shape.json``), unless ``force``.

    Raises:
        ValueError: unknown shape. FileNotFoundError: the default model's tokenizer is missing.
    """
    import torch
    import transformers as tf

    if shape not in SHAPES:
        raise ValueError(f"unknown benchmark shape {shape!r}; known: {sorted(SHAPES)}")
    out = Path(out)
    stamp = {"shape": shape, "seed": seed, "init_std": INIT_STD, "config": SHAPES[shape]}
    if not force and (out / "bench_shape.json").is_file() and json.loads((out / "bench_shape.json").read_text()) == stamp:
        return out
    missing = [f for f in REQUIRED_TOKENIZER_FILES if not (TOKENIZER_SOURCE / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{TOKENIZER_SOURCE}: {missing} missing; the benchmark shapes use the default model's tokenizer")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = tf.LlamaConfig(**SHAPES[shape])
    gen = torch.Generator().manual_seed(seed)
    with torch.device("cpu"):
        model = tf.LlamaForCausalLM(cfg).float()  # = .to(torch.float32); PreTrainedModel.to is typed as the unbound nn.Module.to
    with torch.no_grad():
        for _name, p in sorted(model.named_parameters()):
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
            else:
                p.fill_(1.0)  # RMSNorm weights
    model.save_pretrained(str(tmp), safe_serialization=True)
    for f in TOKENIZER_COPY_FILES:
        if (TOKENIZER_SOURCE / f).is_file():
            shutil.copy2(TOKENIZER_SOURCE / f, tmp / f)
    (tmp / "bench_shape.json").write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.bench.shapes", description="Write a standard benchmark checkpoint.")
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--force", action="store_true", help="rewrite even when the folder already holds this shape")
    a = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    path = make_shape(a.shape, a.out, seed=a.seed, force=a.force)
    print(f"{a.shape}: {parameter_count(a.shape) / 1e6:.1f} M parameters -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
