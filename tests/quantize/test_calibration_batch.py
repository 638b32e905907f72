"""The calibration batch chosen from free memory (``calibration.batch_size=auto``) and a calibration forward pass that
asks for no logits it does not read (issue "real checkpoints at real scale").

Real components: ModelOpt calibrating a tiny Llama (tests/tiny.py) through the quantize stage, the planner's memory
model, and compose-time validation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.core.config import compose
from pipeline.errors import InputError

CALIB = ["calibration.calib_size=16", "calibration.min_samples=4", "calibration.calib_max_seq_length=48"]


# --------------------------------------------------------------------------- the choice
def test_an_integer_batch_is_used_as_given():
    from pipeline.quantize.placement import choose_batch_size

    assert choose_batch_size(4, device="cpu", per_sample_bytes=10**12, free=1, n_samples=100) == (4, "calibration.batch_size=4")
    assert choose_batch_size("32", device="cuda:0", per_sample_bytes=1, free=1, n_samples=8)[0] == 32


def test_auto_fits_half_the_free_memory_and_stops_at_the_cpu_cap_and_the_sample_count():
    from pipeline.quantize.placement import ACTIVATION_FRACTION, AUTO_BATCH_MAX_CPU, choose_batch_size

    mb = 10**6
    b, why = choose_batch_size("auto", device="cpu", per_sample_bytes=100 * mb, free=1000 * mb, n_samples=512)
    assert b == int(ACTIVATION_FRACTION * 1000 // 100) == 5 and "auto: 5" in why and "1.0 GB free on cpu" in why
    assert choose_batch_size("auto", device="cpu", per_sample_bytes=mb, free=10**12, n_samples=512)[0] == AUTO_BATCH_MAX_CPU
    assert choose_batch_size("auto", device="cpu", per_sample_bytes=mb, free=10**12, n_samples=3)[0] == 3
    assert choose_batch_size("AUTO", device="cpu", per_sample_bytes=10**12, free=mb, n_samples=64)[0] == 1  # never 0
    # a GPU is not capped at the CPU's batch: the sample count and the memory bound it
    assert choose_batch_size("auto", device="cuda:0", per_sample_bytes=mb, free=10**12, n_samples=200)[0] == 200
    assert choose_batch_size("auto", device="cuda:0", per_sample_bytes=mb, free=10**12, n_samples=200, probe=lambda: 48) == (
        48,
        "calibration.batch_size=auto: 48 (ModelOpt's get_max_batch_size probe allow 48; 200 samples)",
    )


@pytest.mark.parametrize("bad", ["0", "-3", "many", "1.5", "true"])
def test_a_bad_batch_size_is_refused_at_compose_time_naming_the_field(bad):
    from pipeline.validation import validate

    problems = validate(compose([f"calibration.batch_size={bad}"]), raise_on_error=False)
    hit = [p for p in problems if p.field == "calibration.batch_size"]
    assert hit and "positive integer, or auto" in hit[0].fix, problems


def test_the_placement_refuses_what_validation_would(monkeypatch):
    from pipeline.quantize.placement import parse_batch_size

    assert parse_batch_size("auto") is None and parse_batch_size(7) == 7
    with pytest.raises(InputError, match=r"calibration\.batch_size=0 must be >= 1\. Fix: a positive integer, or auto"):
        parse_batch_size(0)


# --------------------------------------------------------------------------- the planner counts the batch
def test_the_planner_counts_the_batch_and_refuses_one_the_host_cannot_hold(tmp_path):
    import transformers as tf

    from pipeline.core.sizing import ACT_HIDDEN_ROWS, ACT_INTERMEDIATE_ROWS, stage_refusals
    from pipeline.planner import plan

    tf.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=4096,  # calib_max_seq_length=4096 passes the config checks plan() runs first
    ).save_pretrained(str(tmp_path))
    base = [f"model.path={tmp_path}", "quant=int4_awq", "target=onnxruntime_genai", "calibration.device=cpu"]
    base += ["calibration.calib_size=4096", "calibration.min_samples=1", "calibration.calib_max_seq_length=4096"]
    small = plan(compose([*base, "calibration.batch_size=1"])).stages.predicted["quantize"]
    big = plan(compose([*base, "calibration.batch_size=1024"])).stages.predicted["quantize"]
    per_sample = 4096 * (ACT_HIDDEN_ROWS * 4096 + ACT_INTERMEDIATE_ROWS * 14336) * 4  # float32 on the CPU
    assert big.host_bytes - small.host_bytes == 1023 * per_sample
    assert "calibration batch" in big.formula
    refusal = stage_refusals({"quantize": big}, ["quantize"], 24 * 10**9)
    assert refusal and "calibration.batch_size=auto" in refusal[0]
    auto = plan(compose([*base, "calibration.batch_size=auto"])).stages.predicted["quantize"]
    assert auto.host_bytes == small.host_bytes + 15 * per_sample  # auto counts the CPU's most, 16


# --------------------------------------------------------------------------- through the quantize stage


def _quantize(tmp_path_factory, export_dir, repo_root, name, extra):
    from pipeline.quantize.run import quantize

    out = tmp_path_factory.mktemp(name)
    res = quantize(compose([*CALIB, "quant=int4_awq", *extra]), export_dir, Path(repo_root) / "evaluation/data/support_calib_v2.jsonl", out)
    rep = json.loads((out / "quant_report.json").read_text())
    assert "batch_size_reason" not in rep["calibration"]  # it names the free memory: a measurement, not in the digest
    return out, {"calibration": {**rep["calibration"], "batch_size_reason": res["measurements"]["batch_size_reason"]}}


def _calib_stats(rep):
    return rep["calibration"]


def test_auto_is_recorded_and_equals_the_integer_it_chose(tmp_path_factory, export_dir, repo_root):
    auto, rep_a = _quantize(tmp_path_factory, export_dir, repo_root, "auto", ["calibration.batch_size=auto"])
    st = _calib_stats(rep_a)
    assert st["batch_size"] == 16 and st["batch_size_reason"].startswith("calibration.batch_size=auto: 16 (")  # tiny: the CPU cap
    fixed, rep_f = _quantize(tmp_path_factory, export_dir, repo_root, "fixed", ["calibration.batch_size=16"])
    assert _calib_stats(rep_f)["batch_size_reason"] == "calibration.batch_size=16"
    assert (auto / "quant_state.safetensors").read_bytes() == (fixed / "quant_state.safetensors").read_bytes()
    four, rep_4 = _quantize(tmp_path_factory, export_dir, repo_root, "four", ["calibration.batch_size=4"])
    assert _calib_stats(rep_4)["batches"] == 4  # 16 samples, 4 at a time: the batch is honoured
    assert (four / "quant_state.safetensors").read_bytes() != (fixed / "quant_state.safetensors").read_bytes()


def test_the_calibration_pass_computes_only_the_last_logits_and_the_statistics_do_not_change(export_dir, repo_root):
    """ModelOpt calibrates two copies of the tiny model, one through a loop that computes every position's logits and
    one through ours (``last_logits_only``); with the LM head unquantized, every quantizer's statistics match."""
    import modelopt.torch.quantization as mtq
    import transformers as tf

    from pipeline.core.modelio import load_causal_lm
    from pipeline.data.calibration import load_calibration
    from pipeline.quantize.modelopt_config import modelopt_config

    cfg = compose([*CALIB, "quant=int8_sq"])
    hf = export_dir / "hf" if (export_dir / "hf").is_dir() else export_dir
    tok = tf.AutoTokenizer.from_pretrained(str(hf))
    cset = load_calibration(cfg.calibration, tok, Path(repo_root) / "evaluation/data/support_calib_v2.jsonl")
    mcfg = modelopt_config(cfg.quant, {"lm_head": "default"})
    stats = []
    for last_only in (False, True):
        torch.manual_seed(0)
        model = load_causal_lm(hf, torch.float32, "cpu")
        shapes = []
        model.lm_head.register_forward_hook(lambda m, i, o, seen=shapes: seen.append(tuple(o.shape)))
        mtq.quantize(model, mcfg, cset.forward_loop(4, last_logits_only=last_only))
        assert shapes and all((s[1] == 1) == last_only for s in shapes), shapes
        stats.append({k: v.clone() for k, v in model.state_dict().items() if "amax" in k or "pre_quant_scale" in k})
    assert stats[0] and stats[0].keys() == stats[1].keys()
    for k in stats[0]:
        assert torch.equal(stats[0][k], stats[1][k]), k
