"""A chat template that cannot render the eval set's prompts is refused before any work (exit 2), with the item and
the fix.  Found by a fresh-user trial: a template referencing an undefined variable ran export, quantize and build,
then stopped in evaluate (the config-time length check rendered the prompts too, but dropped the failure)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tiny

from pipeline.core.config import compose
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]
BROKEN = "{% for m in messages %}{{ m['content'] }}{{ settings.suffix }}{% endfor %}"  # `settings` is undefined


def _broken_checkpoint(tmp_path: Path) -> Path:
    ckpt = tiny.make_checkpoint(tmp_path / "ckpt", "llama")
    tc = ckpt / "tokenizer_config.json"
    doc = json.loads(tc.read_text())
    doc["chat_template"] = BROKEN
    tc.write_text(json.dumps(doc))
    for f in ("chat_template.jinja", "chat_template.json"):
        (ckpt / f).unlink(missing_ok=True)
    return ckpt


def test_a_template_that_cannot_render_the_eval_prompts_is_a_config_problem(tmp_path):
    ckpt = _broken_checkpoint(tmp_path)
    got = {p.field: str(p) for p in validate(compose([f"model.path={ckpt}", "stages=[evaluate]"]), raise_on_error=False)}
    assert "model.apply_chat_template" in got, got
    msg = got["model.apply_chat_template"]
    assert "cannot render these messages" in msg and "'settings' is undefined" in msg and "model.apply_chat_template=false" in msg, msg
    off = validate(compose([f"model.path={ckpt}", "stages=[evaluate]", "model.apply_chat_template=false"]), raise_on_error=False)
    assert "model.apply_chat_template" not in {p.field for p in off}
    assert "model.apply_chat_template" not in {  # evaluate will not run: nothing renders the eval set
        p.field for p in validate(compose([f"model.path={ckpt}", "stages=[export]"]), raise_on_error=False)
    }


def test_the_run_stops_before_any_stage(tmp_path):
    ckpt = _broken_checkpoint(tmp_path)
    store = tmp_path / "store"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            f"model.path={ckpt}",
            "stages=[package]",
            f"store_dir={store}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
    assert "model.apply_chat_template" in r.stdout + r.stderr
    assert not store.exists() or not any(store.glob("*/*"))  # no stage ran
