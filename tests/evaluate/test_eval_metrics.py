"""Metrics on hand-written cases, the eval-set loader's error messages, stop handling, one BOS and
the too-long skip (tokenizer from tests/tiny.py; no model needed)."""

from __future__ import annotations

import json

import pytest

from pipeline.data.evalset import EvalItem, load_eval_set
from pipeline.data.metrics import METRICS, get_metric
from pipeline.errors import InputError


def item(metric, reference, **args):
    return EvalItem(id="x", slice="s", metric=metric, reference=reference, prompt="p", metric_args=args)


@pytest.mark.parametrize(
    "metric,ref,args,out,want",
    [
        ("exact_match", "damaged_item", {}, " damaged_item\n", 1.0),
        ("exact_match", "damaged_item", {}, "Damaged_item", 0.0),
        ("exact_match", ["a", "b"], {}, "b", 1.0),
        ("normalized_exact_match", "We are sorry that order ORD-1 is delayed.", {}, "we are sorry that order ord 1 is delayed", 1.0),
        ("normalized_exact_match", "The answer", {}, "answer!", 1.0),
        ("normalized_exact_match", "refund", {}, "no refund", 0.0),
        ("normalized_exact_match", "你好", {}, "你好。", 1.0),
        ("contains", "ORD-123", {}, "Your order ord-123 shipped", 1.0),
        ("contains", "ORD-124", {}, "Your order ORD-123 shipped", 0.0),
        ("regex", "42", {"pattern": r"answer:\s*(\d+)", "flags": "i"}, "Reasoning... ANSWER: 42.", 1.0),
        ("regex", "42", {"pattern": r"answer:\s*(\d+)"}, "the answer is 42", 0.0),
        ("numeric", "1234.50", {}, "Total: 1,234.5 dollars", 1.0),
        ("numeric", "38.00", {}, "38", 1.0),
        ("numeric", "38.00", {}, "38.01", 0.0),
        ("numeric", "38.00", {"abs_tol": 0.05}, "38.01", 1.0),
        ("numeric", "100", {"rel_tol": 0.1}, "109", 1.0),
        ("numeric", "5", {}, "five", 0.0),
        ("numeric", "22.20", {}, "２２.２０", 1.0),
        ("json_fields", {"order_id": "ORD-1", "amount": 12.5}, {}, 'Sure: {"order_id": "ORD-1", "amount": 12.50}', 1.0),
        ("json_fields", {"order_id": "ORD-1", "amount": 12.5}, {}, '{"order_id": "ORD-2", "amount": 12.5}', 0.5),
        ("json_fields", {"order_id": "ORD-1"}, {}, "not json {", 0.0),
        ("choice", "B", {}, "The answer is (B).", 1.0),
        ("choice", "B", {}, "A", 0.0),
        ("choice", "C", {"options": {"C": "Refund the order"}}, "refund the order", 1.0),
        ("choice", "B", {}, "Because", 0.0),
    ],
)
def test_metric_cases(metric, ref, args, out, want):
    assert get_metric(metric)(out, item(metric, ref, **args)) == pytest.approx(want)


def test_rouge_l_matches_lcs_definition():
    m = get_metric("rouge_l")
    # LCS("a b c d", "a c d") = 3 -> P = 3/3, R = 3/4, F = 2PR/(P+R) = 6/7 (Lin 2004)
    assert m("a c d", item("rouge_l", "a b c d")) == pytest.approx(6 / 7)
    assert m("identical text", item("rouge_l", "Identical text")) == pytest.approx(1.0)
    assert m("unrelated", item("rouge_l", "something else")) == 0.0
    # CJK characters are tokens (rouge-score's default tokenizer would drop them): LCS 3 of 4 chars
    assert m("订单到", item("rouge_l", "订单已到")) == pytest.approx(2 * 1 * 0.75 / 1.75)
    assert not m.binary and get_metric("exact_match").binary


def test_registry_unknown_name_lists_known():
    with pytest.raises(KeyError) as e:
        get_metric("bleu")
    assert "exact_match" in str(e.value) and "rouge_l" in str(e.value)
    assert all(m.higher_is_better for m in METRICS.values())
    from pipeline.data.metrics import Metric, register

    with pytest.raises(ValueError, match="higher_is_better"):
        register(Metric("edit_distance", lambda o, i: 0.0, higher_is_better=False))
    assert "edit_distance" not in METRICS


