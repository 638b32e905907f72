"""The one tokenization path shared by calibration, evaluation, the client and the Triton pre/postprocessing models.

Standalone on purpose: this module imports only the standard library, ``tokenizers`` and (lazily, to render a
chat template) ``jinja2``; it never imports the ``pipeline`` package or ``transformers``, so the package stage
can copy it next to the Triton Python models and the served text is produced by the same code as the evaluated
text.

:class:`TextCodec` (``TextCodec.from_dir(tokenizer_dir)``) reads ``tokenizer.json`` + ``tokenizer_config.json``
(+ ``special_tokens_map.json``, ``chat_template.jinja`` / ``chat_template.json``) and implements three rules:

1. **User content is data.**  A chat prompt is rendered with the checkpoint's own chat template (a sandboxed
   Jinja environment configured like ``transformers``' ``render_jinja_template``); the control tokens the
   *template* writes (``<s>``, ``<|im_start|>``, ``<|end|>`` ...) become control ids, while special-token strings
   inside a message's ``content`` (a user typing ``</s>`` or ``<|im_end|>``) are encoded as plain text.  When the
   content holds no such string (the normal case) the ids are exactly ``tokenizer.encode(rendered)`` - what
   ``transformers``' ``apply_chat_template(tokenize=True)`` gives.
2. **BOS only where the template or the tokenizer puts it.**  With a chat template, BOS is whatever the template
   renders (Qwen2's ChatML renders none).  Without one, BOS is prepended when the tokenizer adds it
   (``tokenizer.json`` post-processor or ``add_bos_token: true``) or the chat template starts conversations with
   it; ``config.json``'s ``bos_token_id`` is never consulted.
3. **Streaming never repeats or drops text.**  :class:`StreamDecoder` detokenizes incrementally: it decodes only
   the tokens since the last *clean* point (decoded text not ending in U+FFFD, i.e. no unfinished UTF-8 sequence
   from byte-level BPE or SentencePiece ``<0xNN>`` byte-fallback pieces), in the context of a guard token so
   that SentencePiece's leading-space rule is applied only at the true start; so ``"".join(pushes) + flush()``
   equals :meth:`TextCodec.decode` of all ids, and each push costs O(tokens since the last clean point).

Decoding follows ``transformers``' ``PreTrainedTokenizerFast._decode`` (transformers 5.x): ``tokenizers``'
``decode`` and then ``clean_up_tokenization_spaces`` when the tokenizer config asks for it, except for BPE models
where transformers skips that step.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPLACEMENT = "\ufffd"
# Private-use code points mark where message contents go in a rendered template (never produced by templates).
_MARK_OPEN, _MARK_CLOSE, _RUN_MARKER = "\ue000", "\ue001", "\ue002"
_MARK_RE = re.compile(_MARK_OPEN + r"(\d+)" + _MARK_CLOSE)
# transformers.PreTrainedTokenizerBase.clean_up_tokenization (order matters: applied in sequence).
_CLEANUP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class TokenizationError(ValueError):
    """A tokenizer folder or a prompt that cannot be handled; the message names the file/field and the fix."""


def read_json(p: Path, fix: str = "restore the file from the checkpoint", error: type[Exception] = TokenizationError) -> Any:
    """The JSON value in ``p``; ``{}`` when there is no such file.  The one JSON reader of this module and of
    :mod:`pipeline.core.artifacts` (which passes its own ``fix`` and ``InputError``: this module imports no pipeline code).

    Raises:
        ``error``: ``p`` cannot be read or is not JSON (names the file and ``fix``).
    """
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise error(f"{p}: not readable JSON ({e}). Fix: {fix}.") from e


def _token_str(v: Any) -> str | None:
    """A special token as written in tokenizer_config.json: a string or an AddedToken dict ``{"content": ...}``."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) and v else None


def _clean_up(text: str) -> str:
    for a, b in _CLEANUP:
        text = text.replace(a, b)
    return text


