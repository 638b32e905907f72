"""The quant state's self-check compares like with like and blames the right party.

* another export artifact (digest recorded in the state vs the given artifact's manifest) is the user's input: exit 2;
* the right export artifact whose restored model misses the probe on the calibration's kind of device is a pipeline
  fault: exit 1 (SelfCheckError), never exit 2 (the H200's offload run of 2026-12-04 blamed the export artifact);
* a CUDA calibration restored on the CPU is not compared on logits (other kernels), only by digest.
Real ModelOpt calibration (int8 weight-only) of a tiny Llama through the real export writer, real files tampered.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from pipeline.core.config import compose
from pipeline.errors import EXIT_FAILED, InputError, SelfCheckError

CALIB = ["calibration.calib_size=16", "calibration.min_samples=4", "calibration.calib_max_seq_length=48", "calibration.batch_size=8"]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, export_dir, repo_root):
    from pipeline.quantize.run import quantize

    exp = tmp_path_factory.mktemp("exp") / "export"
    shutil.copytree(export_dir, exp)
    (exp / "manifest.json").write_text(json.dumps({"output_digest": "a" * 64}))  # as the store writes it
    out = tmp_path_factory.mktemp("q")
    quantize(compose([*CALIB, "quant=int8_wo"]), exp, Path(repo_root) / "evaluation/data/support_calib_v2.jsonl", out)
    return exp, out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_the_state_records_its_export_and_refuses_another_one_as_input(calibrated, tmp_path):
    from pipeline.core.quant_state import load_simulated_model

    exp, out = calibrated
    assert json.loads((out / "quant_state.json").read_text())["export_digest"] == "a" * 64
    other = _copy(exp, tmp_path / "other")
    (other / "manifest.json").write_text(json.dumps({"output_digest": "b" * 64}))
    with pytest.raises(InputError, match=r"made from the export artifact with digest aaaa.*Fix: pass the export artifact"):
        load_simulated_model(out, other)
    load_simulated_model(out, exp)  # its own export: restored, probe reproduced


def test_a_restored_model_that_misses_the_probe_is_a_pipeline_fault(calibrated, tmp_path):
    from pipeline.core.quant_state import load_simulated_model

    exp, out = calibrated
    bad = _copy(out, tmp_path / "bad")
    t = load_file(str(bad / "quant_state.safetensors"))
    name = next(k for k in t if k.endswith("weight_quantizer._amax"))
    t[name] = t[name] * 4  # what was saved is not what was calibrated
    save_file(t, str(bad / "quant_state.safetensors"), metadata={"schema": "pipeline.quant_state/v1"})
    with pytest.raises(SelfCheckError, match="self-check failed.*same kind of device") as e:
        load_simulated_model(bad, exp)
    assert e.value.exit_code == EXIT_FAILED and not isinstance(e.value, InputError)


def test_a_cuda_calibration_restored_on_the_cpu_is_not_compared_on_logits(calibrated, tmp_path, caplog):
    from pipeline.core.quant_state import load_simulated_model

    exp, out = calibrated
    moved = _copy(out, tmp_path / "cuda")
    doc = json.loads((moved / "quant_state.json").read_text())
    t = load_file(str(moved / "quant_state.safetensors"))
    t["__probe__.logits"] = t["__probe__.logits"] + 0.05  # what other kernels (a GPU's bf16) give
    save_file(t, str(moved / "quant_state.safetensors"), metadata={"schema": "pipeline.quant_state/v1"})
    with pytest.raises(SelfCheckError):
        load_simulated_model(moved, exp)  # on the CPU it came from, the shifted probe is a miss
    doc["calib_device"] = "cuda"
    (moved / "quant_state.json").write_text(json.dumps(doc))
    with caplog.at_level("INFO", logger="pipeline.quantize"):
        load_simulated_model(moved, exp, device="cpu")
    assert any("probe not compared: calibrated on cuda, restored on cpu" in r.getMessage() for r in caplog.records)
