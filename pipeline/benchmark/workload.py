"""Request mix for the benchmark: prompts from the business eval set or synthetic lengths, seeded.

Every request is rendered through :mod:`pipeline.core.tokenization` (chat template supplies BOS), so all
modes (in-process engine, Triton, transformers baseline) receive exactly the same token ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.tokenization import encode_prompt
from ..errors import InputError


@dataclasses.dataclass
class BenchRequest:
    """One benchmark request.

    Attributes:
        request_id: stable id (``<dataset>-<index>``).
        prompt: the user message (text; Triton mode sends it through the ensemble's preprocessing); for an eval item
            given as ``messages``, their contents joined by newlines (for display only).
        input_ids: rendered + encoded prompt ids (what the in-process modes are fed).
        max_new_tokens: output length budget (exactly this many tokens when ``ignore_eos``).
        messages: the eval item's ``[{"role", "content"}, ...]`` when it has them instead of a prompt (Triton mode
            sends them as the ensemble's ``messages``).
    """

    request_id: str
    prompt: str
    input_ids: list[int]
    max_new_tokens: int
    messages: list[dict[str, Any]] | None = None


def sample_lengths(dist: Any, n: int, rng: np.random.Generator, field: str) -> list[int]:
    """``n`` integer lengths from a :class:`pipeline.core.config.benchmark.LengthDist`.

    kinds: ``fixed`` (= mean), ``uniform`` (mean ± spread), ``normal`` (mean, std = spread),
    ``lognormal`` (distribution *mean* = mean, sigma of log = spread; mu = ln(mean) - sigma²/2 so that
    E[X] = mean). Values are rounded and clipped to [min, max].

    Raises:
        InputError: unknown kind or inconsistent bounds (names ``field``).
    """
    lo, hi = int(dist.min), int(dist.max)
    if lo < 1 or hi < lo:
        raise InputError(f"{field}: min={lo}, max={hi} must satisfy 1 <= min <= max. Fix: e.g. {field}.min=1 {field}.max=256")
    mean, spread = float(dist.mean), float(dist.spread)
    if dist.kind == "fixed":
        x = np.full(n, mean)
    elif dist.kind == "uniform":
        x = rng.uniform(mean - spread, mean + spread, n)
    elif dist.kind == "normal":
        x = rng.normal(mean, spread, n)
    elif dist.kind == "lognormal":
        if mean <= 0:
            raise InputError(f"{field}.mean={mean}: a log-normal length needs mean > 0.")
        mu = math.log(mean) - spread**2 / 2.0
        x = rng.lognormal(mu, spread, n)
    else:
        raise InputError(f"{field}.kind={dist.kind!r}: must be one of fixed, uniform, normal, lognormal.")
    return [int(v) for v in np.clip(np.rint(x), lo, hi)]


def _messages_text(messages: Sequence[dict[str, Any]]) -> str:
    """An eval item's ``messages`` as plain text (their contents joined by newlines): its display prompt and, for
    synthetic prompts, corpus text."""
    return "\n".join(str(m.get("content", "")) for m in messages)


def _read_jsonl(path: Path, key: str) -> list[dict[str, Any]]:
    """The objects of a JSONL file that have a string ``key`` (``prompt``: or a list ``messages``, as the eval set
    format allows, docs/evaluate.md).  Raises InputError naming the line and the fix."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise InputError(f"{path}:{ln}: not valid JSON ({e}). Fix the line or regenerate the file.") from None
            if not isinstance(row, dict) or not (
                isinstance(row.get(key), str) or (key == "prompt" and isinstance(row.get("messages"), list) and row["messages"])
            ):
                what = (
                    "a string field 'prompt' or a list 'messages' (the eval set format)" if key == "prompt" else f"a string field {key!r}"
                )
                raise InputError(
                    f"{path}:{ln}: expected an object with {what}. Fix: correct the line, or point the benchmark at "
                    f"another file (eval.eval_set for benchmark.dataset=eval, calibration.dataset for synthetic prompts)."
                )
            rows.append(row)
    if not rows:
        raise InputError(f"{path}: no records. Point the benchmark at a non-empty JSONL file.")
    return rows


def build_requests(
    bcfg: Any,
    tokenizer: Any,
    n: int,
    *,
    seed: int,
    eval_set: Path | None = None,
    corpus: Path | None = None,
    max_input_len: int | None = None,
    max_seq_len: int | None = None,
    prefix: str = "req",
) -> list[BenchRequest]:
    """``n`` seeded requests for ``bcfg`` (a BenchmarkConfig).

    ``dataset=eval``: prompts drawn (seeded, with replacement) from ``eval_set`` (JSONL with
    ``prompt``); ``dataset=synthetic``: a prompt of ``input_len`` tokens cut from ``corpus``
    (JSONL with ``text``, else the eval prompts) at a seeded offset. Output lengths always come from
    ``output_len``. Lengths are checked against the engine limits.

    Raises:
        InputError: missing data file, or a request that cannot fit ``max_input_len``/``max_seq_len``.
    """
    rng = np.random.default_rng(seed)
    out_lens = sample_lengths(bcfg.output_len, n, rng, "benchmark.output_len")
    reqs: list[BenchRequest] = []
    if bcfg.dataset == "eval":
        if eval_set is None or not Path(eval_set).exists():
            raise InputError(
                f"benchmark.dataset=eval needs the eval set (eval.eval_set={eval_set!r}); set eval.eval_set or use benchmark.dataset=synthetic."
            )
        rows = _read_jsonl(Path(eval_set), "prompt")
        idx = rng.integers(0, len(rows), n)
        for i, (j, ol) in enumerate(zip(idx, out_lens)):
            row = rows[int(j)]
            if isinstance(row.get("prompt"), str):
                p = row["prompt"]
                reqs.append(BenchRequest(f"{prefix}-{i}", p, encode_prompt(tokenizer, p), ol))
            else:
                msgs = [dict(m) for m in row["messages"]]
                text = _messages_text(msgs)
                reqs.append(BenchRequest(f"{prefix}-{i}", text, encode_prompt(tokenizer, messages=msgs), ol, messages=msgs))
    else:
        src = corpus if corpus is not None and Path(corpus).exists() else eval_set
        if src is None or not Path(src).exists():
            raise InputError("benchmark.dataset=synthetic needs a text corpus (calibration.dataset or eval.eval_set) to cut prompts from.")
        try:
            texts = [r["text"] for r in _read_jsonl(Path(src), "text")]
        except InputError:
            texts = [
                r["prompt"] if isinstance(r.get("prompt"), str) else _messages_text(r["messages"]) for r in _read_jsonl(Path(src), "prompt")
            ]
        ids = list(tokenizer("\n".join(texts), add_special_tokens=False)["input_ids"])
        in_lens = sample_lengths(bcfg.input_len, n, rng, "benchmark.input_len")
        for i, (il, ol) in enumerate(zip(in_lens, out_lens)):
            il = min(il, len(ids))
            off = int(rng.integers(0, max(1, len(ids) - il)))
            text = tokenizer.decode(ids[off : off + il], skip_special_tokens=True)
            reqs.append(BenchRequest(f"{prefix}-{i}", text, encode_prompt(tokenizer, text), ol))
    bad = []
    for r in reqs:
        if max_input_len is not None and len(r.input_ids) > max_input_len:
            bad.append(f"{r.request_id}: prompt {len(r.input_ids)} tokens > max_input_len {max_input_len}")
        elif max_seq_len is not None and len(r.input_ids) + r.max_new_tokens > max_seq_len:
            bad.append(f"{r.request_id}: {len(r.input_ids)} + {r.max_new_tokens} tokens > max_seq_len {max_seq_len}")
    if bad:
        raise InputError(
            f"{len(bad)} benchmark request(s) do not fit the engine limits, e.g. {bad[0]}. "
            "Fix: lower benchmark.input_len / benchmark.output_len (max) or build with larger build.max_input_len / build.max_seq_len."
        )
    return reqs


def dataset_digest(requests: Sequence[BenchRequest]) -> str:
    """sha256 over every request's input ids and output budget (identifies the exact workload)."""
    h = hashlib.sha256()
    for r in requests:
        h.update(json.dumps([r.input_ids, r.max_new_tokens]).encode())
    return h.hexdigest()