def _compile_template(source: str) -> Any:
    """A compiled chat template in a sandbox configured like transformers' ``_compile_jinja_template``.

    Raises TokenizationError when jinja2 (>= 3.1.6, the first release without the known sandbox escapes) is missing.
    """
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:  # pragma: no cover - jinja2 ships with the pipeline and serving environments
        raise TokenizationError("rendering a chat template needs jinja2>=3.1.6 (pip install 'jinja2>=3.1.6')") from e
    ver = tuple(int(x) for x in re.findall(r"\d+", jinja2.__version__)[:3])
    if ver < (3, 1, 6):
        raise TokenizationError(
            f"jinja2 {jinja2.__version__} has known sandbox escapes; chat templates are untrusted code. Fix: pip install 'jinja2>=3.1.6'."
        )

    class _Generation(Extension):  # ``{% generation %}`` blocks (assistant masks in transformers) render their body
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def _plain(v: Any) -> Any:
    """JSON-plain copy of template data (no rich objects reach the sandbox)."""
    if v is None or type(v) in (str, int, float, bool):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


def flattened_chats_warning(n: int, total: int, what: str, examples: Sequence[Any], fix: str) -> str:
    """The warning for ``n`` of ``total`` items (``what``: "eval items", "calibration samples") given as chat
    ``messages`` to a checkpoint with no chat template: :meth:`TextCodec.encode_prompt` feeds each as its messages'
    contents joined by newlines, the roles dropped."""
    eg = f" (e.g. {', '.join(map(str, list(examples)[:3]))})" if examples else ""
    return (
        f"{n} of {total} {what}{eg} are chat messages but the checkpoint has no chat template: each is fed as its "
        f"messages' contents joined by newlines, roles dropped. Fix: add a chat_template to the checkpoint's "
        f"tokenizer_config.json (or chat_template.jinja), or {fix}."
    )


def chat_template_of(tokenizer_dir: str | os.PathLike, config: dict | None = None) -> tuple[str | None, str | None]:
    """``(template, overridden)``: the default chat template transformers uses for this folder, and, when
    ``tokenizer_config.json`` holds a *different* one that is therefore ignored, that one (else ``None``).

    transformers 5 (``tokenization_utils_base.PreTrainedTokenizerBase._from_pretrained``): "If independent chat
    template file(s) exist, they take priority over template entries in the tokenizer config", so
    ``chat_template.jinja`` wins over ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named
    templates whose ``default`` is used).  ``config``: the parsed ``tokenizer_config.json`` (read when ``None``).
    """
    d = Path(tokenizer_dir)
    if config is None:
        config = read_json(d / "tokenizer_config.json")
    in_config = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(in_config, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in in_config if isinstance(t, dict)}
        in_config = named.get("default")
    in_config = in_config if isinstance(in_config, str) and in_config else None
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        text = jinja.read_text(encoding="utf-8")
        return text, (in_config if in_config is not None and in_config != text else None)
    return in_config, None


