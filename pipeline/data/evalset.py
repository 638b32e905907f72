"""Eval sets as data: a versioned JSONL file, one item per line.

Line format (JSON object; unknown fields are kept in ``EvalItem.meta``, except a near miss of a known field, which is
refused as a typo: ``max_new_token``, ``stops``)::

    {"id": "intent_en-0001",                      # str, unique in the file
     "prompt": "What is the intent ...?",          # str  -- or --
     "messages": [{"role": "user", "content": "..."}],   # chat messages (rendered by the chat template)
     "reference": "damaged_item",                  # str | number | list of acceptable references | object (json_fields)
     "metric": "exact_match",                      # a name in pipeline.data.metrics.METRICS
     "slice": "intent_en",                         # str, the reporting/gating group
     "max_new_tokens": 16,                         # optional int >= 1 (default: eval.max_new_tokens)
     "stop": ["\\n"],                              # optional list of stop strings (added to eval.stop)
     "metric_args": {"tol": 0.01}}                 # optional per-metric arguments (see metrics.py)

A question/answer JSONL and an lm-evaluation-harness task YAML are accepted too: mapped onto these lines first
(:mod:`pipeline.data.foreign`; :func:`read_eval_set` says which mapping was used).

Every malformed line raises :class:`pipeline.errors.InputError` naming the file, the 1-based line
number, the field and the fix; all problems of a file are reported together (up to 20).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from ..core.tokenization import encode_prompt
from ..errors import MAX_LINE_BYTES, InputError, line_too_long, listed_problems


class EvalSetError(InputError):
    """:func:`read_eval_set`'s refusal of the eval set (exit 2). For malformed lines the message lists the first
    :data:`~pipeline.errors.MAX_REPORTED_PROBLEMS` and ``problems`` holds every one, each ``file:line: field ... (value ...). Fix: ...``;
    for a refusal of the whole file (unreadable, no items, a task YAML key that is not implemented) ``problems`` is
    the message alone."""

    def __init__(self, message: str, problems: Sequence[str]):
        super().__init__(message)
        self.problems = list(problems)


@dataclasses.dataclass
class EvalItem:
    """One eval item (see module docstring for the field meanings)."""

    id: str
    slice: str
    metric: str
    reference: Any
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    max_new_tokens: int | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    metric_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    line: int = 0

    @property
    def references(self) -> list[Any]:
        """The acceptable references as a list (a single reference becomes a 1-element list)."""
        return list(self.reference) if isinstance(self.reference, list) else [self.reference]

    def prompt_text(self) -> str:
        """The user-visible prompt (last user message for chat items), for reports."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in self.messages or [])


_KNOWN = {"id", "prompt", "messages", "reference", "metric", "slice", "max_new_tokens", "stop", "metric_args"}
ROLES = ("system", "user", "assistant", "tool", "developer", "ipython")
"""Message roles chat templates know (OpenAI chat roles and Llama 3's ``ipython``); another role is passed to the
template as given, except a near miss of one of these (``usr``), which is refused as a typo."""
NEAR_MISS_CUTOFF = 0.85
"""difflib ratio above which an unknown field is taken for a misspelled known one (``max_new_token``, ``stops``)
and refused rather than kept as metadata; ``idx`` (0.8 to ``id``) stays metadata."""


def _lone_surrogate(v: Any) -> bool:
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return True
    return False


def _surrogate_field(obj: Any) -> str | None:
    """The first field of ``obj`` (a parsed JSON line) whose text holds a lone UTF-16 surrogate (a ``\\ud800``
    escape, which Python's JSON decoder lets through and every tokenizer refuses), or None."""
    from .foreign import find_path

    return find_path(obj, _lone_surrogate, "(value)")


def _ok_messages(messages: Any) -> bool:
    """``messages`` is a non-empty list of ``{"role": str, "content": str}``."""
    return bool(
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)
    )


