"""The evaluate stage's config checks (run by :func:`pipeline.validation.validate` when the evaluate stage will run).

* the eval set file itself (:func:`pipeline.data.evalset.read_eval_set`: each malformed line, duplicate id, unknown
  metric, bad ``metric_args`` ... as a problem of ``eval.eval_set`` naming ``file:line``, the field, the value and the
  fix), so they are reported with the other problems of the run instead of in a second round (fresh-user trial: the
  length problems came first, the file's own problems only after they were fixed);
* the business eval set's prompts, rendered and tokenized as the engine will see them
  (:class:`pipeline.core.tokenization.TextCodec`: ``tokenizers`` + ``jinja2``, no transformers), fit
  ``build.max_input_len`` (max and P99 reported), and prompt + ``max_new_tokens`` fit ``build.max_seq_len``;
* in the release gate mode (``eval.gate.mode=release``, with a baseline), the eval set is large enough for the gate
  to pass at all: every scope (overall, each slice) holds at least :func:`pipeline.evaluate.gate.fewest_items` items
  for its allowance (the best case, no drop and no differing item), or the run would end *inconclusive* (exit 3)
  after every stage's work, whatever the candidate scores.

Fast (well under a second for the default model; cached per file version).
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import Any

from ..core.config.common import Problem


def checks(cfg: Any) -> list[Problem]:
    """Every evaluate-stage problem of ``cfg`` (a composed ``PipelineConfig``); never raises for bad values."""
    from ..core.sizing import shape_or_none

    problems = _eval_set_file_problems(cfg)
    problems += [] if problems else _gate_size_problems(cfg)  # a set the reader refuses has no size to judge
    shape = shape_or_none(cfg)
    if shape is None:
        return problems  # an unreadable checkpoint: the export stage / `pipeline plan` report it
    return problems + _eval_set_problems(cfg, int(shape.max_seq_len_limit))


# --------------------------------------------------------------------------- eval set
def _file_sig(p: Path) -> tuple[str, int, int]:
    st = p.stat()
    return (str(p), st.st_size, st.st_mtime_ns)


def _eval_set_file_problems(cfg: Any) -> list[Problem]:
    """Every problem :func:`~pipeline.data.evalset.read_eval_set` finds in the eval set file (none when it is missing or
    a folder: the run's input check names those), each a :class:`Problem` of ``eval.eval_set``."""
    from ..core.config import resolve_path

    if not cfg.eval.eval_set:
        return []
    try:
        path = resolve_path(cfg.eval.eval_set)
        if path is None or not path.is_file():
            return []
        return list(_file_problems(_file_sig(path), str(cfg.eval.eval_set)))
    except OSError:
        return []  # unreadable: the evaluate stage's own read says why


@functools.lru_cache(maxsize=8)
def _scope_sizes(eval_sig: tuple[str, int, int], limit: int | None) -> dict[str, int]:
    """Items per gate scope (``overall``, ``slice:<name>``) of the eval set the evaluate stage takes (``eval.limit``
    round-robin across slices, :func:`~pipeline.data.evalset.read_eval_set`); cached per file version."""
    from collections import Counter

    from ..data.evalset import read_eval_set

    items = read_eval_set(Path(eval_sig[0]), limit=limit).items
    return {"overall": len(items), **{f"slice:{k}": v for k, v in Counter(it.slice for it in items).items()}}


def _gate_size_problems(cfg: Any) -> list[Problem]:
    """``eval.eval_set`` too small for the release gate ever to pass (:func:`pipeline.evaluate.gate.fewest_items` per
    scope, the gate's own allowances :func:`~pipeline.evaluate.gate.allowances`), as one problem naming every short
    scope; none in the exploratory mode, without a baseline to compare with, or when the set cannot be read (its
    reader's problems are reported instead).  ``PIPELINE_SKIP_GATE_SIZE_CHECK=1`` turns it off (the test suite sets it,
    tests/conftest.py: its tiny release-mode runs show the evaluate stage's own inconclusive verdict)."""
    from ..core.config import resolve_path
    from ..errors import InputError
    from .gate import allowance_sources, allowances, fewest_items

    e = cfg.eval
    if os.environ.get("PIPELINE_SKIP_GATE_SIZE_CHECK") == "1":  # the test suite's tiny sets show the stage's own verdict
        return []
    if e.gate.mode != "release" or "baseline" not in e.runners or e.candidate == "baseline" or not e.eval_set:
        return []
    try:
        path = resolve_path(e.eval_set)
        if path is None or not path.is_file():
            return []
        sizes = _scope_sizes(_file_sig(path), e.limit)
        allow = dict(zip(("overall", "slice"), allowances(e.gate, cfg.quant.recipe)))
    except (OSError, InputError):
        return []
    need = {s: fewest_items(allow["overall" if s == "overall" else "slice"], float(e.gate.confidence)) for s in sizes}
    short = [s for s, n in sizes.items() if need[s] is None or n < need[s]]  # type: ignore[operator]
    if not short:
        return []
    src_all, src_slice = allowance_sources(e.gate, cfg.quant.recipe)
    parts = "; ".join(
        f"{s} has {sizes[s]}, needs {need[s] if need[s] is not None else 'more than any set'} "
        f"(allowance {100 * allow['overall' if s == 'overall' else 'slice']:.1f} pp)"
        for s in short
    )
    counts = f"at least {need['overall']} items" if need["overall"] is not None else "more items"
    per_slice = fewest_items(allow["slice"], float(e.gate.confidence))
    counts += f", {per_slice} per slice" if per_slice is not None and any(s != "overall" for s in short) else ""
    return [
        Problem(
            "eval.eval_set",
            e.eval_set,
            f"too few items for the release gate ever to pass: even with no drop and no item where the candidate and the "
            f"baseline differ, the {float(e.gate.confidence):.0%} upper bound of the drop stays above the allowance, so the "
            f"run would end inconclusive (exit 3) after every stage's work. {parts}; allowances from {src_all} and "
            f"{src_slice}.",
            f"a larger eval set (eval.eval_set=<JSONL with {counts}), or a larger allowance you accept "
            f"(eval.gate.max_drop=<drop> / eval.gate.slice_max_drop=<drop>, absolute 0..1), or eval.gate.mode=exploratory "
            f"(the run finishes, recorded as not releasable)",
        )
    ]


@functools.lru_cache(maxsize=8)
def _file_problems(eval_sig: tuple[str, int, int], value: str) -> tuple[Problem, ...]:
    """The eval set's problems as :class:`Problem` s (the line's own wording, its ``Fix:`` as the fix); at most
    :data:`~pipeline.errors.MAX_REPORTED_PROBLEMS` and one saying how many more. Cached per file version."""
    from ..core.config.common import file_problems
    from ..data.evalset import EvalSetError, read_eval_set

    try:
        read_eval_set(Path(eval_sig[0]))
        return ()
    except EvalSetError as e:  # each malformed line, or the refusal of the whole file (no items, a task YAML key ...)
        return tuple(file_problems("eval.eval_set", value, e.problems, f"problem(s) in {eval_sig[0]}"))


def _eval_rows(path: Path) -> list[dict[str, Any]]:
    """The eval set's lines as objects (a foreign format, a task YAML or a question/answer JSONL, as the eval loader
    maps it; malformed lines and lines over :data:`~pipeline.errors.MAX_LINE_BYTES` are left out, never parsed or
    tokenized: the eval loader reports them with their line number)."""
    from ..data import foreign
    from ..data.evalset import read_eval_set
    from ..errors import MAX_LINE_BYTES, InputError

    text = path.read_text(encoding="utf-8-sig", errors="replace")
    rows = []
    for line in text.split("\n"):  # as the eval loader splits (pipeline.data.evalset._parse_lines)
        if len(line) > MAX_LINE_BYTES // 4 and len(line.encode("utf-8")) > MAX_LINE_BYTES:
            continue
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
    if foreign.is_task_yaml(path, text) or foreign.qa_mapping(rows) is not None:
        try:
            items = read_eval_set(path).items
        except InputError:
            return []
        return [
            {"id": it.id, "prompt": it.prompt, "messages": it.messages, "max_new_tokens": it.max_new_tokens, "slice": it.slice}
            for it in items
        ]
    return rows


@functools.lru_cache(maxsize=8)
def _prompt_lengths(
    eval_sig: tuple[str, int, int], tok_sig: tuple[str, int, int], limit: int | None, apply_chat_template: bool, default_new: int
) -> tuple[list[int], list[int], list[str], list[tuple[str, str]]]:
    """(prompt token lengths, prompt + max_new_tokens, ids, every prompt the tokenizer or its chat template cannot
    render as ``(item id, reason)``) for the eval set; cached per file version."""
    from ..core import tokenization
    from ..errors import InputError

    try:
        tok = tokenization.TextCodec.from_dir(Path(tok_sig[0]).parent)
    except tokenization.TokenizationError as e:
        raise InputError(str(e)) from None
    lens, totals, ids = [], [], []
    slices: list[str] = []
    refused: list[tuple[str, str]] = []
    for i, row in enumerate(_eval_rows(Path(eval_sig[0]))):
        prompt, messages = row.get("prompt"), row.get("messages")
        if not isinstance(prompt, str) and not isinstance(messages, list):
            continue
        try:
            n = len(
                tokenization.encode_prompt(
                    tok,
                    prompt if isinstance(prompt, str) else None,
                    messages if isinstance(messages, list) else None,
                    apply_chat_template=apply_chat_template,
                )
            )
        except tokenization.TokenizationError as e:  # a chat template that cannot render it: evaluate would stop there
            refused.append((str(row.get("id", f"line {i + 1}")), str(e)))
            continue
        except Exception:
            continue
        mnt = row.get("max_new_tokens")
        mnt = mnt if isinstance(mnt, int) and not isinstance(mnt, bool) and mnt > 0 else default_new
        lens.append(n)
        totals.append(n + mnt)
        ids.append(str(row.get("id", f"line {i + 1}")))
        slices.append(str(row.get("slice", "")))
    if limit is not None and 0 < limit < len(ids):
        # the items the evaluate stage will use: eval.limit takes them round-robin across slices
        from ..data.evalset import EvalItem, stratified_head

        items = [EvalItem(id=f"{k}", slice=sl, metric="", reference=None) for k, sl in enumerate(slices)]
        keep = {int(it.id) for it in stratified_head(items, limit)}
        sel = sorted(keep)
        lens, totals, ids = [lens[k] for k in sel], [totals[k] for k in sel], [ids[k] for k in sel]
    return lens, totals, ids, refused


def eval_prompt_stats(cfg: Any) -> dict[str, Any] | None:
    """Token-length statistics of the eval set's prompts as the engine sees them, or ``None`` when the
    eval set or a fast tokenizer is not available.  Keys: count, max, p99, max_id, max_total, max_total_id, file,
    lengths and totals (``[(item id, prompt tokens / prompt + max_new_tokens), ...]``), refused (the first prompt the chat template cannot render as ``(item id,
    reason)``, or None) and refused_more (the ids of the other prompts it cannot render)."""
    from ..core.config import resolve_path

    if not cfg.eval.eval_set or not cfg.model.path:
        return None
    try:
        ep = resolve_path(cfg.eval.eval_set)
        mp = resolve_path(cfg.model.path)
        if ep is None or mp is None or not ep.is_file() or not (mp / "tokenizer.json").is_file():
            return None
    except (OSError, ValueError):
        return None  # the eval loader / export stage name the bad path
    try:
        lens, totals, ids, refusals = _prompt_lengths(
            _file_sig(ep),
            _file_sig(mp / "tokenizer.json"),
            cfg.eval.limit,
            bool(cfg.model.apply_chat_template),
            int(cfg.eval.max_new_tokens),
        )
    except (OSError, ValueError, ImportError):
        return None
    refused = refusals[0] if refusals else None
    refused_more = [item for item, _ in refusals[1:]]
    if not lens:
        return {"count": 0, "refused": refused, "refused_more": refused_more, "file": str(ep)} if refused else None
    s = sorted(lens)
    p99 = s[min(len(s) - 1, max(0, math.ceil(0.99 * len(s)) - 1))]
    imax = max(range(len(lens)), key=lens.__getitem__)
    itot = max(range(len(totals)), key=totals.__getitem__)
    return {
        "count": len(lens),
        "max": lens[imax],
        "p99": p99,
        "max_id": ids[imax],
        "max_total": totals[itot],
        "max_total_id": ids[itot],
        "file": str(ep),
        "lengths": list(zip(ids, lens)),
        "totals": list(zip(ids, totals)),
        "refused": refused,
        "refused_more": refused_more,
    }


MAX_NAMED_ITEMS = 10
"""How many item ids one problem names (the count says how many there are)."""


def _named(ids: list[str]) -> str:
    """The first :data:`MAX_NAMED_ITEMS` of ``ids``, comma-separated (`` ...`` when there are more)."""
    return ", ".join(ids[:MAX_NAMED_ITEMS]) + (" ..." if len(ids) > MAX_NAMED_ITEMS else "")


def _more_items(ids: list[str], what: str) -> str:
    """`` (WHAT N more item(s) too: a, b, ...)``, or '' when ``ids`` is empty."""
    return f" ({what} {len(ids)} more item(s) too: {_named(ids)})" if ids else ""


def _eval_set_problems(cfg: Any, positions: int) -> list[Problem]:
    """The eval set's prompt lengths against the engine limits; ``positions`` is the model's position limit, so a
    fix never asks for a limit the build checks would refuse next."""
    if os.environ.get("PIPELINE_SKIP_EVAL_LENGTH_CHECK") == "1":
        return []
    st = eval_prompt_stats(cfg)
    if st is None:
        return []
    b = cfg.build
    out = []
    if st["refused"]:
        item, why = st["refused"]
        msg, _, fix = why.partition(" Fix: ")
        out.append(
            Problem(
                "model.apply_chat_template",
                bool(cfg.model.apply_chat_template),
                f"the eval set {st['file']} item {item}: {msg}" + _more_items(st["refused_more"], "the template cannot render"),
                fix.rstrip(".") or "correct the chat template, or set model.apply_chat_template=false",
            )
        )
    if not st["count"]:
        return out
    if st["max"] > b.max_input_len:
        over = [item for item, n in st["lengths"] if n >= positions]
        alone = (
            f"item {st['max_id']} alone is more than the model's {positions} positions"
            if len(over) <= 1
            else f"items {_named(over)} ({len(over)}) alone are each more than the model's {positions} positions"
        )
        out.append(
            Problem(
                "build.max_input_len",
                b.max_input_len,
                f"the eval set {st['file']} has prompts up to {st['max']} tokens "
                f"(item {st['max_id']}; P99 {st['p99']} over {st['count']} prompts, rendered with the chat template).",
                f"set build.max_input_len >= {st['max']} (and build.max_seq_len above it), or shorten the prompts"
                if st["max"] < positions
                else f"shorten the prompts: {alone}",
            )
        )
    if st["max_total"] > b.max_seq_len:
        past = [item for item, n in st["totals"] if n > positions]
        out.append(
            Problem(
                "build.max_seq_len",
                b.max_seq_len,
                f"prompt + max_new_tokens reaches {st['max_total']} tokens on the eval set (item {st['max_total_id']})."
                + (f" Over the model's {positions} positions: items {_named(past)} ({len(past)})." if len(past) > 1 else ""),
                f"set build.max_seq_len >= {st['max_total']}"
                if st["max_total"] <= positions
                else f"lower max_new_tokens (eval.max_new_tokens, or the item's own max_new_tokens): the model has "
                f"{positions} positions, so build.max_seq_len cannot reach {st['max_total']}",
            )
        )
    return out
