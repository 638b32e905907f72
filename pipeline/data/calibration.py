"""Calibration-set loader for the quantize stage.

Reads a local JSONL (``text`` or chat ``messages`` per line), plain text (one sample per line, or
blank-line separated paragraphs), parquet, or - only when one is reachable - a Hugging Face dataset,
and turns it into the token batches ModelOpt calibrates on.

Every sample goes through the one tokenization path (:class:`pipeline.core.tokenization.TextCodec`): chat
``messages`` are rendered with the chat template (which supplies BOS) and plain text gets BOS when the
tokenizer or its template starts sequences with it; sample text is data, so a ``</s>`` inside it is
encoded as text, never as the control token.

Batches hold samples sorted by length and are cut to their shortest member, so no padding token ever
reaches a quantizer's statistics (amax, AWQ activation means); ``attention_mask`` is still passed
with every batch.  The pad token is set explicitly when the tokenizer has none and recorded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.tokenization import TokenizationError, codec_of, flattened_chats_warning
from ..errors import MAX_LINE_BYTES, InputError, line_too_long, listed_problems

if TYPE_CHECKING:
    import torch

    from ..core.config.calibration import CalibrationConfig

log = logging.getLogger("pipeline.data.calibration")

#: file suffix -> format read by ``calibration.format: auto`` (the default, also in the shipped preset).
SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".txt": "text",
    ".text": "text",
    ".parquet": "parquet",
    ".pq": "parquet",
}
#: what each file format holds (named in every refusal).
FILE_FORMATS = {
    "jsonl": "one JSON object per line with 'text' (calibration.text_field) or chat 'messages'",
    "json": "one JSON array of such objects (or of strings)",
    "text": "UTF-8 text, one sample per line (or blank-line separated paragraphs with calibration.paragraphs=true)",
    "parquet": "a table with a 'text' (calibration.text_field) or 'messages' column",
}
_PARQUET_MAGIC = b"PAR1"


class CalibrationError(InputError):
    """:func:`read_raw`'s refusal of malformed records (exit 2): every bad line or row, each ``file:line: ... Fix: ...``
    in ``problems``, the first :data:`~pipeline.errors.MAX_REPORTED_PROBLEMS` in the message (a single problem is the message itself);
    ``rows`` and ``blank`` are what the file held besides them, so the min_samples count can be reported with them."""

    def __init__(self, problems: Sequence[str], rows: Sequence[RawSample], blank: int, source: str):
        found = list(problems)
        super().__init__(found[0] if len(found) == 1 else listed_problems(f"calibration set {source}", found))
        self.problems = found
        self.rows = list(rows)
        self.blank = blank


@dataclasses.dataclass
class RawSample:
    """One sample before tokenization: plain ``text`` or chat ``messages``; ``where`` = file:line."""

    where: str
    text: str | None = None
    messages: list[dict] | None = None


@dataclasses.dataclass
class CalibrationSet:
    """Tokenized calibration samples and the facts the quant report records.

    Attributes:
        samples: token-id lists (each 1..max_seq_len ids), in the seeded order used.
        stats: requested, available, used, blank_dropped, short (count < min_tokens), truncated,
            format, source, pad_token, pad_token_set (bool), max_seq_len, batch_size, seed, tokens.
        warnings: human-readable warnings (also logged).
    """

    samples: list[list[int]]
    stats: dict[str, Any]
    warnings: list[str]

    def batches(self, batch_size: int) -> list[tuple[list[int], list[list[int]]]]:
        """Padding-free batches ``(indices, ids)``: samples sorted by length, ``batch_size`` at a time, each
        batch cut to its shortest sample's length.

        No pad token ever reaches a quantizer's statistics, and each row is a real prefix of its sample
        (sorting keeps the tokens cut small; :meth:`trimmed_tokens` counts them).  Deterministic order
        (length, then position in ``samples``).
        """
        order = sorted(range(len(self.samples)), key=lambda i: (len(self.samples[i]), i))
        out = []
        for j in range(0, len(order), batch_size):
            chunk = order[j : j + batch_size]
            n = min(len(self.samples[i]) for i in chunk)
            out.append((chunk, [self.samples[i][:n] for i in chunk]))
        return out

    def trimmed_tokens(self, batch_size: int) -> int:
        """Tokens cut by :meth:`batches` to keep batches padding-free."""
        return sum(len(s) for s in self.samples) - sum(len(r) for _, ids in self.batches(batch_size) for r in ids)

    def forward_loop(self, batch_size: int, device: str = "cpu", progress: Any = None, *, last_logits_only: bool = False):
        """A ModelOpt ``forward_loop(model)`` feeding every batch once (``input_ids`` + ``attention_mask``).

        ``progress`` (optional) is called with the number of samples after each batch. ``last_logits_only`` asks the
        model for the last position's logits only (transformers' ``logits_to_keep=1``, where its ``forward`` takes it):
        calibration reads no logits, and all of them are ``batch x tokens x vocab`` floats (2.1 GB for 8 x 512 tokens of
        a 128 K vocabulary). Only valid when the LM head is not quantized: its input quantizer would then see the last
        position only (the caller checks, :func:`pipeline.quantize.modelopt_config.lm_head_excluded`).
        """
        import inspect

        import torch

        batches = self.batches(batch_size)

        def loop(model: torch.nn.Module) -> None:
            extra: dict[str, Any] = {}
            if last_logits_only and "logits_to_keep" in inspect.signature(model.forward).parameters:
                extra["logits_to_keep"] = 1
            with torch.no_grad():
                for _, ids in batches:
                    t = torch.tensor(ids, dtype=torch.long, device=device)
                    model(input_ids=t, attention_mask=torch.ones_like(t), **extra)
                    if progress is not None:
                        progress(len(ids))

        return loop


def _formats_help() -> str:
    by_fmt: dict[str, list[str]] = {}
    for suf, f in SUFFIX_FORMATS.items():
        by_fmt.setdefault(f, []).append(suf)
    return (
        "; ".join(f"{f} ({', '.join(by_fmt.get(f, []))}): {what}" for f, what in FILE_FORMATS.items())
        + "; hf: a Hugging Face dataset (calibration.hf_dataset, needs the datasets package and network access)"
    )


def _sniff(path: Path) -> str | None:
    """The format the bytes of ``path`` show (parquet magic, a JSON array), or None when they do not tell."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if head.startswith(_PARQUET_MAGIC):
        return "parquet"
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    if text.startswith(b"["):
        return "json"
    return None


