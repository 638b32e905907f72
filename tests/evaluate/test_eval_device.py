"""``eval.device`` (auto | cpu | cuda | cuda:N), ``eval.reference_dtype=auto`` and ``eval.batch_size=auto`` (issue 34).

On a GPU host the baseline and simulated runners run on CUDA in the checkpoint's 16-bit dtype; on the CPU nothing
changes: the same report numbers and the same evaluate key as before these fields (float32 reference, batch 16).
No GPU here: the CUDA paths are checked where they need none (validation, the refusal, the resolved key), never by
mocking CUDA results.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from pipeline.core.config import compose
from pipeline.core.config.common import key_fields
from pipeline.core.stage import get_stage
from pipeline.core.store import Artifact
from pipeline.errors import EXIT_INPUT
from pipeline.runner import compute_key, run_pipeline
from pipeline.validation import validate

_INPUTS = {d: Artifact(d, f"k-{d}", Path("/nonexistent"), {}) for d in ("export", "quantize", "build")}


def _key(*overrides: str):
    return compute_key(get_stage("evaluate"), compose(list(overrides)), _INPUTS, {})


@pytest.mark.parametrize(
    "override,ok",
    [
        ("eval.device=auto", True),
        ("eval.device=cpu", True),
        ("eval.device=cuda", True),
        ("eval.device=cuda:3", True),
        ("eval.device=gpu", False),
        ("eval.device=cuda:x", False),
        ("eval.batch_size=auto", True),
        ("eval.batch_size=many", False),
    ],
)
def test_device_and_batch_are_validated_naming_the_field_and_the_fix(override, ok):
    field = override.split("=")[0]
    problems = [p for p in validate(compose([override]), raise_on_error=False) if p.field == field]
    assert not problems if ok else problems and problems[0].fix, [str(p) for p in problems]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_cuda_on_a_host_without_one_is_exit_2_before_any_work(tmp_path, tiny_llama):
    store = tmp_path / "store"
    overrides = [f"model.path={tiny_llama}", "stages=[evaluate]", "eval.device=cuda", "eval.runners=[baseline,simulated]"]
    cfg = compose([f"store_dir={store}", "progress=false", *overrides])
    summary = run_pipeline(cfg, overrides=overrides, console=Console(file=io.StringIO(), width=200))
    assert summary.exit_code == EXIT_INPUT
    assert "eval.device='cuda'" in summary.error and "Fix: eval.device=auto" in summary.error
    assert not any(s.status == "ran" for s in summary.stages)
    assert not (store / "export").exists()  # nothing was exported


@pytest.mark.skipif(torch.cuda.is_available(), reason="the key of a CPU run")
def test_a_cpu_run_keeps_the_key_it_had_before_auto(tiny_llama):
    """The default (``reference_dtype=auto``, ``device=auto``) resolves to a float32 reference on the CPU, and its key
    document is the one of the old default (``reference_dtype=float32``, no device field): existing artifacts are reused."""
    cfg = compose([f"model.path={tiny_llama}"])
    assert (cfg.eval.reference_dtype, cfg.eval.device, cfg.eval.batch_size) == ("auto", "auto", "auto")
    key, doc = _key(f"model.path={tiny_llama}")
    old_default = compose([f"model.path={tiny_llama}", "eval.reference_dtype=float32"])
    assert doc["config"] == {"eval": key_fields(old_default.eval)}  # what the runner hashed before eval.key_config
    assert doc["config"]["eval"]["reference_dtype"] == "float32" and "device" not in doc["config"]["eval"]
    assert (
        key == _key(f"model.path={tiny_llama}", "eval.device=cpu")[0] == _key(f"model.path={tiny_llama}", "eval.reference_dtype=float32")[0]
    )


def test_the_key_holds_the_resolved_cuda_kind_and_dtype(tiny_llama, tmp_path):
    """``eval.device=cuda`` keys the kind and the dtype ``auto`` stands for there (no GPU needed to compute it):
    bfloat16 for a float32 checkpoint, the checkpoint's own 16-bit dtype otherwise; an explicit dtype is keyed as set."""
    _, doc = _key(f"model.path={tiny_llama}", "eval.device=cuda:1")
    assert doc["config"]["eval"]["device"] == "cuda" and doc["config"]["eval"]["reference_dtype"] == "bfloat16"
    assert _key(f"model.path={tiny_llama}", "eval.device=cuda")[0] == _key(f"model.path={tiny_llama}", "eval.device=cuda:1")[0]
    assert _key(f"model.path={tiny_llama}", "eval.device=cuda")[0] != _key(f"model.path={tiny_llama}", "eval.device=cpu")[0]
    fp16 = tmp_path / "fp16"
    fp16.mkdir()
    (fp16 / "config.json").write_text(json.dumps({**json.loads((tiny_llama / "config.json").read_text()), "dtype": "float16"}))
    assert _key(f"model.path={fp16}", "eval.device=cuda")[1]["config"]["eval"]["reference_dtype"] == "float16"
    explicit = _key(f"model.path={tiny_llama}", "eval.device=cuda", "eval.reference_dtype=float32")[1]["config"]["eval"]
    assert explicit["reference_dtype"] == "float32" and explicit["device"] == "cuda"