def _near_misses(obj: dict[str, Any], where: str, messages: list[dict[str, Any]] | None) -> list[str]:
    """A field that is a near miss of a known one (:data:`NEAR_MISS_CUTOFF`), or a message role that is a near miss of
    one of :data:`ROLES`: refused as a typo, since an unknown field would be kept as ignored metadata.  Matched without
    case (``Stop`` is a near miss of ``stop``, ``User`` of ``user``: fields and roles are lower case)."""
    errs = []
    for m in messages or []:
        near = difflib.get_close_matches(str(m["role"]).lower(), ROLES, n=1, cutoff=0.7) if m["role"] not in ROLES else []
        if near:
            errs.append(f"{where}: field 'messages' has role {m['role']!r}, a near miss of {near[0]!r}. Fix: use role {near[0]!r}.")
            break
    for key in sorted(k for k in obj if k not in _KNOWN):
        near = difflib.get_close_matches(key.lower(), sorted(_KNOWN), n=1, cutoff=NEAR_MISS_CUTOFF)
        if near:
            errs.append(
                f"{where}: field {key!r} is not an eval-set field; did you mean {near[0]!r}? (unknown fields are kept as "
                f"metadata and ignored, so a misspelled one would be dropped silently). Fix: rename it to {near[0]!r}."
            )
    return errs


