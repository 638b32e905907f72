"""The one tokenization path shared by calibration, evaluation, engines and serving.

A chat prompt is rendered to text with the tokenizer's chat template (which supplies BOS), then
encoded **without** adding special tokens again, so every runtime sees exactly one BOS.  When no
chat template is used, BOS is prepended explicitly if the model has one and the text lacks it.
"""

from __future__ import annotations

from typing import Any, Sequence


def render(tokenizer: Any, prompt: str | None = None, messages: Sequence[dict] | None = None, *, apply_chat_template: bool = True) -> str:
    """Prompt text as the model expects it.

    Args:
        tokenizer: a ``transformers`` tokenizer (only ``chat_template``/``bos_token`` are used).
        prompt: a single user message (ignored when ``messages`` is given).
        messages: chat messages ``[{"role": ..., "content": ...}]``.
        apply_chat_template: render through the chat template when the tokenizer has one.
    Returns:
        The text to encode (str).  Raises ``ValueError`` when neither prompt nor messages is given.
    """
    if messages is None:
        if prompt is None:
            raise ValueError("render() needs a prompt or messages")
        messages = [{"role": "user", "content": prompt}]
    if apply_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    text = "\n".join(m["content"] for m in messages)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and not text.startswith(bos):
        text = bos + text
    return text


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of already-rendered text; never adds special tokens (the text carries BOS)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer: Any, prompt: str | None = None, messages: Sequence[dict] | None = None, *, apply_chat_template: bool = True) -> list[int]:
    """``encode(render(...))``: the ids every runtime must be fed for this prompt."""
    return encode(tokenizer, render(tokenizer, prompt, messages, apply_chat_template=apply_chat_template))


def stop_token_ids(model_info: dict[str, Any], extra: Sequence[int] = ()) -> list[int]:
    """The whole eos list from ``model_info.json`` plus extra stop ids, de-duplicated, order kept."""
    ids: list[int] = []
    for i in list(model_info.get("eos_token_ids") or []) + list(extra):
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    return ids


def cut_at_stop(output_ids: Sequence[int], stop_ids: Sequence[int]) -> tuple[list[int], str | None]:
    """Generated ids up to (excluding) the first stop id, and ``"eos"`` if one was found else ``None``.

    Never trusts a reported length: anything after the first stop id (end-id padding) is dropped.
    """
    stops = set(int(s) for s in stop_ids)
    for i, t in enumerate(output_ids):
        if int(t) in stops:
            return list(output_ids[:i]), "eos"
    return list(output_ids), None
