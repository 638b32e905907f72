"""Fresh-user trial: `pipeline plan` (exit 0) and the run (refusing only mid-run, after earlier stages did work) must
agree, and every problem found before work starts is listed in one round. Each check below is the stage's own rule run
at config time (``pipeline/<stage>/checks.py`` through :func:`pipeline.validation.validate`)."""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

from cli_run import run_pipeline_cli

from pipeline.core.config import compose
from pipeline.core.config import validate as validate_fields
from pipeline.validation import validate

TINY = ["build.max_input_len=160", "build.max_seq_len=200", "model.dtype=float32"]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _by_field(problems) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in problems:
        out.setdefault(p.field, []).append(str(p))
    return out


def test_generation_config_sampling_problems_are_refused_before_any_stage_with_the_missing_eval_set(tiny_llama, tmp_path):
    ck = _copy(tiny_llama, tmp_path / "ck")
    gen = json.loads((ck / "generation_config.json").read_text())
    (ck / "generation_config.json").write_text(json.dumps({**gen, "min_p": 0.1, "no_repeat_ngram_size": 3, "top_p": 1.5}))
    cfg = compose([f"model.path={ck}", *TINY, "eval.eval_set=/nonexistent.jsonl"])
    for kw in ({"read_with_transformers": True}, {"list_inputs": True}):  # the plan, the run
        got = _by_field(validate(cfg, raise_on_error=False, **kw))
        said = "\n".join(got.get("model.path", []))
        assert len(got.get("model.path", [])) == 3, got  # one problem per field, each once (not again as one text)
        assert "min_p=0.1" in said and "no_repeat_ngram_size=3" in said and "top_p=1.5 is outside" in said, said
        assert said.count("Fix: ") == 3 and "generation_config.json" in said
        assert "eval.eval_set" in got, got
    r = run_pipeline_cli("plan", f"model.path={ck}", *TINY, "eval.eval_set=/nonexistent.jsonl", cwd=tmp_path)
    assert r.returncode == 2 and "min_p=0.1" in r.stderr and "eval.eval_set='/nonexistent.jsonl'" in r.stderr, r.stderr


def test_a_calibration_file_in_a_format_the_stage_cannot_read_is_refused_before_export(tiny_llama, tmp_path):
    csv = tmp_path / "calib.csv"
    csv.write_text("text\nhello world\n")
    jsonl = tmp_path / "calib.jsonl"
    jsonl.write_text("".join(json.dumps({"text": f"sample {i} of the calibration set"}) + "\n" for i in range(40)))
    base = [f"model.path={tiny_llama}", *TINY, "quant=int4_awq", "eval.eval_set=/nonexistent.jsonl"]
    for over, field, said in (
        ([f"calibration.path={csv}"], "calibration.path", "cannot tell the format from the suffix '.csv'"),
        ([f"calibration.path={jsonl}", "calibration.format=parquet"], "calibration.path", "does not start with the parquet magic"),
    ):
        for kw in ({"read_with_transformers": True}, {"list_inputs": True}):
            got = _by_field(validate(compose(base + over), raise_on_error=False, **kw))
            assert field in got and said in got[field][0] and "Fix: " in got[field][0], got
            assert "eval.eval_set" in got, got


def _plan_json(*argv: str) -> tuple[int, dict]:
    from pipeline.plan_cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["--json", *argv])
    return code, json.loads(buf.getvalue())


def test_plan_json_lists_every_refusal_in_problems(tiny_llama, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{bad")
    code, doc = _plan_json(f"model.path={bad}")
    assert code == 2 and doc["exit_code"] == 2
    assert [p["field"] for p in doc["problems"]] == ["model.path"], doc
    assert set(doc["problems"][0]) == {"field", "value", "message", "fix"} and "not valid JSON" in doc["problems"][0]["message"]
    # a value the config layer refuses while composing: shaped as every other problem
    code, doc = _plan_json("build.max_seq_len=abc")
    assert code == 2 and doc["overrides"] == ["build.max_seq_len=abc"]
    assert [(p["field"], p["value"]) for p in doc["problems"]] == [("build.max_seq_len", "abc")], doc
    assert set(doc["problems"][0]) == {"field", "value", "message", "fix"}
    # the run refuses the unreadable config.json before any stage, with the same words
    got = _by_field(validate(compose([f"model.path={bad}"]), raise_on_error=False, list_inputs=True))
    assert "not valid JSON" in got["model.path"][0] and len(got["model.path"]) == 1, got


def test_calib_max_seq_length_below_min_tokens_is_a_field_problem():
    problems = validate_fields(compose(["calibration.calib_max_seq_length=1"]), raise_on_error=False)
    got = _by_field(problems)
    said = got["calibration.calib_max_seq_length"][0]
    assert "calibration.min_tokens=4" in said and "Fix: raise calibration.calib_max_seq_length to at least 4" in said, said
    assert "calibration.calib_max_seq_length" not in _by_field(
        validate_fields(compose(["calibration.calib_max_seq_length=4"]), raise_on_error=False)
    )