def detect_format(path: Path, fmt: str) -> str:
    """The file format to read ``path`` with: ``fmt`` itself, or (``auto``) the one its suffix names.

    Raises InputError (naming ``calibration.path``/``calibration.format``, the formats that exist and their suffixes)
    for an unknown suffix under ``auto``, or an explicit format the file's bytes contradict (a parquet file read as
    jsonl/text, a JSON array read as jsonl).
    """
    sniffed = _sniff(path)
    if fmt == "auto":
        f = SUFFIX_FORMATS.get(path.suffix.lower())
        if f is None:
            raise InputError(
                f"calibration.path={str(path)!r}: cannot tell the format from the suffix {path.suffix!r}. "
                f"Fix: rename the file or set calibration.format to one of: {_formats_help()}."
            )
        if f == "json" and sniffed != "json":
            f = "jsonl"  # a .json file holding JSON lines (common), not an array
        if sniffed == "parquet" and f != "parquet":
            raise InputError(
                f"calibration.path={str(path)!r}: the suffix says {f} but the file is parquet (it starts with "
                f"{_PARQUET_MAGIC!r}). Fix: rename it to .parquet or set calibration.format=parquet."
            )
        return f
    if fmt not in FILE_FORMATS:
        raise InputError(f"calibration.format={fmt!r}: unknown. Fix: use auto or one of: {_formats_help()}.")
    if sniffed == "parquet" and fmt != "parquet":
        raise InputError(
            f"calibration.path={str(path)!r} is a parquet file but calibration.format={fmt}. Fix: calibration.format=auto (or parquet)."
        )
    if sniffed == "json" and fmt == "jsonl":
        raise InputError(
            f"calibration.path={str(path)!r} holds a JSON array, not JSON lines, but calibration.format=jsonl. "
            "Fix: calibration.format=auto (or json)."
        )
    if fmt == "parquet" and sniffed != "parquet":
        raise InputError(
            f"calibration.path={str(path)!r}: calibration.format=parquet but the file does not start with the "
            f"parquet magic {_PARQUET_MAGIC!r}. Fix: calibration.format=auto, or pass a parquet file."
        )
    return fmt


