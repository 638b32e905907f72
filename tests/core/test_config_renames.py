"""Renamed config fields (issue 15, item 7): ``quant.kv_cache`` -> ``quant.kv_cache_dtype`` (TensorRT-LLM
``kv_cache_quant_algo`` / ``kv_cache_config.dtype``), ``calibration.num_samples`` -> ``calibration.calib_size`` and
``calibration.max_seq_len`` -> ``calibration.calib_max_seq_length`` (TensorRT-LLM ``quantize.py --calib_size`` /
``--calib_max_seq_length``).  The old spellings stay one release as deprecated aliases: honoured, warned about,
recorded in the run summary, outside the cache keys; both spellings set to different values is refused (exit 2).

Old behaviour: the new names did not exist (compose refused them), so every test here fails on it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import ConfigError, compose, deprecations
from pipeline.core.stage import get_stage
from pipeline.runner import compute_key, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
RENAMES = [
    ("quant.kv_cache", "quant.kv_cache_dtype", "fp8"),
    ("calibration.num_samples", "calibration.calib_size", 64),
    ("calibration.max_seq_len", "calibration.calib_max_seq_length", 96),
    ("quant.tp_size", "parallel.tp_size", 2),  # moved to another group: a cross-group alias
    ("quant.pp_size", "parallel.pp_size", 2),
]


def _get(cfg, path):
    for p in path.split("."):
        cfg = getattr(cfg, p)
    return cfg


def _alias_paths(obj, prefix=""):
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            yield from _alias_paths(v, f"{prefix}{f.name}.")
        elif "alias_of" in f.metadata:
            target = f.metadata["alias_of"]
            yield prefix + f.name, target if "." in target else prefix + target, f


def test_every_alias_is_listed_documented_and_outside_the_key():
    found = {(old, new) for old, new, _ in _alias_paths(compose([]))}
    assert found == {(o, n) for o, n, _ in RENAMES}
    for _old, new, f in _alias_paths(compose([])):
        assert f.default is None and f.metadata["cache"] is False
        assert "deprecated alias of" in f.metadata["doc"] and new.rsplit(".", 1)[1] in f.metadata["doc"]


@pytest.mark.parametrize("old,new,value", RENAMES)
def test_old_spelling_is_honoured_warns_and_gives_the_same_keys(old, new, value, caplog):
    base = ["calibration=generic_v1", "quant=int4_awq"] + (["target=tensorrt_llm"] if value == "fp8" else [])
    with caplog.at_level(logging.WARNING, logger="pipeline.core.config"):
        a = compose(base + [f"{old}={value}"])
    assert _get(a, new) == value
    assert any(old in r.getMessage() and new in r.getMessage() for r in caplog.records)
    assert deprecations(a) and old in deprecations(a)[0] and new in deprecations(a)[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.core.config"):
        b = compose(base + [f"{new}={value}"])
    assert not caplog.records and deprecations(b) == []
    assert _get(b, new) == value and _get(b, old) is None
    for stage in ("quantize", "build"):
        st = get_stage(stage)
        ka, da = compute_key(st, a, {}, {})
        kb, db = compute_key(st, b, {}, {})
        assert ka == kb, (stage, da["config"], db["config"])
    # a preset's value of the new field gives way to the old spelling on the command line (generic_v1 sets both)
    assert _get(compose(["calibration=generic_v1", f"{old}={value}"]), new) == value


@pytest.mark.parametrize("old,new,value", RENAMES)
def test_both_spellings_different_is_refused_naming_both(old, new, value):
    other = "int8" if value == "fp8" else value + 1
    with pytest.raises(ConfigError) as e:
        compose([f"{old}={value}", f"{new}={other}"])
    assert old in str(e.value) and new in str(e.value)
    assert _get(compose([f"{old}={value}", f"{new}={value}"]), new) == value  # same value: accepted


def test_without_overrides_a_non_default_new_value_conflicts():
    """to_object on a config built elsewhere (no command line known): any non-default new value must agree."""
    from pipeline.core.config import resolve_aliases

    cfg = compose([])
    cfg.calibration.calib_size, cfg.calibration.num_samples = 100, 50
    with pytest.raises(ConfigError, match="calibration.num_samples.*calibration.calib_size"):
        resolve_aliases(cfg)


def test_run_summary_records_the_deprecations(tmp_path):
    cfg = compose(["quant.kv_cache=none", "calibration.num_samples=64"])
    cfg.stages = []  # refused by validation: the run ends before any stage, the summary is still written
    s = run_pipeline(cfg, summary_dir=tmp_path, console=Console(file=io.StringIO()))
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert s.exit_code == 2
    assert [d.split(" ")[0] for d in doc["deprecations"]] == ["calibration.num_samples", "quant.kv_cache"]


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_cli_shows_new_names_and_refuses_conflicts_with_exit_2(tmp_path):
    r = _cli("--cfg", "job")
    assert r.returncode == 0, r.stderr
    for _, new, _ in RENAMES:
        assert f"  {new.split('.')[1]}: " in r.stdout
    r = _cli("calibration.num_samples=64", "calibration.calib_size=32", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "calibration.num_samples" in r.stderr and "calibration.calib_size" in r.stderr


def test_a_run_shows_each_deprecation_once(tmp_path):
    """A run printed each deprecated spelling twice: the warning logged when the config is resolved, then the same
    warning from the runner (new-user trial).  Now once; the run summary still records it."""
    r = _cli(
        "calibration.num_samples=8",
        "calibration.min_samples=8",
        "stages=[export]",
        "dry_run=true",
        f"store_dir={tmp_path / 'store'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert out.count("calibration.num_samples is a deprecated alias") == 1, out
    doc = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [d.split(" ")[0] for d in doc["deprecations"]] == ["calibration.num_samples"]
