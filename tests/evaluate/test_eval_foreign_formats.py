"""Issue 24 case 10: foreign eval formats are accepted, not refused.  The same small task (12 intent items of the shipped
eval set) as our JSONL, as an lm-evaluation-harness task YAML over a local JSON Lines file, and as a question/answer
JSONL gives the same eval set and the same score through ``stages=[evaluate]`` with the embedded model (real
transformers baseline); the report says which mapping was used.  Every task key that would change the result and
is not implemented is refused with exit 2 naming the key and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.data.evalset import read_eval_set
from pipeline.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "evaluation" / "data" / "support_eval_v2.jsonl"
UNTIL, MAX_NEW = ["\n"], 16


def _docs() -> list[dict]:
    rows = [json.loads(line) for line in SHIPPED.read_text(encoding="utf-8").splitlines() if line.strip()]
    intent = [r for r in rows if r["slice"] == "intent_en"][:12]
    # the task's references in upper case: ignore_case (an lm-eval exact_match option) must be honoured to score
    return [{"question": r["prompt"], "answer": r["reference"].upper()} for r in intent]


def _ours(d: Path) -> Path:
    p = d / "ours.jsonl"
    lines = [
        {
            "id": f"intent-{n:04d}",
            "prompt": doc["question"],
            "reference": doc["answer"],
            "metric": "exact_match",
            "slice": "intent",
            "stop": UNTIL,
            "max_new_tokens": MAX_NEW,
            "metric_args": {"ignore_case": True},
        }
        for n, doc in enumerate(_docs(), start=1)
    ]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return p


def _qa(d: Path) -> Path:
    p = d / "intent.jsonl"  # slice and id prefix default to the file's stem
    extra = {"stop": UNTIL, "max_new_tokens": MAX_NEW, "metric_args": {"ignore_case": True}}
    p.write_text("".join(json.dumps({**doc, **extra}) + "\n" for doc in _docs()), encoding="utf-8")
    return p


def _task(d: Path, **changes) -> Path:
    (d / "docs.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in _docs()), encoding="utf-8")
    task = {
        "task": "intent",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": "docs.jsonl"}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{ question }}",
        "doc_to_target": "answer",
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True, "ignore_case": True}],
        "generation_kwargs": {"until": UNTIL, "max_gen_toks": MAX_NEW, "do_sample": False},
        "num_fewshot": 0,
        "metadata": {"version": 1.0},
    }
    for k, v in changes.items():
        if v is None:
            task.pop(k, None)
        else:
            task[k] = v
    p = d / "intent.yaml"
    p.write_text(yaml.safe_dump(task, allow_unicode=True), encoding="utf-8")
    return p


def _fields(items) -> list[tuple]:
    return [(i.id, i.prompt, i.reference, i.metric, i.slice, i.stop, i.max_new_tokens, i.metric_args) for i in items]


def test_the_three_forms_read_as_the_same_eval_set(tmp_path):
    ours, qa, task = read_eval_set(_ours(tmp_path)), read_eval_set(_qa(tmp_path)), read_eval_set(_task(tmp_path))
    assert len(ours.items) == 12 and _fields(ours.items) == _fields(qa.items) == _fields(task.items)
    assert qa.format["format"] == "question_answer_jsonl" and qa.format["mapping"]["prompt"] == "question"
    assert task.format["format"] == "lm_eval_task" and task.format["mapping"]["reference"] == "doc_to_target"
    assert task.format["metric"] == {"name": "exact_match", "ignore_case": True} and task.data_files == [tmp_path / "docs.jsonl"]


def test_template_text_is_data_and_the_sandbox_holds(tmp_path):
    """A document's text that looks like Jinja stays text; a template touching internals is refused (sandbox)."""
    p = _task(tmp_path)
    (tmp_path / "docs.jsonl").write_text(json.dumps({"question": "{{ 7 * 7 }} {% raw %}", "answer": "X"}) + "\n", encoding="utf-8")
    assert read_eval_set(p).items[0].prompt == "{{ 7 * 7 }} {% raw %}"
    p = _task(tmp_path, doc_to_text="{{ question.__class__.__mro__ }}")
    (tmp_path / "docs.jsonl").write_text(json.dumps({"question": "q", "answer": "X"}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"doc_to_text cannot be rendered for document 1: SecurityError"):
        read_eval_set(p)


def test_exact_match_options_are_honoured():
    from pipeline.data.evalset import EvalItem
    from pipeline.data.metrics import get_metric

    m = get_metric("exact_match")
    item = EvalItem(id="a", slice="s", metric="exact_match", reference="The answer: 42!")
    assert m.fn("the answer: 42!", item) == 0.0
    item.metric_args = {"ignore_case": True, "ignore_punctuation": True, "regexes_to_ignore": ["^the "]}
    assert m.fn("Answer 42", item) == 0.0  # HF evaluate's order: the regexes run before lower-casing ("The " stays)
    item.metric_args = {"ignore_case": True, "ignore_punctuation": True, "regexes_to_ignore": ["(?i)^the "]}
    assert m.fn("Answer 42", item) == 1.0
    item.metric_args = {"ignore_cases": True}
    assert "not exact_match options" in (m.check(item) or "")


REFUSED = [
    ({"process_results": "!function utils.process_results"}, "process_results", "!function"),
    ({"filter_list": [{"name": "take_first", "filter": [{"function": "take_first"}]}]}, "filter_list", "filters"),
    ({"process_results": None}, None, None),  # control: the base task is accepted
    ({"num_fewshot": 5}, "num_fewshot", "few-shot"),
    ({"output_type": "multiple_choice"}, "output_type", "generate_until"),
    ({"dataset_path": "gsm8k"}, "dataset_path", "local JSON Lines"),
    ({"metric_list": [{"metric": "bleu"}]}, "metric_list", "exact_match"),
    ({"metric_list": [{"metric": "exact_match", "ignore_whitespace": True}]}, "metric_list[0].ignore_whitespace", "option"),
    ({"generation_kwargs": {"until": ["\n"], "temperature": 0.7}}, "generation_kwargs.temperature", "greedy"),
    ({"generation_kwargs": {"until": ["\n"], "num_beams": 4}}, "generation_kwargs.num_beams", "generation option"),
    ({"test_split": "validation"}, "test_split", "not a split"),
    ({"frobnicate": 1}, "frobnicate", "not a task key"),
]


@pytest.mark.parametrize("changes, key, why", REFUSED, ids=[r[1] or "accepted" for r in REFUSED])
def test_each_unimplemented_key_is_refused_naming_it(tmp_path, changes, key, why):
    p = _task(tmp_path, **changes)
    text = p.read_text()
    if "!function" in str(changes):  # safe_dump quotes the tag; write it as lm-eval tasks do
        text = text.replace("'!function utils.process_results'", "!function utils.process_results")
        p.write_text(text)
    if key is None:
        assert len(read_eval_set(p).items) == 12
        return
    with pytest.raises(InputError) as ei:
        read_eval_set(p)
    msg = str(ei.value)
    assert f"{key}=" in msg and why in msg and "Fix:" in msg and "pipeline serve --openai" in msg, msg


def test_a_refused_key_exits_2_before_any_stage(tmp_path):
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.runner import run_pipeline

    p = _task(tmp_path, num_fewshot=3)
    cfg = compose([f"eval.eval_set={p}", "stages=[export,quantize,build,evaluate]", f"store_dir={tmp_path / 'store'}", "progress=false"])
    summary = run_pipeline(cfg, console=Console(quiet=True))
    assert summary.exit_code == 2 and "num_fewshot=3" in str(summary.error), summary.error
    assert not any(r.status == "ran" for r in summary.stages)


@pytest.mark.slow
def test_same_score_through_evaluate_for_all_three_forms(tmp_path):
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.runner import run_pipeline

    reports = {}
    for name, path in (("ours", _ours(tmp_path)), ("qa", _qa(tmp_path)), ("task", _task(tmp_path))):
        cfg = compose(
            [
                f"model.path={ROOT / 'models' / 'support-llama'}",
                "quant=none",
                "stages=[evaluate]",
                f"eval.eval_set={path}",
                "eval.runners=[baseline,simulated]",
                "eval.fidelity=false",
                "eval.gate.mode=exploratory",
                f"store_dir={tmp_path / 'store'}",
                "progress=false",
            ]
        )
        summary = run_pipeline(cfg, console=Console(quiet=True))
        assert summary.exit_code == 0, summary.error
        ev = next(s for s in summary.stages if s.stage == "evaluate")
        reports[name] = json.loads((Path(ev.path) / "eval_report.json").read_text())
    scores = {k: r["runners"]["baseline"]["score"] for k, r in reports.items()}
    assert scores["ours"] > 0.5 and scores["ours"] == scores["qa"] == scores["task"], scores  # ignore_case honoured
    assert reports["ours"]["eval_set"]["format"] == {"format": "jsonl"}
    assert reports["qa"]["eval_set"]["format"]["mapping"]["reference"] == "answer"
    assert reports["task"]["eval_set"]["format"]["task"] == "intent"
