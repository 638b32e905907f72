"""Issue 28 M-4: redaction by structure, never of a value the run uses.

Before: any value holding ``sk-`` / ``hf_`` / ``ghp_`` / ``nvapi-`` followed by 20+ alphanumerics was rewritten in
the config itself, even inside a word, so ``model.path=.../task-finetunedsupportllama2024`` was not found and
``store_dir=.../task-nightlybuildsstore2024`` wrote into a folder named ``ta***redacted***``; a password in a URL
was recorded verbatim.  Each test drives the real CLI (export stage, tiny real checkpoint) or the real redaction.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from test_hardening import grep_tree, run_cli

from pipeline.core.store import REDACTED, redact, redact_text

TOKEN = "hf_" + "Qk7" * 10  # token-shaped (mixed case, digits), never a real one
PASSWORD = "pa55wordXyz"
IMAGE = f"https://deploy:{PASSWORD}@registry.example.com/triton/llm:24.05"


def test_word_that_contains_a_token_prefix_is_kept_and_tokens_and_url_passwords_are_masked():
    for ordinary in (
        "/data/task-finetunedsupportllama2024",
        "/data/task-nightlybuildsstore2024",
        "risk-assessmentmodelversiontwo2024",
        "/m/Mask-FinetunedSupportLlama2024",  # mixed case, but 'sk-' is inside the word 'Mask'
        "sk-learnexperimentsfolder2024",  # a prefix and 20+ characters, but one case only: not random
    ):
        assert redact_text(ordinary) == ordinary, ordinary
    assert redact_text(f"model {TOKEN} here") == f"model {REDACTED} here"
    assert redact_text(f"/store/{TOKEN}/x") == f"/store/{REDACTED}/x"
    assert redact_text(IMAGE) == f"https://{REDACTED}@registry.example.com/triton/llm:24.05"
    assert redact_text("https://registry.example.com/a@b") == "https://registry.example.com/a@b"  # '@' in the path
    doc = {"serving_image": IMAGE, "store_dir": "/d/task-nightlybuildsstore2024"}
    assert redact(doc) == {"serving_image": redact_text(IMAGE), "store_dir": "/d/task-nightlybuildsstore2024"}
    assert doc["serving_image"] == IMAGE  # the input is never changed


def test_paths_holding_a_token_prefix_are_used_as_given_and_url_password_never_recorded(tiny_llama, tmp_path):
    model = tmp_path / "task-finetunedsupportllama2024"
    shutil.copytree(tiny_llama, model)
    store = tmp_path / "task-nightlybuildsstore2024"
    code, out, summary = run_cli(
        [f"model.path={model}", f"store_dir={store}", "stages=[export]", f"package.serving_image={IMAGE}"], tmp_path, "run"
    )
    assert code == 0, out[-3000:]
    assert summary is not None and summary["stages"][0]["status"] == "ran"
    assert Path(summary["stages"][0]["path"]).is_relative_to(store)  # the real store, not 'ta***redacted***'
    assert any((store / "export").iterdir())
    assert not [p for p in tmp_path.rglob("*") if "redacted" in p.name]
    assert summary["model"]["name"] == "task-finetunedsupportllama2024"
    assert summary["model"]["name_source"] == "checkpoint folder"
    assert grep_tree(tmp_path, PASSWORD) == []  # summary, .hydra/*.yaml, pipeline.log, manifests
    masked = f"https://{REDACTED}@registry.example.com"
    assert masked in (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text()
    assert masked in json.dumps(summary)


def test_two_token_shaped_store_names_stay_two_stores(tiny_llama, tmp_path):
    """A token-shaped store name is still masked in the records, but the run writes to the real folder: two such
    stores never collapse into one."""
    stores = [tmp_path / TOKEN, tmp_path / ("hf_" + "Zz9" * 10)]
    for i, store in enumerate(stores):
        code, out, summary = run_cli([f"model.path={tiny_llama}", f"store_dir={store}", "stages=[export]"], tmp_path, f"r{i}")
        assert code == 0, out[-3000:]
        assert any((store / "export").iterdir())
        assert "secret-looking value" in out  # the user is told the records mask it
        assert TOKEN not in (tmp_path / f"r{i}" / "summary.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("hf_")) == sorted(s.name for s in stores)
