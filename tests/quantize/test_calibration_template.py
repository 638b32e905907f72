"""Issue 24 item 11, the calibration half: a chat template that renders the eval prompts (checked at config and export
time) but raises on the calibration chats (here: on an assistant turn, which eval prompts never have) used to escape
quantize as a raw ``TokenizationError`` (exit 1).  Now it is an input error (exit 2) naming the calibration file and
line, the template's own error and the fix.  Real tokenizer, real files, the real pipeline for the exit code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.core.config import compose
from pipeline.data.calibration import load_calibration
from pipeline.errors import InputError

# renders user turns (all an eval prompt has), raises on an assistant turn (a calibration chat has one)
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{{ raise_exception('assistant turns are not supported') }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
CHATS = [
    [{"role": "user", "content": f"Where is my order ORD-{10000 + i}?"}, {"role": "assistant", "content": "It ships today."}]
    for i in range(8)
]


def _with_template(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    (dst / "chat_template.jinja").unlink(missing_ok=True)  # transformers reads the .jinja first (docs/export.md)
    return dst


def _chats(p: Path) -> Path:
    p.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS), encoding="utf-8")
    return p


def test_a_template_that_fails_on_calibration_chats_is_an_input_error_naming_the_line(tiny_llama, tmp_path):
    from transformers import AutoTokenizer

    ckpt = _with_template(tiny_llama, tmp_path / "ckpt")
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    cfg = compose([]).calibration
    cfg.calib_size, cfg.min_samples, cfg.apply_chat_template = 8, 2, True
    path = _chats(tmp_path / "chats.jsonl")
    with pytest.raises(InputError) as ei:  # old code: TokenizationError (a ValueError), exit 1
        load_calibration(cfg, tok, path)
    msg = str(ei.value)
    assert f"{path}:" in msg and "assistant turns are not supported" in msg and "TemplateError" in msg, msg
    assert "calibration.apply_chat_template=false" in msg and "Fix:" in msg, msg
    cfg.apply_chat_template = False  # the fix it names works: the same chats calibrate without the template
    assert len(load_calibration(cfg, tok, path).samples) == len(CHATS)


@pytest.mark.slow
def test_quantize_with_such_a_template_exits_2_after_export_passed(tiny_llama, tmp_path):
    from rich.console import Console

    from pipeline.runner import run_pipeline

    ckpt = _with_template(tiny_llama, tmp_path / "ckpt")
    cfg = compose(
        [
            f"model.path={ckpt}",
            "model.name=tiny-tpl",
            "quant=int4_rtn",
            "stages=[export,quantize]",
            f"store_dir={tmp_path / 'store'}",
            f"calibration.path={_chats(tmp_path / 'chats.jsonl')}",
            "calibration.apply_chat_template=true",
            "calibration.calib_size=8",
            "calibration.min_samples=2",
            "progress=false",
        ]
    )
    summary = run_pipeline(cfg, console=Console(quiet=True))
    assert summary.exit_code == 2, summary.error
    assert [r.stage for r in summary.stages if r.status in ("ran", "cached")] == ["export"], summary.stages
    assert "chats.jsonl:" in str(summary.error) and "assistant turns are not supported" in str(summary.error)