def test_reference_dtype_auto_is_float32_on_the_cpu_and_16_bit_on_cuda(tmp_path):
    from pipeline.evaluate.runners import choose_batch, reference_dtype

    for stored, on_cuda in (("float32", "bfloat16"), ("bfloat16", "bfloat16"), ("float16", "float16")):
        (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": stored}))
        assert reference_dtype(tmp_path, "auto", "cpu") == "float32"
        assert reference_dtype(tmp_path, "auto", "cuda:0") == on_cuda
        assert reference_dtype(tmp_path, "checkpoint", "cuda:0") == stored
        assert reference_dtype(tmp_path, "float32", "cuda:0") == "float32"  # an explicit value is honoured
    assert choose_batch("auto", "cpu", None, 100, 720, "float32")[0] == 16  # the batch before auto
    assert choose_batch(5, "cuda:0", None, 100, 720, "bfloat16") == (5, "eval.batch_size=5")  # an integer as given


def _eval_set(path: Path) -> Path:
    prompts = ["Where is my order ORD-12345?", "Cancel order ORD-99871.", "Refund 129.50 dollars.", "My parcel is late.", "Hi."]
    rows = [{"id": f"q{i}", "prompt": p, "reference": "ORD-1", "metric": "exact_match", "slice": "s"} for i, p in enumerate(prompts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _numbers(rep: dict) -> dict:
    """The report's measured numbers (every runner's scores and finish reasons, the comparison, the fidelity figures)."""
    runners = {r: {k: v for k, v in s.items() if k not in ("seconds", "items_per_s", "latency_s")} for r, s in rep["runners"].items()}
    fid = {k: v for k, v in (rep["fidelity"] or {}).items() if k != "seconds"}
    return {"runners": runners, "comparison": rep["comparison"], "fidelity": fid, "gate": rep["gate"]["verdict"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="compares two CPU runs")
def test_eval_device_cpu_gives_the_numbers_of_the_default_run(tmp_path, tiny_llama):
    """A real export -> quantize -> evaluate (baseline + simulated) run with the defaults, then again with
    ``eval.device=cpu`` (same key on this host: forced to run): identical outputs and report numbers."""
    store = tmp_path / "store"
    common = [
        f"model.path={tiny_llama}",
        "model.dtype=float32",
        "quant=int8_wo",
        "calibration.calib_size=16",
        "calibration.min_samples=8",
        f"eval.eval_set={_eval_set(tmp_path / 'e.jsonl')}",
        "eval.runners=[baseline,simulated]",
        "eval.max_new_tokens=6",
        "eval.fidelity_heldout=0",
        "build.max_input_len=96",
        "build.max_seq_len=128",
        "eval.gate.mode=exploratory",
        "eval.gate.max_kld=100",
        "eval.gate.min_top1=0",
        "stages=[evaluate]",
    ]
    reports, outputs, measured = [], [], []
    for extra in ([], ["eval.device=cpu", "force=true"]):
        cfg = compose([f"store_dir={store}", "progress=false", *common, *extra])
        summary = run_pipeline(cfg, overrides=[*common, *extra], console=Console(file=io.StringIO(), width=200))
        assert summary.exit_code == 0, summary.error
        ev = next(s for s in summary.stages if s.stage == "evaluate")
        assert ev.status == "ran"
        reports.append(json.loads((Path(ev.path) / "eval_report.json").read_text()))
        measured.append(json.loads((Path(ev.path) / "manifest.json").read_text())["measurements"])
        outputs.append(
            [
                {k: v for k, v in json.loads(x).items() if k != "latency_s"}
                for x in (Path(ev.path) / "outputs.jsonl").read_text().splitlines()
            ]
        )
    default, cpu = reports
    assert default["device"] == cpu["device"] == "cpu"
    assert default["reference"]["dtype"] == "float32" and default["reference"]["requested"] == "auto"
    assert {r: s["batch_size"] for r, s in default["runners"].items()} == {"baseline": 16, "simulated": 16}
    assert all(s["items_per_s"] > 0 for s in measured[0]["runners"].values())  # items/s: the manifest's measurements
    assert _numbers(default) == _numbers(cpu)
    assert outputs[0] == outputs[1]