def _decoded_lines(path: Path, errors: list[str]) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of a UTF-8 file; a line over the byte limit or with bad bytes is left out, its problem
    (file and line named) appended to ``errors``; InputError when the file cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"calibration.path={str(path)!r}: cannot read ({e.strerror or e}).") from e
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":  # the newline ending the last line does not start a blank line
        lines.pop()
    for n, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE_BYTES:  # refused before it is decoded or tokenized (issue 28)
            errors.append(str(line_too_long(f"{path}:{n}", len(raw), "split the sample into shorter lines (or paragraphs)")))
            continue
        try:
            text = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            errors.append(
                f"{path}:{n}: not valid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}). "
                "Fix: re-encode the calibration file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)."
            )
            continue
        yield n, text


def _read_jsonl(path: Path, text_field: str, errors: list[str] | None = None) -> tuple[list[RawSample], int]:
    """The samples and blank-line count of a JSONL file; each bad line's problem appended to ``errors`` (without a
    list: CalibrationError naming all of them)."""
    problems: list[str] = [] if errors is None else errors
    out: list[RawSample] = []
    blank = 0
    for n, line in _decoded_lines(path, problems):
        if not line.strip():
            blank += 1
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except ValueError as e:  # JSONDecodeError, or an integer literal longer than Python's int digit limit
            why = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            problems.append(f"{where}: not valid JSON ({why}). Fix: one JSON object per line.")
            continue
        if not isinstance(obj, dict):
            problems.append(
                f"{where}: expected a JSON object with {text_field!r} or 'messages', got {type(obj).__name__}. "
                "Fix: one JSON object per line."
            )
            continue
        _collect(out, problems, obj, where, text_field)
    if errors is None and problems:
        raise CalibrationError(problems, out, blank, str(path))
    return out, blank


def _collect(out: list[RawSample], errors: list[str], obj: dict, where: str, text_field: str) -> None:
    """The record's sample appended to ``out``, or its problem to ``errors``."""
    try:
        out.append(_row(obj, where, text_field))
    except InputError as e:
        errors.append(str(e))


def _read_json_array(path: Path, text_field: str, errors: list[str]) -> tuple[list[RawSample], int]:
    try:
        data = path.read_bytes().removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not valid UTF-8 (byte offset {e.start}). Fix: re-encode the calibration file as UTF-8.") from e
    try:
        arr = json.loads(data)
    except ValueError as e:
        raise InputError(
            f"{path}:{getattr(e, 'lineno', '?')}: not valid JSON ({getattr(e, 'msg', e)}). "
            "Fix: calibration.format=json reads one JSON array of objects; for one object per line use .jsonl."
        ) from e
    if not isinstance(arr, list):
        raise InputError(
            f"{path}: calibration.format=json expects a JSON array at the top level, got {type(arr).__name__}. "
            f"Fix: write [{{{text_field!r}: ...}}, ...], or one object per line in a .jsonl file."
        )
    records: list[dict | None] = []
    for i, obj in enumerate(arr, start=1):
        if isinstance(obj, str):
            obj = {text_field: obj}
        if not isinstance(obj, dict):
            errors.append(
                f"{path}[item {i}]: expected an object with {text_field!r} or 'messages' (or a string), got {type(obj).__name__}. "
                f"Fix: write {{{text_field!r}: ...}} or a string."
            )
            obj = None  # keeps the item numbers; left out below
        records.append(obj)
    return _rows_from_records(records, str(path), text_field, errors)


