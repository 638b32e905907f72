"""Chat items fed to a checkpoint with no chat template are warned about where a user looks: the run's console, the
evaluate report (``eval_report.json`` / ``.md`` ``warnings``) and the calibration warnings (fresh-user trial: a
``messages`` item was flattened, roles dropped, and only model_info.json said ``chat_template: false``).  A tiny real
checkpoint, a three-item eval set through the evaluate stage."""

from __future__ import annotations

import json
from pathlib import Path

import tiny
from rich.console import Console

from pipeline.core.config import compose
from pipeline.data.calibration import load_calibration
from pipeline.runner import run_pipeline

SAID = "1 of 3 eval items (e.g. q3) are chat messages but the checkpoint has no chat template"


def _eval_set(p: Path) -> Path:
    item = {"slice": "s", "metric": "exact_match", "reference": "x", "max_new_tokens": 2}
    rows = [
        {"id": "q1", "prompt": "Where is my order?", **item},
        {"id": "q2", "prompt": "Cancel it.", **item},
        {"id": "q3", "messages": [{"role": "user", "content": "Refund please."}], **item},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _evaluate(ckpt: Path, tmp_path: Path, capsys) -> tuple[dict, str, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = compose(
        [
            f"model.path={ckpt}",
            "quant=none",
            "stages=[evaluate]",
            f"eval.eval_set={_eval_set(tmp_path / 'eval.jsonl')}",
            "eval.runners=[baseline]",
            "eval.fidelity=false",
            "eval.gate.mode=exploratory",
            f"store_dir={tmp_path / 'store'}",
            "progress=false",
        ]
    )
    capsys.readouterr()
    summary = run_pipeline(cfg, console=Console(file=None, force_terminal=False, width=400))
    assert summary.exit_code == 0, summary.error
    ev = Path(next(s for s in summary.stages if s.stage == "evaluate").path)
    out = capsys.readouterr()
    return json.loads((ev / "eval_report.json").read_text()), (ev / "eval_report.md").read_text(), out.out + out.err


def test_a_chat_item_without_a_chat_template_is_warned_in_the_console_and_the_report(tiny_llama, tmp_path, capsys, caplog):
    bare = tiny.without_chat_template(tiny_llama, tmp_path / "bare")
    caplog.set_level("WARNING")
    report, md, console = _evaluate(bare, tmp_path / "a", capsys)
    (w,) = report["warnings"]
    assert w.startswith(SAID) and "roles dropped" in w and "Fix: add a chat_template" in w and "as prompt" in w
    assert SAID in md
    assert SAID in console  # the evaluate summary the run prints
    assert any(SAID in r.getMessage() for r in caplog.records)  # the log line (stderr and pipeline.log)
    # the same run again: a cache hit of the evaluate stage printed no warning (only eval_report.json kept it)
    again, _, console = _evaluate(bare, tmp_path / "a", capsys)
    assert again["warnings"] == report["warnings"] and "evaluate  cache hit" in console, console[-3000:]
    assert f"warning: {SAID}" in " ".join(console.split()), console[-3000:]


def test_with_a_chat_template_nothing_is_warned(tiny_llama, tmp_path, capsys):
    report, md, console = _evaluate(tiny_llama, tmp_path, capsys)
    assert report["warnings"] == [] and "chat template" not in md and "no chat template" not in console


def test_calibration_chats_without_a_template_are_warned(tiny_llama, tmp_path):
    from transformers import AutoTokenizer

    p = tmp_path / "calib.jsonl"
    p.write_text('{"text": "plain text row"}\n{"messages": [{"role": "user", "content": "a chat row"}]}\n')
    cfg = compose(["calibration=support_v2"]).calibration
    cfg.calib_size, cfg.min_samples, cfg.min_tokens, cfg.apply_chat_template = 8, 1, 1, True
    bare = AutoTokenizer.from_pretrained(str(tiny.without_chat_template(tiny_llama, tmp_path / "bare")))
    (w,) = [w for w in load_calibration(cfg, bare, p).warnings if "chat template" in w]
    assert "1 of 2 calibration samples (e.g. " in w and "calib.jsonl:2" in w and "no chat template" in w
    assert not [w for w in load_calibration(cfg, AutoTokenizer.from_pretrained(str(tiny_llama)), p).warnings if "chat template" in w]
    cfg.apply_chat_template = False  # asked for: the rows are fed as text on purpose
    assert not [w for w in load_calibration(cfg, bare, p).warnings if "chat template" in w]
