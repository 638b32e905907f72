"""``pipeline plan --config-dir D --config-name N``: the plan of a user YAML, read by the run's own code (a fresh-user
trial: the plan refused the flags with argparse's "unrecognized arguments", exit 2, so a YAML-driven CI job could not
be planned)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.cli import user_config_argv
from pipeline.errors import InputError
from pipeline.plan_cli import main as plan_main

ROOT = Path(__file__).resolve().parents[2]


def _yaml(d: Path, name: str, text: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text(text)
    return d


@pytest.mark.parametrize("flags", [("--config-dir", "--config-name"), ("-cd", "-cn")])
def test_plan_plans_a_user_yaml_with_its_presets_and_values(tmp_path, capsys, flags):
    d = _yaml(tmp_path / "conf", "mine", "model: llama31_8b\nquant: fp8\ntarget:\n  gpu: h100_sxm\nbuild:\n  max_batch_size: 3\n")
    assert plan_main([flags[0], str(d), flags[1], "mine", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["plan"]
    assert (p["model"]["architecture"], p["model"]["num_parameters"]) == ("LlamaForCausalLM", 8030261248)  # llama31_8b
    assert (p["config"]["recipe"], p["config"]["max_batch_size"], p["target"]["key"]) == ("fp8", 3, "h100_sxm")
    # the command line still wins over the file, as in a run
    assert plan_main(["--config-dir", str(d), "--config-name", "mine", "--json", "quant=int8_sq"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["config"]["recipe"] == "int8_sq"


def _bomb() -> str:
    lines, prev = ["a: &a [x, x, x, x, x, x, x, x, x, x]"], "a"
    for name in "bcdef":
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 10)}]")
        prev = name
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text, said",
    [
        (_bomb(), "aliases expand to over 100,000 values"),
        ("model: {name: " + "x" * (1 << 20) + "}\n", "over the limit of 1,048,576"),
        ("build:\n  max_batch_size: two\n", "max_batch_size"),
    ],
    ids=["alias-bomb", "over-1MiB", "wrong-type"],
)
def test_plan_refuses_a_yaml_the_run_refuses_with_the_runs_message(tmp_path, capsys, text, said):
    d = _yaml(tmp_path / "conf", "bad", text)
    with pytest.raises(InputError) as run_error:  # the run's reading of the file (pipeline.cli)
        user_config_argv(["--config-dir", str(d), "--config-name", "bad"], tmp_path / "root")
    assert said in str(run_error.value)
    assert plan_main(["--config-dir", str(d), "--config-name", "bad"]) == 2
    assert capsys.readouterr().err.strip() == f"error (exit 2): {run_error.value}"
    assert plan_main(["-cd", str(d), "-cn", "bad", "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {"exit_code": 2, "error": str(run_error.value)}


def test_the_plan_command_and_the_run_print_the_same_refusal(tmp_path):
    d = _yaml(tmp_path / "conf", "bomb", _bomb())
    cmd = [str(ROOT / ".venv/bin/pipeline")]
    args = ["--config-dir", str(d), "--config-name", "bomb"]
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONPATH": str(ROOT)}  # this tree, wherever the venv was installed from
    run = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    planned = subprocess.run([*cmd, "plan", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert run.returncode == planned.returncode == 2, run.stderr + planned.stderr
    assert "aliases expand to over 100,000 values" in run.stderr and planned.stderr == run.stderr


@pytest.mark.parametrize(
    "what, name",
    [("file", "x"), ("missing", "x"), ("file", None)],
    ids=["a-file", "a-missing-folder", "a-file-without-config-name"],
)
def test_a_config_dir_that_is_no_folder_is_refused_alike_by_the_run_and_the_plan(tmp_path, what, name):
    """``--config-dir`` naming a file (or nothing): the run printed Hydra's "Additional config directory ... not
    found" (or, with --config-name, a message about --config-name listing "found there: []"). The run and the plan
    now refuse it with one message naming --config-dir, the value and the fix (exit 2)."""
    d = _yaml(tmp_path, "mine", "quant: fp8\n") / "mine.yaml" if what == "file" else tmp_path / "nowhere"
    cmd = [str(ROOT / ".venv/bin/pipeline")]
    args = ["--config-dir", str(d), *(["--config-name", name] if name else []), f"hydra.run.dir={tmp_path / 'run'}"]
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "400", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    planned = subprocess.run([*cmd, "plan", *args[:-1]], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    said = f"--config-dir={str(d)!r}: " + (
        f"is a file, not a folder. Fix: pass the file's folder and its name without .yaml: --config-dir={tmp_path} --config-name=mine"
        if what == "file"
        else "no such folder. Fix: name the folder holding your YAML"
    )
    for r in (run, planned):
        assert r.returncode == 2 and said in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
        assert "Additional config directory" not in r.stderr and "found there" not in r.stderr and "Traceback" not in r.stderr


def test_plan_plans_a_yaml_with_its_own_defaults_list_and_a_preset_kept_beside_it(tmp_path, capsys):
    d = _yaml(tmp_path / "conf", "full", "defaults:\n  - pipeline\n  - _self_\nquant:\n  recipe: fp8\n")
    _yaml(d / "model", "mybig", (ROOT / "build_configs/model/llama31_8b.yaml").read_text())
    assert plan_main(["-cd", str(d), "-cn", "full", "--json", "model=mybig", "target.gpu=h200"]) == 0
    p = json.loads(capsys.readouterr().out)["plan"]
    assert (p["config"]["recipe"], p["model"]["num_parameters"], p["target"]["key"]) == ("fp8", 8030261248, "h200")
