"""Build stage, onnxruntime_genai target: real engines from tiny real checkpoints.

* fp32 parity: the engine's greedy tokens equal transformers' greedy tokens (llama, mistral, qwen2, phi3,
  and the default model when it exists);
* int4 AWQ: the engine deploys ModelOpt's quantized weights (not a fresh round-to-nearest) and its
  teacher-forced next-token choices agree with ModelOpt's simulated-quant model on >= 99 % of steps;
* limits in the runtime config, over-long prompts as per-request errors, continuous batching via og.Engine;
* target registry / auto resolution / config-time refusal of recipes the runtime cannot execute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.config import ConfigError, compose
from pipeline.core.targets import get_target, known_targets, resolve_target
from pipeline.core.targets.base import GenerationRequest
from pipeline.core.tokenization import encode_prompt
from pipeline.errors import InputError
from pipeline.quantize.resmooth import resmooth
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "evaluation" / "data" / "support_eval_v2.jsonl"


def _prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in EVAL.read_text(encoding="utf-8").splitlines() if line.strip()]
    step = max(1, len(rows) // n)  # spread over the slices
    return [r["prompt"] for r in rows[::step][:n]]


def _cfg(ckpt: Path, *extra: str):
    quant = [] if any(x.startswith("quant=") for x in extra) else ["quant=none"]
    return compose(
        [
            "target=onnxruntime_genai",
            *quant,
            f"model.path={ckpt}",
            "build.max_input_len=160",
            "build.max_seq_len=200",
            "build.max_batch_size=4",
            *extra,
        ]
    )


def _build(cfg, ckpt: Path, out: Path, **kw):
    (out / "q").mkdir(parents=True)
    (out / "q" / "hf").symlink_to(ckpt, target_is_directory=True)
    (out / "b").mkdir()
    return get_target("onnxruntime_genai").build(cfg, out / "q", out / "b", export_dir=out / "q", **kw)


def _hf_greedy(model, ids: list[int], n: int, eos: int) -> list[int]:
    import torch

    with torch.no_grad():
        g = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    out = g[0, len(ids) :].tolist()
    return out[: out.index(eos)] if eos in out else out


# ----------------------------------------------------------------------------- registry / config
def test_registry_unknown_target_lists_known():
    with pytest.raises(InputError) as e:
        get_target("vllm")
    for name in known_targets():
        assert name in str(e.value)
    assert set(known_targets()) == {"onnxruntime_genai", "tensorrt_llm"}


def test_auto_resolves_to_onnxruntime_genai_here_and_says_why(tiny_llama):
    name, reason = resolve_target(compose([f"model.path={tiny_llama}"]))
    assert name == "onnxruntime_genai"
    assert "tensorrt_llm is not installed" in reason or "no NVIDIA GPU" in reason


@pytest.mark.parametrize("recipe", ["int8_sq", "fp8", "w4a8_awq"])
def test_unexecutable_recipe_fails_at_config_time(tiny_llama, recipe):
    cfg = compose(
        ["target=onnxruntime_genai", f"quant={recipe}", f"model.path={tiny_llama}", "build.max_seq_len=200", "build.max_input_len=100"]
    )
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    msg = str(e.value)
    assert "quant.recipe" in msg and "onnxruntime_genai" in msg and "int4_awq" in msg  # names target + supported recipes


# ----------------------------------------------------------------------------- fp32 parity
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "phi3"])
def test_fp32_engine_greedy_equals_transformers(make_checkpoint, tmp_path, arch):
    import transformers as tf

    # Phi-3 mini with a short context: original_max_position_embeddings == max_position_embeddings selects the
    # builder's plain (non-LongRoPE) Phi-3 path, as for microsoft/Phi-3-mini-4k-instruct
    ckpt = make_checkpoint(arch, **({"original_max_position_embeddings": 256} if arch == "phi3" else {}))
    cfg = _cfg(ckpt)
    info = _build(cfg, ckpt, tmp_path)
    engine = tmp_path / "b" / "engine"
    gc = json.loads((engine / "genai_config.json").read_text())
    assert gc["search"]["max_length"] == 200  # build.max_seq_len in the runtime config
    assert info["limits"] == {"max_batch_size": 4, "max_input_len": 160, "max_seq_len": 200}
    assert info["target"] == "onnxruntime_genai" and info["precision"] == "fp32" and info["engine_bytes"] > 0
    assert (tmp_path / "b" / "build.log").stat().st_size > 0
    # onnxruntime-genai 0.18.0 wires Phi-3's LM head to layer 0's norm; the build repairs that edge
    assert bool(info["graph_fixes"]) == (arch == "phi3"), info["graph_fixes"]

    tok = tf.AutoTokenizer.from_pretrained(str(ckpt))
    model = tf.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    prompts = _prompts(4 if arch == "llama" else 3)
    reqs = [GenerationRequest(encode_prompt(tok, p), 12, [2], f"r{i}") for i, p in enumerate(prompts)]
    with get_target("onnxruntime_genai").load_runner(engine) as runner:
        assert runner.mode == "engine"  # continuous batching through og.Engine
        got = runner.generate(reqs)
        assert [r.request_id for r in got] == [r.request_id for r in reqs]
        for r, req in zip(got, reqs):
            assert r.finish_reason in ("eos", "length") and r.error is None
            assert r.output_ids == _hf_greedy(model, req.input_ids, 12, 2), f"{arch} {req.request_id}"
            assert len(r.token_times_s) == len(r.output_ids)
        if arch == "llama":  # over-long prompt: per-request error, the others still run, nothing truncated
            long = GenerationRequest(list(range(4, 4 + 170)), 5, [2], "long")
            mixed = runner.generate([reqs[0], long])
            assert mixed[0].output_ids == got[0].output_ids
            assert mixed[1].finish_reason == "error" and "max_input_len" in mixed[1].error and mixed[1].output_ids == []
            # streaming callback and extra stop ids
            seen: list[int] = []
            first = got[0].output_ids
            if len(first) > 3:
                stop = first[2]
                res = runner.generate([GenerationRequest(reqs[0].input_ids, 12, [2, stop], "s")], on_token=lambda rid, t, s: seen.append(t))
                assert res[0].output_ids == first[: first.index(stop)] and res[0].finish_reason == "eos"
                assert seen == res[0].output_ids


def test_default_model_fp32_parity(tmp_path):
    import transformers as tf

    ckpt = ROOT / "models" / "support-llama"
    if not (ckpt / "config.json").is_file():
        pytest.skip("models/support-llama has not landed yet")
    cfg = compose(["target=onnxruntime_genai", "quant=none", f"model.path={ckpt}", "build=cpu_default"])
    hf_max = json.loads((ckpt / "config.json").read_text()).get("max_position_embeddings", 384)
    if cfg.build.max_seq_len > hf_max:
        cfg = compose(
            [
                "target=onnxruntime_genai",
                "quant=none",
                f"model.path={ckpt}",
                f"build.max_seq_len={hf_max}",
                f"build.max_input_len={hf_max // 2}",
            ]
        )
    _build(cfg, ckpt, tmp_path)
    tok = tf.AutoTokenizer.from_pretrained(str(ckpt))
    model = tf.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype="float32").eval()
    eos = tok.eos_token_id
    reqs = [GenerationRequest(encode_prompt(tok, p), 16, [eos], f"r{i}") for i, p in enumerate(_prompts(6))]
    with get_target("onnxruntime_genai").load_runner(tmp_path / "b" / "engine") as runner:
        for r, req in zip(runner.generate(reqs), reqs):
            assert r.output_ids == _hf_greedy(model, req.input_ids, 16, eos)


# ----------------------------------------------------------------------------- int4 AWQ: same weights
def test_int4_awq_engine_agrees_with_modelopt_simulated_model(tiny_llama, tmp_path):
    import modelopt.torch.quantization as mtq
    import torch
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(str(tiny_llama))
    model = tf.AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval()
    calib = [json.loads(x)["text"] for x in (ROOT / "evaluation/data/support_calib_v2.jsonl").read_text().splitlines()[:4]]

    def loop(m):
        for t in calib:
            m(**tok(t, return_tensors="pt", truncation=True, max_length=64))

    with torch.no_grad():
        model = mtq.quantize(model, mtq.INT4_AWQ_CFG, loop).eval()
    assert resmooth(model).shared_groups == 4  # what the quantize stage does by default (quant.resmooth)
    cfg = _cfg(tiny_llama, "quant=int4_awq", "target.accuracy_level=1")  # fp32 activations: ModelOpt's exact numerics
    info = _build(cfg, tiny_llama, tmp_path, model=model)
    qw = info["quantized_weights"]
    assert info["precision"] == "int4" and qw["bits"] == 4 and qw["group_size"] == 128 and qw["quantized_linears"] == 14
    # every AWQ pre_quant_scale is deployed: the shared q/k/v and gate/up scales folded into the two RMSNorms of each
    # layer, down_proj's into up_proj's rows, o_proj's (not constant per KV group) applied as an ONNX Mul
    pq = qw["pre_quant_scale"]
    assert pq["norm"] == 4 and pq["up_rows"] == 2 and pq["onnx_mul_inserted"] == pq["onnx_mul"] and pq["onnx_mul"] + pq["v_rows"] == 2, pq

    agree = total = 0
    with get_target("onnxruntime_genai").load_runner(tmp_path / "b" / "engine") as runner:
        for p in _prompts(8):
            ids = encode_prompt(tok, p)
            with torch.no_grad():
                seq = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, min_new_tokens=16, pad_token_id=2)[0].tolist()
                ref = model(torch.tensor([seq])).logits[0, len(ids) - 1 : len(seq) - 1].argmax(-1).tolist()
            eng = runner.next_token_logits(ids, seq[len(ids) :])
            agree += sum(a == b for a, b in zip(eng, ref))
            total += len(ref)
    rate = agree / total
    # the A/B tool of docs/quantize.md runs on this engine (timing itself is not asserted; speed lives in benchmarks)
    from pipeline.benchmark.ab import main as ab_main
    from pipeline.benchmark.ab import measure

    got = measure([str(tmp_path / "b" / "engine")], rounds=2, tokens=4, prompt_len=8)[str(tmp_path / "b" / "engine")]
    assert len(got["per_round_ms"]) == 2 and got["median_ms"] > 0
    assert ab_main([str(tmp_path / "nope"), "--rounds", "1"]) == 2
    print(f"int4_awq teacher-forced next-token agreement engine vs ModelOpt simulated: {agree}/{total} = {rate:.4f}")
    assert total >= 120 and rate >= 0.99


# ----------------------------------------------------------------------------- the stage through the CLI
def test_build_stage_cli_auto_builds_ort_and_tensorrt_llm_stops_in_preflight(tiny_llama, tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="dumb", COLUMNS="250", TOKENIZERS_PARALLELISM="false")
    store = tmp_path / "store"
    base = [
        sys.executable,
        "-m",
        "pipeline",
        f"model.path={tiny_llama}",
        "stages=[build]",
        f"store_dir={store}",
        "progress=false",
        "build.max_seq_len=256",
        "build.max_input_len=200",
        "build.max_batch_size=4",
    ]

    def cli(name: str, *extra: str) -> tuple[int, str, dict]:
        run_dir = tmp_path / name
        p = subprocess.run(base + [f"hydra.run.dir={run_dir}", *extra], env=env, capture_output=True, text=True, timeout=600)
        return p.returncode, p.stdout + p.stderr, json.loads((run_dir / "summary.json").read_text())

    code, out, summ = cli("auto")
    assert code == 0, out[-3000:]
    assert "build target: onnxruntime_genai" in out and "tensorrt_llm is not installed" in out
    build = next(s for s in summ["stages"] if s["stage"] == "build")
    assert build["headline"]["target"] == "onnxruntime_genai" and build["headline"]["engine_mb"] > 0
    art = Path(build["path"])
    info = json.loads((art / "build_info.json").read_text())
    assert info["target_reason"].startswith("target=auto") and info["limits"]["max_seq_len"] == 256
    assert (art / "build.log").stat().st_size > 0 and (art / "engine" / "genai_config.json").is_file()
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["result"]["limits"] == {"max_batch_size": 4, "max_input_len": 200, "max_seq_len": 256}

    code, out, summ = cli("trt", "target=tensorrt_llm")  # export/quantize cached; build stops in preflight
    assert code == 4, out[-3000:]
    assert "cannot build on this machine" in out and "trtllm-build --checkpoint_dir" in out and "pypi.nvidia.com" in out
    assert summ["exit_code"] == 4 and not list((store / "build").glob("*/engine/rank*.engine"))
