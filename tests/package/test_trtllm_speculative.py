"""Speculative decoding, acceptance first: the package stage enables a draft model only when its acceptance rate, measured
on the business eval set (overall and per slice), reaches ``package.speculative.min_acceptance_rate``.

The measurement runs for real: the embedded default model (models/support-llama) generates greedily through the same
runner the evaluate stage uses, and ``draft_acceptance`` replays greedy draft-target speculative decoding with (a) the
same model as draft and (b) an unrelated random-weight draft with the same vocabulary. The package stage's decision then
runs for real on those numbers. The TensorRT-LLM engine files of the build artifact are test data (this machine has no
TensorRT-LLM); only their packaging is checked, never their output.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from pipeline.errors import GateFailed
from pipeline.package.trtllm_config import DRAFT_MODEL, decide_speculative, expected_tokens_per_step

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "support-llama"
EVAL_SET = ROOT / "evaluation" / "data" / "support_eval_v2.jsonl"
N_ITEMS = 24  # a slice of the eval set, spread over its slices: enough to separate ~1.0 from ~0.0 on 2 CPU cores


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Evaluate-stage measurements {'same': speculative section, 'random': ...} on the default model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.data.evalset import load_eval_set, prepare
    from pipeline.evaluate.draft import speculative_summary
    from pipeline.evaluate.runners import HFRunner, draft_acceptance, load_hf_model, load_tokenizer

    torch.set_num_threads(1)
    items = load_eval_set(EVAL_SET)
    by_slice: dict[str, list] = {}
    for it in items:
        by_slice.setdefault(it.slice, []).append(it)
    per = max(1, N_ITEMS // len(by_slice))
    items = [it for s in sorted(by_slice) for it in by_slice[s][:per]]
    tok = load_tokenizer(DEFAULT_MODEL)
    prepared = prepare(items, tok, max_input_len=256, max_seq_len=384, default_max_new_tokens=48)
    target = load_hf_model(DEFAULT_MODEL)
    outs = HFRunner(target, tok, stop_ids=[2], pad_id=3, name="baseline").run(prepared, 8)
    cfg = AutoConfig.from_pretrained(str(DEFAULT_MODEL))
    cfg.num_hidden_layers = 1
    torch.manual_seed(1234)
    rnd = AutoModelForCausalLM.from_config(cfg)  # unrelated random weights, same vocabulary
    rnd_dir = tmp_path_factory.mktemp("random_draft")
    rnd.save_pretrained(str(rnd_dir))

    class E:  # the eval config fields speculative_summary reads
        draft_tokens = 4

    res = {}
    for name, draft, path in (("same", target, DEFAULT_MODEL), ("random", rnd, rnd_dir)):
        E.draft_model_path = str(path)
        acc = draft_acceptance(draft, prepared, outs, k=4, pad_id=3, stop_ids=[2], batch_size=8)
        res[name] = speculative_summary(acc, prepared, E, "baseline")
    return res


def _gate(**kw):
    from pipeline.core.config.serving import SpeculativeGateConfig

    return SpeculativeGateConfig(**kw)


def test_acceptance_is_measured_for_real_same_model_high_random_draft_near_zero(measured):
    same, rnd = measured["same"], measured["random"]
    assert same["acceptance_rate"] >= 0.99 and rnd["acceptance_rate"] <= 0.05, (same["acceptance_rate"], rnd["acceptance_rate"])
    assert same["proposed"] > 100 and len(same["slices"]) >= 4
    assert same["mean_tokens_per_step"] > 3.0 and rnd["mean_tokens_per_step"] < 1.2


def test_decision_passes_same_model_and_refuses_random_draft(measured):
    ok = decide_speculative("draft_tokens_external", measured["same"], _gate(), draft_model_path=measured["same"]["draft_model"])
    assert ok.enabled and not ok.override and ok.acceptance_rate >= 0.99
    assert (
        ok.expected_tokens_per_step == pytest.approx(expected_tokens_per_step(ok.acceptance_rate, 4)) and ok.expected_tokens_per_step > 4.9
    )
    with pytest.raises(GateFailed) as e:
        decide_speculative("draft_tokens_external", measured["random"], _gate(), draft_model_path=measured["random"]["draft_model"])
    msg = str(e.value)
    assert "overall acceptance rate 0.0" in msg and "min_acceptance_rate=0.5" in msg and "allow_low_acceptance" in msg
    assert e.value.exit_code == 3
    over = decide_speculative(
        "draft_tokens_external", measured["random"], _gate(allow_low_acceptance=True), draft_model_path=measured["random"]["draft_model"]
    )
    assert over.override and "allow_low_acceptance=true" in over.reason


def test_unmeasured_mode_other_draft_and_low_slice_are_refused():
    with pytest.raises(GateFailed, match="was not measured"):
        decide_speculative("medusa", None, _gate())
    m = {"acceptance_rate": 0.9, "k": 4, "draft_model": "/a", "slices": {"x": {"acceptance_rate": 0.95}, "y": {"acceptance_rate": 0.2}}}
    with pytest.raises(GateFailed, match="slice acceptance below 0.5: y=0.200"):
        decide_speculative("draft_tokens_external", m, _gate(), draft_model_path="/a")
    with pytest.raises(GateFailed, match="measured with draft /a"):
        decide_speculative("draft_tokens_external", {**m, "slices": {}}, _gate(), draft_model_path="/b")
    with pytest.raises(GateFailed, match="measured with k=4 draft tokens"):
        decide_speculative("draft_tokens_external", {**m, "slices": {}}, _gate(), draft_model_path="/a", max_draft_len=8)
    assert expected_tokens_per_step(0.0, 4) == 1.0 and expected_tokens_per_step(1.0, 4) == 5.0


def _package_ctx(tmp_path: Path, spec_measured: dict, **pkg):
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.core.stage import StageContext
    from pipeline.core.store import Artifact

    draft = spec_measured["draft_model"]
    cfg = compose(
        [
            "stages=[package]",
            "target=tensorrt_llm",
            "quant=none",
            "model.name=support-llama",
            "build.speculative.mode=draft_tokens_external",
            "build.speculative.max_draft_len=4",
            f"build.speculative.draft_model_path={draft}",
            f"eval.draft_model_path={draft}",
        ]
        + [f"package.{k}={v}" for k, v in {"parity": "false", **pkg}.items()]
    )  # hand-made evaluate artifact: no answers to replay
    exp = tmp_path / "export"
    shutil.copytree(DEFAULT_MODEL, exp / "hf")
    (exp / "model_info.json").write_text(
        json.dumps({"eos_token_ids": [2], "pad_token_id": 3, "bos_token_id": 1, "architecture": "LlamaForCausalLM"})
    )
    build = tmp_path / "build"
    for d in ("engine", "draft_engine"):  # test data standing in for trtllm-build output; never run
        (build / d).mkdir(parents=True)
        (build / d / "config.json").write_text(json.dumps({"version": "1.2.1"}))
        (build / d / "rank0.engine").write_bytes(b"test data, not an engine")
    from pipeline.build.targets.tensorrt_llm.runtime import runtime_knobs

    bi = {
        "target": "tensorrt_llm",
        "backend": "tensorrt",
        "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 388, "max_beam_width": 1},
        "runtime": runtime_knobs(cfg),
        "versions": {"tensorrt_llm": "1.2.1", "tensorrt": "10.13.3.9"},
    }
    (build / "build_info.json").write_text(json.dumps(bi))
    ev = tmp_path / "evaluate"
    ev.mkdir()
    (ev / "eval_report.json").write_text(json.dumps({"speculative": spec_measured}))
    arts = {
        "export": Artifact("export", "e" * 64, exp, {"output_digest": "e" * 64, "result": {}}),
        "build": Artifact("build", "b" * 64, build, {"output_digest": "b" * 64, "result": {}}),
        "evaluate": Artifact(
            "evaluate", "v" * 64, ev, {"output_digest": "v" * 64, "result": {"gate": {"passed": True, "reason": "ok"}, "headline": {}}}
        ),
    }
    out = tmp_path / "out"
    out.mkdir()
    return StageContext(
        cfg=cfg,
        inputs=arts,
        external={},
        out=out,
        manifest={},
        console=Console(quiet=True),
        log=logging.getLogger("test"),
        show_progress=False,
    )


def test_package_stage_gates_a_draft_model_package_on_measured_acceptance(tmp_path, measured):
    from pipeline.core.stage import get_stage
    from pipeline.package.validate import parse_config

    stage = get_stage("package")
    ctx = _package_ctx(tmp_path / "same", measured["same"], archive="false")
    res = stage.run(ctx)
    man = json.loads((ctx.out / "release_manifest.json").read_text())
    sp = man["speculative"]
    assert sp["enabled"] and not sp["override"] and sp["mode"] == "draft_tokens_external" and sp["max_draft_len"] == sp["k"] == 4
    assert sp["acceptance_rate"] >= 0.99 and sp["expected_tokens_per_step"] > 4.9 and sp["measured_tokens_per_step"] > 3.0
    assert DRAFT_MODEL in res.models
    repo = ctx.out / "model_repository"
    d = parse_config(repo / DRAFT_MODEL / "config.pbtxt")
    assert d.name == DRAFT_MODEL and d.parameters["gpt_model_path"].string_value == f"/models/{DRAFT_MODEL}/1/engine"
    assert (repo / DRAFT_MODEL / "1" / "engine" / "rank0.engine").is_file()
    # the random-weight draft: refused (exit 3), nothing packaged
    ctx2 = _package_ctx(tmp_path / "random", measured["random"], archive="false")
    with pytest.raises(GateFailed, match="acceptance"):
        stage.run(ctx2)
    assert not (ctx2.out / "release_manifest.json").exists()
    # ... unless explicitly overridden, which the manifest records
    ctx3 = _package_ctx(tmp_path / "override", measured["random"], archive="false", **{"speculative.allow_low_acceptance": "true"})
    stage.run(ctx3)
    sp3 = json.loads((ctx3.out / "release_manifest.json").read_text())["speculative"]
    assert sp3["override"] and sp3["acceptance_rate"] <= 0.05 and sp3["expected_tokens_per_step"] < 1.1
