"""The speculative-decoding measurement (``eval.draft_model_path``): how many of a draft model's proposals the target's
greedy outputs accept (:func:`pipeline.evaluate.runners.draft_acceptance`), overall and per slice: the report's
``speculative`` section, which the package stage's acceptance-first decision reads."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..core.stage import StageContext
from ..errors import InputError
from .inputs import Setup
from .running import Runs


def speculative_section(ctx: StageContext, st: Setup, runs: Runs) -> dict[str, Any] | None:
    """``eval.draft_model_path``: the draft model's acceptance of the target's outputs, else None.

    Raises:
        InputError: the draft's tokenizer differs from the target's.
    """
    from .runners import choose_batch, draft_acceptance, load_hf_model, load_tokenizer

    e = ctx.cfg.eval
    if not e.draft_model_path:
        return None
    target_runner = "baseline" if "baseline" in runs.outputs else st.cand
    draft_dir = ctx.external["draft_model"]
    draft_tok = load_tokenizer(draft_dir)
    if draft_tok.get_vocab() != st.tokenizer.get_vocab():
        raise InputError(
            f"eval.draft_model_path={e.draft_model_path!r}: its tokenizer differs from the target's. "
            "Fix: use a draft model trained with the same tokenizer (speculative decoding needs a shared vocabulary)."
        )
    draft = load_hf_model(draft_dir)
    with ctx.progress("evaluate: draft acceptance", total=None) as adv:
        acc = draft_acceptance(
            draft,
            st.prepared,
            runs.outputs[target_runner],
            k=e.draft_tokens,
            pad_id=st.pad_id,
            stop_ids=st.stop_ids,
            batch_size=choose_batch(e.batch_size, "cpu", None, 1, len(st.prepared), "float32")[0],  # the draft runs on the CPU
            advance=adv,
        )
    return speculative_summary(acc, st.prepared, e, target_runner)


def speculative_summary(acc: dict[str, dict[str, int]], prepared: list[Any], e: Any, target_runner: str) -> dict[str, Any]:
    by_slice: dict[str, dict[str, int]] = defaultdict(lambda: {"proposed": 0, "accepted": 0, "steps": 0, "tokens": 0})
    slice_of = {p.item.id: p.item.slice for p in prepared}
    tot = {"proposed": 0, "accepted": 0, "steps": 0, "tokens": 0}
    for i, a in acc.items():
        for k in tot:
            by_slice[slice_of[i]][k] += a[k]
            tot[k] += a[k]
    rate = lambda d: d["accepted"] / d["proposed"] if d["proposed"] else 0.0  # noqa: E731
    return {
        "draft_model": str(e.draft_model_path),
        "k": e.draft_tokens,
        "target_runner": target_runner,
        "acceptance_rate": rate(tot),
        "mean_tokens_per_step": tot["tokens"] / tot["steps"] if tot["steps"] else 0.0,
        "proposed": tot["proposed"],
        "accepted": tot["accepted"],
        "slices": {s: {**v, "acceptance_rate": rate(v)} for s, v in sorted(by_slice.items())},
    }
