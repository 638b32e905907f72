"""Export: the written tokenizer tokenizes as transformers' ``AutoTokenizer`` does (issue 36).

Every later stage (calibration, evaluate, serving, onnxruntime-genai) tokenizes with ``hf/tokenizer.json`` through
:class:`pipeline.core.tokenization.TextCodec`, never through transformers. transformers 5 does not always use the
checkpoint's ``tokenizer.json`` as written: its ``AutoTokenizer`` picks a class by ``config.json``'s ``model_type``
and some classes rebuild the pipeline around the file's vocabulary, e.g. ``Qwen2Tokenizer.__init__``
(transformers/models/qwen2/tokenization_qwen2.py) installs Qwen's NFC normalizer and digit-splitting
``PRETOKENIZE_REGEX`` whatever the file says, and ``LlamaTokenizer`` with ``legacy: false`` a Metaspace
pre-tokenizer. :func:`probe` compares the two on a sample conversation (rendered with the chat template) and texts
with digits, whitespace and unicode; :func:`check_tokenizer` then plans to write transformers' own
``tokenizers.Tokenizer`` (``backend_tokenizer``) as ``hf/tokenizer.json`` after probing it too, and says so. A
mismatch that remains is an :class:`~pipeline.errors.InputError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ..errors import InputError

#: Texts of the parity probe: digits (Qwen2 splits them one by one), runs of spaces, tabs and newlines, accents
#: (NFC vs NFD), CJK and an emoji (byte-level pieces / byte fallback).
PROBE_TEXTS = (
    "Order ORD-12345 costs 129.50 USD, due 2024-03-05 (ref 0042).",
    "  two  spaces,\ttabs\tand\n\nblank lines  \n",
    "Ünïcödé café naïve – 我的订单什么时候到？😀",
    "Cafe\u0301 vs Caf\u00e9, x\u00b2 and \u2163",
)

#: Sample conversations for the chat-template probe; the first one the template renders is used (some templates
#: refuse a system message).
PROBE_CONVERSATIONS = (
    [
        {"role": "system", "content": "You are a support agent. Answer in 2 sentences."},
        {"role": "user", "content": "Where is order ORD-12345? It was due 2024-03-05."},
        {"role": "assistant", "content": "It ships today: 3 items, 129.50 USD."},
        {"role": "user", "content": "  Thanks!\nCan I change the address to 12 Main Street? 我的订单"},
    ],
    [
        {"role": "user", "content": "Where is order ORD-12345? It was due 2024-03-05."},
        {"role": "assistant", "content": "It ships today: 3 items, 129.50 USD."},
        {"role": "user", "content": "  Thanks!\nCan I change the address to 12 Main Street? 我的订单"},
    ],
)


def _hf_chat_ids(tok: Any, messages: list[dict]) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    return [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]


def probe(codec: Any, tok: Any) -> dict[str, Any]:
    """Compare ``codec`` (a :class:`~pipeline.core.tokenization.TextCodec`) with the transformers tokenizer ``tok``.

    Texts: ``codec.encode_text`` vs ``tok.encode(add_special_tokens=False)`` (where BOS goes is the codec's documented
    rule, not compared here). Chat: ``codec.encode_prompt(messages=...)`` vs ``tok.apply_chat_template(tokenize=True,
    add_generation_prompt=True)`` on the first :data:`PROBE_CONVERSATIONS` entry both render (none when the
    tokenizer has no chat template).

    Returns:
        ``{"compared": n, "mismatched": [{"what": ..., "ours": ids, "transformers": ids}, ...]}``.
    """
    from ..core.tokenization import TokenizationError

    mismatched: list[dict[str, Any]] = []
    compared = 0
    for text in PROBE_TEXTS:
        ours = codec.encode_text(text)
        theirs = [int(i) for i in tok.encode(text, add_special_tokens=False)]
        compared += 1
        if ours != theirs:
            mismatched.append({"what": f"text {text!r}", "ours": ours, "transformers": theirs})
    if codec.chat_template and getattr(tok, "chat_template", None):
        for conv in PROBE_CONVERSATIONS:
            try:
                theirs = _hf_chat_ids(tok, conv)
            except Exception:  # the template refuses this conversation (e.g. no system role): try the next one
                continue
            try:
                ours = codec.encode_prompt(messages=conv)
            except TokenizationError as e:
                mismatched.append({"what": f"chat template ({len(conv)} messages): {e}", "ours": [], "transformers": theirs})
                compared += 1
                break
            compared += 1
            if ours != theirs:
                mismatched.append({"what": f"chat template ({len(conv)} messages)", "ours": ours, "transformers": theirs})
            break
    return {"compared": compared, "mismatched": mismatched}


def _first_difference(m: dict[str, Any]) -> str:
    a, b = m["ours"], m["transformers"]
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"{m['what']}: tokenizer.json gives {a[k : k + 6]}..., transformers {b[k : k + 6]}... (from token {k})"


class TokenizerPlan(NamedTuple):
    """What the export writes as ``hf/tokenizer.json`` and says about it (:func:`check_tokenizer`)."""

    record: dict[str, Any]  # model_info.json "tokenizer_parity"
    warnings: list[str]
    tokenizer_json: str | None  # transformers' tokenizer to write instead of the source file, or None (copy it)

    def write(self, hf_dir: Path) -> None:
        """Replace the copied ``hf_dir/tokenizer.json`` with transformers' tokenizer when the plan says so."""
        if self.tokenizer_json is not None:
            (hf_dir / "tokenizer.json").write_text(self.tokenizer_json, encoding="utf-8")


