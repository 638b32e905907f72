"""Config: every shipped preset composes and validates; bad keys/types fail at compose time; CLI exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.config import CONFIG_DIR, GROUPS, compose
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = [sys.executable, "-m", "pipeline"]

_KV = re.compile(r"^[\w.+~/-]+=[^\s`]+$")


def documented_overrides(group: str, preset: str) -> list[str]:
    """The overrides of the command a preset's leading comment documents (``# ... pipeline a=b c=d``).

    Each preset is validated in the combination its own comment tells users to run (e.g.
    ``target=tensorrt_llm build=latency``); placeholders (``target.gpu=...``) and alternatives
    (``fp8|int8``) are skipped.  The preset itself is always selected.
    """
    comment = []
    for line in (CONFIG_DIR / group / f"{preset}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# "))
    out: list[str] = []
    m = next((m for m in (re.search(r"\bpipeline\s+(.*)", line) for line in comment) if m), None)  # first command line only
    for tok in m.group(1).split() if m else []:
        if tok.startswith("("):
            break
        tok = tok.rstrip("`.,;")
        if (
            _KV.match(tok)
            and "..." not in tok
            and "|" not in tok
            and "," not in tok.split("=", 1)[1].strip("[]")
            or tok.startswith("stages=[")
        ):
            out.append(tok)
    if f"{group}={preset}" not in out:
        out.append(f"{group}={preset}")
    if group == "calibration" and not any(o.startswith("quant=") for o in out):
        out.insert(0, "quant=int4_awq")  # calibration is only validated when a quantized recipe runs
    return out


def _presets() -> list[tuple[str, str]]:
    """(group, preset) for every YAML under build_configs/<group>/ (discovered, so new presets are covered)."""
    out = []
    for g in sorted(p for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name in GROUPS):
        for f in sorted(g.glob("*.yaml")):
            out.append((g.name, f.stem))
    return out


def test_every_group_has_presets():
    groups = {g for g, _ in _presets()}
    assert groups == set(GROUPS), f"groups without a preset: {set(GROUPS) - groups}"


@pytest.mark.parametrize(("group", "preset"), _presets(), ids=[f"{g}={p}" for g, p in _presets()])
def test_shipped_preset_composes_and_validates(group, preset):
    overrides = documented_overrides(group, preset)
    cfg = compose(overrides)
    node = getattr(cfg, group)
    assert type(node) is GROUPS[group]  # the preset extends the typed schema (Defaults List: base_<group>)
    problems = validate(cfg, raise_on_error=False)
    assert not problems, f"pipeline {' '.join(overrides)}:\n" + "\n".join(str(p) for p in problems)


def test_preset_yaml_starts_with_the_command_that_uses_it():
    missing = [f"{g}/{p}.yaml" for g, p in _presets() if not (CONFIG_DIR / g / f"{p}.yaml").read_text().lstrip().startswith("#")]
    assert not missing, f"presets without a leading comment: {missing}"


def test_unknown_key_fails_at_compose_time_naming_the_key():
    with pytest.raises(Exception) as ei:
        compose(["build.max_batch_sizee=4"])
    assert "max_batch_sizee" in str(ei.value)
    with pytest.raises(Exception) as ei:
        compose(["model.nope=1"])
    assert "nope" in str(ei.value)


def test_wrong_type_fails_at_compose_time_naming_the_key():
    with pytest.raises(Exception) as ei:
        compose(["build.max_batch_size=lots"])
    assert "max_batch_size" in str(ei.value) and "lots" in str(ei.value)
    with pytest.raises(Exception) as ei:
        compose(["model.trust_remote_code=maybe"])
    assert "trust_remote_code" in str(ei.value)


def test_stage_list_override_parses():
    cfg = compose(["stages=[export,quantize]"])
    assert cfg.stages == ["export", "quantize"]
    assert compose([]).stages[0] == "export"


def test_validation_collects_every_problem():
    cfg = compose(["model.dtype=int8", "stages=[export,bogus]"])
    problems = validate(cfg, raise_on_error=False)
    fields = {p.field for p in problems}
    assert {"model.dtype", "stages"} <= fields
    assert any("float16" in str(p) for p in problems if p.field == "model.dtype")


@pytest.mark.parametrize(
    "field,value", [("eval.max_new_tokens", -1), ("eval.max_new_tokens", 0), ("eval.worst_regressions", -1), ("eval.torch_threads", -2)]
)
def test_eval_counts_out_of_range_are_refused(field, value):
    """eval.max_new_tokens=-1 was accepted and the whole evaluation ran with it."""
    problems = validate(compose([f"{field}={value}"]), raise_on_error=False)
    assert field in {p.field for p in problems}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="dumb", COLUMNS="200")
    return subprocess.run([*PIPELINE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_cli_prints_the_resolved_config(tmp_path):
    r = _cli("--cfg", "job", "quant=int4_awq", "stages=[export,quantize]", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "recipe: int4_awq" in r.stdout and "- export" in r.stdout and "model:" in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["model.nope=1"],  # unknown key (Hydra composition error)
        ["build.max_batch_size=lots"],  # wrong type
        ["quant=int3_magic"],  # unknown preset
        ["model.dtype=int8", "stages=[export]"],  # composes, fails validation inside the run
    ],
    ids=["unknown-key", "wrong-type", "unknown-preset", "invalid-value"],
)
def test_cli_config_error_exits_2(args, tmp_path):
    r = _cli(*args, f"hydra.run.dir={tmp_path / 'run'}", f"store_dir={tmp_path / 'store'}", cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    out = r.stdout + r.stderr
    key = {
        "model.nope=1": "nope",
        "build.max_batch_size=lots": "max_batch_size",
        "quant=int3_magic": "int3_magic",
        "model.dtype=int8": "model.dtype",
    }[args[0]]
    assert key in out


@pytest.mark.parametrize(
    "arg,expect",
    [
        ("eval.path=/x.jsonl", "eval_set"),  # Hydra suggested `+eval.path=...`, which would add an unknown field
        ("quant=int5", "int4_awq"),  # Hydra printed its search path, base_quant and HYDRA_FULL_ERROR
        ("eval.gate.max_dropp=1", "did you mean eval.gate.max_drop"),
    ],
)
def test_unknown_field_or_preset_names_the_valid_ones(arg, expect):
    from pipeline.cli import check_overrides

    problems = check_overrides([arg])
    assert len(problems) == 1 and arg.split("=")[0] in problems[0] and expect in problems[0], problems
    assert "base_" not in problems[0] and "HYDRA_FULL_ERROR" not in problems[0]
    assert check_overrides(["quant=int4_awq", "eval.eval_set=/x", "hydra.run.dir=x", "-m"]) == []
    # +key adds a field nothing reads: refused like a misspelt key (tests/core/test_cli_key_hints.py)
    assert len(check_overrides(["+model.extra=1"])) == 1
