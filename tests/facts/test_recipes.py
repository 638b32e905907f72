"""Recipes that show the trade-offs: plain round-to-nearest INT4 (``int4_rtn``) next to AWQ, the deprecated
``int4_wo`` alias, one TensorRT-LLM ``quant_algo`` per recipe, and the per-layer format search ``quant=auto``.

Real ModelOpt on tiny real-architecture checkpoints (tests/tiny.py); the CPU engine is a real
onnxruntime-genai build.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.config import ConfigError, compose
from pipeline.core.quant_state import load_simulated_model
from pipeline.errors import InputError
from pipeline.facts.recipes import RECIPES
from pipeline.quantize.auto import auto_quant_algo
from pipeline.quantize.run import quantize
from pipeline.validation import validate

CALIB = ["calibration.calib_size=16", "calibration.min_samples=4", "calibration.calib_max_seq_length=48", "calibration.batch_size=8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, export_dir, repo_root):
    cache: dict[str, tuple[Path, dict]] = {}

    def run(name: str, overrides: list[str]):
        if name not in cache:
            out = tmp_path_factory.mktemp(f"q_{name}")
            res = quantize(compose(CALIB + overrides), export_dir, Path(repo_root) / "evaluation/data/support_calib_v2.jsonl", out)
            cache[name] = (out, res)
        return cache[name]

    return run


def _report(out: Path) -> dict:
    return json.loads((out / "quant_report.json").read_text())


# ----------------------------------------------------------------------------- int4_rtn
def test_int4_rtn_is_plain_round_to_nearest(runs, export_dir):
    """Every quantized weight is the nearest multiple of s = max|W| / 7 per group of 128 to W itself (no AWQ scale, no clipping)."""
    import torch

    out, res = runs("int4_rtn", ["quant=int4_rtn"])
    state = json.loads((out / "quant_state.json").read_text())
    assert state["changed_weights"] == []  # no AWQ scale folded into any weight
    assert not any("pre_quant_scale" in b for b in state["quantizer_buffers"])
    model = load_simulated_model(out, export_dir)
    n = 0
    for name, m in model.named_modules():
        wq = getattr(m, "weight_quantizer", None)
        if wq is None or not wq.is_enabled:
            continue
        w = m.weight.detach()
        g = w.reshape(w.shape[0], -1, 128)
        s = g.abs().amax(-1, keepdim=True) / 7
        with torch.no_grad():
            got = wq(w).reshape(g.shape)
        k = got / s  # integers in [-7, 7], each the nearest to W / s (ties may go either way in float32)
        assert torch.allclose(k, k.round(), atol=1e-4) and float(k.abs().max()) <= 7 + 1e-4, name
        assert float(((got - g).abs() / s).max()) <= 0.5 + 1e-4, name
        n += 1
    assert n == 14  # 2 layers x (q, k, v, o, gate, up, down); lm_head stays high precision
    c = json.loads((out / "trtllm_checkpoint/config.json").read_text())
    assert c["quantization"]["quant_algo"] == "W4A16_AWQ" and c["quantization"]["group_size"] == 128
    assert res["headline"]["recipe"] == "int4_rtn" and _report(out)["warnings"] == []


def test_int4_rtn_differs_from_int4_awq(runs):
    from safetensors.torch import load_file

    rtn, _ = runs("int4_rtn", ["quant=int4_rtn"])
    awq, _ = runs("int4_awq", ["quant=int4_awq"])
    a, b = load_file(str(rtn / "trtllm_checkpoint/rank0.safetensors")), load_file(str(awq / "trtllm_checkpoint/rank0.safetensors"))
    assert any(k.endswith("prequant_scaling_factor") for k in b)
    key = "transformer.layers.0.mlp.fc.weight"
    assert not bool((a[key] == b[key]).all())


def test_int4_wo_is_a_deprecated_alias_of_int4_rtn(runs):
    rtn, _ = runs("int4_rtn", ["quant=int4_rtn"])
    wo, _ = runs("int4_wo", ["quant=int4_wo"])
    assert (wo / "trtllm_checkpoint/rank0.safetensors").read_bytes() == (rtn / "trtllm_checkpoint/rank0.safetensors").read_bytes()
    warns = _report(wo)["warnings"]
    assert any("deprecated alias of 'int4_rtn'" in w for w in warns), warns


def test_one_quant_algo_per_recipe_across_quantize_and_tensorrt_llm_target():
    """The TensorRT-LLM target's recipe table agrees with what ModelOpt writes (int4_wo said W4A16 there)."""
    from pipeline.build.targets.tensorrt_llm.builder import RECIPE_QUANT_ALGO

    for name, algo in RECIPE_QUANT_ALGO.items():
        assert RECIPES[name].quant_algo == algo, name
    assert RECIPE_QUANT_ALGO["int4_rtn"] == RECIPE_QUANT_ALGO["int4_wo"] == "W4A16_AWQ"


