"""What ``pipeline plan`` says must be what holds (fresh-user trial, report honesty): a plan that cannot be made is a
problem in the JSON a CI job reads, tensor parallelism on the CPU is refused, and each line names what it counts."""

from __future__ import annotations

import json

import pytest

from pipeline.core.config import compose
from pipeline.plan_cli import main as plan_main
from pipeline.planner import plan


def _no_gpu_here() -> None:
    if plan(compose(["model=llama31_8b", "target=tensorrt_llm"])).status != "unplanned":
        pytest.skip("a local GPU is visible: the plan is made for it")


def test_unplanned_target_is_a_problem_in_the_json_with_the_exit_code_of_the_text_form(capsys):
    """``--json model=llama31_8b target=tensorrt_llm`` with no GPU printed ``problems: []`` (the reason only in the
    plan's notes) while exiting 2: a CI job reading ``problems`` saw nothing wrong."""
    _no_gpu_here()
    over = ["model=llama31_8b", "target=tensorrt_llm"]
    code = plan_main(["--json", *over])
    doc = json.loads(capsys.readouterr().out)
    assert code == doc["exit_code"] == plan_main(over) == 2
    assert doc["plan"]["status"] == "unplanned"
    [p] = doc["problems"]
    assert p["field"] == "target.gpu" and "needs a GPU" in p["message"] and "target.gpu=h100_sxm" not in p["fix"]
    assert "h100_sxm" in p["fix"] and p["fix"].startswith("name one: target.gpu=<")
    err = capsys.readouterr().err
    assert err.startswith("error (exit 2): ") and "needs a GPU" in err  # the text form says it is an error too


def _cpu_plan(*over: str):
    p = plan(compose(["model=llama31_8b", *over]))
    if p.target.kind != "cpu":
        pytest.skip("target=auto plans for a GPU on this host")
    return p


@pytest.mark.parametrize("field", ["tp_size", "pp_size"])
def test_parallel_ranks_on_the_cpu_target_are_refused_with_the_fix(field, capsys):
    """``pipeline plan model=llama31_8b parallel.tp_size=2`` (target auto, no GPU) planned "tp=2 on host CPU": the CPU
    target runs on one device. The config checks leave a shapes-only preset with target=auto to TP geometry
    (tests/core/test_validate.py: ``plan --gpus`` plans each GPU); the plan, once it knows the device is this CPU,
    refuses it (exit 4), naming both ways out."""
    p = _cpu_plan(f"parallel.{field}=2")
    assert p.status == "refused"
    [r] = [r for r in p.refusals if f"parallel.{field}=2" in r]
    assert "one device" in r and f"parallel.{field}=1" in r and "target=tensorrt_llm target.gpu=" in r
    assert not any("parallel." in r for r in _cpu_plan().refusals)
    assert plan_main(["model=llama31_8b", f"parallel.{field}=2"]) == 4
    assert plan_main(["--gpus", "h100_sxm", "model=llama31_8b", f"parallel.{field}=2"]) == 0  # each GPU's plan is a GPU plan
    assert plan_main(["model=llama31_8b", "target=onnxruntime_genai", f"parallel.{field}=2"]) == 2  # a named CPU target: the check


def test_high_precision_line_names_everything_it_counts(monkeypatch, capsys):
    """ "high precision: 1.96 GiB (lm_head)" for Llama-3.1-8B int4: 1.96 GiB is lm_head and the embedding table (0.98 GiB
    each in bf16) plus the norms; the line named lm_head alone."""
    from pipeline.core.sizing import load_shape
    from pipeline.planner.weights import weight_bytes

    shape, _ = load_shape(compose(["model=llama31_8b"]))
    w = weight_bytes(shape, "int4_awq", hp_dtype="bfloat16", exclude=["lm_head"])
    table = 2 * shape.vocab_size * shape.hidden_size * 2  # lm_head + embedding, bf16
    assert table < w.high_precision_bytes < table * 1.01
    assert w.high_precision_modules == ["lm_head", "embedding", "norms"]
    assert weight_bytes(shape, "none", hp_dtype="bfloat16").high_precision_modules == []  # all of it: nothing to name
    monkeypatch.setenv("COLUMNS", "300")
    plan_main(["model=llama31_8b", "target.gpu=h100_sxm", "quant=int4_awq"])
    assert "high precision: 1.96 GiB (lm_head, embedding, norms)" in capsys.readouterr().out


