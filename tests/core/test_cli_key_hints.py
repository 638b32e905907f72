"""Did-you-mean for unknown override keys: eval.path -> eval.eval_set (targeted), parallel.tp -> parallel.tp_size
(a shortened leaf)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from pipeline.cli import check_overrides


def _one(arg: str) -> str:
    out = check_overrides([arg])
    assert len(out) == 1, out
    return out[0]


def test_eval_path_suggests_eval_set():
    assert "did you mean eval.eval_set" in _one("eval.path=x.jsonl")


def test_shortened_leaf_suggests_the_full_key():
    assert "did you mean parallel.tp_size" in _one("parallel.tp=2")


def test_plus_override_of_a_field_nothing_reads_is_refused(tmp_path):
    """``+key=v`` makes Hydra add a key the schema lacks; the pipeline would never read it, so it is refused like a
    misspelt key, through the real command (exit 2).  Adding a key to a dict-valued field stays Hydra's business."""
    import subprocess
    import sys

    assert "did you mean package.parity" in _one("+package.parit=false")
    assert "no such field in the top level" in _one("+foo.bar=3")
    assert check_overrides(["++package.parity=false", "+eval.gate.max_drop_by_recipe.new_recipe=0.1"]) == []
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "+package.foo=3", "stages=[export]", f"store_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "package.foo: no such field in package" in r.stderr + r.stdout, (r.returncode, r.stderr[-2000:])
    assert not (tmp_path / "export").exists()


def test_a_boolean_set_to_another_number_is_refused():
    """OmegaConf reads any nonzero integer as true; the config refuses 2 (a typo, or a count meant for another key)
    and keeps OmegaConf's boolean spellings."""
    import pytest

    from pipeline.core.config import ConfigError, compose

    # compose says what the command line says (pipeline.core.config.overrides)
    with pytest.raises(ConfigError, match=r"package.parity=2: not a boolean. Fix: package.parity=true or package.parity=false"):
        compose(["package.parity=2"])
    with pytest.raises(ConfigError, match=r"progress=-1: not a boolean"):
        compose(["progress=-1"])
    assert compose(["package.parity=yes"]).package.parity is True
    assert compose(["package.parity=0", "progress=false"]).package.parity is False
    assert compose(["eval.gate.seed=5"]).eval.gate.seed == 5  # an int field is not touched


def test_stages_without_brackets_says_it_is_a_list():
    assert "Fix: stages=[quantize]" in _one("stages=quantize")
    assert check_overrides(["stages=[export,quantize]"]) == []


def test_gate_allowances_out_of_range_are_refused_with_the_scale():
    """eval.gate.max_drop=5 (meant as 5 pp) would allow a 500 pp drop: every absolute share is checked to [0, 1], the
    fix converting a percentage; the per-recipe tables too."""
    import pytest

    from pipeline.core.config import ConfigError, compose, validate

    def problems(*o: str) -> list[str]:
        with pytest.raises(ConfigError) as e:
            validate(compose(list(o)))
        return [str(p) for p in e.value.problems]

    (p,) = problems("eval.gate.max_drop=5")
    assert "eval.gate.max_drop=5.0: must be in [0, 1]" in p and "Fix: e.g. eval.gate.max_drop=0.05" in p
    assert "eval.gate.slice_max_drop=-0.1" in problems("eval.gate.slice_max_drop=-0.1")[0]
    assert "eval.gate.min_score=90.0" in problems("eval.gate.min_score=90")[0]
    assert "must be >= 0 (nats)" in problems("eval.gate.max_kld_by_recipe.int4_awq=-1")[0]
    assert "eval.gate.max_drop_by_recipe.int4_awq=3.0" in problems("eval.gate.max_drop_by_recipe.int4_awq=3")[0]
    validate(compose(["eval.gate.max_drop=1.0", "eval.gate.slice_max_drop=0", "eval.gate.min_score=0.5"]))


def test_a_value_of_the_wrong_type_gets_a_fix():
    """Hydra said "Value 'maybe' is not a valid bool" with no fix; each scalar type now names its fix, and values that
    convert (OmegaConf's boolean words, numbers, null for an optional field, each value of a sweep) pass."""
    assert _one("package.parity=maybe") == "package.parity=maybe: not a boolean. Fix: package.parity=true or package.parity=false."
    assert "not a number. Fix: eval.gate.max_drop=<number> or null." in _one("eval.gate.max_drop=abc")
    assert "not a whole number. Fix: eval.limit=<integer> or null." in _one("eval.limit=ten")
    assert "eval.gate.max_drop=x" in _one("eval.gate.max_drop=0.05,x")
    ok = [
        "package.parity=Yes",
        "progress=off",
        "eval.gate.max_drop=0.05,0.1",
        "eval.limit=null",
        "eval.limit=12",
        "eval.gate.seed=${oc.env:SEED,0}",
    ]
    assert check_overrides(ok) == []


def test_a_user_yaml_is_checked_like_the_command_line(tmp_path):
    """A plain user YAML (--config-dir/--config-name) went to Hydra unchecked: `parity: 2` was read as true, `foo: 1`
    got Hydra's bare ConfigKeyError, `stages: quantize` a type error. Its values are now judged as overrides."""
    import pytest

    from pipeline.cli import user_config_argv
    from pipeline.errors import InputError

    def refusal(text: str) -> str:
        (tmp_path / "mine.yaml").write_text(text)
        with pytest.raises(InputError) as e:
            user_config_argv(["--config-dir", str(tmp_path), "--config-name", "mine"], tmp_path / "root")
        return str(e.value)

    assert "mine.yaml: package.parity=2: not a boolean" in refusal("package:\n  parity: 2\n")
    err = refusal("foo: 1\npackage:\n  foo: 3\n")
    assert "foo: no such field in the top level" in err and "package.foo: no such field in package" in err
    assert "stages=quantize: stages is a list" in refusal("stages: quantize\n")
    (tmp_path / "ok.yaml").write_text(
        'progress: "yes"\nstages: [export]\nquant: int4_awq\neval:\n  gate:\n    max_drop_by_recipe:\n      int4_awq: 0.04\n'
    )
    argv = user_config_argv(["--config-dir", str(tmp_path), "--config-name", "ok"], tmp_path / "root2")
    assert "quant=int4_awq" in argv


