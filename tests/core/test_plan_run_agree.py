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
    # a bad field value: listed, shaped as every other problem
    code, doc = _plan_json(f"model.path={tiny_llama}", *TINY, "build.max_seq_len=-5")
    assert code == 2 and ("build.max_seq_len", -5) in [(p["field"], p["value"]) for p in doc["problems"]], doc
    # an unknown --gpus name
    code, doc = _plan_json("--gpus", "zzz", "model=llama31_8b")
    assert code == 2 and [(p["field"], p["value"]) for p in doc["problems"]] == [("--gpus", "zzz")], doc
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


def _eval_set(path: Path, n: int, slices: int = 1) -> Path:
    rows = [
        {"id": f"q{i}", "prompt": f"Where is order ORD-{i}?", "reference": f"ORD-{i}", "metric": "exact_match", "slice": f"s{i % slices}"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_an_eval_set_too_small_for_the_release_gate_is_refused_before_any_work(tiny_llama, tmp_path, monkeypatch):
    from pipeline.evaluate.gate import fewest_items, items_needed, tango_upper

    monkeypatch.delenv("PIPELINE_SKIP_GATE_SIZE_CHECK", raising=False)
    # the bound: no drop and no discordant pair is the best case short of the candidate beating its baseline
    assert fewest_items(0.05, 0.95) == 52 == items_needed(0, 0, 6, 0.05, 0.95)
    assert tango_upper(0, 0, 51, 0.95) > 0.05 >= tango_upper(0, 0, 52, 0.95)
    six = _eval_set(tmp_path / "six.jsonl", 6)
    base = [f"model.path={tiny_llama}", *TINY, f"eval.eval_set={six}"]
    for kw in ({"read_with_transformers": True}, {"list_inputs": True}):  # the plan, the run
        got = _by_field(validate(compose([*base, "quant=int4_awq"]), raise_on_error=False, **kw))
        said = got["eval.eval_set"][0]
        assert "too few items for the release gate ever to pass" in said and "overall has 6, needs 52 (allowance 5.0 pp)" in said
        assert "slice:s0 has 6, needs 25 (allowance 10.0 pp)" in said, said
        assert "Fix: a larger eval set" in said and "eval.gate.max_drop=<drop>" in said and "eval.gate.mode=exploratory" in said
    # exploratory mode, a relaxed allowance the set can show, or no baseline: not refused
    for over in (["eval.gate.mode=exploratory"], ["eval.gate.max_drop=0.5"], ["eval.runners=[engine]"]):
        got = _by_field(validate(compose([*base, "quant=int4_awq", *over]), raise_on_error=False, list_inputs=True))
        assert "eval.eval_set" not in got, (over, got)
    # per slice: 60 items over 4 slices pass overall (>= 52) but no 15-item slice can show 10 pp (25 needed)
    sixty = _eval_set(tmp_path / "sixty.jsonl", 60, slices=4)
    got = _by_field(validate(compose([*base, f"eval.eval_set={sixty}", "quant=int4_awq"]), raise_on_error=False))
    said = got["eval.eval_set"][0]
    assert "overall has" not in said and "slice:s0 has 15, needs 25" in said and "52 items, 25 per slice" in said, said
    # eval.limit: the items the stage takes
    got = _by_field(validate(compose([f"model.path={tiny_llama}", *TINY, "quant=int4_awq", "eval.limit=24"]), raise_on_error=False))
    assert "overall has 24, needs" in got["eval.eval_set"][0], got
    r = run_pipeline_cli("plan", *base, "quant=none", cwd=tmp_path, PIPELINE_SKIP_GATE_SIZE_CHECK="0")
    assert r.returncode == 2 and "overall has 6, needs 133 (allowance 2.0 pp)" in r.stderr, r.stderr


def test_the_inconclusive_fix_is_printed_once_at_the_end_of_a_run():
    """A fresh-user trial saw the ~1,500-character inconclusive text three times: the evaluate stage's verdict, the
    run summary's gate section and the package stage's refusal (the error line)."""
    from rich.console import Console

    from pipeline.core.config.eval import GateConfig
    from pipeline.core.contracts.evaluate import EvalReport
    from pipeline.evaluate.gate import judge, paired_stats
    from pipeline.evaluate.report import print_console
    from pipeline.evaluate.results import gate_summary
    from pipeline.report import RunSummary, print_summary

    st = paired_stats([1.0] * 6, [1.0] * 6, binary=True, agree=None, confidence=0.95, samples=200, seed=0)
    v = judge(GateConfig(), "none", {"overall": st, "slice:a": st}, {"overall": 1.0, "slice:a": 1.0})
    head = v["fix"].split(". ", 1)[0]
    assert v["verdict"] == "inconclusive" and head.startswith("the gate is INCONCLUSIVE, not failed")
    rep = {"gate": v, "eval_set": {"name": "x"}, "candidate": "engine", "recipe": "none", "runners": {}, "skipped": {"too_long": []}}
    stage, end = io.StringIO(), io.StringIO()
    print_console(EvalReport.from_json(rep), Console(file=stage, width=2000), in_run=True)
    refusal = f"package: refusing to package an artifact whose evaluation gate is inconclusive: {v['fix']}"
    record = {"passed": False, "reason": v["reason"], **gate_summary(v, {})}
    print_summary(RunSummary([], 3, [], 1.0, None, refusal, gate={"evaluate": record}), Console(file=end, width=2000))
    assert stage.getvalue().count(head) == 0 and "gate INCONCLUSIVE" in stage.getvalue() and "at the end of the run" in stage.getvalue()
    assert end.getvalue().count(head) == 0 and "non-inferiority inconclusive" in end.getvalue()  # the error line: stderr
    # a run that stops at evaluate: its error line is the reason, so the summary's gate section prints the fix
    end = io.StringIO()
    print_summary(
        RunSummary([], 3, [], 1.0, None, f"evaluation gate inconclusive: {v['reason']}", gate={"evaluate": record}),
        Console(file=end, width=2000),
    )
    assert end.getvalue().count(head) == 1