def test_evaluate_on_gpu_fix_offers_a_dtype_only_when_it_halves_the_figure():
    """The note for a reference model too large for the GPU estimated it in bfloat16 and offered
    eval.reference_dtype=float16 as the fix: the same 2 bytes a parameter. A 16-bit dtype is offered for a float32
    estimate only, and it is the checkpoint's (the one evaluate loads on a GPU)."""
    over = ["model=llama31_70b", "target.gpu=h100_sxm", "quant=fp8", "parallel.tp_size=2"]

    def note(*more: str) -> str:
        [n] = [n for n in plan(compose([*over, *more])).notes if n.startswith("evaluate loads the reference model whole")]
        return n

    bf16 = note()
    assert "(P x 2 B, bfloat16)" in bf16 and "reference_dtype=" not in bf16 and "eval.device=cpu" in bf16
    fp32 = note("eval.reference_dtype=float32")
    assert "(P x 4 B, float32)" in fp32 and "eval.reference_dtype=bfloat16 (half of it)" in fp32


def test_cpu_quantize_figure_says_the_disk_offload_does_not_lower_it(tiny_llama):
    """On the CPU a model beyond the budget calibrates with its layers on disk, and the plan printed "on cpu, layers
    offloaded to disk: host 37.1 GiB" beside a warning that quantize needs 37.1 GiB: as if the offload should have
    handled it. It does not (pipeline/quantize/run.py: the exports restore the whole float32 model on the host), so the
    figure, and the warning that quotes it, say so."""
    base = [f"model.path={tiny_llama}", "quant=int4_awq", "calibration.device=cpu"]
    q = plan(compose([*base, "calibration.max_device_memory_gb=0.0001"])).stages.predicted["quantize"]
    assert q.offload == "disk" and "the offload does not lower this peak" in q.formula
    assert "whole float32 model on the host" in q.formula
    whole = plan(compose(base)).stages.predicted["quantize"]
    assert whole.offload == "none" and "offload" not in whole.formula


def test_a_refused_placement_says_what_does_not_fit_once():
    """The 70 B refusal on this CPU host read "... 245.4 GiB on disk, onloaded one layer at a time; the disk has 31.1 GiB
    free. GPU: none; host: 21.75 GiB available; disk of store_dir: 31.11 GiB free": the placement of a run that
    cannot happen, then each figure twice. Now: what exceeds what, and what does not fit where, each figure once."""
    from pipeline.core.sizing import calibration_placement

    GB = 10**9
    cpu = calibration_placement(100 * GB, None, 50 * GB, disk_free_bytes=30 * GB)
    assert cpu.refused and "onloaded" not in cpu.reason and cpu.reason.count("GiB free") == 2
    assert cpu.reason.endswith("and the 55.9 GiB beyond it do not fit the 27.9 GiB free on the disk of store_dir")
    gpu = calibration_placement(141 * GB, 150 * GB, 500 * GB, max_host_bytes=10 * GB, disk_free_bytes=5 * GB)
    assert gpu.refused and "onloaded" not in gpu.reason
    assert "of the 19.6 GiB beyond it, 9.3 GiB may wait in host memory and the 10.2 GiB left do not fit the 4.7 GiB free" in gpu.reason
    ok = calibration_placement(100 * GB, None, 50 * GB, disk_free_bytes=300 * GB)
    assert not ok.refused and ok.reason.endswith("55.9 GiB on disk, onloaded one layer at a time")


def test_the_70b_refusal_on_a_cpu_host_reads_once(monkeypatch):
    from pipeline.core.sizing import Room
    from pipeline.planner import stages

    room = Room(host_free=22 * 2**30, disk_free=31 * 2**30)
    monkeypatch.setattr(stages, "plan_room", lambda *a, **k: ("cpu", "cpu", room, []))
    monkeypatch.setattr(stages, "local_gpus", lambda: [])
    p = plan(compose(["model=llama31_70b", "quant=int4_awq"]))
    [r] = [r for r in p.refusals if r.startswith("quantize: nothing can hold the model")]
    assert "on disk, onloaded" not in r and r.count("31.0 GiB") == 1 and "available" not in r, r
    assert "beyond it do not fit the 31.0 GiB free on the disk of store_dir (GPU: none). Fix: " in r, r
