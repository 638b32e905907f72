"""A user's eval / calibration file is not labelled with the shipped set's name (support_v2)."""

from __future__ import annotations

import json

from pipeline.core.config import compose, key_fields


def _file(tmp_path, name):
    p = tmp_path / name
    p.write_text(json.dumps({"id": "a", "prompt": "p", "reference": "r", "metric": "exact_match", "slice": "s"}) + "\n", encoding="utf-8")
    return p


def test_custom_eval_set_is_labelled_by_its_file(tmp_path):
    shipped = compose([])
    assert shipped.eval.name == "support_v2"
    mine = _file(tmp_path, "my_eval.jsonl")
    cfg = compose([f"eval.eval_set={mine}"])
    assert cfg.eval.name == "my_eval.jsonl"
    assert key_fields(cfg.eval)["name"] == "my_eval.jsonl"  # the report's label is keyed


def test_explicit_non_preset_name_is_kept(tmp_path):
    mine = _file(tmp_path, "my_eval.jsonl")
    assert compose([f"eval.eval_set={mine}", "eval.name=tickets_q3"]).eval.name == "tickets_q3"


def test_custom_calibration_file_is_labelled_by_its_file(tmp_path):
    assert compose([]).calibration.name == compose(["calibration=support_v2"]).calibration.name
    mine = _file(tmp_path, "calib_mine.jsonl")
    cfg = compose(["calibration=support_v2", f"calibration.path={mine}"])
    assert cfg.calibration.name == "calib_mine.jsonl"