def test_malformed_lines_name_file_line_field(tmp_path):
    good = {"id": "a", "prompt": "p", "reference": "r", "metric": "exact_match", "slice": "s"}
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps({**good, "id": "b", "metric": "bleu"}),
        json.dumps({k: v for k, v in {**good, "id": "c"}.items() if k != "reference"}),
        json.dumps({**good, "id": "d", "max_new_tokens": 0}),
        json.dumps({**good}),  # duplicate id
        json.dumps({**good, "id": "e", "metric": "regex", "metric_args": {"pattern": "(unclosed"}}),
        json.dumps({**good, "id": "f", "prompt": None, "messages": [{"role": "user"}]}),
        json.dumps({**good, "id": "g", "metric": "numeric", "reference": "twelve"}),
    ]
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_eval_set(f)
    msg = str(e.value)
    assert f"{f}:2: invalid JSON" in msg
    assert f"{f}:3: field 'metric'" in msg and "'bleu'" in msg and "rouge_l" in msg
    assert f"{f}:4: field 'reference'" in msg
    assert f"{f}:5: field 'max_new_tokens'" in msg
    assert f"{f}:6: field 'id'" in msg and "duplicates line 1" in msg
    assert f"{f}:7:" in msg and "does not compile" in msg
    assert f"{f}:8: field 'messages'" in msg
    assert f"{f}:9:" in msg and "not numbers" in msg
    assert "Fix:" in msg


def test_a_misspelled_optional_field_or_role_is_refused_not_dropped(tmp_path):
    """Fresh-user trial: ``"max_new_token": 0`` and ``"stops": [...]`` ran to exit 0 (kept as metadata, so the item's
    budget and stop strings were silently the defaults), and role ``"usr"`` was accepted.  A near miss of a known
    field or role is now refused; other unknown fields (``lang``, ``idx``) stay metadata."""
    good = {"id": "a", "prompt": "p", "reference": "r", "metric": "exact_match", "slice": "s"}
    lines = [
        json.dumps({**good, "max_new_token": 0}),
        json.dumps({**good, "id": "b", "stops": ["\n"]}),
        json.dumps({**good, "id": "c", "prompt": None, "messages": [{"role": "usr", "content": "hi"}]}),
        # trial 2: a capitalised field or role was not caught (the match was case-sensitive)
        json.dumps({**good, "id": "d", "Stop": ["\n"]}),
        json.dumps({**good, "id": "e", "prompt": None, "messages": [{"role": "User", "content": "hi"}]}),
    ]
    f = tmp_path / "typos.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_eval_set(f)
    msg = str(e.value)
    assert f"{f}:1: field 'max_new_token' is not an eval-set field; did you mean 'max_new_tokens'?" in msg, msg
    assert f"{f}:2: field 'stops' is not an eval-set field; did you mean 'stop'?" in msg, msg
    assert f"{f}:3: field 'messages' has role 'usr', a near miss of 'user'" in msg, msg
    assert f"{f}:4: field 'Stop' is not an eval-set field; did you mean 'stop'?" in msg, msg
    assert f"{f}:5: field 'messages' has role 'User', a near miss of 'user'" in msg, msg
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({**good, "lang": "en", "idx": 3, "messages": [{"role": "ipython", "content": "x"}], "prompt": None}) + "\n")
    (item,) = load_eval_set(ok)
    assert item.meta == {"lang": "en", "idx": 3} and item.messages == [{"role": "ipython", "content": "x"}]


def test_shipped_eval_set_loads(repo_root):
    items = load_eval_set(repo_root / "evaluation/data/support_eval_v2.jsonl")
    assert len(items) >= 100 and len({i.slice for i in items}) >= 4
    assert items[0].meta.get("lang") in ("en", "zh")


# --------------------------------------------------------------------------- stop handling / tokenization
@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    import tiny
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("tok")
    tiny.make_tokenizer(d)
    return AutoTokenizer.from_pretrained(str(d))


