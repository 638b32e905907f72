"""Interleaved single-stream A/B of onnxruntime-genai engines: decode time per token of each, measured in turns.

    python -m pipeline.benchmark.ab ENGINE_DIR [ENGINE_DIR ...] [--rounds 15] [--tokens 96] [--prompt-len 64]

Each round runs every engine once (same prompt: token ids 10 .. 10+prompt_len-1, greedy, exactly ``tokens`` new
tokens through ``og.Generator``), so slow drifts of a shared host hit all engines alike; the median over rounds is
reported. TPOT here = (time of the last token - time of the first) / (tokens - 1), in ms, the same definition as the
benchmark stage (docs/benchmark.md). One warm-up round of 16 tokens per engine is not counted. This is how the
``quant.resmooth`` A/B of docs/quantize.md was measured; it compares engines, it does not replace ``make bench``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def _tpot_ms(model: Any, prompt: list[int], tokens: int) -> float:
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + tokens, min_length=len(prompt) + tokens, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    first = last = 0.0
    n = 0
    while not gen.is_done():
        gen.generate_next_token()
        n += 1
        last = time.perf_counter()
        if n == 1:
            first = last
    return (last - first) / max(1, n - 1) * 1000.0


def measure(engine_dirs: list[str], *, rounds: int = 15, tokens: int = 96, prompt_len: int = 64) -> dict[str, dict[str, Any]]:
    """``{engine_dir: {"median_ms", "per_round_ms"}}``; see the module docstring. Raises ``ValueError`` for
    ``tokens`` < 2, ``rounds`` < 1 or a folder onnxruntime-genai cannot load."""
    import onnxruntime_genai as og

    if tokens < 2 or rounds < 1:
        raise ValueError(f"tokens={tokens} and rounds={rounds}: need tokens >= 2 and rounds >= 1")
    models = {}
    for d in engine_dirs:
        try:
            models[d] = og.Model(d)
        except Exception as e:  # og raises RuntimeError with its own message
            raise ValueError(f"{d}: not an onnxruntime-genai engine folder ({e})") from e
    prompt = list(range(10, 10 + prompt_len))
    for m in models.values():
        _tpot_ms(m, prompt, 16 if tokens >= 16 else tokens)
    per: dict[str, list[float]] = {d: [] for d in engine_dirs}
    for _ in range(rounds):
        for d, m in models.items():
            per[d].append(_tpot_ms(m, prompt, tokens))
    return {d: {"median_ms": statistics.median(v), "per_round_ms": v} for d, v in per.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.benchmark.ab", description=__doc__.splitlines()[0])
    ap.add_argument("engines", nargs="+", help="engine folders (a build artifact's engine/)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--prompt-len", type=int, default=64)
    a = ap.parse_args(argv)
    try:
        res = measure(a.engines, rounds=a.rounds, tokens=a.tokens, prompt_len=a.prompt_len)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    for d, r in res.items():
        print(f"{r['median_ms']:8.3f} ms  TPOT median of {a.rounds}  {d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
