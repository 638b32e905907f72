"""The package ships the built engine, so a run whose gate would judge another model (``eval.candidate=simulated``)
is refused before any work (fresh-user trial: it released an engine the gate never judged, exit 0, no warning)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.config import compose
from pipeline.package.manifest import simulated_candidate_warning
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]


def _candidate_problems(*over: str) -> list[str]:
    return [str(p) for p in validate(compose(list(over)), raise_on_error=False) if p.field == "eval.candidate"]


def test_simulated_candidate_with_package_is_refused_naming_field_value_and_fix():
    (msg,) = _candidate_problems("quant=int4_awq", "eval.candidate=simulated")  # default stages end with package
    assert msg.startswith("eval.candidate='simulated': ") and "simulated-quantization model" in msg
    assert "Fix: eval.candidate=engine" in msg and "drop package from stages" in msg


@pytest.mark.parametrize(
    "over",
    [
        ["eval.candidate=simulated", "stages=[export,quantize,build,evaluate]"],  # nothing shipped: a CPU-only look
        ["eval.candidate=engine"],
        ["eval.candidate=auto"],
    ],
)
def test_candidate_allowed_when_nothing_ships_or_the_engine_is_gated(over):
    assert _candidate_problems("quant=int4_awq", *over) == []


def test_cli_refuses_it_with_exit_2_before_any_work(tmp_path, tiny_llama):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", f"model.path={tiny_llama}", "quant=int4_awq", "eval.candidate=simulated",
         "build.max_input_len=128", "build.max_seq_len=192", f"store_dir={tmp_path / 'store'}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "eval.candidate='simulated'" in out and "Fix: eval.candidate=engine" in out
    assert not (tmp_path / "store" / "export").exists()  # refused before the first stage


def test_auto_resolved_to_simulated_is_a_loud_manifest_warning():
    """``auto`` -> simulated (the documented TensorRT-LLM forward path on a host without a GPU) stays allowed, said loudly."""
    assert simulated_candidate_warning("engine") is None and simulated_candidate_warning(None) is None
    w = simulated_candidate_warning("simulated")
    assert w is not None and "not the engine this package ships" in w and "Fix:" in w