def test_cut_at_first_stop_of_eos_list_and_end_id_padding(tok):
    from pipeline.evaluate.runners import finalize

    ans = tok("ORD-12345", add_special_tokens=False)["input_ids"]
    eos_list = [2, 99]
    # second eos id of the list ends it; the end-id padding after it is dropped
    text, ids, reason = finalize(ans + [99] + [2] * 5, eos_list, [], tok)
    assert (text, ids, reason) == ("ORD-12345", ans, "eos")
    # padding with the end id after the answer (what an engine returns for a finished sequence)
    text, ids, reason = finalize(ans + [2, 2, 2], eos_list, [], tok)
    assert text == "ORD-12345" and reason == "eos"
    # stop string cuts the text; budget exhaustion is "length"
    text, _, reason = finalize(ans + tok(" refund", add_special_tokens=False)["input_ids"], eos_list, [" ref"], tok)
    assert (text, reason) == ("ORD-12345", "stop")
    assert finalize(ans, eos_list, [], tok)[2] == "length"


def test_chat_template_with_bos_gives_exactly_one_bos(tok):
    from pipeline.data.evalset import prepare

    assert "bos_token" in tok.chat_template
    p = prepare(
        [EvalItem(id="a", slice="s", metric="exact_match", reference="r", prompt="Where is my order?")],
        tok,
        max_input_len=256,
        max_seq_len=384,
        default_max_new_tokens=8,
    )[0]
    assert p.input_ids.count(tok.bos_token_id) == 1 and p.input_ids[0] == tok.bos_token_id
    chat = prepare(
        [
            EvalItem(
                id="b",
                slice="s",
                metric="exact_match",
                reference="r",
                messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "refund"}],
            )
        ],
        tok,
        max_input_len=256,
        max_seq_len=None,
        default_max_new_tokens=8,
    )[0]
    assert chat.input_ids.count(tok.bos_token_id) == 1


def test_over_long_prompt_is_skipped_not_truncated(tok):
    from pipeline.data.evalset import SKIP_TOO_LONG, prepare

    items = [
        EvalItem(id="short", slice="s", metric="exact_match", reference="r", prompt="refund", max_new_tokens=50),
        EvalItem(id="long", slice="s", metric="exact_match", reference="r", prompt="refund the damaged item " * 40),
    ]
    ps = prepare(items, tok, max_input_len=64, max_seq_len=70, default_max_new_tokens=8)
    assert ps[0].skipped is None and len(ps[0].input_ids) + ps[0].max_new_tokens <= 70
    assert ps[1].skipped == SKIP_TOO_LONG and len(ps[1].input_ids) > 64


def test_a_registered_metric_is_checked_when_registered_and_when_it_scores():
    """``pipeline.register_metric`` refused only a lower-is-better metric; a function of the wrong arity failed deep in
    evaluate, and a score of 2.0 (or 0.5 from a binary metric) went into the gate's paired statistics unchecked."""
    from pipeline.data.metrics import Metric, register
    from pipeline.errors import InputError

    with pytest.raises(ValueError, match=r"fn must be callable as fn\(output, item\)"):
        register(Metric("one_arg", lambda o: 1.0))
    with pytest.raises(ValueError, match=r"check must be callable as check\(item\)"):
        register(Metric("bad_check", lambda o, i: 1.0, check=lambda: None))
    with pytest.raises(ValueError, match="identifier-like"):
        register(Metric("has space", lambda o, i: 1.0))
    assert not {"one_arg", "bad_check", "has space"} & set(METRICS)
    it = EvalItem(id="x1", slice="s", metric="m", reference="r", prompt="p")
    with pytest.raises(InputError, match=r"metric 'len_score' returned 2\.0 for item 'x1'; a metric must return a number in \[0, 1\]"):
        Metric("len_score", lambda o, i: 2.0, binary=False)("out", it)
    with pytest.raises(InputError, match=r"returned 0\.5 .* must return 0 or 1 \(binary=True\).*binary=False"):
        Metric("half", lambda o, i: 0.5)("out", it)
    assert Metric("half", lambda o, i: 0.5, binary=False)("out", it) == 0.5
