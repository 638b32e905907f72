"""Config messages a user trial found confusing: each reads as field, value and fix.

Old behaviour, one per test:
* the group-size refusal said "use quant.group_size in [64, 32] and no tp_size fits group_size=128" (two
  clauses glued into one fix);
* ``eval.path=...`` got "did you mean gate?" (the closest *field name* in the group, sharing only letters);
* ``pipeline --cfg job``, documented as "print the resolved config", printed ``${checkpoint_name:${.path}}``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import check_overrides
from pipeline.core.config import ParallelConfig, compose
from pipeline.errors import InputError
from pipeline.quantize.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
FACTS = {
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 1024,
    "num_hidden_layers": 4,
}
LINEARS = {"model.layers.0.self_attn.q_proj": (256, 256), "model.layers.0.mlp.down_proj": (192, 256), "lm_head": (256, 1024)}


def _group_size_problem(tp: int) -> str:
    q = compose(["quant=int4_awq"]).quant
    with pytest.raises(InputError) as e:
        preflight(q, FACTS, LINEARS, {"lm_head": "kept"}, None, ParallelConfig(tp_size=tp))
    (line,) = [ln for ln in str(e.value).splitlines() if "quant.group_size=128" in ln]
    return line


def test_group_size_refusal_reads_as_field_value_fix():
    line = _group_size_problem(tp=1)  # 192 is not a multiple of 128 at any TP size; 64 and 32 fit
    assert line.strip().startswith("- quant.group_size=128: with parallel.tp_size=1, the input dimension(s) [192]")
    fix = line.split(" Fix: ", 1)[1]
    assert fix.startswith("set quant.group_size=64 (the group sizes that fit at parallel.tp_size=1: [64, 32])")
    assert "no tp_size fits" not in line and " and no " not in fix
    assert "parallel.tp_size to one of" not in fix  # no TP size helps at 128: none offered
    assert fix.endswith("keep those layers in high precision with quant.exclude_modules (e.g. model.layers.0.mlp.down_proj)")


def test_group_size_refusal_offers_each_working_fix_as_its_own_alternative():
    wide = dict(LINEARS, **{"model.layers.0.mlp.down_proj": (384, 256)})  # 384 / 3 = 128 fits at tp 3
    q = compose(["quant=int4_awq"]).quant
    with pytest.raises(InputError) as e:
        preflight(q, FACTS, wide, {"lm_head": "kept"}, None, ParallelConfig(tp_size=2))
    fix = next(ln for ln in str(e.value).splitlines() if "quant.group_size=128" in ln).split(" Fix: ", 1)[1]
    parts = fix.split("; or ")
    assert parts[0].startswith("set quant.group_size=64 ") and parts[1].startswith("set parallel.tp_size to one of [1")
    assert parts[2].startswith("keep those layers in high precision")


@pytest.mark.parametrize("arg", ["eval.path=/x.jsonl", "eval.pth=/x.jsonl"])
def test_no_nonsense_suggestion_for_an_unknown_field(arg):
    (msg,) = check_overrides([arg])
    # eval.path has one targeted hint (eval.eval_set, tests/core/test_cli_key_hints.py); nothing else is suggested
    near = msg.split("valid:")[0]
    expected = "did you mean eval.eval_set? " if arg.startswith("eval.path=") else ""
    assert "gate" not in near and near.endswith(expected) and near.count("did you mean") == bool(expected)
    assert "eval_set" in msg  # the valid names of the group are still listed


@pytest.mark.parametrize(
    "arg,suggested",
    [
        ("eval.max_new_token=8", "eval.max_new_tokens"),
        ("quant.kv_cach_dtype=fp8", "quant.kv_cache_dtype"),
        ("eval.gate.max_dropp=0.1", "eval.gate.max_drop"),
        ("stage=[export]", "stages"),
        ("parallel.tp_sise=2", "parallel.tp_size"),
        ("calibration.num_sample=64", "calibration.calib_size"),  # a typo of a deprecated name: the new name
    ],
)
def test_suggestions_are_whole_dotted_keys(arg, suggested):
    (msg,) = check_overrides([arg])
    assert f"did you mean {suggested}" in msg, msg
    valid = msg.split("valid: ", 1)[1].split(". Fix:")[0].split(", ")
    deprecated = {"quant": {"kv_cache", "tp_size", "pp_size"}, "calibration": {"num_samples", "max_seq_len"}}
    assert not deprecated.get(arg.split(".")[0], set()) & set(valid), valid  # old spellings are not offered


def test_cfg_job_prints_resolved_values():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "pipeline", "--cfg", "job"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "${" not in r.stdout, [ln for ln in r.stdout.splitlines() if "${" in ln]
    assert "  name: support-llama\n" in r.stdout and "  export_dtype: float16\n" in r.stdout


def test_cfg_job_with_a_deprecated_alias_says_which_field_the_run_uses():
    """Hydra prints the composed config, before the run copies ``quant.tp_size`` into ``parallel.tp_size``: the
    printout alone showed ``parallel.tp_size: 1`` for a run that uses 2 (found by a user trial)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "--cfg", "job", "quant.tp_size=2"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "quant.tp_size is a deprecated alias of parallel.tp_size" in r.stderr, r.stderr
    assert "the run uses parallel.tp_size=2" in r.stderr
    plain = subprocess.run(
        [sys.executable, "-m", "pipeline", "--cfg", "job"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert "deprecated alias" not in plain.stderr


def test_cfg_job_with_an_alias_and_a_different_new_value_says_the_run_refuses():
    """``--cfg job quant.tp_size=2 parallel.tp_size=4`` said "the run uses parallel.tp_size=2" while the run exits 2."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "--cfg", "job", "quant.tp_size=2", "parallel.tp_size=4"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert "the run refuses this (exit 2)" in r.stderr, r.stderr
    assert "the run uses" not in r.stderr
