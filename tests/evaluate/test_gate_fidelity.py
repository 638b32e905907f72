"""Fidelity metrics (pipeline/evaluate/fidelity.py) against hand computations, the teacher-forced logits of
the real runners against each other, and the fidelity thresholds of the gate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.core.config.eval import GateConfig
from pipeline.evaluate import fidelity as F
from pipeline.evaluate import gate as G


def test_kld_top1_and_nll_match_hand_computation():
    p = np.log(np.array([[0.7, 0.2, 0.1], [0.5, 0.25, 0.25]]))
    q = np.log(np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]))
    st = F.position_stats(p + 3.0, q - 1.0, [0, 1])  # logits: shifts do not matter
    want = [
        0.7 * math.log(0.7 / 0.6) + 0.2 * math.log(0.2 / 0.3),
        0.5 * math.log(0.5 / 0.2) + 0.25 * math.log(0.25 / 0.5) + 0.25 * math.log(0.25 / 0.3),
    ]
    assert st["kld"] == pytest.approx(want, abs=1e-12)
    assert st["same_top"].tolist() == [True, False]
    assert st["nll_base"] == pytest.approx([-math.log(0.7), -math.log(0.25)])
    assert st["nll_cand"] == pytest.approx([-math.log(0.6), -math.log(0.5)])


def test_summary_like_llama_cpp():
    kld = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    s = F.summarize(kld, np.array([1, 1, 1, 0, 1], bool), np.zeros(5), np.full(5, 0.5))
    assert s["positions"] == 5 and s["kld"]["mean"] == pytest.approx(0.2) and s["kld"]["max"] == 0.4
    assert s["kld"]["se"] == pytest.approx(np.std(kld, ddof=1) / math.sqrt(5)) and s["kld"]["median"] == pytest.approx(0.2)
    assert s["top1"] == pytest.approx(0.8) and s["ln_ppl_ratio"] == pytest.approx(0.5)
    assert s["ppl_cand"] / s["ppl_base"] == pytest.approx(math.exp(0.5))
    assert set(s["kld"]) >= {"mean", "se", "median", "p90", "p95", "p99", "p99_9", "max"}


def test_identical_models_have_zero_kld_and_full_agreement_per_slice():
    rng = np.random.default_rng(0)
    seqs = [F.TFSequence("a", "x", [1, 2], [3, 4]), F.TFSequence("b", "y", [1], [5, 6, 7])]
    logits = [rng.normal(size=(2, 11)), rng.normal(size=(3, 11))]
    out = F.compare(seqs, logits, [x.copy() for x in logits])
    assert out["overall"]["positions"] == 5 and out["overall"]["kld"]["max"] == pytest.approx(0, abs=1e-12)
    assert out["overall"]["top1"] == 1.0 and set(out["slices"]) == {"x", "y"}


def test_candidate_padded_vocab_is_cut_and_mismatch_raises():
    b = np.zeros((2, 5))
    F.position_stats(b, np.zeros((2, 8)), [0, 1])
    with pytest.raises(ValueError, match="shapes differ"):
        F.position_stats(b, np.zeros((3, 5)), [0, 1])


def test_gate_fails_on_fidelity_thresholds():
    base = np.ones(600)
    stats = {"overall": G.paired_stats(base, base, binary=True, agree=None, confidence=0.95, samples=200, seed=0)}
    fid = {"positions": 100, "kld": {"mean": 0.2}, "top1": 0.9}
    v = G.judge(GateConfig(), "int4_awq", stats, {"overall": 1.0}, fid)
    assert v["verdict"] == "fail" and "max_kld" in v["reason"] and "min_top1" in v["reason"]
    v = G.judge(GateConfig(max_kld=1.0, min_top1=0.5), "int4_awq", stats, {"overall": 1.0}, fid)
    assert v["verdict"] == "pass", v["reason"]


def test_a_fidelity_failure_of_a_rope_scaled_checkpoint_names_the_scaling():
    """Issue 36: an engine that ignores the checkpoint's RoPE scaling fails on fidelity; the report says so."""
    from pipeline.core.contracts.evaluate import EvalReport
    from pipeline.evaluate.report import rope_note
    from pipeline.facts.rope import normalise_rope

    base = np.ones(600)
    stats = {"overall": G.paired_stats(base, base, binary=True, agree=None, confidence=0.95, samples=200, seed=0)}
    fid = {"positions": 100, "kld": {"mean": 0.2}, "top1": 0.9}
    rope = normalise_rope({"rope_scaling": {"type": "linear", "factor": 4}})[1]
    failed = {"gate": G.judge(GateConfig(), "none", stats, {"overall": 1.0}, fid), "target": "onnxruntime_genai", "rope_scaling": rope}
    note = rope_note(EvalReport.from_json(failed))
    assert note and "rope_scaling type 'linear'" in note and "max_kld/min_top1 failed" in note and "onnxruntime_genai" in note
    assert rope_note(EvalReport.from_json({**failed, "rope_scaling": None})) is None
    passed = G.judge(GateConfig(max_kld=1.0, min_top1=0.5), "none", stats, {"overall": 1.0}, fid)
    assert rope_note(EvalReport.from_json({**failed, "gate": passed})) is None


