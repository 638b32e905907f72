"""Did-you-mean for unknown override keys: eval.path -> eval.eval_set (targeted), parallel.tp -> parallel.tp_size
(a shortened leaf)."""

from __future__ import annotations

from pipeline.cli import check_overrides


def _one(arg: str) -> str:
    out = check_overrides([arg])
    assert len(out) == 1, out
    return out[0]


def test_eval_path_suggests_eval_set():
    assert "did you mean eval.eval_set" in _one("eval.path=x.jsonl")


def test_shortened_leaf_suggests_the_full_key():
    assert "did you mean parallel.tp_size" in _one("parallel.tp=2")
