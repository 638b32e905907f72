"""Every problem of an eval set that can be found before work starts is reported in one run (exit 2).

Found by a fresh-user trial: an eval set with prompts longer than ``build.max_input_len`` and malformed lines was
reported in two rounds: the length problems (a config check, ``pipeline.evaluate.checks``) first, the file's own
problems (unknown metric, missing reference, duplicate id, bad ``metric_args``, a line that is not an object; read by
``pipeline.data.evalset`` while the run listed its inputs) only after the lengths were fixed; a missing calibration
set came in yet another round, and an item over the model's positions, or one the chat template cannot render, was
named one at a time."""

from __future__ import annotations

import io
import json
from pathlib import Path

import tiny
from cli_run import run_pipeline_cli
from rich.console import Console

from pipeline.core.config import compose
from pipeline.runner import run_pipeline
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]
POSITIONS = 512  # models/support-llama (the default model): max_position_embeddings


def _row(i: int, **kw) -> str:
    row = {"id": f"t-{i}", "prompt": "What is the intent of this ticket? My order is late.", "reference": "shipping_delay"}
    return json.dumps({**row, "slice": "s", "metric": "exact_match", **kw})


def _bad_eval_set(p: Path) -> Path:
    lines = [
        _row(1),
        _row(2, metric="exact_matchh"),  # 2: unknown metric
        json.dumps({k: v for k, v in json.loads(_row(3)).items() if k != "reference"}),  # 3: no reference
        _row(1),  # 4: duplicate id
        _row(5, metric_args="tol"),  # 5: metric_args not an object
        _row(6, prompt="word " * 1500),  # 6: over the model's positions
        _row(7, prompt="word " * 1000),  # 7: over them too
        "[1, 2]",  # 8: not an object
        "{not json",  # 9: not JSON
    ]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _assert_every_problem(err: str, es: Path) -> None:
    assert f"{es}:2: field 'metric' is not a known metric (value 'exact_matchh'). Fix: did you mean 'exact_match'?" in err, err
    assert f"{es}:3: field 'reference' is missing or empty (value None). Fix: add \"reference\"" in err, err
    assert f"{es}:4: field 'id' value 't-1' duplicates line 1. Fix: make ids unique." in err, err
    assert f"{es}:5: field 'metric_args' must be an object (value 'tol'). Fix: use e.g." in err, err
    assert f"{es}:8: expected a JSON object, got list. Fix: one object per line." in err, err
    assert f"{es}:9: invalid JSON" in err, err
    assert (
        "build.max_input_len=256: the eval set" in err and f"items t-6, t-7 (2) alone are each more than the model's {POSITIONS}" in err
    ), err
    assert "build.max_seq_len=384: prompt + max_new_tokens reaches" in err, err


def test_every_problem_of_the_eval_set_is_reported_in_one_run(tmp_path):
    """The trial's command: lengths and the file's own problems in one exit-2 message, before any stage runs."""
    es = _bad_eval_set(tmp_path / "eval.jsonl")
    store = tmp_path / "store"
    r = run_pipeline_cli(
        f"eval.eval_set={es}",
        "stages=[export,quantize,build,evaluate]",
        f"store_dir={store}",
        "quant=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=ROOT,
        timeout=300,
    )
    out = " ".join((r.stdout + r.stderr).split())  # the console wraps long lines
    assert r.returncode == 2, out[-3000:]
    assert "configuration problem(s)" in out, out[-3000:]
    _assert_every_problem(out, es)
    assert not store.exists() or not any(store.glob("*/*"))  # no stage ran


def test_config_problems_missing_inputs_and_eval_set_problems_come_together(tmp_path):
    """A field problem, a missing calibration set and a malformed eval set: one ConfigError naming all three kinds;
    no stage is blamed, none ran."""
    es = _bad_eval_set(tmp_path / "eval.jsonl")
    cal = tmp_path / "missing-calib.jsonl"
    ov = [f"eval.eval_set={es}", f"calibration.path={cal}", "quant=int8_wo", "eval.gate.min_score=90"]
    ov += ["stages=[export,quantize,build,evaluate]"]
    cfg = compose([f"store_dir={tmp_path / 'store'}", "progress=false", *ov])
    summary = run_pipeline(cfg, overrides=ov, console=Console(file=io.StringIO(), width=200))
    err = str(summary.error)
    assert summary.exit_code == 2, err
    _assert_every_problem(err, es)
    assert "eval.gate.min_score=90.0: must be in [0, 1]" in err, err
    assert f"calibration.path='{cal}': not found (looked for {cal}; the quantize stage reads it). Fix: set calibration.path" in err
    assert {r.status for r in summary.stages} == {"not-run"}