def test_int4_rtn_builds_on_the_cpu_target_with_modelopts_integers(runs, export_dir, tmp_path):
    """The onnxruntime-genai engine deploys int4_rtn's integers: teacher-forced next tokens agree with the
    ModelOpt simulated model on >= 99 % of steps, and no AWQ pre-quant scale is involved."""
    import torch

    from pipeline.core.targets import get_target
    from pipeline.core.tokenization import encode_prompt

    out, _ = runs("int4_rtn", ["quant=int4_rtn"])
    # accuracy_level=1: fp32 activations, the engine's exact numerics are what this test checks (the default, 4,
    # quantizes activations to int8 and flips near-tied choices of this random-weight model)
    cfg = compose(
        [
            "target=onnxruntime_genai",
            "quant=int4_rtn",
            "build.max_input_len=160",
            "build.max_seq_len=200",
            "build.max_batch_size=4",
            "target.accuracy_level=1",
        ]
    )
    validate(cfg)
    info = get_target("onnxruntime_genai").build(cfg, out, tmp_path / "b", export_dir=export_dir)
    qw = info["quantized_weights"]
    assert info["precision"] == "int4" and qw["bits"] == 4 and qw["quantized_linears"] == 14
    assert qw["pre_quant_scale"]["onnx_mul"] == 0
    model = load_simulated_model(out, export_dir)
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(str(export_dir / "hf"))
    agree = total = 0
    prompts = [
        "Where is my order ORD-12345?",
        "Please cancel order ORD-99871 and refund 129.50 dollars.",
        "I want a refund for the damaged item.",
        "Change the shipping address to 12 Main Street.",
    ]
    with get_target("onnxruntime_genai").load_runner(tmp_path / "b" / "engine") as runner:
        for p in prompts:
            ids = encode_prompt(tok, p)
            with torch.no_grad():
                seq = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, min_new_tokens=24, pad_token_id=2)[0].tolist()
                ref = model(torch.tensor([seq])).logits[0, len(ids) - 1 : len(seq) - 1].argmax(-1).tolist()
            eng = runner.next_token_logits(ids, seq[len(ids) :])
            agree += sum(a == b for a, b in zip(eng, ref))
            total += len(ref)
    assert total == 96 and agree / total >= 0.99, (agree, total)


# ----------------------------------------------------------------------------- quant=auto
def test_auto_config_is_validated():
    with pytest.raises(ConfigError) as e:
        validate(compose(["quant=auto", "quant.auto.formats=[int4_awq,int3]", "quant.auto.effective_bits=2", "quant.auto.method=hessian"]))
    msg = str(e.value)
    for field in ("quant.auto.formats", "quant.auto.effective_bits", "quant.auto.method"):
        assert field in msg, msg
    with pytest.raises(ConfigError, match="quant.kv_cache_dtype"):
        validate(compose(["quant=auto", "quant.kv_cache_dtype=fp8", "target=tensorrt_llm"]))


def test_auto_writes_a_per_layer_report_and_mixed_precision_checkpoint(runs, export_dir):
    # tiny llama: 2 decoder layers of 147,456 weights + lm_head 49,152 (kept at 16 bits): all int4 = 5.71 bits,
    # all int8 = 8.57 bits; a budget of 7 bits forces a real mix.
    out, res = runs("auto", ["quant=auto", "quant.auto.effective_bits=7", "quant.auto.num_score_steps=2"])
    rep = _report(out)
    auto = rep["auto"]
    assert auto["effective_bits"]["budget"] == 7.0 and auto["effective_bits"]["achieved"] <= 7.0 + 1e-6
    layers = auto["layers"]
    # q/k/v and gate/up are searched as one group each (TensorRT-LLM fuses them): 4 groups per decoder layer
    assert len([g for g in layers if ".layers." in g["layer"]]) == 8
    chosen = {g["format"] for g in layers if ".layers." in g["layer"]}
    assert chosen <= {"int4_awq", "int8_wo", "none"} and len(chosen) >= 2, layers
    for g in layers:
        assert set(g["scores"]) <= {"int4_awq", "int8_wo", "none"} and g["scores"].get("none") == 0
        if ".layers." in g["layer"]:
            assert g["sensitivity"] == g["scores"]["int4_awq"] >= g["scores"]["int8_wo"] >= 0
    # the per-module precision follows the chosen formats
    per_module = {m: g["format"] for g in layers for m in g["modules"]}
    mods = {m["module"]: m for m in rep["modules"]}
    for name, fmt in per_module.items():
        if name in mods and fmt != "none":
            assert mods[name]["precision"] == RECIPES[fmt].quant_algo and mods[name]["weight"].startswith(
                "int4" if "int4" in fmt else "int8"
            )
    algo = auto_quant_algo(per_module)
    c = json.loads((out / "trtllm_checkpoint/config.json").read_text())
    assert c["quantization"]["quant_algo"] == algo == rep["quant_algo"] == res["quant_algo"]
    if algo == "MIXED_PRECISION":
        layer_cfg = json.loads((out / "trtllm_checkpoint/quant_cfg.json").read_text())["quantized_layers"]
        assert {v["quant_algo"] for v in layer_cfg.values()} == {RECIPES[f].quant_algo for f in chosen if f != "none"}
    md = (out / "quant_report.md").read_text()
    assert "## Per-layer format search" in md and "sensitivity" in md
    # the simulated model restores (probe logits checked inside)
    load_simulated_model(out, export_dir)


