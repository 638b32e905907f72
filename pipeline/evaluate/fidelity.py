"""Token-level fidelity of the candidate against the baseline, teacher-forced.

Both models read the *same* token stream: every eval prompt followed by its reference answer and the
first eos id (cut to the item's generation budget; see :func:`build_sequences` for the answer's tokens).  At every answer position t the baseline's
next-token distribution P_t and the candidate's Q_t are compared, as llama.cpp's perplexity tool does in
its KL-divergence mode (``tools/perplexity``, ``--kl-divergence-base`` then ``--kl-divergence``):

- KLD_t = sum_v P_t(v) (log P_t(v) - log Q_t(v)) in nats (natural log), from ``log_softmax`` in float64;
  reported as mean +- standard error (sample std / sqrt(N - 1)), median, p90, p95, p99, p99.9, max
  (``numpy.quantile``, linear interpolation) over all positions;
- top-1 agreement ("same top p" in llama.cpp): share of positions where argmax Q_t == argmax P_t, +- its
  binomial standard error sqrt(p (1 - p) / (N - 1));
- ln(PPL_cand / PPL_base) = mean_t (-log Q_t(x_t) + log P_t(x_t)) over the actual next tokens x_t,
  +- the standard error of that mean; PPL_base and PPL_cand too.

Teacher forcing keeps one early divergence from making every later comparison meaningless.  Positions
within one answer are correlated, so the standard errors (like llama.cpp's) understate the uncertainty;
they are reported, not used by the gate.  The gate uses the overall mean KLD and top-1 agreement
(``eval.gate.max_kld`` / ``min_top1``, ``pipeline/evaluate/gate.py``).

Runners provide ``teacher_forced_logits(seqs, batch_size, advance, into=None)`` filling ``into[i]`` (default: a new
list) with ``np.ndarray (len(continuation), vocab)``, the float32 logits at the positions that predict each continuation
token; see ``runners.py``. The evaluate stage never holds all of them: the baseline's go to a file
(:class:`SpilledLogits`, memory-mapped back), and each of the candidate's is compared the moment it arrives
(:class:`StreamedComparison`), keeping four numbers per position. Held in memory they would be
``sequences x tokens x vocab x 4`` bytes twice: 3.7 GB each for 720 ten-token answers of a 128 K vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PERCENTILES = (("median", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p99_9", 0.999))


@dataclasses.dataclass
class TFSequence:
    """One teacher-forced stream: ``prompt`` ids, then ``continuation`` ids whose predictions are compared."""

    id: str
    slice: str
    prompt: list[int]
    continuation: list[int]


def reference_text(reference: Any) -> str:
    """The text of an item's reference answer (the first of a list; a JSON object compact-dumped)."""
    if isinstance(reference, list):
        reference = reference[0] if reference else ""
    if isinstance(reference, dict):
        return json.dumps(reference, ensure_ascii=False)
    return str(reference)


def build_sequences(
    prepared: Sequence[Any], tokenizer: Any, stop_ids: Sequence[int], answers: dict[str, Sequence[int]] | None = None
) -> list[TFSequence]:
    """Prompt ids + the reference answer's ids + the first stop id, cut to the item's budget
    (``Prepared.max_new_tokens``); skipped items and empty answers are left out.

    The reference answer is taken in the token form the baseline itself writes it when the baseline
    answered the item correctly and stopped on eos (``answers[id]``: its generated ids; e.g. with the
    leading space the model learned, which a bare ``encode(reference)`` lacks); otherwise the reference text
    encoded without special tokens.  Teacher forcing on a spelling the model never produces would measure
    the models far off their own distribution (measured: baseline PPL 650 instead of ~1 on the default model).
    """
    out = []
    for p in prepared:
        if p.skipped:
            continue
        ref = (answers or {}).get(p.item.id)
        if ref is None:
            ref = tokenizer.encode(reference_text(p.item.reference), add_special_tokens=False)
        cont = (list(ref) + ([int(stop_ids[0])] if stop_ids else []))[: max(1, int(p.max_new_tokens))]
        if cont:
            out.append(TFSequence(p.item.id, p.item.slice, list(p.input_ids), [int(t) for t in cont]))
    return out