def _check_line(obj: Any, where: str, known_metrics: set[str]) -> tuple[EvalItem | None, list[str]]:
    errs: list[str] = []
    if not isinstance(obj, dict):
        return None, [f"{where}: expected a JSON object, got {type(obj).__name__}. Fix: one object per line."]
    bad_text = _surrogate_field(obj)
    if bad_text:
        return None, [
            f"{where}: field {bad_text!r} contains a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair): "
            f"not valid Unicode text. Fix: pair the surrogate or remove the escape."
        ]

    def bad(field: str, msg: str, fix: str) -> None:
        errs.append(f"{where}: field {field!r} {msg} (value {obj.get(field)!r}). Fix: {fix}")

    iid = obj.get("id")
    if not isinstance(iid, str) or not iid.strip():
        bad("id", "must be a non-empty string", 'add "id": "<slice>-0001"')
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if prompt is None and messages is None:
        errs.append(f"{where}: needs field 'prompt' (string) or 'messages' (chat list). Fix: add \"prompt\": \"...\".")
    if prompt is not None and messages is not None:
        errs.append(f"{where}: has both 'prompt' and 'messages'. Fix: keep one of them.")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        bad("prompt", "must be a non-empty string", 'write the prompt text, e.g. "prompt": "..."')
    if messages is not None and not _ok_messages(messages):
        bad("messages", 'must be a non-empty list of {"role": str, "content": str}', 'use [{"role": "user", "content": "..."}]')
    errs.extend(_near_misses(obj, where, messages if _ok_messages(messages) else None))
    ref_ok = not ("reference" not in obj or obj["reference"] is None or obj["reference"] == [] or obj["reference"] == "")
    if not ref_ok:
        bad("reference", "is missing or empty", 'add "reference": "<expected answer>" (or a list of acceptable answers)')
    metric = obj.get("metric")
    if not isinstance(metric, str) or metric not in known_metrics:
        close = difflib.get_close_matches(metric, sorted(known_metrics), n=1) if isinstance(metric, str) else []
        bad("metric", "is not a known metric", (f"did you mean {close[0]!r}? " if close else "") + f"use one of {sorted(known_metrics)}")
    sl = obj.get("slice")
    if not isinstance(sl, str) or not sl.strip():
        bad("slice", "must be a non-empty string", 'add "slice": "<group name>"')
    mnt = obj.get("max_new_tokens")
    if mnt is not None and (isinstance(mnt, bool) or not isinstance(mnt, int) or mnt < 1):
        bad("max_new_tokens", "must be an integer >= 1", "remove it or set e.g. 32")
    stop = obj.get("stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        bad("stop", "must be a list of non-empty strings", 'use e.g. "stop": ["\\n"]')
    margs = obj.get("metric_args", {})
    if not isinstance(margs, dict):
        bad("metric_args", "must be an object", 'use e.g. "metric_args": {"tol": 0.01}')
    if not (ref_ok and isinstance(metric, str) and metric in known_metrics and isinstance(margs, dict)):
        return None, errs
    item = EvalItem(
        id=iid if isinstance(iid, str) else "",
        slice=sl if isinstance(sl, str) else "",
        metric=cast(str, metric),
        reference=obj["reference"],
        prompt=prompt if isinstance(prompt, str) else None,
        messages=messages if isinstance(messages, list) else None,
        max_new_tokens=mnt if isinstance(mnt, int) and not isinstance(mnt, bool) else None,
        stop=list(stop) if isinstance(stop, list) else [],
        metric_args=dict(cast(dict, margs)),
        meta={k: v for k, v in obj.items() if k not in _KNOWN},
    )
    # metric-specific reference checks (e.g. a regex that does not compile), reported with the line's other problems
    from .metrics import get_metric

    msg = get_metric(item.metric).check(item)
    if msg:
        errs.append(f"{where}: field 'reference'/'metric_args' invalid for metric {item.metric!r}: {msg}")
    return (None, errs) if errs else (item, [])


@dataclasses.dataclass
class EvalSet:
    """An eval set as read: its items (file order) and how the file was read (``format``: ``{"format": "jsonl"}``,
    or a foreign format's record with the mapping used, :mod:`pipeline.data.foreign`), and the data files a task
    YAML read (their content is part of the eval set: the evaluate stage digests them into its key)."""

    items: list[EvalItem]
    format: dict[str, Any]
    data_files: list[Path] = dataclasses.field(default_factory=list)


def load_eval_set(path: str | Path, *, limit: int | None = None) -> list[EvalItem]:
    """The items of :func:`read_eval_set` (same arguments and errors)."""
    return read_eval_set(path, limit=limit).items


def _parse_lines(p: Path, text: str, errors: list[str]) -> list[tuple[int, Any]]:
    """``(line number, parsed JSON)`` of every non-blank, non-comment line; problems appended to ``errors``."""
    rows: list[tuple[int, Any]] = []
    for n, raw in enumerate(text.split("\n"), start=1):  # not splitlines: JSON strings may hold U+2028, \x0c, ...
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{p}:{n}"
        if len(line) > MAX_LINE_BYTES // 4 and (nbytes := len(line.encode("utf-8"))) > MAX_LINE_BYTES:
            errors.append(str(line_too_long(where, nbytes, "shorten the prompt and references (one eval item per line)")))
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            errors.append(f"{where}: invalid JSON ({e.msg} at column {e.colno}). Fix: one JSON object per line.")
    return rows


def read_eval_set(path: str | Path, *, limit: int | None = None) -> EvalSet:
    """Read and validate an eval set: our JSONL, a question/answer JSONL or an lm-evaluation-harness task YAML
    (the foreign formats are mapped onto our lines first, :mod:`pipeline.data.foreign`).

    Args:
        path: the file (UTF-8; in JSONL, blank lines and lines starting with ``#`` are skipped).
        limit: keep only ``limit`` items, taken round-robin across slices (:func:`stratified_head`);
            the whole file is still validated.
    Returns:
        :class:`EvalSet` (items in file / document order, the format record).
    Raises:
        EvalSetError: (an :class:`~pipeline.errors.InputError`) a directory, an unreadable file, a line over
            :data:`pipeline.errors.MAX_LINE_BYTES`, invalid JSON, missing/wrong fields, duplicate ids, an unknown metric,
            an empty set, a task-YAML key that is not implemented; the message names ``file:line`` (or the key), the
            field and the fix; ``problems`` lists each problem.
    """
    try:
        return _read_eval_set(path, limit)
    except EvalSetError:
        raise
    except InputError as e:  # a refusal of the whole file
        raise EvalSetError(str(e), [str(e)]) from None


def _read_eval_set(path: str | Path, limit: int | None) -> EvalSet:
    from . import foreign
    from .metrics import METRICS

    p = Path(path)
    if p.is_dir():
        raise InputError(f"eval.eval_set={str(p)!r} is a directory. Fix: set eval.eval_set to a .jsonl file (one JSON object per line).")
    try:
        text = p.read_text(encoding="utf-8-sig")  # utf-8-sig: a leading BOM (Windows editors) is accepted
    except FileNotFoundError:
        raise InputError(f"eval set {p} not found. Fix: set eval.eval_set to an existing .jsonl file.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"eval set {p} cannot be read as UTF-8 text: {e}. Fix: save it as UTF-8 JSONL.") from None
    errors: list[str] = []
    data_files: list[Path] = []
    if foreign.is_task_yaml(p, text):
        rows, fmt, data_files = foreign.read_task_yaml(p, text)
        where_of = {n: f"{p} document {n}" for n, _ in rows}
    else:
        parsed = _parse_lines(p, text, errors)
        fmt = {"format": "jsonl"}
        if not errors and foreign.qa_mapping([o for _, o in parsed]) is not None:
            rows, fmt = foreign.map_qa(p, parsed)
        else:
            rows = parsed
        where_of = {n: f"{p}:{n}" for n, _ in rows}
    items: list[EvalItem] = []
    seen: dict[str, int] = {}
    known = set(METRICS)
    for n, obj in rows:
        where = where_of[n]
        item, errs = _check_line(obj, where, known)
        errors.extend(errs)
        iid = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(iid, str) and iid.strip():  # checked on every line, whatever else is wrong with it
            if iid in seen:
                errors.append(f"{where}: field 'id' value {iid!r} duplicates line {seen[iid]}. Fix: make ids unique.")
                continue
            seen[iid] = n
        if item is None:
            continue
        item.line = n
        items.append(item)
    if errors:
        raise EvalSetError(listed_problems(f"eval set {p}", errors), errors)
    if not items:
        raise InputError(f"eval set {p} has no items. Fix: add JSONL lines with id, prompt, reference, metric, slice.")
    return EvalSet(stratified_head(items, limit) if limit else items, fmt, data_files)


def stratified_head(items: list[EvalItem], limit: int) -> list[EvalItem]:
    """The first ``limit`` items taken round-robin across slices (file order within a slice), returned
    in file order, so a quick ``eval.limit`` run still covers every slice."""
    by_slice: dict[str, list[EvalItem]] = {}
    for it in items:
        by_slice.setdefault(it.slice, []).append(it)
    picked: set[str] = set()
    r = 0
    while len(picked) < min(limit, len(items)):
        for lst in by_slice.values():
            if r < len(lst) and len(picked) < limit:
                picked.add(lst[r].id)
        r += 1
    return [it for it in items if it.id in picked]


SKIP_TOO_LONG = "too_long"


@dataclasses.dataclass
class Prepared:
    """An item ready to run: its token ids and its own generation budget."""

    item: EvalItem
    input_ids: list[int]
    max_new_tokens: int
    stop_strings: list[str]
    skipped: str | None = None
    """``too_long`` when ``len(input_ids) > max_input_len`` (the item is not run by any runner)."""


def prepare(
    items: Sequence[EvalItem],
    tokenizer: Any,
    *,
    max_input_len: int,
    max_seq_len: int | None,
    default_max_new_tokens: int,
    extra_stop: Sequence[str] = (),
    apply_chat_template: bool = True,
) -> list[Prepared]:
    """Encode every item once (shared by all runners) and apply the engine limits.

    Args:
        tokenizer: the export's ``transformers`` tokenizer (with its chat template).
        max_input_len: longest prompt in tokens (the engine's build limit); longer prompts are skipped.
        max_seq_len: prompt + generated tokens limit; an item's budget is reduced to fit it.
        default_max_new_tokens: budget for items without ``max_new_tokens``.
        extra_stop: stop strings added to every item's own ``stop`` list.
        apply_chat_template: render through the chat template (``model.apply_chat_template``).
    """
    from ..core.tokenization import TokenizationError
    from ..errors import InputError

    out = []
    for it in items:
        try:
            ids = encode_prompt(tokenizer, it.prompt, it.messages, apply_chat_template=apply_chat_template)
        except TokenizationError as e:  # a chat template that raises, does not parse or touches unsafe attributes
            raise InputError(f"eval item {it.id!r} (eval set line {it.line}): {e}") from None
        mnt = it.max_new_tokens or default_max_new_tokens
        skipped = SKIP_TOO_LONG if len(ids) > max_input_len else None
        if max_seq_len and not skipped:
            mnt = max(1, min(mnt, max_seq_len - len(ids)))
        stops = list(dict.fromkeys([*extra_stop, *it.stop]))
        out.append(Prepared(it, ids, mnt, stops, skipped))
    return out
