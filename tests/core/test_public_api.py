"""The public Python surface (issue "one package per stage"): ``pipeline.compose``/``run``/``plan``, one typed reader
per stage artifact, ``register_metric``, ``register_target`` and ``LLMClient`` resolve from ``import pipeline``, lazily (no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pipeline


def test_every_public_name_resolves_to_its_defining_object():
    from pipeline.core.config import compose
    from pipeline.core.contracts.build import BuildArtifact
    from pipeline.data.metrics import register
    from pipeline.runner import run_pipeline
    from pipeline.serve.client import LLMClient
    from pipeline.validation import checked_plan, validate

    assert pipeline.compose is compose and pipeline.run is run_pipeline and pipeline.plan is checked_plan
    assert pipeline.validate is validate
    assert pipeline.BuildArtifact is BuildArtifact and pipeline.register_metric is register and pipeline.LLMClient is LLMClient
    for name in pipeline.__all__:
        assert getattr(pipeline, name) is not None, name
    assert {n.removesuffix("Artifact").lower() for n in pipeline.__all__ if n.endswith("Artifact")} == {
        "export",
        "quantize",
        "build",
        "eval",
        "package",
        "benchmark",
    }


def test_an_unknown_name_lists_the_public_ones():
    with pytest.raises(AttributeError, match="public names: .*compose"):
        pipeline.no_such_name  # noqa: B018


def test_import_pipeline_and_compose_import_no_torch():
    code = "import sys, pipeline; cfg = pipeline.compose([]); assert 'torch' not in sys.modules, 'torch'; print(cfg.stages)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip()


def test_subpackages_still_import_by_name():
    from pipeline import export, planner

    assert export.__name__ == "pipeline.export" and planner.__name__ == "pipeline.planner"