def check_tokenizer(src: Path, tok: Any) -> TokenizerPlan:
    """Decide (before anything is written) how ``hf/tokenizer.json`` tokenizes as ``tok`` (``AutoTokenizer`` of
    ``src``), and say so.

    Probes the codec of ``src``'s files against ``tok``; on a mismatch probes again with ``tok.backend_tokenizer``
    (padding and truncation off) in place of ``tokenizer.json`` (in a temporary copy of the tokenizer files), and plans
    to write that one. A differing ``chat_template.jinja`` / ``tokenizer_config.json`` ``chat_template`` pair is a
    warning (both follow transformers: the ``.jinja``).

    Returns:
        :class:`TokenizerPlan`; its ``record`` (``model_info.json`` ``tokenizer_parity``): ``probes``,
        ``source_mismatches``, ``followed`` (the transformers class whose tokenizer is written, or null).
    Raises:
        InputError: even transformers' own tokenizer, read by the codec, differs from transformers (names
        ``tokenizer.json`` and the fix).
    """
    import shutil
    import tempfile

    from tokenizers import Tokenizer

    from ..core.artifacts import TOKENIZER_FILES
    from ..core.tokenization import TextCodec, TokenizationError, chat_template_of

    warnings: list[str] = []
    _, ignored = chat_template_of(src)
    if ignored is not None:
        warnings.append(
            f"{src / 'chat_template.jinja'} and the chat_template in {src / 'tokenizer_config.json'} differ; "
            f"transformers uses chat_template.jinja, and so does every stage of this pipeline (the tokenizer_config.json "
            f"one is ignored, and hf/tokenizer_config.json is written without it). Fix: delete the stale one from the "
            f"checkpoint to silence this"
        )
    try:
        first = probe(TextCodec.from_dir(src), tok)
    except TokenizationError as e:
        raise InputError(f"{src / 'tokenizer.json'}: {e}") from None
    record: dict[str, Any] = {"probes": first["compared"], "source_mismatches": len(first["mismatched"]), "followed": None}
    if not first["mismatched"]:
        return TokenizerPlan(record, warnings, None)
    if getattr(tok, "backend_tokenizer", None) is None:
        raise InputError(
            f"{src / 'tokenizer.json'}: tokenizes differently from transformers' {type(tok).__name__} in "
            f"{len(first['mismatched'])} of {first['compared']} probes ({_first_difference(first['mismatched'][0])}), and "
            f"that tokenizer has no tokenizers backend to follow. Fix: use a standard fast tokenizer (tokenizer.json) "
            f"saved by transformers (AutoTokenizer.from_pretrained(...).save_pretrained(...))."
        )
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    text = backend.to_str(pretty=True)
    with tempfile.TemporaryDirectory(prefix="pipeline-tokenizer-") as tmp:
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, Path(tmp) / name)
        (Path(tmp) / "tokenizer.json").write_text(text, encoding="utf-8")
        again = probe(TextCodec.from_dir(tmp), tok)
    if again["mismatched"]:
        raise InputError(
            f"{src / 'tokenizer.json'}: tokenizes differently from transformers' {type(tok).__name__} "
            f"({len(again['mismatched'])} of {again['compared']} probes, even with transformers' own tokenizer in its "
            f"place: {_first_difference(again['mismatched'][0])}). Fix: use the tokenizer files of the model this "
            f"checkpoint was trained with, saved by transformers (AutoTokenizer.from_pretrained(...).save_pretrained(...))."
        )
    record["followed"] = type(tok).__name__
    warnings.append(
        f"{src / 'tokenizer.json'} tokenizes differently from transformers' AutoTokenizer ({type(tok).__name__}, the "
        f"class transformers picks for this checkpoint) in {len(first['mismatched'])} of {first['compared']} probes, e.g. "
        f"{_first_difference(first['mismatched'][0])}; hf/tokenizer.json is written from the tokenizer transformers "
        f"builds, so every stage tokenizes as transformers does (model_info.json tokenizer_parity)"
    )
    return TokenizerPlan(record, warnings, text)
