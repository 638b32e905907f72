"""A light tokenizer for preflight checks: the checkpoint's ``tokenizer.json`` (``tokenizers``) and its
chat template (``jinja2``), without importing ``transformers`` (whose tokenizer import pulls in torch,
several seconds) so that validation stays under a second.

It implements exactly what :mod:`pipeline.tokenization` uses (``chat_template``, ``bos_token``,
``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` and
``__call__(text, add_special_tokens=False)["input_ids"]``), so prompts are rendered and encoded through
the one shared path.  The Jinja environment mirrors the one ``transformers`` builds for chat
templates (sandboxed, ``trim_blocks``/``lstrip_blocks``, loop controls, ``raise_exception``,
``tojson``, ``strftime_now``); tests/test_validate.py checks the ids against ``transformers``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _tok_str(v: Any) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


class FastTokenizer:
    """Tokenizer facade over ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``chat_template.jinja``).

    Raises ``FileNotFoundError`` when the folder has no ``tokenizer.json`` (slow-only tokenizers are
    not supported here; callers skip the check)."""

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer

        folder = Path(folder)
        tj = folder / "tokenizer.json"
        if not tj.is_file():
            raise FileNotFoundError(f"{tj}: no fast tokenizer file")
        try:
            self._tok = Tokenizer.from_file(str(tj))
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for corrupt/truncated files
            from ..errors import InputError

            raise InputError(f"{tj}: not a readable tokenizer.json ({e}). Fix: restore tokenizer.json from the original checkpoint.") from None
        cfg: dict[str, Any] = {}
        tc = folder / "tokenizer_config.json"
        if tc.is_file():
            try:
                cfg = json.loads(tc.read_text(encoding="utf-8"))
            except ValueError:
                cfg = {}
        self.special = {k: _tok_str(cfg.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        self.bos_token = self.special["bos_token"]
        tmpl = cfg.get("chat_template")
        if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            tmpl = named.get("default") or next(iter(named.values()), None)
        jf = folder / "chat_template.jinja"
        if not tmpl and jf.is_file():
            tmpl = jf.read_text(encoding="utf-8")
        self.chat_template = tmpl if isinstance(tmpl, str) and tmpl else None
        self._compiled = None

    def _template(self):
        if self._compiled is None:
            import datetime

            import jinja2
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise jinja2.exceptions.TemplateError(message)

            def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
                return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
            self._compiled = env.from_string(self.chat_template)
        return self._compiled

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, add_generation_prompt: bool = False, **kw: Any) -> str:
        if tokenize:
            raise ValueError("FastTokenizer.apply_chat_template only renders text (tokenize=False)")
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        return self._template().render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                       **{k: v for k, v in self.special.items() if v is not None}, **kw)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self._tok.encode(text, add_special_tokens=add_special_tokens).ids}
