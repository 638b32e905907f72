"""Issue 24 cases 10 and 11: bad inputs that ended in exit 1 with a raw exception (or in a wall of per-field errors)
now get one message naming the field or file, the value and the fix (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.config import ConfigError, compose
from pipeline.data.evalset import load_eval_set
from pipeline.errors import InputError
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"id": "a-1", "prompt": "Where is my order?", "reference": "x", "metric": "exact_match", "slice": "s"}


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=str(cwd), env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("value", ["${oops}", "${model.name}"])
def test_bad_or_cyclic_interpolation_is_exit_2_naming_the_field(value, tmp_path):
    r = _cli([f"model.name={value}", "stages=[export]", f"store_dir={tmp_path / 'store'}", "progress=false"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]  # old code: exit 1, Hydra's bare "Interpolation key 'oops' not found"
    assert f"model.name={value}: its ${{...}} interpolation cannot be resolved" in r.stderr and "Fix:" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not (tmp_path / "store").exists()


def test_over_long_model_name_is_refused_at_config_time(tiny_llama):
    with pytest.raises(ConfigError) as ei:
        validate(compose([f"model.path={tiny_llama}", "model.name=" + "a" * 300]))
    msg = str(ei.value)  # old code: OSError "File name too long" from the package stage, exit 1
    assert "model.name" in msg and "300 bytes" in msg and "Fix: pass a shorter model.name" in msg, msg


def _write(p: Path, lines: list[str]) -> Path:
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_lone_surrogate_in_an_eval_line_names_file_line_and_field(tmp_path):
    bad = json.dumps({**GOOD, "id": "a-2", "prompt": "late \ud800 order"})  # json.dumps writes the \ud800 escape
    p = _write(tmp_path / "e.jsonl", [json.dumps(GOOD), bad])
    with pytest.raises(InputError) as ei:  # old code: TypeError "TextInputSequence must be str" in a runner, exit 1
        load_eval_set(p)
    assert f"{p}:2: field 'prompt' contains a lone UTF-16 surrogate" in str(ei.value) and "Fix:" in str(ei.value)


def test_lm_eval_task_yaml_without_local_data_gets_one_message_naming_the_key(tmp_path):
    """A task YAML is read as an eval set now (tests/evaluate/test_eval_foreign_formats.py); one whose documents are not a local
    JSON Lines file gets one line naming the key and the fix, in a .yaml file or not (old code: 6+ lines of
    "invalid JSON ... one JSON object per line")."""
    task = "task: support\ndataset_path: json\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: exact_match\n"
    for name in ("task.yaml", "task.jsonl"):
        p = tmp_path / name
        p.write_text(task, encoding="utf-8")
        with pytest.raises(InputError) as ei:
            load_eval_set(p)
        msg = str(ei.value)
        assert "lm-evaluation-harness task" in msg and "dataset_kwargs=" in msg and "pipeline serve --openai" in msg, msg
        assert msg.count("\n") == 0


def test_question_answer_jsonl_is_mapped_not_a_wall_of_field_errors(tmp_path):
    from pipeline.data.evalset import read_eval_set

    p = _write(tmp_path / "qa.jsonl", [json.dumps({"question": f"q{i}?", "answer": f"a{i}"}) for i in range(50)])
    es = read_eval_set(p)  # old code: 150 per-field errors, no hint; then a refusal naming the mapping
    assert [(i.id, i.prompt, i.reference, i.metric, i.slice) for i in es.items[:2]] == [
        ("qa-0001", "q0?", "a0", "exact_match", "qa"),
        ("qa-0002", "q1?", "a1", "exact_match", "qa"),
    ]
    assert es.format["mapping"]["prompt"] == "question" and es.format["mapping"]["reference"] == "answer"
    assert load_eval_set(_write(tmp_path / "ok.jsonl", [json.dumps(GOOD)]))[0].prompt == GOOD["prompt"]


@pytest.mark.parametrize(
    "template, kind",
    [
        ("{{ raise_exception('Conversation roles must alternate') }}", "TemplateError: Conversation roles must alternate"),
        ("{% for m in messages %}{{ m.content ", "TemplateSyntaxError"),
        ("{{ messages.__class__.__mro__ }}", "SecurityError"),
    ],
)
def test_a_chat_template_that_fails_is_an_input_error_naming_the_item_and_the_fix(tiny_llama, tmp_path, template, kind):
    """Old code: jinja2's TemplateError / TemplateSyntaxError / SecurityError escaped from evaluate (exit 1)."""
    import shutil

    from pipeline.data.evalset import prepare
    from pipeline.evaluate.runners import load_tokenizer

    d = tmp_path / "tok"
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_llama / f).is_file():
            shutil.copy(tiny_llama / f, d / f)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    items = load_eval_set(_write(tmp_path / "e.jsonl", [json.dumps(GOOD)]))
    with pytest.raises(InputError) as ei:
        prepare(items, load_tokenizer(d), max_input_len=64, max_seq_len=128, default_max_new_tokens=8)
    msg = str(ei.value)
    assert "eval item 'a-1' (eval set line 1)" in msg and kind in msg and "model.apply_chat_template=false" in msg, msg


@pytest.mark.parametrize(
    "override, field, needle",
    [
        ("benchmark.request_rates=[inf]", "benchmark.request_rates", "finite number"),  # old: "cannot hash non-finite float"
        ("benchmark.request_rates=[nan]", "benchmark.request_rates", "finite number"),
        ("benchmark.concurrency=[1,100000]", "benchmark.concurrency", "one client thread per request"),  # old: can't start new thread
    ],
)
def test_benchmark_settings_that_crashed_mid_run_are_refused_at_config_time(override, field, needle):
    with pytest.raises(ConfigError) as ei:
        validate(compose([override]))
    msg = str(ei.value)
    assert field in msg and needle in msg and "Fix:" in msg, msg


def test_unwritable_benchmark_results_dir_is_refused_before_measuring(tmp_path):
    import dataclasses

    from pipeline.benchmark.stage import _check_results_dir

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    b = compose([]).benchmark
    with pytest.raises(InputError) as ei:  # old code: FileNotFoundError / NotADirectoryError after the whole run
        _check_results_dir(dataclasses.replace(b, results_dir=str(blocker / "results")))
    assert "benchmark.results_dir=" in str(ei.value) and "Fix:" in str(ei.value)
    with pytest.raises(InputError, match="benchmark.name='a/b'"):
        _check_results_dir(dataclasses.replace(b, name="a/b", results_dir=str(tmp_path / "ok")))
    _check_results_dir(dataclasses.replace(b, results_dir=str(tmp_path / "ok")))  # a writable folder passes
    assert (tmp_path / "ok").is_dir() and not list((tmp_path / "ok").iterdir())
