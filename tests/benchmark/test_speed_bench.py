"""Benchmark pieces of issue 14: the deterministic benchmark shapes, the builder_int4 reference mode, the per-engine
roofline and the per-benchmark target ratios. No timed assertions (speed belongs in ``make bench``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pipeline.bench import shapes
from pipeline.benchmark.core import TARGETS, BenchInputs, ratios, run_benchmark
from pipeline.core.config import compose
from pipeline.core.contracts.export import ModelInfo

ROOT = Path(__file__).resolve().parents[2]


def test_llama80m_shape_is_the_issue_shape_with_80m_parameters():
    c = shapes.SHAPES["llama80m"]
    assert (
        c["num_hidden_layers"],
        c["hidden_size"],
        c["intermediate_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["vocab_size"],
    ) == (12, 768, 2048, 12, 4, 3072)
    assert 79e6 < shapes.parameter_count("llama80m") < 81e6


def test_shape_checkpoint_is_deterministic_and_loads(tmp_path, monkeypatch):
    import transformers as tf

    if not (shapes.TOKENIZER_SOURCE / "tokenizer.json").is_file():
        pytest.skip("models/support-llama has not landed yet")
    small = dict(
        shapes.SHAPES["llama80m"], num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
    )
    monkeypatch.setitem(shapes.SHAPES, "tiny_test", small)
    a = shapes.make_shape("tiny_test", tmp_path / "a")
    b = shapes.make_shape("tiny_test", tmp_path / "b")
    digest = [hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest() for p in (a, b)]
    assert digest[0] == digest[1]
    assert not (tmp_path / "a.partial").exists()
    model = tf.AutoModelForCausalLM.from_pretrained(str(a))
    assert sum(p.numel() for p in model.parameters()) == shapes.parameter_count("tiny_test")
    assert tf.AutoTokenizer.from_pretrained(str(a)).vocab_size <= small["vocab_size"]
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert shapes.make_shape("tiny_test", a) == a and (a / "model.safetensors").stat().st_mtime_ns == mtime  # reused
    other = shapes.make_shape("tiny_test", tmp_path / "c", seed=7)
    assert hashlib.sha256((other / "model.safetensors").read_bytes()).hexdigest() != digest[0]


def _summary(key: str, tpot: float | None = None, thr: float | None = None, frac: list[float] | None = None) -> dict:
    spread = {}
    if tpot is not None:
        spread["time_per_output_token.avg"] = {"mean": tpot}
    if thr is not None:
        spread["output_token_throughput.avg"] = {"mean": thr}
    return {"key": key, "spread": spread, "roofline_fraction": frac or []}


def test_target_ratios_and_judged_subset():
    summ = [
        _summary("engine/concurrency=1", tpot=6.0, thr=160, frac=[0.3, 0.5]),
        _summary("builder_int4/concurrency=1", tpot=5.0),
        _summary("engine/concurrency=8", tpot=12.0, thr=500),
        _summary("triton/concurrency=8", thr=400),
        _summary("triton/concurrency=1", tpot=6.3),
    ]
    r = ratios(summ, [], judged=["engine_vs_builder_int4_tpot_c1", "engine_roofline_fraction_c1", "triton_vs_engine_throughput_c8"])
    assert r["engine_vs_builder_int4_tpot_c1"]["value"] == pytest.approx(1.2) and r["engine_vs_builder_int4_tpot_c1"]["met"] is False
    assert r["engine_roofline_fraction_c1"]["value"] == pytest.approx(0.4) and r["engine_roofline_fraction_c1"]["met"] is True
    assert r["triton_vs_engine_throughput_c8"]["value"] == pytest.approx(0.8) and r["triton_vs_engine_throughput_c8"]["met"] is False
    # measured but not a target of this benchmark: reported, not judged
    assert r["triton_overhead_tpot_c1"]["value"] == pytest.approx(1.05)
    assert r["triton_overhead_tpot_c1"]["met"] is None and r["triton_overhead_tpot_c1"]["judged"] is False
    # decode-phase batching gain: (8 / 12 ms) / (1 / 6 ms) = 4.0, reported next to the throughput ratio (500 / 160)
    assert r["engine_decode_rate_c8_over_c1"]["value"] == pytest.approx(4.0) and r["engine_decode_rate_c8_over_c1"]["judged"] is False
    assert r["engine_throughput_c8_over_c1"]["value"] == pytest.approx(500 / 160)
    assert set(r) == set(TARGETS)


def test_builder_int4_reference_mode_runs_with_its_own_roofline(tiny_llama, tmp_path):
    from pipeline.core.targets import get_target

    cfg = compose(
        [
            "target=onnxruntime_genai",
            "quant=none",
            f"model.path={tiny_llama}",
            "build.max_input_len=96",
            "build.max_seq_len=128",
            "build.max_batch_size=4",
            "benchmark=smoke",
            "benchmark.modes=[engine,builder_int4]",
            "benchmark.dataset=synthetic",
            "benchmark.input_len.mean=16",
            "benchmark.input_len.min=16",
            "benchmark.input_len.max=16",
            "benchmark.num_requests=2",
            "benchmark.concurrency=[1]",
            "benchmark.targets=[engine_vs_builder_int4_tpot_c1,failed_requests]",
        ]
    )
    (tmp_path / "b").mkdir()
    get_target("onnxruntime_genai").build(cfg, tiny_llama, tmp_path / "b")
    inp = BenchInputs(
        hf_dir=tiny_llama,
        model_info=ModelInfo.from_json({"eos_token_ids": [2]}),
        engine_dir=tmp_path / "b" / "engine",
        corpus=ROOT / "evaluation" / "data" / "support_calib_v2.jsonl",
        max_input_len=96,
        max_seq_len=128,
        max_batch_size=4,
    )
    doc = run_benchmark(cfg.benchmark, inp)
    keys = {s["key"] for s in doc["summary"]}
    assert keys == {"engine/concurrency=1", "builder_int4/concurrency=1"}
    assert doc["ratios"]["failed_requests"]["value"] == 0
    assert doc["ratios"]["engine_vs_builder_int4_tpot_c1"]["value"] > 0
    per = doc["roofline"]["per_mode"]
    # fp32 engine vs the builder's int4 engine of the same checkpoint: the int4 graph reads fewer bytes per step
    assert 0 < per["builder_int4"]["weight_bytes_per_step"] < per["engine"]["weight_bytes_per_step"]
    ref = next(r for r in doc["runs"] if r["mode"] == "builder_int4")
    assert ref["roofline"]["fraction"] > 0 and ref["metrics"]["requests"]["completed"] == 2
    from pipeline.benchmark.report import markdown

    md = markdown(doc)
    assert "| `builder_int4` |" in md and "(not a target here)" in md
    # a fraction above the bandwidth bound (tiny weights stay in the CPU caches) is said to be no roofline result
    import copy

    for frac, said in ((0.5, False), (1.5, True)):
        d = copy.deepcopy(doc)
        for r in d["runs"]:
            if r["roofline"]:
                r["roofline"]["fraction"] = frac
        assert ("is not a roofline result" in markdown(d)) is said