class TextCodec:
    """Prompt rendering, encoding and (streaming) decoding for one checkpoint's tokenizer.

    Attributes:
        tokenizer: the ``tokenizers.Tokenizer`` (from ``tokenizer.json``).
        special_tokens: ``{"bos_token": "<s>", ...}`` as configured (missing ones absent).
        bos_id, eos_id, pad_id, unk_id: ids of those tokens in the tokenizer, or ``None``.
        chat_template: the Jinja source of the default chat template, or ``None``.
        special_ids: ids of every special added token (skipped by ``decode(skip_special_tokens=True)``).
    """

    def __init__(
        self, tokenizer: Any, config: dict | None = None, chat_template: str | None = None, special_tokens: dict | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.config = dict(config or {})
        self.chat_template = chat_template or None
        st = {k: _token_str(self.config.get(k)) for k in _SPECIAL_KEYS}
        for k, v in (special_tokens or {}).items():
            if k in _SPECIAL_KEYS and st.get(k) is None:
                st[k] = _token_str(v)
        self.special_tokens = {k: v for k, v in st.items() if v is not None}
        tid = lambda k: None if k not in self.special_tokens else tokenizer.token_to_id(self.special_tokens[k])  # noqa: E731
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = tid("bos_token"), tid("eos_token"), tid("pad_token"), tid("unk_token")
        self.bos_token = self.special_tokens.get("bos_token")
        self.eos_token = self.special_tokens.get("eos_token")
        self.pad_token = self.special_tokens.get("pad_token")
        self.unk_token = self.special_tokens.get("unk_token")
        added = tokenizer.get_added_tokens_decoder()  # {id: AddedToken}
        self.special_ids = frozenset(int(i) for i, t in added.items() if t.special)
        self._special_by_content = {t.content: int(i) for i, t in added.items() if t.special}
        model_type = (
            json.loads(tokenizer.to_str()).get("model", {}).get("type") if self.config.get("clean_up_tokenization_spaces") else None
        )
        # transformers 5.x: clean_up_tokenization_spaces is ignored for BPE models (it corrupts their output)
        self.clean_up_tokenization_spaces = bool(self.config.get("clean_up_tokenization_spaces")) and model_type != "BPE"
        if self.config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"):
            self.clean_up_tokenization_spaces = bool(self.config.get("clean_up_tokenization_spaces"))
        self._template: Any = None  # a jinja2 Template, compiled on first use
        self._plain_tok = self._run_tok = None
        self._byte_piece_ids = self._find_byte_pieces()
        self._guard = self._find_guard()
        self._adds_bos = self._tokenizer_adds_bos()
        self._adds_bos_cached: bool | None = None

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_dir(cls, tokenizer_dir: str | os.PathLike) -> TextCodec:
        """Load ``tokenizer.json`` (required), ``tokenizer_config.json``, ``special_tokens_map.json`` and the chat
        template (:func:`chat_template_of`: ``chat_template.jinja``, else ``tokenizer_config.json``'s
        ``chat_template``, as transformers; else ``chat_template.json``) from ``tokenizer_dir``.

        Raises:
            TokenizationError: no ``tokenizer.json`` (a slow-only tokenizer) or an unreadable JSON file.
        """
        from tokenizers import Tokenizer

        d = Path(tokenizer_dir)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise TokenizationError(
                f"{tj}: missing. The pipeline needs a fast tokenizer (tokenizer.json). "
                "Fix: save the tokenizer with transformers' PreTrainedTokenizerFast.save_pretrained."
            )
        try:
            tok = Tokenizer.from_file(str(tj))
        except Exception as e:
            raise TokenizationError(
                f"{tj}: not a readable tokenizer.json ({e}). Fix: restore tokenizer.json from the original checkpoint."
            ) from None

        def read(name: str) -> dict:
            obj = read_json(d / name)
            return obj if isinstance(obj, dict) else {}

        config = read("tokenizer_config.json")
        stmap = read("special_tokens_map.json")
        template, _ = chat_template_of(d, config)
        if not template and (d / "chat_template.json").is_file():
            template = read("chat_template.json").get("chat_template")
        return cls(tok, config, template if isinstance(template, str) else None, stmap)

    def _find_byte_pieces(self) -> frozenset:
        """Ids of SentencePiece byte-fallback pieces (``<0x00>``..``<0xFF>``) when the decoder has ``ByteFallback``.

        tokenizers' ByteFallback decoder turns a whole run of consecutive byte pieces into text at once, and into one
        U+FFFD per piece when the run is not valid UTF-8, so a run's text is known only once a non-byte piece follows.
        """

        def has_byte_fallback(node: Any) -> bool:
            if isinstance(node, dict):
                return node.get("type") == "ByteFallback" or any(has_byte_fallback(v) for v in node.values())
            if isinstance(node, list):
                return any(has_byte_fallback(v) for v in node)
            return False

        if not has_byte_fallback(json.loads(self.tokenizer.to_str()).get("decoder")):
            return frozenset()
        ids = (self.tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256))
        return frozenset(i for i in ids if i is not None)

    def _find_guard(self) -> int | None:
        """A plain ASCII-letter token whose decoding is context free (used as left context by StreamDecoder)."""
        for s in ("a", "e", "x", "A", "0", "."):
            i = self.tokenizer.token_to_id(s)
            if i is not None and i not in self.special_ids and self.tokenizer.decode([i], skip_special_tokens=False) == s:
                return i
        return None

    def _tokenizer_adds_bos(self) -> bool:
        if self.bos_id is None:
            return False
        flag = self.config.get("add_bos_token")
        if isinstance(flag, bool):
            return flag
        probe = self.tokenizer.encode("a", add_special_tokens=True).ids
        return bool(probe) and probe[0] == self.bos_id

    @property
    def adds_bos(self) -> bool:
        """Whether a prompt encoded without a chat template starts with BOS: the tokenizer adds it (post-processor or
        ``add_bos_token``) or the chat template begins every conversation with it."""
        if self._adds_bos_cached is None:
            v = self._adds_bos
            if not v and self.bos_token and self.chat_template:
                try:
                    v = self._render_template([{"role": "user", "content": "a"}], True).startswith(self.bos_token)
                except Exception:
                    v = False
            self._adds_bos_cached = bool(v)
        return self._adds_bos_cached

    # ------------------------------------------------------------------ rendering
    def _render_template(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
        assert self.chat_template is not None, "callers render through the template only when uses_template() is true"
        try:
            import jinja2

            template_errors: tuple[type[BaseException], ...] = (jinja2.TemplateError,)
        except ImportError:  # pragma: no cover - _compile_template names the missing package
            template_errors = ()
        try:
            if self._template is None:
                self._template = _compile_template(self.chat_template)
            kw = dict(self.special_tokens)
            return self._template.render(
                messages=_plain(list(messages)), add_generation_prompt=add_generation_prompt, tools=None, documents=None, **kw
            )
        except template_errors as e:  # raise_exception(), a syntax error, the sandbox refusing an unsafe attribute
            lineno = getattr(e, "lineno", None)
            line = f" (template line {lineno})" if lineno else ""
            raise TokenizationError(
                f"the model's chat template cannot render these messages: {type(e).__name__}: {e}{line}. Fix: correct "
                f"chat_template in the checkpoint's tokenizer_config.json / chat_template.jinja, or render without it "
                f"(model.apply_chat_template=false)."
            ) from None

    @staticmethod
    def _messages(prompt: str | None, messages: Sequence[dict] | None) -> list[dict]:
        if messages is None:
            if prompt is None:
                raise ValueError("needs a prompt or messages")
            return [{"role": "user", "content": prompt}]
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "role" not in m:
                raise ValueError(f"messages[{i}] must be {{'role': str, 'content': str}}, got {m!r}")
            out.append(dict(m))
        return out

    def uses_template(self, apply_chat_template: bool = True) -> bool:
        return bool(apply_chat_template and self.chat_template)

    def render(
        self,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        apply_chat_template: bool = True,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt as text: the chat-template rendering, or (no template / ``apply_chat_template=False``) the
        message contents joined by newlines with the BOS *string* in front when :attr:`adds_bos`.

        For display and logs; to feed a model use :meth:`encode_prompt` (rendered text loses the boundary between
        template and user content, so a user's ``</s>`` would read as a control token if re-encoded).
        """
        msgs = self._messages(prompt, messages)
        if self.uses_template(apply_chat_template):
            return self._render_template(msgs, add_generation_prompt)
        text = "\n".join(m["content"] for m in msgs)
        if self.adds_bos and self.bos_token and not text.startswith(self.bos_token):
            text = self.bos_token + text
        return text

    # ------------------------------------------------------------------ encoding
    def encode_text(self, text: str) -> list[int]:
        """Ids of ``text`` as plain data: special-token strings are encoded as ordinary text, nothing is added."""
        return list(self._plain().encode(text, add_special_tokens=False).ids)

    def encode_rendered(self, text: str) -> list[int]:
        """Ids of trusted, already-rendered text: special-token strings *are* control tokens; nothing is added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_prompt(
        self,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        apply_chat_template: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The ids every runtime is fed for this prompt.

        Args:
            prompt: one user message (ignored when ``messages`` is given).
            messages: ``[{"role": str, "content": str}, ...]``.
            apply_chat_template: render through the chat template when the tokenizer has one.
        Returns:
            list[int]: template control tokens as control ids, message contents as plain text, BOS per the module
            rules (never taken from config.json).
        Raises:
            ValueError: neither prompt nor messages, or a malformed message.
        """
        msgs = self._messages(prompt, messages)
        if not self.uses_template(apply_chat_template):
            ids = self.encode_text("\n".join(m["content"] for m in msgs))
            return ([self.bos_id] if self.adds_bos and self.bos_id is not None else []) + ids
        real = self._render_template(msgs, add_generation_prompt)
        enc = self.tokenizer.encode(real, add_special_tokens=False)
        if not any(i in self.special_ids for i in enc.ids) or not any(self._has_special_text(m["content"]) for m in msgs):
            return list(enc.ids)
        return self._encode_guarded(real, msgs, add_generation_prompt)

    def _has_special_text(self, s: str) -> bool:
        return any(c in s for c in self._special_by_content)

    def _content_spans(self, real: str, msgs: list[dict], add_generation_prompt: bool) -> list[tuple[int, int]]:
        """Character spans of the message contents inside ``real`` (the rendering of ``msgs``).

        Renders once more with private-use markers in place of each content, then walks the template literals;
        a content the template trimmed is matched in its stripped forms.  Raises TokenizationError when the
        template transforms contents beyond that (the prompt is then refused rather than guessed).
        """
        marked = self._render_template(
            [{**m, "content": f"{_MARK_OPEN}{i}{_MARK_CLOSE}"} for i, m in enumerate(msgs)], add_generation_prompt
        )
        parts = _MARK_RE.split(marked)  # literal, idx, literal, idx, ..., literal
        spans: list[tuple[int, int]] = []
        pos = 0
        for j in range(0, len(parts) - 1, 2):
            lit, idx, nxt = parts[j], int(parts[j + 1]), parts[j + 2]
            if not real.startswith(lit, pos):
                break
            pos += len(lit)
            c = msgs[idx]["content"]
            for v in (c, c.strip(), c.lstrip(), c.rstrip()):
                if real.startswith(v, pos) and real.startswith(nxt, pos + len(v)):
                    spans.append((pos, pos + len(v)))
                    pos += len(v)
                    break
            else:
                break
        else:
            if real[pos:] == parts[-1]:
                return spans
        raise TokenizationError(
            "the chat template transforms message contents in a way the tokenizer cannot separate "
            "from template text, and a message contains a special-token string. Fix: remove "
            f"special-token strings ({sorted(self._special_by_content)[:6]}...) from the content."
        )

    def _encode_guarded(self, real: str, msgs: list[dict], add_generation_prompt: bool) -> list[int]:
        spans = self._content_spans(real, msgs, add_generation_prompt)
        enc = self.tokenizer.encode(real, add_special_tokens=False)
        legit: list[tuple[int, int, int]] = []  # (start, end, id) of control tokens the template wrote
        content_of = {i: c for c, i in self._special_by_content.items()}
        for tid, (s, e) in zip(enc.ids, enc.offsets):
            if tid not in self.special_ids:
                continue
            # the token's own characters (an lstrip/rstrip token's span also covers the whitespace it absorbed)
            k = real.find(content_of.get(tid, ""), s, e)
            cs0, ce0 = (k, k + len(content_of[tid])) if k >= 0 and tid in content_of else (s, e)
            if not any(cs0 < ce and cs < ce0 for cs, ce in spans):
                legit.append((s, e, tid))
        out: list[int] = []
        pos = 0
        for s, e, tid in legit + [(len(real), len(real), -1)]:
            if s > pos:
                out.extend(self._encode_run(real[pos:s], after_control=pos > 0))
            if tid >= 0:
                out.append(tid)
            pos = e
        return out

    def _plain(self, marker: bool = False) -> Any:
        """A copy of the tokenizer that encodes special-token strings as text (``encode_special_tokens``); with
        ``marker`` it also knows one private-use added token used as left context by :meth:`_encode_run`."""
        attr = "_run_tok" if marker else "_plain_tok"
        if getattr(self, attr) is None:
            from tokenizers import AddedToken, Tokenizer

            t = Tokenizer.from_str(self.tokenizer.to_str())
            t.encode_special_tokens = True
            if marker:
                t.add_tokens([AddedToken(_RUN_MARKER, normalized=False, special=False)])
            setattr(self, attr, t)
        return getattr(self, attr)

    def _encode_run(self, text: str, after_control: bool) -> list[int]:
        """Ids of a stretch of rendered text between two control tokens, as the full encode would give them (after a
        control token, a SentencePiece pre-tokenizer sees a split that does not start the input)."""
        if not after_control:
            return list(self._plain().encode(text, add_special_tokens=False).ids)
        t = self._plain(marker=True)
        ids = t.encode(_RUN_MARKER + text, add_special_tokens=False).ids
        if not ids or ids[0] != t.token_to_id(_RUN_MARKER):  # pragma: no cover - an added token always splits first
            raise TokenizationError("internal: the run marker was not kept as one token")
        return list(ids[1:])

    # ------------------------------------------------------------------ decoding
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` exactly as ``transformers``' fast tokenizer ``decode`` gives it."""
        text = self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self.clean_up_tokenization_spaces else text

    def stream_decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)


class StreamDecoder:
    """Incremental detokenizer: ``"".join(d.push(chunk) for chunk in chunks) + d.flush() == codec.decode(all ids)``.

    State: the ids since the last clean point (``_window``, decoded in the context of a guard token when it does not
    start the sequence) and how much of that window's text was already emitted.  A push emits the window's text up
    to any trailing U+FFFD (an unfinished multi-byte character: byte-level BPE or ``<0xNN>`` byte-fallback pieces);
    once the window decodes without a trailing U+FFFD its text is final and the window restarts empty, so each push
    decodes only the tokens since the last complete character.  With ``clean_up_tokenization_spaces`` (non-BPE
    tokenizers), text after a space among the last 3 released characters is held back until more arrives.

    ``push(new_ids)`` takes ids as generated (special ids are dropped when ``skip_special_tokens``, as ``decode``
    drops them); ``self.ids`` keeps every id pushed.
    """

    def __init__(self, codec: TextCodec, skip_special_tokens: bool = True) -> None:
        self.codec = codec
        self.skip = skip_special_tokens
        self._window: list[int] = []
        self._at_start = True
        self._emitted = 0  # chars of the current window's raw text already released
        self._prefix_tail = ""  # cleanup mode: held text of earlier windows, not yet returned
        self.ids: list[int] = []

    def _decode_window(self, window: list[int] | None = None) -> str:
        c = self.codec
        window = self._window if window is None else window
        if self._at_start or c._guard is None:
            return c.tokenizer.decode(window, skip_special_tokens=False)
        g = c.tokenizer.decode([c._guard], skip_special_tokens=False)
        text = c.tokenizer.decode([c._guard] + window, skip_special_tokens=False)
        return text[len(g) :] if text.startswith(g) else text

    def push(self, new_ids: Iterable[int]) -> str:
        """Append generated ids; return the newly stable text (may be ``""``)."""
        new = [int(i) for i in new_ids]
        self.ids.extend(new)
        if self.skip:
            new = [i for i in new if i not in self.codec.special_ids]
        # ids the tokenizer has no token for (a model vocabulary padded past the tokenizer's) decode to nothing and do
        # not end a run of byte pieces, exactly as in the unary decode
        new = [i for i in new if self.codec.tokenizer.id_to_token(i) is not None]
        if not new:
            return ""
        self._window.extend(new)
        if self._window[-1] in self.codec._byte_piece_ids:
            # inside a run of byte-fallback pieces: release the text before the run, hold the run itself
            r = len(self._window)
            while r > 0 and self._window[r - 1] in self.codec._byte_piece_ids:
                r -= 1
            if r == 0:
                return ""
            head = self._decode_window(self._window[:r])
            out = self._advance(head, final_window=False)
            self._window, self._at_start = self._window[r:], False
            self._emitted = max(0, self._emitted - len(head))
            return out
        text = self._decode_window()
        if not text.endswith(REPLACEMENT):
            return self._advance(text, final_window=True)
        out = self._advance(text.rstrip(REPLACEMENT), final_window=False)
        self._rebase(text)
        return out

    def _rebase(self, text: str) -> None:
        """Chunks cut mid-character keep the window open; restart it at the last clean point among its last 4 tokens
        (an unfinished UTF-8 sequence is at most 3 bytes, so one of them is clean unless the model emits stray bytes)."""
        n = len(self._window)
        for k in range(n - 1, max(0, n - 4) - 1, -1):
            pre = self._decode_window(self._window[:k]) if k else ""
            if pre and not pre.endswith(REPLACEMENT) and text.startswith(pre):
                self._window, self._at_start = self._window[k:], False
                self._emitted = max(0, self._emitted - len(pre))
                return

    def _advance(self, text: str, final_window: bool) -> str:
        raw = text[self._emitted :] if len(text) > self._emitted else ""
        if final_window and (text or not self._at_start):
            # the window's text is final: restart it (at the start of a sequence an empty text, e.g. a lone
            # SentencePiece "▁" whose space the decoder strips, keeps the window so the strip rule stays right)
            self._window, self._at_start, self._emitted = [], False, 0
        else:
            self._emitted = max(self._emitted, len(text))
        if not self.codec.clean_up_tokenization_spaces:
            return raw
        # clean-up patterns (" .", " n't", " ' " ...) start with a space and are at most 4 characters long: text is
        # released only up to a cut with no space in the 3 characters before it, so no pattern spans a cut and
        # cleaning the pieces equals cleaning the whole (the patterns only delete spaces).
        pending = self._prefix_tail + raw
        cut = len(pending)
        while cut > 0 and " " in pending[max(0, cut - 3) : cut]:
            cut = max(0, cut - 3) + pending[max(0, cut - 3) : cut].index(" ")
        self._prefix_tail = pending[cut:]
        return _clean_up(pending[:cut])

    def flush(self) -> str:
        """The rest of the text, including a trailing U+FFFD of an unfinished character (as the unary decode has)."""
        text = self._decode_window() if self._window else ""
        rest = text[self._emitted :]
        if self.codec.clean_up_tokenization_spaces:
            rest = _clean_up(self._prefix_tail + rest)
            self._prefix_tail = ""
        self._window, self._emitted = [], 0
        return rest


# ---------------------------------------------------------------------- backwards-compatible helpers
def codec_of(tokenizer: Any) -> TextCodec:
    """The :class:`TextCodec` of a ``transformers`` fast tokenizer (cached on it), a ``TextCodec`` or a folder."""
    if isinstance(tokenizer, TextCodec):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        return TextCodec.from_dir(tokenizer)
    c = getattr(tokenizer, "_pipeline_text_codec", None)
    if c is not None:
        return c
    src = getattr(tokenizer, "name_or_path", None)
    if src and (Path(str(src)) / "tokenizer.json").is_file():
        # the files, which serving reads: export writes transformers' own tokenizer as hf/tokenizer.json wherever
        # transformers 5 rebuilds it differently (Qwen2Tokenizer, LlamaTokenizer ``legacy: false``), so they agree
        # (pipeline/export/tokenizer.py)
        c = TextCodec.from_dir(str(src))
        try:
            tokenizer._pipeline_text_codec = c
        except Exception:
            pass
        return c
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TokenizationError(
            f"{type(tokenizer).__name__} is not a fast tokenizer (no tokenizer.json); the pipeline "
            "needs one. Fix: load it with transformers' PreTrainedTokenizerFast."
        )
    cfg = {k: getattr(tokenizer, k, None) for k in _SPECIAL_KEYS}
    cfg = {k: (str(v) if v is not None else None) for k, v in cfg.items()}
    for k in ("add_bos_token", "clean_up_tokenization_spaces", "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"):
        v = getattr(tokenizer, k, None)
        if isinstance(v, bool):
            cfg[k] = v
    c = TextCodec(Tokenizer.from_str(backend.to_str()), cfg, getattr(tokenizer, "chat_template", None))
    try:
        tokenizer._pipeline_text_codec = c
    except Exception:
        pass
    return c


def render(tokenizer: Any, prompt: str | None = None, messages: Sequence[dict] | None = None, *, apply_chat_template: bool = True) -> str:
    """``codec_of(tokenizer).render(...)`` (display text; feed models :func:`encode_prompt`)."""
    return codec_of(tokenizer).render(prompt, messages, apply_chat_template)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of trusted already-rendered text (control-token strings are control tokens); never adds special tokens."""
    return codec_of(tokenizer).encode_rendered(text)


def encode_prompt(
    tokenizer: Any, prompt: str | None = None, messages: Sequence[dict] | None = None, *, apply_chat_template: bool = True
) -> list[int]:
    """``codec_of(tokenizer).encode_prompt(...)``: the ids every runtime must be fed for this prompt."""
    return codec_of(tokenizer).encode_prompt(prompt, messages, apply_chat_template)


def stop_token_ids(eos_token_ids: Sequence[int], extra: Sequence[int] = ()) -> list[int]:
    """The whole eos list (``model_info.json`` ``eos_token_ids``) plus extra stop ids, de-duplicated, order kept."""
    ids: list[int] = []
    for i in list(eos_token_ids) + list(extra):
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    return ids


def cut_at_stop(output_ids: Sequence[int], stop_ids: Iterable[int]) -> tuple[list[int], str | None]:
    """Generated ids up to (excluding) the first stop id, and ``"eos"`` if one was found else ``None``.

    Never trusts a reported length: anything after the first stop id (end-id padding) is dropped.
    """
    stops = set(int(s) for s in stop_ids)
    for i, t in enumerate(output_ids):
        if int(t) in stops:
            return list(output_ids[:i]), "eos"
    return list(output_ids), None


# --------------------------------------------------------------------------- request limits
# Checked by the served text models (serve/models/genai_requests.py of onnxruntime_genai_model.py, which gets this file copied next
# to it) and by the OpenAI front end *before* anything is tokenized: tokenizing a 10 MB prompt takes tens of seconds and
# holds the model's execute thread, so one oversized request would delay every other one.

#: Floor of the derived per-prompt byte limit (chat templates and short-context test models stay usable).
MIN_PROMPT_BYTES = 64 << 10
#: Headroom of the derived limit over ``max_input_len x longest token``: text a normalizer shrinks (NFKC maps some
#: 3-byte characters to 1-2 bytes) and JSON escaping of chat messages (``\uXXXX``).
PROMPT_BYTES_HEADROOM = 4
#: The most generations one request may ask for: prompts x ``n`` on the OpenAI endpoint, prompt rows on gRPC.
MAX_REQUEST_GENERATIONS = 64


def max_token_bytes(tokenizer: Any) -> int:
    """The longest vocabulary entry in UTF-8 bytes (with added tokens).  Every token stands for at most that many
    input bytes: a byte-level BPE piece spells each byte as one character of 1-2 UTF-8 bytes, a SentencePiece piece
    spells a space as the 3-byte ``\u2581`` and a byte-fallback piece ``<0xNN>`` (6 bytes) one byte."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max((len(t.encode("utf-8")) for t in vocab), default=1)


def prompt_byte_limit(max_input_len: int, token_bytes: int, configured: int | None = None) -> int:
    """Bytes (UTF-8) one prompt may hold: ``configured`` (``package.max_prompt_bytes``) when set, else
    ``max(MIN_PROMPT_BYTES, max_input_len x token_bytes x PROMPT_BYTES_HEADROOM)`` - more than any prompt of at most
    ``max_input_len`` tokens can hold, so only a prompt the engine would refuse anyway is refused by bytes."""
    if configured:
        return int(configured)
    return max(MIN_PROMPT_BYTES, int(max_input_len) * max(1, int(token_bytes)) * PROMPT_BYTES_HEADROOM)


def prompt_too_large(nbytes: int, limit: int, what: str = "the prompt") -> str | None:
    """The refusal for a prompt of ``nbytes`` bytes over ``limit`` (naming the limit and the fix), else ``None``."""
    if nbytes <= limit:
        return None
    return (
        f"{what} holds {nbytes} bytes, over this deployment's limit of {limit} bytes per prompt (package.max_prompt_bytes; "
        f"by default max_input_len x the longest token x {PROMPT_BYTES_HEADROOM}); send a shorter prompt"
    )