def test_deleting_a_schema_group_or_field_is_refused():
    """``~build`` made OmegaConf crash with a traceback (found by tests/contracts/test_fuzz.py); deleting what the schema needs is
    refused with the fix, and Hydra's own keys stay Hydra's."""
    assert "~build: deletes build" in _one("~build") and "Fix: set it instead (build=<value>)" in _one("~build")
    assert "~quant.group_size: deletes quant.group_size" in _one("~quant.group_size")
    assert check_overrides(["~hydra.run"]) == []


@pytest.mark.parametrize(
    "args,code",
    [
        (["benchmark", "show", "bench/results/default.json"], 0),
        # rich's Console exits 1 on a broken pipe (plan, doctor, compare); the help's print left a traceback
        (["plan"], 0),
        (["doctor"], 0),
        (["benchmark", "compare", "bench/results/default.json", "bench/results/llama80m.json"], 0),
        (["--help"], 0),
        # a second trial: the broken pipe turned a refusal into exit 0, and a run into exit 1 with no summary
        (["plan", "model=llama31_8b", "parallel.tp_size=2"], 4),
        (["doctor", "--require", "tensorrt_llm"], 4),
        (["dry_run=true", "store_dir=store", "hydra.run.dir=run"], 0),
    ],
)
def test_a_reader_that_stops_reading_gets_no_traceback_and_the_commands_own_exit_code(tmp_path, args, code):
    """`pipeline benchmark show x.json | head` ended in a BrokenPipeError traceback (fresh-user trial); `pipeline plan
    | head -1` exited 1. The reader here closes the pipe before the command writes, so every write fails: the
    command runs on with its output dropped and exits with its own code (a run writes its summary)."""
    import subprocess
    import sys
    from pathlib import Path

    if "--require" in args and importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("TensorRT-LLM is installed: doctor --require passes")
    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *[str(root / a) if a.startswith("bench/") else a for a in args]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == code and "Traceback" not in err, err[-2000:]
    if args[0] == "dry_run=true":
        assert json.loads((tmp_path / "run" / "summary.json").read_text())["exit_code"] == 0


def test_a_bare_word_that_is_no_subcommand_is_refused_by_us(capsys):
    """`pipeline frobnicate` (close to no subcommand) printed Hydra's raw "missing EQUAL" parse error while `pipeline
    docter` got a did-you-mean (fresh-user trial): any bare word without `=` is an unknown subcommand, exit 2; flags,
    overrides (`+`/`~` included) and `migrate` still reach the run."""
    from pipeline.cli import _subcommand

    with pytest.raises(SystemExit) as e:
        _subcommand(["frobnicate", "quant=none"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unknown subcommand 'frobnicate'" in err and "'plan'" in err and "key=value" in err, err
    for argv in (["--cfg", "job"], ["-m", "quant=none,fp8"], ["quant=none"], ["~hydra.run"], ["+foo"], ["migrate", "x"], []):
        assert _subcommand(argv) is None, argv


@pytest.mark.parametrize(
    "word, said",
    [
        ("quant", "pipeline quant=<preset>, one of ['auto', 'fp8', 'int4_awq'"),
        ("quantize", "to run the stages up to quantize: pipeline stages=[quantize]"),
        ("evalute", "pipeline stages=[evaluate]"),
        ("modl", "pipeline model=<preset>, one of ["),
    ],
)
def test_a_bare_word_that_names_a_stage_or_a_config_group_gets_the_override(capsys, word, said):
    """`pipeline quant` and `pipeline quantize` listed the subcommands only (a recheck): the override that does what the
    word most likely meant is offered, with the presets of a group; the presets are read from build_configs/."""
    from pipeline.cli import _subcommand

    with pytest.raises(SystemExit) as e:
        _subcommand([word])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"unknown subcommand {word!r}" in err and said in err, err


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_is_the_pipelines(capsys, flag):
    """`pipeline --version` printed Hydra's ("Hydra 1.3.8")."""
    from pipeline import __version__
    from pipeline.cli import _subcommand

    with pytest.raises(SystemExit) as e:
        _subcommand([flag])
    assert e.value.code == 0 and capsys.readouterr().out == f"pipeline {__version__}\n"


def test_help_is_plain_text(capsys):
    """`pipeline --help` printed the module docstring's reStructuredText (double backticks, :mod:`pipeline.errors`)."""
    import re

    from pipeline.cli import _subcommand

    with pytest.raises(SystemExit) as e:
        _subcommand(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "pipeline plan [overrides]" in out and "docs/cli.md" in out
    assert not re.search(r"``|:\w+:`", out), out


@pytest.mark.parametrize(
    "args,code",
    [(["plan", "model=llama31_8b", "parallel.tp_size=2"], 4), (["frobnicate"], 2), (["plan", "model.path=."], 2)],
)
def test_a_reader_of_stdout_and_stderr_that_stops_reading_leaves_the_exit_code(tmp_path, args, code):
    """A recheck: ``pipeline ... 2>&1 | head`` ended a run with exit 1 and no summary (a progress bar on stderr met
    the closed pipe), and ``pipeline frobnicate 2>&1 | true`` exited 1, not 2: stderr is wrapped as stdout is."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    p.stdout.close()
    assert p.wait(timeout=300) == code
