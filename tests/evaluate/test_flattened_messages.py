"""Eval items with a conversation encoded without a chat template are said so, once (fresh-user trial: a system +
user item was joined by newlines and its roles dropped without a word, where transformers' apply_chat_template would
refuse a tokenizer without a template). Real tokenizer of a tiny checkpoint, real eval items."""

from __future__ import annotations

import logging
import types

import tiny

from pipeline.data.evalset import EvalItem
from pipeline.evaluate.inputs import _warn_flattened_messages


def _items():
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is my order?"}]
    return [
        EvalItem("q1", "s", "exact_match", "x", prompt="Where is my order?"),
        EvalItem("q4", "s", "exact_match", "x", messages=conv),
        EvalItem("q5", "s", "exact_match", "x", messages=[{"role": "user", "content": "hi"}]),
    ]


def _warnings(tok, apply_chat_template, caplog):
    log = logging.getLogger("pipeline.test_flattened")
    caplog.clear()
    with caplog.at_level("WARNING", logger=log.name):
        _warn_flattened_messages(types.SimpleNamespace(log=log), _items(), tok, apply_chat_template)
    return [r.getMessage() for r in caplog.records]


def test_conversations_without_a_chat_template_are_warned_about_once(tiny_llama, tmp_path, caplog):
    from transformers import AutoTokenizer

    with_template = AutoTokenizer.from_pretrained(str(tiny_llama))
    assert _warnings(with_template, True, caplog) == []  # the template renders the roles
    (msg,) = _warnings(with_template, False, caplog)
    assert "1 eval item(s) with a conversation (e.g. q4)" in msg and "model.apply_chat_template=false" in msg

    bare = tiny.without_chat_template(tiny_llama, tmp_path / "no_template")
    (msg,) = _warnings(AutoTokenizer.from_pretrained(str(bare)), True, caplog)
    # no template: every chat item counts, a single user message too (its role is dropped as well)
    assert "2 of 3 eval items (e.g. q4, q5) are chat messages but the checkpoint has no chat template" in msg
    assert "roles dropped" in msg and "Fix:" in msg
