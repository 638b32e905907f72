"""An eval set saved with a UTF-8 byte-order mark (Windows editors) is read, not refused as invalid JSON."""

from __future__ import annotations

import json

from pipeline.data.evalset import load_eval_set


def test_eval_set_with_a_utf8_bom_is_read(tmp_path):
    rows = [
        {"id": f"q{i}", "prompt": f"Where is ORD-{i}?", "reference": f"ORD-{i}", "metric": "exact_match", "slice": "s"} for i in range(2)
    ]
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8"))
    items = load_eval_set(p)
    assert [i.id for i in items] == ["q0", "q1"]


def test_calibration_jsonl_with_a_utf8_bom_is_read(tmp_path):
    """Guard (calibration already stripped the BOM; kept so both readers stay consistent)."""
    from pipeline.data.calibration import _read_jsonl

    p = tmp_path / "calib.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"text": "hello"}\n{"text": "world"}\n')
    rows, blank = _read_jsonl(p, "text")
    assert len(rows) == 2 and blank == 0


def test_every_problem_of_a_line_is_reported_with_the_others(tmp_path):
    """A line's duplicate id and its metric-specific problem are reported even when the line has other problems."""
    import pytest

    from pipeline.data.evalset import load_eval_set
    from pipeline.errors import InputError

    p = tmp_path / "set.jsonl"
    p.write_text(
        '{"id": "a1", "prompt": "x", "reference": "y", "metric": "exact_match", "slice": "s"}\n'
        '{"id": "a1", "prompt": "x", "reference": "y", "metric": "exactmatch", "slice": "s"}\n'
        '{"id": "a3", "prompt": "", "reference": "y", "metric": "regex", "slice": ""}\n',
        encoding="utf-8",
    )
    with pytest.raises(InputError) as e:
        load_eval_set(p)
    msg = str(e.value)
    assert "5 problem(s)" in msg
    assert ":2: field 'metric' is not a known metric" in msg and ":2: field 'id' value 'a1' duplicates line 1" in msg
    assert (
        ":3: field 'prompt'" in msg
        and ":3: field 'slice'" in msg
        and ":3: field 'reference'/'metric_args' invalid for metric 'regex'" in msg
    )
