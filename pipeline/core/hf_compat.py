"""Hugging Face files that both the transformers here (5.x) and the serving image's (4.57.x) read alike.

The pipeline runs on transformers 5; the TensorRT-LLM PyTorch backend that serves the ``tensorrt_llm_pytorch``
package loads the shipped checkpoint and tokenizer with the transformers its image pins (TensorRT-LLM 1.2.x
``requirements.txt``: ``transformers==4.57.1``; ``pipeline/package/requirements-trtllm-compat.txt`` holds the pin the
test suite checks against, docs/package.md). Files transformers 5 writes that 4.57 cannot read, or reads differently,
are given the spelling both read, here, by their writers (export ``hf/``, quantize ``hf/``):

``config.json`` (:func:`write_older_config_spellings`)
    transformers 5 writes RoPE as ``rope_parameters`` and the dtype as ``dtype``; 4.x (and TensorRT-LLM's converters)
    read ``rope_theta`` / ``rope_scaling`` and ``torch_dtype`` and silently default a missing ``rope_theta`` to 10000.
    Both spellings are written with the same values.

``tokenizer_config.json`` (:func:`tokenizer_config_both_read`)
    * ``tokenizer_class: "TokenizersBackend"`` (transformers 5's generic fast tokenizer) does not exist in 4.57
      (``AutoTokenizer``: "Tokenizer class TokenizersBackend does not exist"); ``PreTrainedTokenizerFast`` is the
      same class in 5 (5.25 ``tokenization_utils_tokenizers.py``: ``PreTrainedTokenizerFast = TokenizersBackend``)
      and the generic fast tokenizer in 4.57.
    * ``extra_special_tokens`` as a *list* (5's name for the additional special tokens) crashes 4.57, which reads
      that key as a ``{name: token}`` dict (4.57.1 ``tokenization_utils_base.py`` ``_set_model_specific_special_tokens``:
      "'list' object has no attribute 'keys'"); the list is written as ``additional_special_tokens``, which both
      read as the additional special tokens. A dict ``extra_special_tokens`` (4.x's named tokens) is kept.
    * ``chat_template`` beside a template file (``chat_template.jinja``, ``additional_chat_templates/*.jinja``) is
      dropped: both 5 and 4.57 (``tokenization_utils_base.py`` ``_from_pretrained``: "independent chat template
      file(s) ... take priority over template entries in the tokenizer config") ignore it, so it could only mislead
      a reader of ``tokenizer_config.json`` alone (an older transformers, a Triton client) into the other template.
      transformers' own ``save_pretrained`` writes the same layout (the ``.jinja``, no config entry).
    The chat template stays in ``chat_template.jinja``: 4.57 reads it (4.57.1 ``utils/hub.py`` ``CHAT_TEMPLATE_FILE``,
    loaded by ``tokenization_utils_base.py`` ``from_pretrained``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERIC_FAST_V5 = "TokenizersBackend"
"""transformers 5's class name for a generic ``tokenizer.json`` tokenizer (absent from 4.x)."""
GENERIC_FAST = "PreTrainedTokenizerFast"
"""The generic fast tokenizer's name in 4.x, an alias of :data:`GENERIC_FAST_V5` in 5."""


def write_older_config_spellings(path: Path, dtype: str, rope_theta: float | None, rope_scaling: dict[str, Any] | None) -> None:
    """Add the spellings transformers 4.x reads to the ``config.json`` transformers 5 wrote at ``path``: ``dtype``
    and ``torch_dtype`` = ``dtype``, ``rope_theta`` (when known) and ``rope_scaling`` (``None`` for plain RoPE);
    ``rope_parameters`` stays as transformers wrote it."""
    from .store import write_json_atomic

    cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    cfg["dtype"] = dtype
    cfg["torch_dtype"] = dtype
    if rope_theta is not None:
        cfg["rope_theta"] = rope_theta
    cfg["rope_scaling"] = dict(rope_scaling) if rope_scaling else None
    write_json_atomic(Path(path), cfg)


def tokenizer_config_both_read(doc: dict[str, Any], template_files: bool = False) -> tuple[dict[str, Any], list[str]]:
    """``tokenizer_config.json`` ``doc`` in the spelling transformers 4.57 and 5 both read (module docstring), and
    what was changed (empty when nothing). ``template_files``: the folder has a chat template file, which both read
    instead of ``doc``'s ``chat_template`` (then dropped). ``doc`` is not modified."""
    out = dict(doc)
    changed: list[str] = []
    if template_files and "chat_template" in out:
        del out["chat_template"]
        changed.append("chat_template dropped (transformers reads chat_template.jinja instead)")
    if out.get("tokenizer_class") == GENERIC_FAST_V5:
        out["tokenizer_class"] = GENERIC_FAST
        changed.append(f"tokenizer_class {GENERIC_FAST_V5} -> {GENERIC_FAST}")
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        del out["extra_special_tokens"]
        have = list(out.get("additional_special_tokens") or [])
        out["additional_special_tokens"] = have + [t for t in extra if t not in have]
        changed.append("extra_special_tokens (a list) -> additional_special_tokens")
    return out, changed


def has_template_files(tokenizer_dir: Path) -> bool:
    """Whether ``tokenizer_dir`` holds a chat template file transformers (5 and 4.57) reads in preference to
    ``tokenizer_config.json``'s ``chat_template``: ``chat_template.jinja`` or ``additional_chat_templates/*.jinja``."""
    d = Path(tokenizer_dir)
    return (d / "chat_template.jinja").is_file() or any((d / "additional_chat_templates").glob("*.jinja"))


def rewrite_tokenizer_config(tokenizer_dir: Path) -> list[str]:
    """Rewrite ``tokenizer_dir/tokenizer_config.json`` (when present) with :func:`tokenizer_config_both_read`; the
    file is left byte for byte when nothing needs changing. Returns what was changed."""
    p = Path(tokenizer_dir) / "tokenizer_config.json"
    if not p.is_file():
        return []
    doc = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        return []
    new, changed = tokenizer_config_both_read(doc, has_template_files(tokenizer_dir))
    if changed:
        p.unlink()  # may be a hard link into the source checkpoint: never write through it
        p.write_text(json.dumps(new, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed
