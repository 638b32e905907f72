"""Benchmark results of a user's own model never overwrite the committed results of the repository's model, and the
Markdown names the model measured (fresh-user trial: ``model.path=<own> benchmark=default`` overwrote
``bench/results/default.{json,md}``, whose Markdown never named the model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.benchmark.report import markdown
from pipeline.benchmark.stage import results_stem
from pipeline.core.config import compose

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "over,stem",
    [
        (["benchmark=default"], "default"),  # the embedded default model: make bench's paths unchanged
        (["benchmark=default", f"model.path={ROOT / 'models' / 'support-llama'}"], "default"),  # the same folder, absolute
        (["benchmark=llama80m", "model.path=bench/models/llama80m", "model.name=llama80m"], "llama80m"),  # make bench
        (["benchmark=default", "model.path=/data/my-ckpt"], "my-ckpt-default"),
        (["benchmark=llama80m", "model.path=/data/my-ckpt", "model.name=a/b c"], "a-b-c-llama80m"),  # a plain file name
        (["benchmark=default", "model.path=/data/default"], "default-default"),  # a recheck: named as the preset, not ours
        (["benchmark=llama80m", "model.path=/data/x", "model.name=llama80m"], "llama80m-llama80m"),
    ],
)
def test_results_are_named_after_a_model_other_than_the_presets(over, stem):
    assert results_stem(compose(over)) == stem


def test_markdown_names_the_model_measured():
    doc = json.loads((ROOT / "bench" / "results" / "default.json").read_text(encoding="utf-8"))
    md = markdown(doc)
    digest = doc["model"]["artifacts"]["export"]["digest"][:12]
    assert f"Model `support-llama` (export digest `{digest}`, checkpoint `{doc['model']['hf_dir']}`)." in md
