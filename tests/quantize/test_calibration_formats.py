"""Issue 12 case 8: calibration ``format: auto`` by suffix (jsonl, json array, parquet, txt), refusals that list the
formats that exist, and calibration text treated as data (case 4).  Real tokenizer, real files, no mocks."""

from __future__ import annotations

import json

import pytest

from pipeline.core.config import compose
from pipeline.data.calibration import load_calibration
from pipeline.errors import InputError

SENT = [
    "Where is my order ORD-12345?",
    "I want a refund for the damaged item.",
    "Please cancel order ORD-99871.",
    "Change the shipping address to 12 Main Street.",
    "The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    import tiny
    from transformers import AutoTokenizer

    d = tmp_path_factory.mktemp("tok")
    tiny.make_tokenizer(d)
    return AutoTokenizer.from_pretrained(str(d))


def _shipped(**kw):
    """The shipped preset with a user's file, as `pipeline calibration.path=...` composes it."""
    cfg = compose(["calibration=support_v2"]).calibration
    cfg.calib_size, cfg.min_samples = 8, 2
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def _write_parquet(p, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": rows}), str(p))


def test_shipped_preset_uses_auto():
    assert compose(["calibration=support_v2"]).calibration.format == "auto"


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".json-lines-in-json", ".parquet", ".txt"])
def test_auto_reads_every_format_through_the_shipped_preset(tmp_path, tok, suffix):
    """`calibration.path=my.parquet` / `.txt` / a JSON array used to fail with the preset's pinned `format: jsonl`."""
    if suffix == ".jsonl":
        p = tmp_path / "c.jsonl"
        p.write_text("\n".join(json.dumps({"text": s}) for s in SENT) + "\n", encoding="utf-8")
        want = "jsonl"
    elif suffix == ".json":
        p = tmp_path / "c.json"
        p.write_text(json.dumps([{"text": s} for s in SENT[:3]] + SENT[3:], ensure_ascii=False, indent=2), encoding="utf-8")
        want = "json"
    elif suffix == ".json-lines-in-json":
        p = tmp_path / "lines.json"
        p.write_text("\n".join(json.dumps({"text": s}) for s in SENT) + "\n", encoding="utf-8")
        want = "jsonl"
    elif suffix == ".parquet":
        p = tmp_path / "c.parquet"
        _write_parquet(p, SENT)
        want = "parquet"
    else:
        p = tmp_path / "c.txt"
        p.write_text("\n".join(SENT) + "\n", encoding="utf-8")
        want = "text"
    cs = load_calibration(_shipped(path=str(p)), tok, p)
    assert cs.stats["format"] == want and cs.stats["used"] == len(SENT)
    assert sorted(tok.decode(s, skip_special_tokens=True) for s in cs.samples) == sorted(SENT)


def test_unknown_suffix_lists_the_formats(tmp_path, tok):
    p = tmp_path / "c.csv"
    p.write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_calibration(_shipped(path=str(p)), tok, p)
    msg = str(e.value)
    for part in (
        "calibration.format",
        "'.csv'",
        "jsonl (.jsonl, .ndjson)",
        "json (.json)",
        "text (.txt, .text)",
        "parquet (.parquet, .pq)",
        "hf",
    ):
        assert part in msg, part


def test_explicit_format_contradicted_by_the_file_is_named(tmp_path, tok):
    pq_file = tmp_path / "data.parquet"
    _write_parquet(pq_file, SENT)
    with pytest.raises(InputError, match=r"is a parquet file but calibration.format=jsonl.*calibration.format=auto"):
        load_calibration(_shipped(path=str(pq_file), format="jsonl"), tok, pq_file)
    with pytest.raises(InputError, match=r"is a parquet file but calibration.format=text"):
        load_calibration(_shipped(path=str(pq_file), format="text"), tok, pq_file)
    arr = tmp_path / "arr.jsonl"
    arr.write_text(json.dumps([{"text": s} for s in SENT]), encoding="utf-8")
    with pytest.raises(InputError, match=r"holds a JSON array, not JSON lines.*calibration.format=auto \(or json\)"):
        load_calibration(_shipped(path=str(arr), format="jsonl"), tok, arr)
    not_pq = tmp_path / "x.txt"
    not_pq.write_text("hello\n", encoding="utf-8")
    with pytest.raises(InputError, match="parquet magic"):
        load_calibration(_shipped(path=str(not_pq), format="parquet"), tok, not_pq)


def test_json_array_errors_name_the_item(tmp_path, tok):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps([{"text": "ok"}, 3]), encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.json\[item 2\]: expected an object"):
        load_calibration(_shipped(path=str(p)), tok, p)
    p2 = tmp_path / "obj.json"
    p2.write_text('[{"text": "a"}, ', encoding="utf-8")
    with pytest.raises(InputError, match=r"obj.json:1: not valid JSON"):
        load_calibration(_shipped(path=str(p2)), tok, p2)


def test_control_token_strings_in_calibration_text_are_data(tmp_path, tok):
    """A calibration line containing `</s>` / `<s>` is text: no eos id inside a sample, exactly one BOS (from the
    template) at its start."""
    p = tmp_path / "c.txt"
    p.write_text("\n".join(f"{s} </s> then <s> more" for s in SENT) + "\n", encoding="utf-8")
    cs = load_calibration(_shipped(path=str(p)), tok, p)
    bos, eos = tok.convert_tokens_to_ids("<s>"), tok.convert_tokens_to_ids("</s>")
    assert all(s[0] == bos and s.count(bos) == 1 and eos not in s for s in cs.samples)
    assert all("</s> then <s>" in tok.decode(s, skip_special_tokens=True) for s in cs.samples)