def test_auto_budget_below_reach_is_refused_before_search(export_dir, repo_root, tmp_path):
    cfg = compose(CALIB + ["quant=auto", "quant.auto.effective_bits=4"])
    with pytest.raises(InputError) as e:
        quantize(cfg, export_dir, Path(repo_root) / "evaluation/data/support_calib_v2.jsonl", tmp_path)
    assert "quant.auto.effective_bits=4" in str(e.value) and "5.71" in str(e.value)


def test_cpu_target_refuses_auto_with_the_fix():
    with pytest.raises(ConfigError) as e:
        validate(compose(["quant=auto", "target=onnxruntime_genai"]))
    assert (
        "quant.recipe" in str(e.value)
        and "mixes per-layer weight formats" in str(e.value)
        and "eval.runners=[baseline,simulated]" in str(e.value)
    )


# ----------------------------------------------------------------------------- generic calibration set
def test_generic_calibration_set_is_the_generator_output(repo_root):
    """evaluation/data/generic_calib_v1.jsonl is exactly what evaluation/generate_generic_calib.py makes (same CPython
    minor version as recorded in its rows; other versions' docstrings differ, so the check is skipped there)."""
    import platform

    path = Path(repo_root) / "evaluation/data/generic_calib_v1.jsonl"
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    made_with = rows[0]["source"].split()[1]
    assert all(r["source"].startswith(f"CPython {made_with} docstring of ") for r in rows)
    assert len(rows) == len({r["text"] for r in rows}) >= 448  # the generic_v1 preset uses 448
    if made_with.rsplit(".", 1)[0] != platform.python_version().rsplit(".", 1)[0]:
        pytest.skip(f"file made with CPython {made_with}, running {platform.python_version()}")
    # a fresh interpreter, as the file was made: what a package module lists (dir()) depends on what the process
    # imported before, so running the generator inside the test process gave other rows late in a full suite
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "generic.jsonl"
        subprocess.run(
            [sys.executable, "-I", str(Path(repo_root) / "evaluation/generate_generic_calib.py"), "--out", str(out)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        made = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [{k: r[k] for k in ("id", "text")} for r in made] == [{k: r[k] for k in ("id", "text")} for r in rows]


def test_vocab_not_a_multiple_of_64_survives_awq_export_and_builds(tmp_path, repo_root):
    """A user's tokenizer-trained vocabulary (330 rows here; 326 in the report) is padded to 384 by ModelOpt's AWQ
    export; the export check refused that padding as a mismatch (exit 2) although TensorRT-LLM reads it as is."""
    import sys

    sys.path.insert(0, str(repo_root / "tests"))
    import tiny
    from rich.console import Console

    from pipeline.runner import run_pipeline

    ckpt = tiny.make_checkpoint(tmp_path / "odd_vocab", "llama", vocab_size=330)
    cfg = compose(
        [
            f"model.path={ckpt}",
            "model.name=odd-vocab",
            "quant=int4_awq",
            "quant.group_size=64",
            "target=onnxruntime_genai",
            f"store_dir={tmp_path / 'store'}",
            "stages=[build]",
            "calibration.calib_size=16",
            "calibration.min_samples=8",
            "build.max_input_len=128",
            "build.max_seq_len=192",
            "build.max_batch_size=4",
            "progress=false",
        ]
    )
    summary = run_pipeline(cfg, console=Console(quiet=True))
    assert summary.exit_code == 0, summary.error
    q = next(s for s in summary.stages if s.stage == "quantize")
    rep = json.loads((Path(q.path) / "quant_report.json").read_text())
    assert rep["export_checks"]["vocab_padded"] == {"original": 330, "padded": 384, "by": "ModelOpt AWQ export (multiple of 64, zero rows)"}