def test_hf_teacher_forced_logits_equal_an_unpadded_forward(tiny_llama):
    """Batched, right-padded teacher forcing returns, for each sequence, the logits of its own unpadded forward."""
    import torch

    from pipeline.evaluate.runners import HFRunner, load_reference_model

    model = load_reference_model(tiny_llama, "float32")
    r = HFRunner(model, None, stop_ids=[2], pad_id=0, name="baseline")
    seqs = [F.TFSequence("a", "s", [1, 5, 6, 7, 8], [9, 10]), F.TFSequence("b", "s", [1, 11], [12, 13, 14])]
    got = r.teacher_forced_logits(seqs, batch_size=2)
    for s, g in zip(seqs, got):
        ids = torch.tensor([s.prompt + s.continuation[:-1]])
        with torch.inference_mode():
            ref = model(input_ids=ids).logits[0, len(s.prompt) - 1 :].numpy()
        assert g.shape == (len(s.continuation), model.config.vocab_size)
        np.testing.assert_allclose(g, ref, atol=1e-4)


def test_spilled_baseline_and_streamed_candidate_give_what_the_in_memory_comparison_gives(tmp_path):
    """The evaluate stage's path: the baseline's logits on disk, each candidate sequence compared as it arrives."""
    rng = np.random.default_rng(1)
    seqs = [F.TFSequence(str(i), "xy"[i % 2], [1], list(rng.integers(0, 13, size=i + 1))) for i in range(5)]
    seqs.append(F.TFSequence("empty", "x", [1], []))
    base = [rng.normal(size=(len(s.continuation), 13)).astype(np.float32) for s in seqs]
    cand = [b + rng.normal(scale=0.3, size=b.shape).astype(np.float32) for b in base]
    spill = F.SpilledLogits(tmp_path / "b.f32")
    for i in (3, 0, 5, 1, 4, 2):  # any order, as batches sorted by length come
        spill[i] = base[i]
    assert (tmp_path / "b.f32").stat().st_size == 4 * sum(b.size for b in base)
    cmp = F.StreamedComparison(seqs, spill)
    for i in range(len(seqs)):
        np.testing.assert_array_equal(spill[i], base[i])
        cmp[i] = cand[i]
    assert cmp.result(0, 4) == F.compare(seqs[:4], base[:4], cand[:4])
    assert cmp.result(4, 6) == F.compare(seqs[4:], base[4:], cand[4:])
    spill.close()
    assert not (tmp_path / "b.f32").exists()


def test_hf_teacher_forced_logits_fill_a_given_store_and_project_only_the_needed_positions(tiny_llama):
    import torch

    from pipeline.evaluate.runners import HFRunner, load_reference_model

    model = load_reference_model(tiny_llama, "float32")
    widths = []
    model.lm_head.register_forward_hook(lambda m, i, o: widths.append(o.shape[1]))
    r = HFRunner(model, None, stop_ids=[2], pad_id=0, name="baseline")
    seqs = [F.TFSequence("a", "s", [1, 5, 6, 7, 8, 3, 4], [9, 10]), F.TFSequence("b", "s", [1, 11, 4, 4, 4], [12, 13, 14])]
    store: dict[int, np.ndarray] = {}
    assert r.teacher_forced_logits(seqs, batch_size=2, into=store) is store and sorted(store) == [0, 1]
    assert widths == [8 - 4]  # the padded width is 8; from the shortest prompt's last position (4) on
    for i, s in enumerate(seqs):
        ids = torch.tensor([s.prompt + s.continuation[:-1]])
        with torch.inference_mode():
            ref = model(input_ids=ids).logits[0, len(s.prompt) - 1 :].numpy()
        np.testing.assert_allclose(store[i], ref, atol=1e-4)