def _row(obj: dict, where: str, text_field: str) -> RawSample:
    if obj.get("messages") is not None:
        msgs = obj["messages"]
        if not (isinstance(msgs, list) and all(isinstance(m, dict) and "role" in m and isinstance(m.get("content"), str) for m in msgs)):
            raise InputError(
                f"{where}: 'messages' must be a list of {{'role': ..., 'content': str}} (value {msgs!r:.80}). "
                "Fix: use [{'role': 'user', 'content': '...'}]."
            )
        return RawSample(where, messages=[{"role": m["role"], "content": m["content"]} for m in msgs])
    if text_field in obj:
        v = obj[text_field]
        if not isinstance(v, str):
            raise InputError(
                f"{where}: field {text_field!r} must be a string, got {type(v).__name__} (value {v!r:.80}). Fix: write the text as a JSON string."
            )
        return RawSample(where, text=v)
    raise InputError(
        f"{where}: neither {text_field!r} nor 'messages' present (keys: {sorted(obj)[:8]}). "
        f"Fix: set calibration.text_field to the key holding the text."
    )


def _read_text(path: Path, paragraphs: bool, errors: list[str]) -> tuple[list[RawSample], int]:
    out, blank = [], 0
    if not paragraphs:
        for n, line in _decoded_lines(path, errors):
            if line.strip():
                out.append(RawSample(f"{path}:{n}", text=line))
            else:
                blank += 1
        return out, blank
    cur: list[str] = []
    start = 0
    for n, line in _decoded_lines(path, errors):
        if line.strip():
            if not cur:
                start = n
            cur.append(line)
        else:
            blank += 1
            if cur:
                out.append(RawSample(f"{path}:{start}", text="\n".join(cur)))
                cur = []
    if cur:
        out.append(RawSample(f"{path}:{start}", text="\n".join(cur)))
    return out, blank


def _rows_from_records(records: Sequence[dict | None], source: str, text_field: str, errors: list[str]) -> tuple[list[RawSample], int]:
    """The samples of ``records`` (blank ones counted, not kept; ``None``: an item already reported); each bad
    record's problem appended to ``errors``."""
    out: list[RawSample] = []
    blank = 0
    for i, obj in enumerate(records, start=1):
        where = f"{source}[row {i}]"
        if obj is None:
            continue
        if obj.get("messages") is None and isinstance(obj.get(text_field), str) and not obj[text_field].strip():
            blank += 1
            continue
        _collect(out, errors, obj, where, text_field)
    return out, blank


def _read_parquet(path: Path, text_field: str, errors: list[str]) -> tuple[list[RawSample], int]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - pyarrow ships with the venv
        raise InputError("calibration.format=parquet needs pyarrow: pip install pyarrow") from e
    try:
        table = pq.read_table(str(path))
    except Exception as e:
        raise InputError(f"calibration.path={str(path)!r}: not a readable parquet file ({e}).") from e
    cols = [c for c in (text_field, "messages") if c in table.column_names]
    if not cols:
        raise InputError(
            f"{path}: no {text_field!r} or 'messages' column (columns: {table.column_names}). "
            "Fix: set calibration.text_field to the text column."
        )
    return _rows_from_records(table.select(cols).to_pylist(), str(path), text_field, errors)


def _read_hf(cfg: CalibrationConfig, errors: list[str]) -> tuple[list[RawSample], int]:
    try:
        import datasets
    except ImportError as e:
        raise InputError(
            f"calibration.format=hf (hf_dataset={cfg.hf_dataset!r}) needs the `datasets` package, which is not installed. "
            "Fix: pip install datasets (and network access to the Hub), or use a local file: calibration=support_v2."
        ) from e
    try:
        ds = datasets.load_dataset(cfg.hf_dataset, split=cfg.hf_split)
    except Exception as e:
        raise InputError(
            f"calibration.hf_dataset={cfg.hf_dataset!r} (split {cfg.hf_split!r}) could not be loaded: {type(e).__name__}: {e}. "
            "Fix: check the name and network access, or download it and pass calibration.path=<file>."
        ) from e
    n = min(len(ds), max(cfg.calib_size * 4, cfg.calib_size))
    return _rows_from_records([dict(r) for r in ds.select(range(n))], f"hf:{cfg.hf_dataset}", cfg.text_field, errors)