def test_validate_lists_the_eval_set_file_problems_with_the_field_the_row_the_value_and_the_fix(tmp_path):
    es = _bad_eval_set(tmp_path / "eval.jsonl")
    problems = [p for p in validate(compose([f"eval.eval_set={es}"]), raise_on_error=False) if p.field == "eval.eval_set"]
    assert len(problems) == 6 and all(p.value == str(es) and p.fix for p in problems), problems
    assert sorted(p.message.split(": ", 1)[0] for p in problems) == [f"{es}:{n}" for n in (2, 3, 4, 5, 8, 9)]
    # a clean file adds nothing
    ok = tmp_path / "ok.jsonl"
    ok.write_text(_row(1) + "\n" + _row(2) + "\n", encoding="utf-8")
    assert not [p for p in validate(compose([f"eval.eval_set={ok}"]), raise_on_error=False) if p.field == "eval.eval_set"]


def test_every_item_the_chat_template_cannot_render_is_named(tmp_path):
    """A template that refuses a system message: every eval item with one is named in the one problem."""
    ckpt = tiny.make_checkpoint(tmp_path / "ckpt", "llama")
    strict = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}{{ m['content'] }}{% endfor %}"
    (ckpt / "chat_template.jinja").write_text(strict, encoding="utf-8")
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is my order?"}]
    rows = [_row(1)] + [_row(i, prompt=None, messages=system) for i in (2, 3, 4)]
    es = tmp_path / "eval.jsonl"
    es.write_text("\n".join(json.dumps({k: v for k, v in json.loads(r).items() if v is not None}) for r in rows) + "\n")
    got = {
        p.field: str(p) for p in validate(compose([f"model.path={ckpt}", f"eval.eval_set={es}", "stages=[evaluate]"]), raise_on_error=False)
    }
    msg = got["model.apply_chat_template"]
    assert "item t-2:" in msg and "no system role" in msg and "2 more item(s) too: t-3, t-4" in msg, msg


def test_a_checkpoint_the_export_stage_refuses_is_named_once_with_the_config_problems(tmp_path):
    """The export stage's own refusal of model.path (listed with the inputs) comes with a field problem, once."""
    gone = tmp_path / "no-model"
    ov = [f"model.path={gone}", "quant=none", "eval.gate.min_score=90", "stages=[export,quantize,build,evaluate]"]
    cfg = compose([f"store_dir={tmp_path / 'store'}", "progress=false", *ov])
    summary = run_pipeline(cfg, overrides=ov, console=Console(file=io.StringIO(), width=200))
    err = str(summary.error)
    assert summary.exit_code == 2 and err.startswith("2 configuration problem(s):"), err
    assert "eval.gate.min_score=90.0: must be in [0, 1]" in err and err.count(f"model.path='{gone}': not found") == 1, err


def test_a_line_over_the_byte_limit_is_refused_and_never_tokenized(tmp_path):
    """Fresh-user trial: a 20 MB eval line was refused by the loader, but the prompt-length check parsed and tokenized
    it anyway (32 s, 3.6 GB peak) and reported its token count. Now only the line limit names it."""
    from pipeline.errors import MAX_LINE_BYTES

    es = tmp_path / "eval.jsonl"
    es.write_text(_row(1) + "\n" + _row(2, prompt="word " * (MAX_LINE_BYTES // 5 + 10)) + "\n", encoding="utf-8")
    got = [str(p) for p in validate(compose([f"eval.eval_set={es}", "stages=[evaluate]"]), raise_on_error=False)]
    assert any(f"{es}:2: the line holds" in p and "over the limit" in p for p in got), got
    assert not any("tokens" in p for p in got), got  # its prompt was never measured (no token count of it)


def test_json_line_separators_inside_a_prompt_are_data(tmp_path):
    """JSON lets U+2028, U+2029, form feed and U+0085 stand unescaped in a string; they are not line ends of a JSONL file
    (recheck trial: str.splitlines() cut such an item in two, refused a valid eval set and misnumbered later lines)."""
    from pipeline.data.evalset import read_eval_set

    odd = "Where is my order?\u2028Line two\u2029\x0c\x85 end"
    es = tmp_path / "eval.jsonl"
    rows = [_row(1), json.dumps(json.loads(_row(2, prompt=odd)), ensure_ascii=False), "{not json"]
    es.write_text("\n".join(rows) + "\n", encoding="utf-8")
    problems = [str(p) for p in validate(compose([f"eval.eval_set={es}"]), raise_on_error=False) if p.field == "eval.eval_set"]
    assert len(problems) == 1 and f"{es}:3: invalid JSON" in problems[0], problems  # the bad line keeps its number
    es.write_text("\n".join(rows[:2]) + "\n", encoding="utf-8")
    assert [it.prompt for it in read_eval_set(es).items][1] == odd
