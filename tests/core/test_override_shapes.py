"""Overrides of the wrong shape, and sweeps outside a multirun, are refused with the field, the value and the fix.

Before: ``model.name=[a]``, ``eval.gate=3``, ``build.speculative=null``, ``quant.exclude_modules=lm_head`` and
``target.gpu={x:1}`` were Hydra's bare ``ConfigCompositionException: Error merging override ...`` (compose: with the
generic fix "use group=<preset name> ..."); a list value of a typed field was split at its commas
(``build.max_seq_len=[1`` in the message); ``compose(["quant=none,fp8"])`` and ``pipeline quant=none,fp8`` without
``-m`` ended in Hydra's "Ambiguous value" text.  Every ``pipeline`` run also made an empty
``pipeline-user-config-*`` folder in the temp dir, left behind whenever the process was killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_pipeline_cli

from pipeline.core.config import ConfigError, compose

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "override, want",
    [
        ("model.name=[a]", "model.name=[a]: takes text, not a list. Fix: model.name=<text> (text with brackets"),
        ("target.gpu={x:1}", "target.gpu={x:1}: takes text, not a mapping."),
        ("build.max_seq_len=[1,2]", "build.max_seq_len=[1,2]: takes a whole number, not a list. Fix: build.max_seq_len=<integer>."),
        ("build.max_seq_len=1.5", "build.max_seq_len=1.5: not a whole number."),
        ("build.max_seq_len=null", "build.max_seq_len=null: cannot be null."),
        ("build.speculative=null", "build.speculative=null: cannot be null."),
        ("eval.gate=3", "eval.gate=3: is a group of fields (min_score, max_drop,"),
        ("quant.exclude_modules=lm_head", "quant.exclude_modules=lm_head: is a list. Fix: quant.exclude_modules=[lm_head]"),
        ("build=[1,2]", "build=[1, 2]: no such build preset"),
        ("quant=none,fp8", "quant=none,fp8: is a sweep of 2 values; a config has one value per key. Fix: compose one config"),
        ("build.max_seq_len=range(1,3)", "is a sweep of 2 values"),
    ],
)
def test_a_value_of_the_wrong_shape_names_the_field_and_the_fix(override, want):
    with pytest.raises(ConfigError) as e:
        compose([override])
    msg = str(e.value)
    assert want in msg and "ConfigCompositionException" not in msg and "Error merging" not in msg, msg


@pytest.mark.parametrize(
    "override",
    [
        "quant.exclude_modules=[lm_head]",
        "eval.limit=null",
        "model.name='a,b'",
        "package.parity=yes",
        "model.name=3",
        "build.max_seq_len=1024",
    ],
)
def test_values_of_the_right_shape_still_compose(override):
    compose([override])


def test_a_comma_list_for_a_list_field_is_offered_bracketed():
    with pytest.raises(ConfigError, match=r"Fix: quant\.exclude_modules=\[lm_head,x\]"):
        compose(["quant.exclude_modules=lm_head,x"])


def test_the_cli_refuses_a_sweep_without_multirun_and_leaves_no_temp_folder(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path))
    run = [sys.executable, "-m", "pipeline"]
    r = subprocess.run(
        [*run, "build.max_seq_len=1024,2048", "stages=[export]"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "error (exit 2): build.max_seq_len=1024,2048: is a sweep of 2 values" in r.stderr and "Fix: set one value" in r.stderr, r.stderr
    assert "Ambiguous value" not in r.stderr and "HYDRA_FULL_ERROR" not in r.stderr, r.stderr
    r = subprocess.run([*run, "model.name=x", "--cfg", "job"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("pipeline-user-config-*")), list(tmp_path.iterdir())


def test_a_key_given_twice_is_said_and_the_last_value_is_the_one_used(tmp_path):
    """Hydra applies overrides in order (``make bench ARGS=quant=fp8`` overrides the target's own ``quant=``); the
    earlier value used to be dropped unseen."""
    r = run_pipeline_cli("build.max_seq_len=256", "quant=fp8", "build.max_seq_len=512", "--cfg", "job", cwd=tmp_path, HF_HUB_OFFLINE="1")
    assert r.returncode == 0, r.stderr
    assert "note: build.max_seq_len is given 2 times (256, 512); the last, build.max_seq_len=512, is used." in r.stderr
    assert "max_seq_len: 512" in r.stdout and "quant is given" not in r.stderr


@pytest.mark.parametrize("group", ["quant", "model"])
def test_an_empty_group_value_names_the_presets_not_hydras_search_path(group):
    """``quant=`` used to end in Hydra's "Could not find 'quant/'" with its internal base_* schemas and HYDRA_FULL_ERROR."""
    with pytest.raises(ConfigError, match=rf"{group}=: names no {group} preset; valid: .*Fix: name one") as e:
        compose([f"{group}="])
    assert "base_" not in str(e.value) and "HYDRA_FULL_ERROR" not in str(e.value)