def read_raw(cfg: CalibrationConfig, path: Path | None) -> tuple[list[RawSample], int, str]:
    """Raw samples, blank lines/rows dropped, and the format used.

    Raises:
        CalibrationError: (an InputError) malformed lines or rows: every one of them, each naming file:line (or row),
            the field, the value and the fix.
        InputError: input that cannot be read at all (no file, an unknown format, an unreadable parquet file ...).
    """
    errors: list[str] = []
    fmt = cfg.format
    if fmt == "hf":
        rows, blank = _read_hf(cfg, errors)
        if errors:
            raise CalibrationError(errors, rows, blank, f"hf:{cfg.hf_dataset}")
        return rows, blank, "hf"
    if path is None:
        raise InputError("calibration.path=None: no calibration file given. Fix: calibration=support_v2 or calibration.path=<file>.")
    path = Path(path)
    if not path.is_file():
        raise InputError(f"calibration.path={str(path)!r}: no such file.")
    fmt = detect_format(path, fmt)
    if fmt == "jsonl":
        rows, blank = _read_jsonl(path, cfg.text_field, errors)
    elif fmt == "json":
        rows, blank = _read_json_array(path, cfg.text_field, errors)
    elif fmt == "text":
        rows, blank = _read_text(path, cfg.paragraphs, errors)
    elif fmt == "parquet":
        rows, blank = _read_parquet(path, cfg.text_field, errors)
    else:  # pragma: no cover - detect_format refuses unknown formats
        raise InputError(f"calibration.format={fmt!r}: unknown. Fix: use auto or one of: {_formats_help()}.")
    if errors:
        raise CalibrationError(errors, rows, blank, str(path))
    return rows, blank, fmt


def ensure_pad_token(tokenizer: Any) -> tuple[str, bool]:
    """Give ``tokenizer`` a pad token when it has none (the eos token, else unk); returns (pad token, whether it was set).

    Raises InputError when the tokenizer has neither pad, eos nor unk.
    """
    if tokenizer.pad_token is not None:
        return str(tokenizer.pad_token), False
    for cand in (tokenizer.eos_token, tokenizer.unk_token):
        if cand is not None:
            tokenizer.pad_token = cand
            return str(cand), True
    raise InputError(
        "the tokenizer has no pad, eos or unk token to pad calibration batches with. "
        "Fix: add a pad token to the checkpoint's tokenizer (export stage)."
    )


def _encode_row(codec: Any, r: Any, apply_chat_template: bool) -> list[int]:
    """One calibration row's token ids (empty for a blank text row).

    Raises:
        InputError: a chat the model's chat template cannot render (file:line, the template's error and the fix).
    """
    if r.messages is not None:
        try:
            return list(codec.encode_prompt(messages=r.messages, apply_chat_template=apply_chat_template, add_generation_prompt=False))
        except TokenizationError as e:  # the template renders eval prompts (checked at config time) but not this chat
            raise InputError(
                f"{r.where}: calibration sample (chat messages, calibration.apply_chat_template=true): {e} Or calibrate "
                f"on these chats without the template: calibration.apply_chat_template=false."
            ) from None
    if not r.text or not r.text.strip():
        return []
    return list(codec.encode_prompt(r.text, apply_chat_template=False))


