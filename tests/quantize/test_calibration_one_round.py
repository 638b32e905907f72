"""Every problem of a calibration file that can be found before work starts is reported in one run (exit 2).

Found by a fresh-user trial: a 4-line calibration file with an invalid JSON line, a line with ``txt`` instead of
``text`` and too few samples for ``calibration.min_samples`` took three runs: run 1 ran export, then quantize named the
invalid line only; run 2 the ``text`` key only; run 3 the min_samples problem (a config check,
``pipeline.quantize.checks``, which skipped a file the reader refused).  Now the reader
(``pipeline.data.calibration``) collects every malformed line and the config checks report them as
``calibration.path`` problems with the min_samples one, before any stage runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run_pipeline_cli

from pipeline.core.config import compose
from pipeline.core.config.calibration import CalibrationConfig
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]


def _bad_calibration(p: Path) -> Path:
    lines = [
        json.dumps({"text": "Where is my order?"}),
        json.dumps({"text": "My parcel arrived damaged."}),
        "{not json",  # 3: not JSON
        json.dumps({"txt": "I want a refund."}),  # 4: 'txt', not 'text'
    ]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _assert_every_problem(err: str, cal: Path) -> None:
    assert f"{cal}:3: not valid JSON" in err and "Fix: one JSON object per line" in err, err
    assert f"{cal}:4: neither 'text' nor 'messages' present (keys: ['txt'])" in err, err
    assert "Fix: set calibration.text_field to the key holding the text" in err, err
    assert "holds 2 non-blank record(s) (0 blank, 2 malformed and not counted), fewer than calibration.min_samples=32" in err, err


def test_every_problem_of_the_calibration_file_is_reported_in_one_run(tmp_path):
    """The trial's command: the two malformed lines and min_samples in one exit-2 message, before any stage runs."""
    cal = _bad_calibration(tmp_path / "calib2.jsonl")
    store = tmp_path / "store"
    r = run_pipeline_cli(
        f"calibration.path={cal}",
        "quant=int4_awq",
        "stages=[export,quantize]",
        f"store_dir={store}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=ROOT,
        timeout=600,
    )
    out = " ".join((r.stdout + r.stderr).split())  # the console wraps long lines
    assert r.returncode == 2, out[-3000:]
    assert "3 configuration problem(s)" in out, out[-3000:]
    _assert_every_problem(out, cal)
    assert not store.exists() or not any(store.glob("*/*"))  # no stage ran


def test_validate_names_each_line_as_a_calibration_path_problem(tmp_path):
    cal = _bad_calibration(tmp_path / "calib.jsonl")
    ov = [f"calibration.path={cal}", "quant=int4_awq", "stages=[export,quantize]"]
    problems = [p for p in validate(compose(ov), raise_on_error=False) if p.field == "calibration.path"]
    assert len(problems) == 3 and all(p.value == str(cal) and p.fix for p in problems), problems
    _assert_every_problem("\n".join(map(str, problems)), cal)
    # enough good lines: the malformed ones alone, no min_samples problem
    ok = [p for p in validate(compose([*ov, "calibration.min_samples=2"]), raise_on_error=False) if p.field == "calibration.path"]
    assert [p.message.split(": ", 1)[0] for p in ok] == [f"{cal}:3", f"{cal}:4"], ok


def test_the_reader_collects_every_bad_line_and_caps_the_message(tmp_path):
    from pipeline.data.calibration import CalibrationError, read_raw
    from pipeline.errors import MAX_REPORTED_PROBLEMS

    cal = tmp_path / "calib.jsonl"
    distinct = [json.dumps({f"t{i}": "x"}) for i in range(MAX_REPORTED_PROBLEMS + 5)]  # one message each (not grouped)
    cal.write_text("\n".join([*distinct, json.dumps({"text": "ok"})]) + "\n", encoding="utf-8")
    with pytest.raises(CalibrationError) as ei:
        read_raw(CalibrationConfig(format="jsonl"), cal)
    e = ei.value
    assert len(e.problems) == MAX_REPORTED_PROBLEMS + 5 and len(e.rows) == 1 and e.blank == 0
    assert f"{MAX_REPORTED_PROBLEMS + 5} problem(s)" in str(e) and "... and 5 more" in str(e)
    assert f"{cal}:{MAX_REPORTED_PROBLEMS + 1}: neither" not in str(e)  # past the cap: counted only
    ov = [f"calibration.path={cal}", "quant=int4_awq", "stages=[export,quantize]", "calibration.min_samples=1"]
    got = [str(p) for p in validate(compose(ov), raise_on_error=False) if p.field == "calibration.path"]
    assert len(got) == MAX_REPORTED_PROBLEMS + 1 and "... and 5 more malformed line(s)" in got[-1], got