def heldout_sequences(samples: Sequence[Sequence[int]], slice_name: str = "calibration_heldout") -> list[TFSequence]:
    """Whole calibration samples (token ids, chat-rendered as calibration does) teacher-forced from their
    first token: every later position is compared."""
    return [TFSequence(f"heldout-{k}", slice_name, [int(s[0])], [int(t) for t in s[1:]]) for k, s in enumerate(samples) if len(s) >= 2]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def position_stats(base_logits: np.ndarray, cand_logits: np.ndarray, targets: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-position statistics of one sequence.

    Args:
        base_logits, cand_logits: (T, V) logits (any float dtype) predicting ``targets``; a candidate with
            a larger padded vocabulary is cut to the baseline's V.
        targets: (T,) the actual next tokens.
    Returns:
        ``kld`` (T,) nats, ``same_top`` (T,) bool, ``nll_base`` / ``nll_cand`` (T,) nats.
    Raises:
        ValueError: shapes differ (other than the candidate's extra padded vocabulary rows).
    """
    b = np.asarray(base_logits)
    c = np.asarray(cand_logits)
    if c.shape[-1] > b.shape[-1]:
        c = c[..., : b.shape[-1]]
    if b.shape != c.shape or b.shape[0] != len(targets):
        raise ValueError(f"logit shapes differ: baseline {b.shape}, candidate {c.shape}, {len(targets)} targets")
    lp, lq = _log_softmax(b), _log_softmax(c)
    t = np.asarray(targets, dtype=np.int64)
    rows = np.arange(len(t))
    kld = np.sum(np.exp(lp) * (lp - lq), axis=-1)
    return {"kld": kld, "same_top": lp.argmax(-1) == lq.argmax(-1), "nll_base": -lp[rows, t], "nll_cand": -lq[rows, t]}


def _se(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


def summarize(kld: np.ndarray, same_top: np.ndarray, nll_base: np.ndarray, nll_cand: np.ndarray) -> dict[str, Any]:
    """llama.cpp-style summary of concatenated per-position arrays (see module doc); ``positions`` = 0 when empty."""
    n = len(kld)
    if n == 0:
        return {"positions": 0}
    p = float(np.mean(same_top))
    d = nll_cand - nll_base
    q = np.quantile(kld, [f for _, f in PERCENTILES])
    return {
        "positions": int(n),
        "kld": {
            "mean": float(np.mean(kld)),
            "se": _se(kld),
            **{k: float(v) for (k, _), v in zip(PERCENTILES, q)},
            "max": float(np.max(kld)),
            "min": float(np.min(kld)),
        },
        "top1": p,
        "top1_se": float(np.sqrt(p * (1 - p) / (n - 1))) if n > 1 else 0.0,
        "ppl_base": float(np.exp(np.mean(nll_base))),
        "ppl_cand": float(np.exp(np.mean(nll_cand))),
        "ln_ppl_ratio": float(np.mean(d)),
        "ln_ppl_ratio_se": _se(d),
    }


def compare(seqs: Sequence[TFSequence], base: Sequence[np.ndarray], cand: Sequence[np.ndarray]) -> dict[str, Any]:
    """Fidelity overall and per slice: ``{"overall": summary, "slices": {slice: summary}, "items": n}``."""
    return compare_stats(seqs, [position_stats(b, c, s.continuation) for s, b, c in zip(seqs, base, cand)])


def compare_stats(seqs: Sequence[TFSequence], stats: Sequence[dict[str, np.ndarray]]) -> dict[str, Any]:
    """:func:`compare` from each sequence's :func:`position_stats` (``stats[i]`` belongs to ``seqs[i]``)."""
    acc: dict[str, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    for s, st in zip(seqs, stats):
        for scope in ("overall", f"slice:{s.slice}"):
            for k, v in st.items():
                acc[scope][k].append(v)

    def summ(d: dict[str, list[np.ndarray]]) -> dict[str, Any]:
        return summarize(*(np.concatenate(d[k]) if d[k] else np.zeros(0) for k in ("kld", "same_top", "nll_base", "nll_cand")))

    overall = summ(acc["overall"]) if "overall" in acc else {"positions": 0}
    return {
        "overall": overall,
        "slices": {k.split(":", 1)[1]: summ(v) for k, v in sorted(acc.items()) if k != "overall"},
        "items": len(seqs),
    }


class SpilledLogits:
    """Per-sequence float32 logits written to one file as they come (``store[i] = (T, V) array``) and read back
    memory-mapped (``store[i]``), so that the baseline's logits wait on disk, not in memory, while the candidate runs.

    The file is raw little-endian float32 rows; :meth:`close` removes it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: Any = self.path.open("wb")
        self._where: dict[int, tuple[int, tuple[int, ...]]] = {}  # i -> (byte offset, shape)

    def __setitem__(self, i: int, logits: Any) -> None:
        a = np.ascontiguousarray(logits, dtype="<f4")
        self._where[int(i)] = (self._f.tell(), tuple(a.shape))
        self._f.write(a.tobytes())
        self._f.flush()

    def __getitem__(self, i: int) -> np.ndarray:
        off, shape = self._where[int(i)]
        if not int(np.prod(shape)):
            return np.zeros(shape, dtype=np.float32)
        return np.memmap(self.path, dtype="<f4", mode="r", offset=off, shape=shape)

    def __len__(self) -> int:
        return len(self._where)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        self.path.unlink(missing_ok=True)


class StreamedComparison:
    """The candidate's side of :func:`compare`: ``cmp[i] = logits`` compares sequence ``i``'s logits with ``base[i]``
    at once (:func:`position_stats`) and keeps only the per-position statistics; :meth:`result` is :func:`compare`'s
    result for a range of the sequences."""

    def __init__(self, seqs: Sequence[TFSequence], base: Any) -> None:
        self.seqs, self.base = seqs, base
        self.stats: dict[int, dict[str, np.ndarray]] = {}

    def __setitem__(self, i: int, logits: Any) -> None:
        self.stats[int(i)] = position_stats(self.base[i], logits, self.seqs[i].continuation)

    def __len__(self) -> int:
        return len(self.stats)

    def result(self, start: int, stop: int) -> dict[str, Any]:
        idx = range(start, stop)
        return compare_stats([self.seqs[i] for i in idx], [self.stats[i] for i in idx])
