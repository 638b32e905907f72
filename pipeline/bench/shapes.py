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

from ..core.artifacts import REQUIRED_TOKENIZER_FILES, TOKENIZER_COPY_FILES

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_SOURCE = ROOT / "models" / "support-llama"

_COMMON: dict[str, Any] = {
    "vocab_size": 3072,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
    "tie_word_embeddings": False,
}
SHAPES: dict[str, dict[str, Any]] = {
    "llama80m": {
        "num_hidden_layers": 12,
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        **_COMMON,
    },
    # The scale ladder of `make bench-scale` (docs/memory.md): real geometries, the default tokenizer's vocabulary,
    # stored in bfloat16 like the released checkpoints they stand in for.
    "llama400m": {  # 16 layers of hidden 1536 / intermediate 4096, 12 heads / 4 KV heads (head_dim 128): 412 M
        **_COMMON,
        "num_hidden_layers": 16,
        "hidden_size": 1536,
        "intermediate_size": 4096,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "dtype": "bfloat16",
    },
    "llama1b": {  # TinyLlama-1.1B's decoder geometry (22 x 2048 / 5632, 32 heads / 4 KV heads): 1.0 B
        **_COMMON,
        "num_hidden_layers": 22,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "dtype": "bfloat16",
    },
    "llama3b": {  # Llama-3.2-3B's decoder geometry (28 x 3072 / 8192, 24 heads / 8 KV heads): 2.8 B
        **_COMMON,
        "num_hidden_layers": 28,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "dtype": "bfloat16",
    },
    "llama8b": {  # Llama-3.1-8B's decoder geometry (32 x 4096 / 14336, 32 heads / 8 KV heads): 7.0 B with this vocabulary
        **_COMMON,
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "dtype": "bfloat16",
    },
    "llamatiny": {  # the smallest shape with the int4 group size (128) dividing every linear: `make test`'s gpu-check run
        **_COMMON,
        "num_hidden_layers": 4,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "dtype": "bfloat16",
    },
}
"""Shape name -> ``transformers.LlamaConfig`` fields (``dtype``: the stored dtype, float32 when absent)."""
#: Largest safetensors shard written (bytes); bigger checkpoints get ``model-0000N-of-0000M.safetensors`` + an index.
SHARD_BYTES = 2_000_000_000
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


def make_shape(shape: str, out: Path, *, seed: int = SEED, force: bool = False, draw_device: str = "cpu") -> Path:
    """Write the ``shape`` checkpoint (config.json, model.safetensors, tokenizer files) into ``out``.

    Deterministic: same ``seed`` -> same weights (torch CPU generator; ``draw_device="cuda"`` draws with a CUDA
    generator instead: other numbers, the same distribution, a 7 B shape in seconds instead of minutes). Skips the work
    when ``out`` already holds this shape, seed and draw device (``bench_shape.json``), unless ``force``.

    Raises:
        ValueError: unknown shape. FileNotFoundError: the default model's tokenizer is missing.
    """
    import transformers as tf

    if shape not in SHAPES:
        raise ValueError(f"unknown benchmark shape {shape!r}; known: {sorted(SHAPES)}")
    out = Path(out)
    stamp = {"shape": shape, "seed": seed, "init_std": INIT_STD, "config": SHAPES[shape]}
    if draw_device != "cpu":
        stamp["draw_device"] = draw_device
    if not force and (out / "bench_shape.json").is_file() and json.loads((out / "bench_shape.json").read_text()) == stamp:
        return out
    missing = [f for f in REQUIRED_TOKENIZER_FILES if not (TOKENIZER_SOURCE / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{TOKENIZER_SOURCE}: {missing} missing; the benchmark shapes use the default model's tokenizer")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _write_weights(tf.LlamaConfig(**SHAPES[shape]), tmp, seed, draw_device)
    for f in TOKENIZER_COPY_FILES:
        if (TOKENIZER_SOURCE / f).is_file():
            shutil.copy2(TOKENIZER_SOURCE / f, tmp / f)
    (tmp / "bench_shape.json").write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _write_weights(cfg: Any, out: Path, seed: int, draw_device: str = "cpu") -> None:
    """Write ``config.json`` and the random weights of ``cfg`` into ``out`` one tensor at a time (never the whole model).

    Draws: every 2-D parameter N(0, ``INIT_STD``²), in sorted name order, from one torch CPU generator seeded with
    ``seed``, in float32, then cast to the stored dtype; 1-D (RMSNorm) weights are 1. That is the sequence of building
    the model and filling it in place (what this module did before), so a shape's weights do not change; a 3 B shape
    needs one tensor of memory instead of 11 GB. Shards hold at most :data:`SHARD_BYTES`.
    """
    import torch
    import transformers as tf

    from ..core.tensorio import write_streaming

    dtype = getattr(torch, str(getattr(cfg, "dtype", None) or "float32").removeprefix("torch."))
    with torch.device("meta"):
        meta = tf.LlamaForCausalLM(cfg)
    params = sorted((n, tuple(p.shape)) for n, p in meta.named_parameters())
    size = dtype.itemsize if hasattr(dtype, "itemsize") else torch.finfo(dtype).bits // 8
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for n, shape in params:
        b = size * int(torch.Size(shape).numel())
        if shards[-1] and used + b > SHARD_BYTES:
            shards.append([])
            used = 0
        shards[-1].append((n, shape))
        used += b
    gen = torch.Generator(device=draw_device).manual_seed(seed)

    shape_of = dict(params)

    def draw(name: str) -> torch.Tensor:
        shape = shape_of[name]
        if len(shape) != 2:
            return torch.ones(shape).to(dtype)
        return (torch.randn(shape, generator=gen, device=draw_device) * INIT_STD).to(dtype).cpu()

    # generate in sorted order across shards (the generator's sequence), writing each shard as its tensors come
    names = [[n for n, _ in sh] for sh in shards]
    files = (
        ["model.safetensors"] if len(shards) == 1 else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for f, sh in zip(files, shards):
        write_streaming(out / f, [(n, dtype, shape) for n, shape in sh], draw, metadata={"format": "pt"})
    if len(files) > 1:
        index = {"metadata": {"total_size": sum(size * int(torch.Size(s).numel()) for _, s in params)}, "weight_map": {}}
        for f, ns in zip(files, names):
            index["weight_map"].update({n: f for n in ns})
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.dtype = dtype
    cfg.save_pretrained(str(out))
    del meta


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