def _warnings(cfg: CalibrationConfig, source: str, blank: int, short: list[str], chats: list[str], used: int, requested: str) -> list[str]:
    """What :func:`load_calibration` warns about (each also logged): blank rows dropped, samples shorter than
    ``min_tokens`` (``short``: where), chat rows flattened for want of a chat template (``chats``: where), and a set
    with fewer than ``calib_size`` usable samples (``used``)."""
    warnings: list[str] = []
    if blank:
        warnings.append(f"{source}: dropped {blank} blank line(s)/row(s)")
    if short:
        warnings.append(
            f"{source}: {len(short)} sample(s) shorter than calibration.min_tokens={cfg.min_tokens} tokens "
            f"(e.g. {', '.join(short[:3])}); they are kept but carry little signal"
        )
    if chats:
        fix = "write those rows as text"
        warnings.append(f"{source}: " + flattened_chats_warning(len(chats), used, "calibration samples", chats, fix))
    if used < cfg.calib_size:
        warnings.append(f"{source}: {used} usable sample(s) of {cfg.calib_size} requested{requested}")
    for w in warnings:
        log.warning(w)
    return warnings


def load_calibration(cfg: CalibrationConfig, tokenizer: Any, path: Path | None, *, requested: str = "") -> CalibrationSet:
    """Read, shuffle (seeded), tokenize and check a calibration set.

    Args:
        cfg: the ``calibration`` config group (calib_size, calib_max_seq_length, seed, min_tokens, min_samples ...).
        tokenizer: the export checkpoint's ``transformers`` tokenizer.
        path: the resolved calibration file (``None`` for ``format: hf``).
        requested: what ``calib_size`` is made of, for the short-set warning (evaluate's fidelity hold-out asks for
            calibration's samples plus its own: ``" (16 calibration + 64 eval.fidelity_heldout)"``).
    Returns:
        :class:`CalibrationSet` with up to ``calib_size`` samples, each truncated to ``calib_max_seq_length`` tokens.
    Raises:
        InputError: unreadable input, malformed or non-UTF-8 lines (:class:`CalibrationError`: every one, file and line
        named), a chat sample the model's chat
        template cannot render (``raise_exception``, a syntax error, the sandbox refusing an attribute: file:line, the
        template's error and the fix), or fewer than ``min_samples`` usable samples (counts named).
    """
    rows, blank, fmt = read_raw(cfg, path)
    pad, pad_set = ensure_pad_token(tokenizer)
    codec = codec_of(tokenizer)
    order = list(range(len(rows)))
    random.Random(cfg.seed).shuffle(order)
    samples: list[list[int]] = []
    short: list[str] = []
    truncated = empty = 0
    chats: list[str] = []  # chat rows used while the checkpoint has no template to render them
    flattens = cfg.apply_chat_template and not codec.uses_template(True)
    for i in order:
        if len(samples) >= cfg.calib_size:
            break
        ids = _encode_row(codec, rows[i], cfg.apply_chat_template)
        if not ids:
            empty += 1
            continue
        if len(ids) > cfg.calib_max_seq_length:
            ids = ids[: cfg.calib_max_seq_length]
            truncated += 1
        if len(ids) < cfg.min_tokens:
            short.append(rows[i].where)
        if flattens and rows[i].messages is not None:
            chats.append(rows[i].where)
        samples.append(ids)
    source = str(path) if fmt != "hf" else f"hf:{cfg.hf_dataset}"
    warnings = _warnings(cfg, source, blank, short, chats, len(samples), requested)
    stats = {
        "source": source,
        "format": fmt,
        "requested": cfg.calib_size,
        "available": len(rows),
        "used": len(samples),
        "blank_dropped": blank,
        "empty_dropped": empty,
        "short": len(short),
        "truncated": truncated,
        "min_tokens": cfg.min_tokens,
        "max_seq_len": cfg.calib_max_seq_length,
        "batch_size": cfg.batch_size,
        "seed": cfg.seed,
        "tokens": sum(len(s) for s in samples),
        "pad_token": pad,
        "pad_token_set": pad_set,
        "apply_chat_template": cfg.apply_chat_template,
    }
    if len(samples) < cfg.min_samples:
        raise InputError(
            f"calibration: only {len(samples)} usable sample(s) in {source} ({len(rows)} read, {blank} blank dropped, "
            f"{empty} empty), fewer than calibration.min_samples={cfg.min_samples} (requested calib_size={cfg.calib_size}). "
            "Fix: provide a larger calibration set or lower calibration.min_samples."
        )
    return CalibrationSet(samples, stats, warnings)
