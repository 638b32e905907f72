"""Calibration-set loader: formats, bad inputs, padding-free batches (real tokenizer, no mocks)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from pipeline.core.config import compose
from pipeline.data.calibration import CalibrationSet, ensure_pad_token, load_calibration
from pipeline.errors import InputError


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    import tiny
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("tok")
    tiny.make_tokenizer(d)
    return AutoTokenizer.from_pretrained(str(d))


def _cfg(**kw):
    cfg = compose([]).calibration
    cfg.calib_size, cfg.min_samples, cfg.calib_max_seq_length, cfg.format = 8, 2, 32, "auto"
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


SENT = [
    "Where is my order ORD-12345?",
    "I want a refund for the damaged item.",
    "Please cancel order ORD-99871.",
    "Change the shipping address to 12 Main Street.",
    "The quick brown fox jumps over the lazy dog.",
]


def test_jsonl_text_and_messages(tmp_path, tok):
    p = tmp_path / "c.jsonl"
    rows = [{"id": i, "text": s} for i, s in enumerate(SENT)]
    rows.append({"messages": [{"role": "user", "content": "Where is my order?"}, {"role": "assistant", "content": "On its way."}]})
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n   \n", encoding="utf-8")
    cs = load_calibration(_cfg(apply_chat_template=True, calib_max_seq_length=256), tok, p)
    assert cs.stats["used"] == 6 and cs.stats["available"] == 6 and cs.stats["blank_dropped"] == 2
    bos = tok.convert_tokens_to_ids("<s>")
    assert all(s[0] == bos for s in cs.samples), "every sample starts with exactly one BOS"
    assert all(s.count(bos) == 1 for s in cs.samples)
    # the chat sample went through the chat template (renders "User: ...")
    decoded = [tok.decode(s) for s in cs.samples]
    assert any(d.startswith("<s>User: Where is my order?") and "Assistant: On its way." in d for d in decoded)


def test_text_lines_and_paragraphs_and_blank_lines_dropped(tmp_path, tok):
    p = tmp_path / "c.txt"
    p.write_text("first sample line\n\nsecond sample\nthird sample\n\n\nfourth one\n", encoding="utf-8")
    lines = load_calibration(_cfg(), tok, p)
    assert lines.stats["used"] == 4 and lines.stats["blank_dropped"] == 3 and lines.stats["format"] == "text"
    paras = load_calibration(_cfg(paragraphs=True), tok, p)
    assert paras.stats["used"] == 3
    assert any("second sample\nthird sample" in tok.decode(s) for s in paras.samples)


def test_parquet(tmp_path, tok):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": SENT + [""]}), str(p))
    cs = load_calibration(_cfg(text_field="body"), tok, p)
    assert cs.stats["format"] == "parquet" and cs.stats["used"] == 5 and cs.stats["blank_dropped"] == 1
    with pytest.raises(InputError, match="no 'text' or 'messages' column"):
        load_calibration(_cfg(), tok, p)


def test_non_utf8_names_file_and_line(tmp_path, tok):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"text": "ok line"}\n{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(InputError) as e:
        load_calibration(_cfg(), tok, p)
    assert f"{p}:3" in str(e.value) and "UTF-8" in str(e.value)


def test_bad_json_and_missing_field_name_line(tmp_path, tok):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "a"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(InputError, match=rf"{p.name}:2: not valid JSON"):
        load_calibration(_cfg(), tok, p)
    p.write_text('{"text": "a"}\n{"body": "b"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=rf"{p.name}:2: neither 'text' nor 'messages'"):
        load_calibration(_cfg(), tok, p)


def test_too_few_samples_fails_with_counts(tmp_path, tok):
    p = tmp_path / "c.txt"
    p.write_text("one\n\ntwo\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_calibration(_cfg(min_samples=3), tok, p)
    msg = str(e.value)
    assert "only 2 usable sample(s)" in msg and "calibration.min_samples=3" in msg and "1 blank dropped" in msg


def test_short_samples_warned_and_usable_vs_requested(tmp_path, tok, caplog):
    p = tmp_path / "c.txt"
    p.write_text("hi\nok\n" + "\n".join(SENT) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="pipeline.data.calibration"):
        cs = load_calibration(_cfg(min_tokens=5, calib_size=10), tok, p)
    assert cs.stats["short"] == 2 and cs.stats["used"] == 7 and cs.stats["requested"] == 10
    assert any("shorter than calibration.min_tokens=5" in r.message for r in caplog.records)
    assert any("7 usable sample(s) of 10 requested" in w for w in cs.warnings)
    # evaluate's fidelity hold-out asks for more than calib_size: the warning says what the number is made of
    held = load_calibration(_cfg(min_tokens=5, calib_size=10), tok, p, requested=" (4 calibration + 6 eval.fidelity_heldout)")
    assert any("7 usable sample(s) of 10 requested (4 calibration + 6 eval.fidelity_heldout)" in w for w in held.warnings)


def test_seeded_selection_and_truncation(tmp_path, tok):
    p = tmp_path / "c.txt"
    p.write_text("\n".join(f"{s} number {i}" for i, s in enumerate(SENT * 6)) + "\n", encoding="utf-8")
    a = load_calibration(_cfg(calib_size=5, seed=1, calib_max_seq_length=6), tok, p)
    b = load_calibration(_cfg(calib_size=5, seed=1, calib_max_seq_length=6), tok, p)
    c = load_calibration(_cfg(calib_size=5, seed=2, calib_max_seq_length=6), tok, p)
    assert a.samples == b.samples and a.samples != c.samples
    assert max(len(s) for s in a.samples) == 6 and a.stats["truncated"] == 5


def test_pad_token_set_and_recorded(tmp_path):
    import tiny
    from transformers import AutoTokenizer

    tiny.make_tokenizer(tmp_path)
    t = AutoTokenizer.from_pretrained(str(tmp_path))
    t.pad_token = None
    pad, was_set = ensure_pad_token(t)
    assert was_set and pad == "</s>" and t.pad_token == "</s>"
    assert ensure_pad_token(t) == ("</s>", False)


def test_batches_are_padding_free_prefixes():
    samples = [[1, 5, 6, 7], [1, 5], [1, 9, 9, 9, 9], [1, 2, 3], [1, 4, 4, 4]]
    cs = CalibrationSet(samples, {}, [])
    batches = cs.batches(2)
    seen = []
    for idx, ids in batches:
        assert len({len(r) for r in ids}) == 1, "no padding inside a batch"
        for i, r in zip(idx, ids):
            assert samples[i][: len(r)] == r, "each row is a real prefix of its sample"
            seen.append(i)
    assert sorted(seen) == list(range(5))
    assert cs.trimmed_tokens(2) == sum(map(len, samples)) - sum(len(r) for _, ids in batches for r in ids)
    assert cs.trimmed_tokens(1) == 0


def test_hf_format_without_datasets_is_a_clear_error(tok):
    try:
        import datasets  # noqa: F401

        pytest.skip("datasets is installed; this checks the not-installed message")
    except ImportError:
        pass
    with pytest.raises(InputError, match="needs the `datasets` package"):
        load_calibration(_cfg(format="hf", hf_dataset="cnn_dailymail"), tok, None)


def test_shipped_calibration_set_loads(repo_root, tok):
    cfg = compose(["calibration=support_v2"]).calibration
    cfg.calib_size = 64
    cs = load_calibration(cfg, tok, Path(repo_root) / cfg.path)
    assert cs.stats["used"] == 64 and cs.stats["blank_dropped"] == 0 and cs.stats["format"] == "jsonl"


def test_unknown_suffix(tmp_path, tok):
    p = tmp_path / "c.csv"
    p.write_text("a\n", encoding="utf-8")
    with pytest.raises(InputError, match="calibration.format"):
        load_calibration(_cfg(), tok, p)
