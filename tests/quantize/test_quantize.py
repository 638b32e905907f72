"""Quantize stage: every recipe through real ModelOpt on a tiny Llama, checks before/after, restore.

All runs share one export artifact and a small slice of the shipped calibration set (16 samples,
<= 48 tokens) so the whole file stays fast on a shared 2-core box.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.core.config import ParallelConfig, compose
from pipeline.core.quant_state import load_simulated_model
from pipeline.errors import InputError
from pipeline.facts.recipes import RECIPES
from pipeline.quantize.common import KV_CACHE
from pipeline.quantize.preflight import preflight, source_facts
from pipeline.quantize.run import quantize
from pipeline.quantize.trtllm_ckpt import check_trtllm_checkpoint

CALIB = ["calibration.calib_size=16", "calibration.min_samples=4", "calibration.calib_max_seq_length=48", "calibration.batch_size=8"]
RECIPE_KV = {
    "none": "none",
    "fp8": "fp8",
    "int8_sq": "int8",
    "int8_wo": "none",
    "int4_wo": "none",
    "int4_rtn": "none",
    "int4_awq": "none",
    "w4a8_awq": "none",
    "auto": "none",
}


@pytest.fixture(scope="module")
def calib(repo_root):
    return Path(repo_root) / "evaluation/data/support_calib_v2.jsonl"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, export_dir, calib):
    """run(name, overrides, export=export_dir) -> (out folder, result); cached per name."""
    cache: dict[str, tuple[Path, dict]] = {}

    def run(name: str, overrides: list[str], export: Path | None = None):
        if name not in cache:
            cfg = compose(CALIB + overrides)
            out = tmp_path_factory.mktemp(f"q_{name}")
            res = quantize(cfg, export or export_dir, calib, out)
            cache[name] = (out, res)
        return cache[name]

    return run


def _recipe_run(runs, recipe):
    return runs(recipe, [f"quant={recipe}", f"quant.kv_cache_dtype={RECIPE_KV[recipe]}"])


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "auto"])  # auto: tests/facts/test_recipes.py
def test_every_recipe_writes_the_contract(runs, export_dir, recipe):
    out, res = _recipe_run(runs, recipe)
    kv = RECIPE_KV[recipe]
    for f in (
        "hf/config.json",
        "trtllm_checkpoint/config.json",
        "trtllm_checkpoint/rank0.safetensors",
        "quant_state.json",
        "quant_state.safetensors",
        "quant_report.json",
        "quant_report.md",
    ):
        assert (out / f).is_file(), f
    c = json.loads((out / "trtllm_checkpoint/config.json").read_text())
    assert c["quantization"]["quant_algo"] == RECIPES[recipe].quant_algo
    assert c["quantization"]["kv_cache_quant_algo"] == KV_CACHE[kv][0]
    assert c["rotary_base"] == 10000.0 and c["vocab_size"] == 384 and c["num_key_value_heads"] == 2
    h = res["headline"]
    assert h["recipe"] == recipe and h["kv_cache"] == kv and h["calib_samples"] == (0 if recipe == "none" else 16)
    rep = json.loads((out / "quant_report.json").read_text())
    mods = {m["module"]: m for m in rep["modules"]}
    assert mods["lm_head"]["weight"] == "float16" and mods["lm_head"]["kept_high_precision"]
    q = mods["model.layers.0.self_attn.q_proj"]
    if recipe == "none":
        assert q["weight"] == "float16" and h["compression"] == pytest.approx(1.0, abs=0.01)
        # hf/ is the export's weights, byte for byte
        assert (out / "hf/model.safetensors").read_bytes() == (export_dir / "hf/model.safetensors").read_bytes()
        assert json.loads((out / "quant_state.json").read_text())["modelopt_state"] is None
    else:
        assert q["weight"] != "float16" and q["precision"] == RECIPES[recipe].quant_algo
        assert h["compression"] > 1.2
        assert json.loads((out / "hf/hf_quant_config.json").read_text())["quantization"]["quant_algo"] == RECIPES[recipe].quant_algo
        assert rep["calibration"]["used"] == 16 and rep["calibration"]["pad_token"] == "<pad>"
    if RECIPES[recipe].grouped:
        assert q["weight"].startswith("int4/g128") and c["quantization"]["group_size"] == 128
    if recipe == "w4a8_awq":
        assert q["activation"].startswith("fp8")
    if kv != "none":
        scales = rep["export_checks"]["kv_cache_scales"]
        assert sorted(scales) == ["0", "1"] and all(math.isfinite(v) and v > 0 for v in scales.values())
    assert "## Per-module precision" in (out / "quant_report.md").read_text()


@pytest.mark.parametrize("recipe", ["int8_sq", "int4_awq", "w4a8_awq"])
def test_load_simulated_model_reproduces_logits(runs, export_dir, recipe):
    import torch

    out, _ = _recipe_run(runs, recipe)
    st = _tensors(out / "quant_state.safetensors")
    ids, want = st["__probe__.input_ids"], st["__probe__.logits"]
    model = load_simulated_model(out, export_dir, verify=False)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert torch.equal(got, want), (got - want).abs().max()
    # and it is really quantized: the plain export model gives different logits
    plain = load_simulated_model(_recipe_run(runs, "none")[0], export_dir)
    with torch.no_grad():
        assert not torch.equal(plain(input_ids=ids).logits, want)


def test_load_simulated_model_refuses_a_different_export(runs, tmp_path):
    import tiny

    from pipeline.export.write import export_checkpoint

    out, _ = _recipe_run(runs, "int8_wo")
    other = tmp_path / "export"
    export_checkpoint(tiny.make_checkpoint(tmp_path / "src", "llama", seed=7), other)
    with pytest.raises(InputError, match="not the one this quant state was made from"):
        load_simulated_model(out, other)


def test_determinism_byte_identical(runs):
    a, _ = _recipe_run(runs, "int4_awq")
    b, _ = runs("int4_awq_again", ["quant=int4_awq"])
    for f in ("trtllm_checkpoint/rank0.safetensors", "trtllm_checkpoint/config.json", "hf/model.safetensors", "quant_state.safetensors"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_int4_weights_dequantize_within_half_a_step(runs, export_dir):
    """Unpack the TensorRT-LLM INT4 weights (two signed nibbles per byte along the output dim, ModelOpt
    ``pack_int4_in_uint8``), scale per group, undo the AWQ pre-quant scale, compare with the source."""
    import torch

    out, _ = _recipe_run(runs, "int4_awq")
    t = _tensors(out / "trtllm_checkpoint/rank0.safetensors")
    src = _tensors(export_dir / "hf/model.safetensors")["model.layers.0.mlp.down_proj.weight"].float()
    packed = t["transformer.layers.0.mlp.proj.weight"].view(torch.uint8).to(torch.int16)
    lo, hi = packed & 0x0F, packed >> 4
    lo, hi = torch.where(lo >= 8, lo - 16, lo), torch.where(hi >= 8, hi - 16, hi)
    q = torch.stack([lo, hi], dim=1).reshape(-1, packed.shape[1]).float()  # rows 2k, 2k+1
    assert q.shape == src.shape and q.abs().max() <= 8
    scale = t["transformer.layers.0.mlp.proj.weights_scaling_factor"].float()  # (out, in / group)
    step = scale.repeat_interleave(128, dim=1)
    pqs = t["transformer.layers.0.mlp.proj.prequant_scaling_factor"].float()  # input-side AWQ scale
    deq = q * step * pqs[None, :]
    err = (deq - src).abs()
    bound = 0.5 * step * pqs[None, :]
    assert bool((err <= bound * 1.01 + 1e-3).all()), (err / bound).max()
    assert err.mean() < 0.25 * src.abs().mean()


def test_exclude_modules_empty_quantizes_the_lm_head_everywhere(runs):
    """quant.exclude_modules=[]: the LM head is int4 in the report, in the HF export and in the TensorRT-LLM checkpoint
    (whose exclude_modules no longer names it); the post-export vocabulary check still reads the float embedding."""
    out, _ = runs("int4_awq_lm_head", ["quant=int4_awq", "quant.exclude_modules=[]"])
    rep = json.loads((out / "quant_report.json").read_text())
    lm = {m["module"]: m for m in rep["modules"]}["lm_head"]
    assert lm["weight"].startswith("int4/g128") and not lm["kept_high_precision"], lm
    c = json.loads((out / "trtllm_checkpoint/config.json").read_text())
    assert c["quantization"]["quant_algo"] == "W4A16_AWQ" and "lm_head" not in (c["quantization"]["exclude_modules"] or [])
    t = _tensors(out / "trtllm_checkpoint/rank0.safetensors")
    assert t["lm_head.weight"].dtype not in (torch.float16, torch.float32) and t["transformer.vocab_embedding.weight"].shape == (384, 128)
    assert "lm_head" not in (json.loads((out / "hf/hf_quant_config.json").read_text())["quantization"].get("exclude_modules") or [])


def test_tp2_two_ranks_with_shard_shapes(runs):
    one, _ = _recipe_run(runs, "int4_awq")
    two, res = runs("int4_awq_tp2", ["quant=int4_awq", "parallel.tp_size=2", "quant.group_size=64"])
    assert sorted(p.name for p in (two / "trtllm_checkpoint").glob("rank*")) == ["rank0.safetensors", "rank1.safetensors"]
    c = json.loads((two / "trtllm_checkpoint/config.json").read_text())
    assert c["mapping"]["tp_size"] == 2 and c["mapping"]["world_size"] == 2 and c["quantization"]["group_size"] == 64
    full = _tensors(one / "trtllm_checkpoint/rank0.safetensors")
    split = {"attention.qkv.weight": 0, "mlp.fc.weight": 0, "mlp.gate.weight": 0, "attention.dense.weight": 1, "mlp.proj.weight": 1}
    for r in (0, 1):
        part = _tensors(two / f"trtllm_checkpoint/rank{r}.safetensors")
        assert part["transformer.vocab_embedding.weight"].shape == (192, 128)
        assert part["lm_head.weight"].shape == (192, 128)
        for name, dim in split.items():
            f, p = full[f"transformer.layers.1.{name}"].shape, part[f"transformer.layers.1.{name}"].shape
            want = list(f)
            want[dim] //= 2
            assert list(p) == want, (name, f, p)
    assert res["tp_size"] == 2


def test_pp2_splits_layers_and_kv_scales_cover_every_layer(runs):
    out, res = runs("sq_pp2", ["quant=int8_sq", "quant.kv_cache_dtype=int8", "parallel.pp_size=2"])
    c = json.loads((out / "trtllm_checkpoint/config.json").read_text())
    assert c["mapping"] == {"world_size": 2, "tp_size": 1, "pp_size": 2}
    r0, r1 = (_tensors(out / f"trtllm_checkpoint/rank{r}.safetensors") for r in (0, 1))
    assert "transformer.vocab_embedding.weight" in r0 and "lm_head.weight" in r1 and "lm_head.weight" not in r0
    rep = json.loads((out / "quant_report.json").read_text())
    assert sorted(rep["export_checks"]["kv_cache_scales"]) == ["0", "1"]


def test_rope_scaled_model_keeps_scaling_and_vocab_is_padded(runs, tmp_path_factory):
    import tiny

    from pipeline.export.write import export_checkpoint

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    src = tiny.make_checkpoint(tmp_path_factory.mktemp("rope_src"), "llama", vocab_size=385, rope_parameters=rope)
    exp = tmp_path_factory.mktemp("rope_export")
    export_checkpoint(src, exp)
    out, _ = runs("rope_tp2", ["quant=int8_wo", "parallel.tp_size=2"], export=exp)
    c = json.loads((out / "trtllm_checkpoint/config.json").read_text())
    assert c["rotary_base"] == 500000.0
    sc = c["rotary_scaling"]
    assert (sc.get("rope_type") or sc.get("type")) == "llama3"
    assert {k: sc[k] for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")} == {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    rep = json.loads((out / "quant_report.json").read_text())
    assert rep["preflight"]["vocab_padding"] == {"original": 385, "padded": 386}
    assert c["vocab_size"] == 385
    assert _tensors(out / "trtllm_checkpoint/rank1.safetensors")["lm_head.weight"].shape[0] == 193


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_other_architectures_int4_awq(runs, tmp_path_factory, arch):
    import tiny

    from pipeline.export.write import export_checkpoint

    exp = tmp_path_factory.mktemp(f"{arch}_export")
    export_checkpoint(tiny.make_checkpoint(tmp_path_factory.mktemp(f"{arch}_src"), arch), exp)
    out, res = runs(f"{arch}_awq", ["quant=int4_awq"], export=exp)
    c = json.loads((out / "trtllm_checkpoint/config.json").read_text())
    assert c["quantization"]["quant_algo"] == "W4A16_AWQ" and res["headline"]["compression"] > 1.5
    load_simulated_model(out, exp)  # probe logits reproduced


def test_phi3_quantizes_without_a_tensorrt_llm_checkpoint(tmp_path, calib):
    """Issue 12 case 1: ModelOpt 0.47 has no TensorRT-LLM converter for Phi-3; quantize still calibrates (the CPU target
    and tensorrt_llm_pytorch need no such checkpoint), says so, and target=tensorrt_llm is refused at config time."""
    import tiny

    from pipeline.export.write import export_checkpoint

    exp = tmp_path / "export"
    export_checkpoint(tiny.make_checkpoint(tmp_path / "src", "phi3"), exp)
    out = tmp_path / "q"
    out.mkdir()
    quantize(compose(CALIB + ["quant=int4_awq"]), exp, calib, out)
    assert (out / "trtllm_checkpoint" / "NOT_EXPORTED").is_file() and not list((out / "trtllm_checkpoint").glob("rank*"))
    report = json.loads((out / "quant_report.json").read_text())
    assert "skipped" in report["export_checks"] and any("no TensorRT-LLM checkpoint" in w for w in report["warnings"])
    load_simulated_model(out, exp)  # the simulated-quant state is complete


# ----------------------------------------------------------------------------- checks before calibration
def _facts(**kw):
    f = {"num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "num_hidden_layers": 4}
    f.update(kw)
    return f


def _q(**kw):
    q = compose(["quant=int4_awq"]).quant
    for k, v in kw.items():
        setattr(q, k, v)
    return q


def _par(tp_size=1, pp_size=1):
    return ParallelConfig(tp_size=tp_size, pp_size=pp_size)


LINEARS = {
    "model.layers.0.self_attn.q_proj": (256, 256),
    "model.layers.0.self_attn.o_proj": (256, 256),
    "model.layers.0.mlp.down_proj": (192, 256),
    "lm_head": (256, 1000),
}


def test_group_size_check_lists_dims_and_working_sizes():
    with pytest.raises(InputError) as e:
        preflight(_q(group_size=128), _facts(), LINEARS, {"lm_head": "x"}, None, _par(tp_size=2))
    msg = str(e.value)
    assert "quant.group_size=128" in msg and "dimension(s) [192]" in msg and "per-rank sizes [96]" in msg
    assert "model.layers.0.mlp.down_proj" in msg
    assert "Fix: set quant.group_size=32 (the group sizes that fit at parallel.tp_size=2: [32])" in msg
    assert "no tp_size fits" not in msg and "parallel.tp_size to one of" not in msg  # no TP size fits 192 and 256 at 128
    assert preflight(_q(group_size=32), _facts(), LINEARS, {"lm_head": "x"}, None, _par(tp_size=2))["tp_size"] == 2


def test_heads_check_lists_valid_tp_and_records_kv_replication():
    with pytest.raises(
        InputError, match=r"parallel.tp_size=3: does not divide num_attention_heads=8. Fix: use parallel.tp_size in \[1, 2, 4, 8\]"
    ):
        preflight(_q(recipe="int8_wo"), _facts(), LINEARS, {}, None, _par(tp_size=3))
    with pytest.raises(InputError, match=r"neither divides num_key_value_heads=3.*parallel.tp_size in \[1, 3, 6\]"):
        preflight(_q(recipe="int8_wo"), _facts(num_attention_heads=6, num_key_value_heads=3), LINEARS, {}, None, _par(tp_size=2))
    pre = preflight(_q(recipe="int8_wo"), _facts(), LINEARS, {}, None, _par(tp_size=4))
    assert pre["kv_heads_replicated"] == 2


def test_kv_cache_without_a_recipe_is_refused():
    with pytest.raises(InputError, match="quant.kv_cache_dtype='fp8': a quantized KV cache needs calibrated K/V scales"):
        preflight(_q(recipe="none", kv_cache_dtype="fp8"), _facts(), LINEARS, {}, None, _par())


def test_vocab_padding_recorded_or_rejected():
    pre = preflight(_q(recipe="int8_wo"), _facts(vocab_size=1001), LINEARS, {}, None, _par(tp_size=8))
    assert pre["vocab_padding"] == {"original": 1001, "padded": 1008}
    with pytest.raises(InputError, match=r"quant.vocab_padding='reject': vocab_size=1001 is not divisible by tp_size=8"):
        preflight(_q(recipe="int8_wo", vocab_padding="reject"), _facts(vocab_size=1001), LINEARS, {}, None, _par(tp_size=8))


def test_target_gpu_refuses_fp8_and_w4a8_before_sm89():
    with pytest.raises(InputError) as e:
        preflight(_q(recipe="fp8", kv_cache_dtype="fp8"), _facts(), LINEARS, {}, "a100_80gb", _par())
    msg = str(e.value)
    assert "2 problem(s)" in msg and "quant.recipe='fp8'" in msg and "quant.kv_cache_dtype='fp8'" in msg and "int4_awq" in msg
    with pytest.raises(InputError, match="quant.recipe='w4a8_awq': needs compute capability >= 8.9"):
        preflight(_q(recipe="w4a8_awq", group_size=64), _facts(), LINEARS, {}, "a10g", _par())
    assert preflight(_q(recipe="fp8", kv_cache_dtype="fp8"), _facts(), LINEARS, {}, "h100_sxm", _par())["target_gpu"]["sm"] == 90
    with pytest.raises(InputError, match="target.gpu='nope': unknown GPU"):
        preflight(_q(recipe="fp8"), _facts(), LINEARS, {}, "nope", _par())


def test_problems_are_collected_into_one_error():
    with pytest.raises(InputError) as e:
        preflight(_q(recipe="w4a8_awq", group_size=128), _facts(), LINEARS, {}, "a10g", _par(tp_size=3, pp_size=9))
    msg = str(e.value)
    assert "4 problem(s)" in msg
    for field in ("quant.group_size", "parallel.tp_size", "parallel.pp_size", "quant.recipe"):
        assert field in msg, field


def test_bad_config_fails_before_calibration(export_dir, calib, tmp_path):
    cfg = compose(CALIB + ["quant=int4_awq", "parallel.tp_size=2"])  # tiny hidden 128 / 2 = 64: not a multiple of 128
    with pytest.raises(InputError, match="quant.group_size=128"):
        quantize(cfg, export_dir, calib, tmp_path)
    assert not (tmp_path / "quant_state.json").exists()


# ----------------------------------------------------------------------------- checks after export
def test_export_checks_catch_wrong_fields_and_bad_kv_scales(runs, export_dir, tmp_path):
    import torch
    from safetensors.torch import save_file

    out, _ = _recipe_run(runs, "int8_sq")
    ck = tmp_path / "ck"
    shutil.copytree(out / "trtllm_checkpoint", ck)
    facts = source_facts(export_dir / "hf")
    q = compose(["quant=int8_sq", "quant.kv_cache_dtype=int8"]).quant
    assert check_trtllm_checkpoint(ck, facts, q, _par())["kv_cache_scales"]
    c = json.loads((ck / "config.json").read_text())
    c.update(rotary_base=20000.0, norm_epsilon=1e-5, num_key_value_heads=4)
    (ck / "config.json").write_text(json.dumps(c))
    t = _tensors(ck / "rank0.safetensors")
    t["transformer.layers.1.attention.kv_cache_scaling_factor"] = torch.tensor([0.0])
    del t["transformer.layers.0.attention.kv_cache_scaling_factor"]
    save_file(t, str(ck / "rank0.safetensors"))
    with pytest.raises(InputError) as e:
        check_trtllm_checkpoint(ck, facts, q, _par())
    msg = str(e.value)
    for s in (
        "rotary_base: exported 20000.0 != source 10000.0",
        "norm_epsilon",
        "num_key_value_heads: exported 4 != source 2",
        "kv_cache_scaling_factor missing on attention layer(s) [0]",
        "not finite and positive on layer(s) {1: 0.0}",
    ):
        assert s in msg, s


# ----------------------------------------------------------------------------- stage + default model
def test_stage_keys_calibration_only_when_calibrating(repo_root):
    from pipeline.quantize.stage import STAGE

    cfg = compose(["quant=none"])
    assert STAGE.external_inputs(cfg) == {}
    assert STAGE.key_extras(cfg, {})["calibration"] is None
    cfg = compose(["quant=int4_awq"])
    assert STAGE.external_inputs(cfg) == {"calibration": Path("evaluation/data/support_calib_v2.jsonl")}
    assert STAGE.key_extras(cfg, {})["calibration"]["calib_size"] == 512


def test_default_model_int4_awq(repo_root, calib, tmp_path):
    model = Path(repo_root) / "models/support-llama"
    if not (model / "config.json").is_file():
        pytest.skip(f"default model not trained yet: {model}/config.json is absent")
    from pipeline.export.write import export_checkpoint

    exp = tmp_path / "export"
    export_checkpoint(model, exp)
    out = tmp_path / "q"
    out.mkdir()
    res = quantize(compose(CALIB + ["quant=int4_awq"]), exp, calib, out)
    assert res["headline"]["compression"] > 1.5
    load_simulated_model(out, exp)  # verifies the stored probe logits


def test_stage_through_the_runner_caches_on_calibration_content(tmp_path, repo_root):
    """Real runner: export -> quantize; a rerun is a cache hit; editing the calibration file re-runs quantize only."""
    import io

    import tiny
    from rich.console import Console

    from pipeline.runner import run_pipeline

    src = tiny.make_checkpoint(tmp_path / "src", "llama")
    cal = tmp_path / "calib.jsonl"
    lines = (Path(repo_root) / "evaluation/data/support_calib_v2.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    cal.write_text("\n".join(lines) + "\n", encoding="utf-8")
    over = [
        f"model.path={src}",
        "stages=[export,quantize]",
        "quant=int8_wo",
        f"calibration.path={cal}",
        f"store_dir={tmp_path / 'store'}",
        "progress=false",
    ] + CALIB

    def go():
        s = run_pipeline(compose(over), console=Console(file=io.StringIO()))
        assert s.exit_code == 0, s.error
        return {r.stage: r for r in s.stages}

    first = go()
    assert first["quantize"].status == "ran" and first["quantize"].headline["recipe"] == "int8_wo"
    assert first["quantize"].headline["calib_samples"] == 16
    again = go()
    assert again["quantize"].status == "cached" and again["quantize"].path == first["quantize"].path
    cal.write_text("\n".join(lines[:30]) + "\n", encoding="utf-8")
    changed = go()
    assert changed["export"].status == "cached" and changed["quantize"].status == "ran"
    assert changed["quantize"].path != first["quantize"].path
    mf = json.loads((Path(changed["quantize"].path) / "manifest.json").read_text())
    assert "calibration" in mf["external"]