def test_identical_problems_of_many_lines_are_printed_once_with_their_lines(tmp_path):
    """Fresh-user trial: 8 lines with ``txt`` instead of ``text`` printed the same message 8 times, one per line. The
    reader's ``problems`` stay one per line; the printed message and ``validate``'s problems (``plan --json``) group
    the ones that differ only in their line: the lines, how many, the message once (a second trial: with the cap
    applied first, a mistake on 100 lines read "lines 1-20 (20 lines)" and "80 more (not listed here)")."""
    from pipeline.core.config import ConfigError
    from pipeline.data.calibration import CalibrationError, read_raw

    cal = tmp_path / "calib.jsonl"
    bad = json.dumps({"txt": "I want a refund."})
    lines = [bad, bad, bad, json.dumps({"text": "ok"}), bad, "{not json", bad, bad, bad, json.dumps({"text": "ok too"})]
    cal.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ov = [f"calibration.path={cal}", "quant=int4_awq", "stages=[export,quantize]", "calibration.min_samples=1"]
    problems = [p for p in validate(compose(ov), raise_on_error=False) if p.field == "calibration.path"]
    assert len(problems) == 2  # the seven lines of one mistake, and the line that is not JSON
    msg = str(ConfigError(problems))
    assert msg.startswith("2 configuration problem(s):") and msg.count("neither 'text' nor 'messages'") == 1, msg
    assert f"{cal} lines 1-3, 5, 7-9 (7 lines): neither 'text' nor 'messages' present (keys: ['txt'])" in msg, msg
    assert f"{cal}:6: not valid JSON" in msg  # a message of one line is printed as it was
    with pytest.raises(CalibrationError) as ei:
        read_raw(CalibrationConfig(format="jsonl"), cal)
    assert len(ei.value.problems) == 8 and str(ei.value).count("neither 'text' nor 'messages'") == 1
    assert f"{cal} lines 1-3, 5, 7-9 (7 lines): neither" in str(ei.value)


def test_one_mistake_on_more_lines_than_the_cap_is_one_problem_naming_every_line(tmp_path):
    """A second trial: 100 lines with the same mistake read "lines 1-20 (20 lines)" and "... and 80 more (not listed
    here)": grouping now comes before the cap, so every line is named, in the message and in ``validate``'s list."""
    from pipeline.data.calibration import CalibrationError, read_raw

    cal = tmp_path / "calib.jsonl"
    cal.write_text("\n".join([json.dumps({"txt": "x"})] * 100 + [json.dumps({"text": "ok"})]) + "\n", encoding="utf-8")
    with pytest.raises(CalibrationError) as ei:
        read_raw(CalibrationConfig(format="jsonl"), cal)
    assert len(ei.value.problems) == 100 and f"{cal} lines 1-100 (100 lines): neither" in str(ei.value)
    assert "... and" not in str(ei.value)
    ov = [f"calibration.path={cal}", "quant=int4_awq", "stages=[export,quantize]", "calibration.min_samples=1"]
    problems = [str(p) for p in validate(compose(ov), raise_on_error=False) if p.field == "calibration.path"]
    assert len(problems) == 1 and f"{cal} lines 1-100 (100 lines): neither" in problems[0], problems


def test_a_long_list_of_lines_is_shortened():
    """A recheck: the same mistake on every third line of a 3,000-line file listed all 1,000 line numbers (5.9 KB)."""
    from pipeline.errors import grouped

    texts = [f"eval.jsonl:{n}: metric 'exact_matsh' is not known. Fix: use exact_match" for n in range(1, 3001, 3)]
    (line,) = grouped(texts)
    assert line.startswith("eval.jsonl lines 1, 4, 7, ") and ", 28, ..., 2998 (1000 lines): metric" in line, line
    assert len(line) < 200
