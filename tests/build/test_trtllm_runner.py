"""The TensorRT-LLM engine runner (evaluate/benchmark ``engine`` runner of target=tensorrt_llm), contract-tested against a
TEST DOUBLE of the ``tensorrt_llm`` package (tests/fakes/tensorrt_llm: TensorRT-LLM 1.2.x signatures of
``ModelRunnerCpp.from_dir/generate`` and ``LLM/SamplingParams``). The double delegates greedy decoding to a transformers
checkpoint, so the runner's request/response handling (end_id, pad_id, stop words, output slicing, budgets, errors) is
checked token for token against the baseline runner. Its output is test data, never reported as an engine's.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tiny
import yaml

from pipeline.errors import PreflightError

FAKES = Path(__file__).parents[1] / "fakes"


@pytest.fixture()
def fake_trtllm(monkeypatch):
    for m in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.syspath_prepend(str(FAKES))
    import tensorrt_llm

    tensorrt_llm.CALLS.clear()
    yield tensorrt_llm
    # popped, not monkeypatch.delitem: monkeypatch's undo (after this teardown) would put the double back, and a
    # later test in the same worker then found "tensorrt_llm 0.0.0+test-double" installed
    for m in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[m]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny.make_checkpoint(tmp_path_factory.mktemp("ckpt"), "llama")


def _prepared(ckpt: Path, n: int = 6):
    from pipeline.data.evalset import EvalItem, prepare
    from pipeline.evaluate.runners import load_tokenizer

    tok = load_tokenizer(ckpt)
    items = [
        EvalItem(id=f"i{i}", slice="s", prompt=f"order {i} {'x' * i} status?", reference="", metric="exact_match", max_new_tokens=4 + i)
        for i in range(n)
    ]
    return tok, prepare(items, tok, max_input_len=64, max_seq_len=96, default_max_new_tokens=8, apply_chat_template=False)


def _engine_dir(tmp_path: Path, ckpt: Path) -> Path:
    build = tmp_path / "build"
    eng = build / "engine"
    eng.mkdir(parents=True)
    (eng / "config.json").write_text(
        json.dumps({"version": "1.2.1", "build_config": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 96}})
    )
    (eng / "rank0.engine").write_bytes(b"test data, not an engine")
    shutil.copytree(ckpt, eng / "test_double_hf")
    (build / "build_info.json").write_text(
        json.dumps(
            {
                "target": "tensorrt_llm",
                "limits": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 96},
                "runtime": {"max_attention_window_size": 32, "kv_cache_free_gpu_mem_fraction": 0.8},
            }
        )
    )
    return eng


def _baseline(ckpt, tok, prepared, stop_ids, pad):
    from pipeline.evaluate.runners import HFRunner, load_hf_model

    return HFRunner(load_hf_model(ckpt), tok, stop_ids=stop_ids, pad_id=pad, name="baseline").run(prepared, 4)


def test_engine_runner_matches_the_baseline_through_model_runner_cpp(tmp_path, ckpt, fake_trtllm):
    from pipeline.core.targets import get_target
    from pipeline.evaluate.runners import EngineAdapter

    tok, prepared = _prepared(ckpt)
    base = _baseline(ckpt, tok, prepared, [2, 5], 3)
    runner = get_target("tensorrt_llm").load_runner(_engine_dir(tmp_path, ckpt), pad_id=3)
    assert runner.backend == "tensorrt" and runner.max_batch_size == 4
    outs = EngineAdapter(runner, tok, stop_ids=[2, 5]).run(prepared, 16)
    assert {i: o.output_ids for i, o in outs.items()} == {i: o.output_ids for i, o in base.items()}
    assert {i: o.finish_reason for i, o in outs.items()} == {i: o.finish_reason for i, o in base.items()}
    calls = dict((n, kw) for n, kw in fake_trtllm.CALLS if n == "ModelRunnerCpp.from_dir")
    fd = calls["ModelRunnerCpp.from_dir"]
    assert fd["max_attention_window_size"] == [32] and fd["kv_cache_free_gpu_memory_fraction"] == 0.8 and fd["max_beam_width"] == 1
    gens = [kw for n, kw in fake_trtllm.CALLS if n == "ModelRunnerCpp.generate"]
    assert gens and all(g["end_id"] == 2 and g["pad_id"] == 3 and g["n"] <= 4 for g in gens)
    assert all(g["stop_words_list"] == [[[5]]] * g["n"] for g in gens)  # the other stop ids as one-token stop words
    runner.close()


def test_generation_logits_and_errors(tmp_path, ckpt, fake_trtllm):
    from pipeline.build.targets.tensorrt_llm.runner import load_runner
    from pipeline.core.targets.base import GenerationRequest

    runner = load_runner(_engine_dir(tmp_path, ckpt), generation_logits=True)
    reqs = [
        GenerationRequest(input_ids=[1, 7, 9], max_new_tokens=3, stop_token_ids=[2], request_id="a", ignore_eos=True),
        GenerationRequest(input_ids=list(range(4, 70)), max_new_tokens=3, stop_token_ids=[2], request_id="long"),
    ]
    a, long = runner.generate(reqs)
    assert len(a.output_ids) == 3 and a.finish_reason == "length"  # ignore_eos: exactly max_new_tokens
    assert runner.last_logits["a"].shape[0] == 3
    assert long.finish_reason == "error" and "max_input_len=64" in long.error


def test_llm_api_runner_for_the_pytorch_backend(tmp_path, ckpt, fake_trtllm):
    from pipeline.build.targets.tensorrt_llm.runner import load_runner
    from pipeline.evaluate.runners import EngineAdapter

    tok, prepared = _prepared(ckpt)
    base = _baseline(ckpt, tok, prepared, [2], 3)
    eng = tmp_path / "engine"
    shutil.copytree(ckpt, eng / "hf")
    (eng / "llm_api_options.yaml").write_text(
        yaml.safe_dump(
            {
                "max_batch_size": 4,
                "max_num_tokens": 256,
                "max_seq_len": 96,
                "max_input_len": 64,
                "kv_cache_config": {"free_gpu_memory_fraction": 0.9},
            }
        )
    )
    runner = load_runner(eng, pad_id=3)
    assert runner.backend == "pytorch"
    outs = EngineAdapter(runner, tok, stop_ids=[2]).run(prepared, 4)
    assert {i: o.output_ids for i, o in outs.items()} == {i: o.output_ids for i, o in base.items()}
    llm = dict((n, kw) for n, kw in fake_trtllm.CALLS)["LLM"]
    assert llm["model"] == str(eng / "hf") and llm["max_seq_len"] == 96
    runner.close()


def test_with_tensorrt_llm_present_default_evaluate_uses_the_engine(tmp_path, ckpt, fake_trtllm):
    """candidate=auto picks the engine (no exit 4) when tensorrt_llm is importable and the build has an engine."""
    from pipeline.core.config import compose
    from pipeline.evaluate.inputs import resolve_runners

    eng = _engine_dir(tmp_path, ckpt)
    art = SimpleNamespace(path=eng.parent, result={"headline": {"target": "tensorrt_llm"}})
    cfg = compose(["target=tensorrt_llm", "quant=int4_awq"])
    runners, cand, notes = resolve_runners(cfg, art)
    assert cand == "engine" and "engine" in runners, notes


def test_without_tensorrt_llm_the_engine_runner_is_a_preflight_error_with_the_fix(tmp_path, ckpt, monkeypatch):
    from pipeline.build.targets.tensorrt_llm import versions
    from pipeline.core.targets import get_target

    monkeypatch.setattr(versions, "installed_version", lambda: None)
    with pytest.raises(PreflightError) as e:
        get_target("tensorrt_llm").load_runner(_engine_dir(tmp_path, ckpt))
    assert e.value.exit_code == 4 and "pip install 'tensorrt-llm==1.2.1'" in str(e.value) and "eval.candidate=simulated" in str(e.value)


@pytest.mark.parametrize("backend", ["tensorrt", "pytorch"])
def test_teacher_forced_logits_match_transformers(tmp_path, ckpt, fake_trtllm, backend):
    """The gate's fidelity metrics read runner.teacher_forced_logits(prompt, continuation): rows = positions predicting
    each continuation token. Checked against transformers on the same weights (through the double)."""
    import numpy as np
    import torch

    from pipeline.build.targets.tensorrt_llm.runner import load_runner
    from pipeline.evaluate.runners import load_hf_model

    if backend == "tensorrt":
        eng = _engine_dir(tmp_path, ckpt)
        with pytest.raises(NotImplementedError, match="build.gather_context_logits=true"):
            load_runner(eng).teacher_forced_logits([1, 5, 9], [4, 7])
        cfg = json.loads((eng / "config.json").read_text())
        cfg["build_config"]["gather_context_logits"] = True
        (eng / "config.json").write_text(json.dumps(cfg))
    else:
        eng = tmp_path / "engine"
        shutil.copytree(ckpt, eng / "hf")
        (eng / "llm_api_options.yaml").write_text(yaml.safe_dump({"max_batch_size": 4, "max_seq_len": 96, "max_input_len": 64}))
    got = load_runner(eng).teacher_forced_logits([1, 5, 9], [4, 7, 11])
    with torch.inference_mode():
        ref = load_hf_model(ckpt)(torch.tensor([[1, 5, 9, 4, 7]])).logits[0, 2:5].float().numpy()
    assert got.shape == ref.shape == (3, ref.shape[1]) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_streaming_reports_each_token_as_its_step_returns(tmp_path, ckpt, fake_trtllm):
    """With on_token (benchmark), the engine path streams: tokens arrive step by step, in order, ids == non-streaming."""
    from pipeline.build.targets.tensorrt_llm.runner import load_runner
    from pipeline.core.targets.base import GenerationRequest

    runner = load_runner(_engine_dir(tmp_path, ckpt))
    reqs = [
        GenerationRequest(input_ids=[1, 7, 9], max_new_tokens=6, stop_token_ids=[2], request_id="a", ignore_eos=True),
        GenerationRequest(input_ids=[1, 8], max_new_tokens=6, stop_token_ids=[2], request_id="b", ignore_eos=True),
    ]
    seen: list[tuple[str, int, float]] = []
    streamed = runner.generate(reqs, on_token=lambda rid, tok, t: seen.append((rid, tok, t)))
    plain = runner.generate(reqs)
    assert [r.output_ids for r in streamed] == [r.output_ids for r in plain]
    assert [t for rid, t, _ in seen if rid == "a"] == streamed[0].output_ids
    steps = [kw["k"] for n, kw in fake_trtllm.CALLS if n == "ModelRunnerCpp.generate.stream_step"]
    assert steps == list(range(1, 7))
    ta = streamed[0].token_times_s
    assert len(ta) == 6 and ta == sorted(ta) and runner.streams_tokens
