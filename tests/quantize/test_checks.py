"""The quantize stage's config checks (pipeline/quantize/checks.py) on a real checkpoint's config.json: the recipe's
rules on the model's linear layers are refused before any work (export included), with the same message the
quantize stage's own preflight gives on the loaded model. Found by a fresh-user trial: a hidden-64 Qwen2 with
quant=int4_awq ran its export, then exited 2 on quant.group_size=128, and `pipeline plan` said nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.core.config import compose
from pipeline.validation import stage_problems

ROOT = Path(__file__).resolve().parents[2]


def _fields(over: list[str]) -> dict[str, str]:
    return {p.field: str(p) for p in stage_problems(compose(over))}


def test_group_size_that_does_not_divide_the_hidden_size_is_a_config_problem(small_qwen2):
    got = _fields([f"model.path={small_qwen2}", "quant=int4_awq", "stages=[export,quantize]"])
    assert "quant.group_size" in got, got
    assert "the input dimension(s) [64]" in got["quant.group_size"] and "set quant.group_size=64" in got["quant.group_size"]
    assert "quant.group_size" not in _fields(
        [f"model.path={small_qwen2}", "quant=int4_awq", "quant.group_size=64", "stages=[export,quantize]"]
    )
    assert "quant.group_size" not in _fields([f"model.path={small_qwen2}", "quant=int8_sq", "stages=[export,quantize]"])  # not grouped
    assert "quant.group_size" not in _fields([f"model.path={small_qwen2}", "quant=int4_awq", "stages=[export]"])  # quantize will not run


def test_split_qkv_exclusion_is_a_config_problem(small_qwen2):
    got = _fields([f"model.path={small_qwen2}", "quant=int8_sq", "quant.exclude_modules=[lm_head,*q_proj]", "stages=[export,quantize]"])
    assert "quant.exclude_modules" in got and "splits the q/k/v" in got["quant.exclude_modules"], got


def test_the_run_and_the_plan_refuse_it_before_any_work(small_qwen2, tmp_path):
    store = tmp_path / "store"
    # (hydra.run.dir only for the run: `pipeline plan` writes no run folder and refuses hydra.* overrides)
    for cmd in (["pipeline.cli", "stages=[package]", f"store_dir={store}", f"hydra.run.dir={tmp_path / 'run'}"], ["pipeline.cli", "plan"]):
        r = subprocess.run(
            [sys.executable, "-m", *cmd, f"model.path={small_qwen2}", "quant=int4_awq"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert r.returncode == 2, (cmd, r.stdout[-2000:] + r.stderr[-2000:])
        assert "quant.group_size=128" in r.stdout + r.stderr
    assert not any(store.glob("*/*")) if store.exists() else True  # no stage ran


def test_an_exclude_pattern_that_matches_no_linear_is_refused(small_qwen2):
    """Fresh-user trial: ``quant.exclude_modules=[nonexistent_mod]`` (or a typo ``lm_haed``) ran to exit 0 and
    quantized the LM head, because the list replaces the default [lm_head] and the pattern kept nothing."""
    base = [f"model.path={small_qwen2}", "quant=int8_sq", "stages=[export,quantize]"]
    got = _fields([*base, "quant.exclude_modules=[lm_haed]"])
    assert "quant.exclude_modules" in got, got
    msg = got["quant.exclude_modules"]
    assert "['lm_haed'] match no linear layer" in msg and "did you mean lm_head" in msg and "LM head would be quantized" in msg, msg
    kept = _fields([*base, "quant.exclude_modules=[lm_head,model.layers.9.*]"])["quant.exclude_modules"]
    assert "['model.layers.9.*'] match no linear layer" in kept and "LM head would be quantized" not in kept, kept
    for ok in ("[lm_head]", "[lm_head,model.layers.0.*]", "[]", "[lm_head,*q_proj,*k_proj,*v_proj]"):
        assert "quant.exclude_modules" not in _fields([*base, f"quant.exclude_modules={ok}"]), ok


def test_the_loaded_model_check_refuses_the_same_pattern():
    """The quantize stage's own preflight (on the loaded model's module names) applies the same rule."""
    import types

    from pipeline.quantize.preflight import excluded_modules, linear_problems

    q = types.SimpleNamespace(
        recipe="int4_awq", exclude_modules=["lm_head", "*mlp.gate_projj"], sensitive_preset="none", kv_cache_dtype="none", group_size=64
    )
    linears = {"model.layers.0.mlp.gate_proj": (64, 128), "model.layers.0.mlp.down_proj": (128, 64), "lm_head": (64, 320)}
    probs = linear_problems(q, linears, excluded_modules(q, list(linears), 1), 1)
    assert [p.field for p in probs] == ["quant.exclude_modules"] and "['*mlp.gate_projj']" in str(probs[0]), probs


def test_a_kv_cache_fix_never_repeats_an_unknown_kv_format():
    """``quant=none quant.kv_cache_dtype=int4`` suggested "e.g. quant=int8_sq quant.kv_cache_dtype=int4", the invalid
    value again (new-user trial): every ``quant.kv_cache_dtype=`` a fix names is a KV format there is."""
    import re

    from pipeline.facts.recipes import KV_CACHE_FORMATS

    for over in (["quant=none", "quant.kv_cache_dtype=int4"], ["quant=none", "quant.kv_cache_dtype=fp8"]):
        problems = [p for p in stage_problems(compose([*over, "stages=[export,quantize]"])) if "calibrates nothing" in str(p)]
        assert problems, over
        named = re.findall(r"quant\.kv_cache_dtype=(\w+)", problems[0].fix)
        assert named and set(named) <= set(KV_CACHE_FORMATS), (over, problems[0].fix)
    assert "quant.kv_cache_dtype=fp8" in problems[0].fix  # a known format is kept in the example


def test_a_calibration_file_with_too_few_records_is_refused_before_export(small_qwen2, tmp_path):
    """Trial 3: a 20-line calibration file ran export, then quantize exited 2 (fewer than min_samples=32 usable)."""
    import json

    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"Where is order {i}?"}) + "\n" for i in range(20)) + "\n\n", encoding="utf-8")
    base = [f"model.path={small_qwen2}", "quant=int8_sq", "stages=[export,quantize]", f"calibration.path={calib}"]
    got = _fields(base)
    assert "calibration.path" in got, got
    msg = got["calibration.path"]
    assert "holds 20 non-blank record(s) (2 blank), fewer than calibration.min_samples=32" in msg, msg
    assert "lower calibration.min_samples (<= 20)" in msg, msg
    assert "calibration.path" not in _fields([*base, "calibration.min_samples=20"])  # as many records as needed
    assert "calibration.path" not in _fields([*base[:-1], "quant=none", f"calibration.path={calib}"])  # nothing calibrated
