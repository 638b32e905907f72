"""Findings of a fresh-user trial of the Python API and sweeps, one section each.

Old behaviour:
* ``pipeline -m quant=none ... quant=none,int8_sq``: the swept key was also a fixed override, so
  :func:`pipeline.cli.sweep_dirname_argv` excluded it from the job folder names (``0``, ``1``); with
  ``hydra.sweep.subdir=${hydra.job.override_dirname}`` both jobs wrote into one folder;
* ``pipeline.compose(["model.name=${nosuch}"])`` raised OmegaConf's ``InterpolationKeyError`` (no override, no fix);
  ``compose("model.name=x")`` read the str one character at a time (Hydra's parse error of override ``m``);
* ``pipeline.run({"stages": ["export"]})`` raised ``AttributeError: 'dict' object has no attribute 'stages'``, and a
  Hydra ``DictConfig`` of the pipeline's config a ``TypeError`` from deep in the runner;
* ``ExportArtifact("artifacts/export/k").hf_dir`` (every stage artifact class, given a str) raised
  ``TypeError: unsupported operand type(s) for /: 'str' and 'str'``;
* ``pipeline.plan(cfg)`` of a config the run refuses (``build.max_input_len=4096 build.max_seq_len=1024``) returned
  ``status='ok'``; ``pipeline plan`` printed that plan (``--json``: ``"status": "warn"``) above the problems.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from cli_run import run_pipeline_cli
from rich.console import Console

import pipeline
from pipeline.cli import sweep_dirname_argv
from pipeline.core.artifacts import STAGE_ARTIFACTS, artifact_classes
from pipeline.core.config import ConfigError, ConfigTypeError
from pipeline.errors import EXIT_INPUT, InputError

ROOT = Path(__file__).resolve().parents[2]
EXCLUDE = "hydra.job.config.override_dirname.exclude_keys="


# --------------------------------------------------------------------------- 1. a swept key also given a fixed value
def test_a_swept_key_is_never_excluded_from_the_job_folder_name():
    for argv in (
        ["-m", "quant=none", "model.name=tq", "quant=none,int8_sq"],
        ["-m", "quant=none,int8_sq", "model.name=tq", "quant=none"],
        ["-m", "quant=none", "model.name=tq", "hydra.sweeper.params.quant=choice(none,int8_sq)"],
    ):
        (extra,) = [a for a in sweep_dirname_argv(argv) if a.startswith(EXCLUDE)]
        assert extra == EXCLUDE + "[model.name]", (argv, extra)
    assert not [a for a in sweep_dirname_argv(["-m", "quant=none", "quant=none,int8_sq"]) if a.startswith(EXCLUDE)]


def test_a_sweep_of_a_key_also_given_fixed_writes_one_folder_per_job(tmp_path):
    """The real CLI, two jobs that stop at validation (no checkpoint): each job folder names its quant, and with the
    subdir of Hydra's docs (``${hydra.job.override_dirname}``, no job number) the two no longer share one folder."""
    common = ["model.path=/nonexistent", "stages=[export]", "progress=false", f"store_dir={tmp_path / 'store'}"]
    for sub, want in ((None, {"0-quant=none", "1-quant=int8_sq"}), ("${hydra.job.override_dirname}", {"quant=none", "quant=int8_sq"})):
        sweep = tmp_path / f"sweep-{bool(sub)}"
        extra = [f"hydra.sweep.subdir={sub}"] if sub else []
        r = run_pipeline_cli("-m", "quant=none", "quant=none,int8_sq", *common, f"hydra.sweep.dir={sweep}", *extra, cwd=tmp_path)
        assert r.returncode == 2, r.stderr[-3000:]  # both jobs refused (no checkpoint), after their folders were made
        jobs = {p.name for p in sweep.iterdir() if p.is_dir()}
        assert jobs == want, jobs
        assert all((sweep / j / "summary.json").is_file() for j in jobs)


# --------------------------------------------------------------------------- 2. compose: interpolations, a str
@pytest.mark.parametrize(
    "overrides,field,said",
    [
        (["model.name=${nosuch}"], "model.name", "it refers to 'nosuch', which is no key of the config."),
        (["model.name=${model.nosuch}"], "model.name", "it refers to 'model.nosuch', which is no key"),
        (["model.path=/ckpt/${nosuch}"], "model.path", "it refers to 'nosuch'"),  # model.name reads it: still model.path
        (["stages=[export,${nosuch}]"], "stages", "it refers to 'nosuch'"),
        (["model.name=${model.name}"], "model.name", "it refers to itself (a cycle)."),
        (["model.name=${nosuch:x}"], "model.name", "it calls the resolver 'nosuch', which is not registered."),
        (["model.name=${oc.env:PIPELINE_NO_SUCH_VARIABLE}"], "model.name", "'PIPELINE_NO_SUCH_VARIABLE' it reads is not set"),
        (["build.max_seq_len=${model.name}"], "build.max_seq_len", "the value it resolves to does not fit the field"),
    ],
)
def test_compose_refuses_an_interpolation_it_cannot_resolve(overrides, field, said):
    with pytest.raises(ConfigError) as e:
        pipeline.compose(overrides)
    err = e.value
    assert isinstance(err, InputError) and err.exit_code == EXIT_INPUT
    (p,) = err.problems
    assert p.field == field and str(p).startswith(f"{overrides[0]}: its ${{...}} interpolation cannot be resolved: "), str(p)
    assert said in str(p) and "Fix: " in str(p), str(p)


def test_compose_names_every_bad_interpolation_and_a_literal_one_composes():
    with pytest.raises(ConfigError) as e:
        pipeline.compose(["model.name=${nosuch}", "build.max_seq_len=${nosuch2}"])
    assert [p.field for p in e.value.problems] == ["model.name", "build.max_seq_len"]
    assert pipeline.compose([r"model.name=\${nosuch}"]).model.name == "${nosuch}"  # the escape the fix names
    assert pipeline.compose(["model.name=${model.path}"]).model.name == pipeline.compose([]).model.path  # a good one resolves


def test_a_preset_value_whose_interpolation_fails_is_named_by_its_field(tmp_path):
    """A value no override set (a user YAML's): the run refuses it with exit 2 naming the field and its value."""
    (tmp_path / "mine.yaml").write_text("model:\n  name: ${nosuch}\nstages: [export]\n", encoding="utf-8")
    r = run_pipeline_cli(
        "--config-dir", str(tmp_path), "--config-name", "mine", f"store_dir={tmp_path / 'store'}", "progress=false", cwd=tmp_path
    )
    assert r.returncode == EXIT_INPUT, r.stderr[-2000:]
    assert "model.name='${nosuch}': its ${...} interpolation cannot be resolved: it refers to 'nosuch'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Fix: " in r.stderr


@pytest.mark.parametrize(
    "arg,fix",
    [
        ("model.name=x", "compose(['model.name=x'])"),
        ("model.name=x quant=none", "compose(['model.name=x', 'quant=none'])"),
        ({"model.name": "x"}, 'compose([f"{k}={v}" for k, v in overrides.items()])'),
        (["model.name=x", 3], '"build.max_batch_size=8"'),
    ],
)
def test_compose_refuses_what_is_not_a_list_of_str(arg, fix):
    with pytest.raises(ConfigTypeError) as e:
        pipeline.compose(arg)
    err = e.value
    assert isinstance(err, TypeError) and isinstance(err, ConfigError) and err.exit_code == EXIT_INPUT
    assert fix in str(err) and "list" in str(err), str(err)
    assert pipeline.compose(("model.name=x",)).model.name == "x"  # a tuple is a list of overrides too


# --------------------------------------------------------------------------- 2. run: what it takes
@pytest.mark.parametrize(
    "cfg,fix",
    [
        ({"stages": ["export"]}, 'pipeline.compose([f"{k}={v}" for k, v in overrides.items()])'),
        (["quant=none", "stages=[export]"], "pipeline.compose(['quant=none', 'stages=[export]'])"),
        ("quant=none stages=[export]", "pipeline.compose(['quant=none', 'stages=[export]'])"),
    ],
)
def test_run_refuses_what_is_not_a_config_naming_what_it_takes(cfg, fix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigTypeError) as e:
        pipeline.run(cfg, console=Console(file=io.StringIO()))
    err = e.value
    assert isinstance(err, TypeError) and err.exit_code == EXIT_INPUT
    assert "run takes the PipelineConfig of pipeline.compose(...)" in str(err) and fix in str(err), str(err)
    assert not list(tmp_path.iterdir())  # refused before any work


def test_run_takes_a_hydra_dictconfig_of_the_pipeline_config(tmp_path):
    """A DictConfig composed by Hydra's own API (a user's @hydra.main app) runs as the CLI runs it: here validation
    refuses the missing checkpoint, the documented exit 2 in the summary, no exception."""
    from hydra import compose, initialize_config_dir

    from pipeline.core.config import CONFIG_DIR, register

    register()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        dc = compose("pipeline", ["model.path=/nonexistent", "stages=[export]", "progress=false", f"store_dir={tmp_path}"])
    summary = pipeline.run(dc, console=Console(file=io.StringIO()))
    assert summary.exit_code == EXIT_INPUT and "model.path='/nonexistent': not found" in str(summary.error), summary.error


# --------------------------------------------------------------------------- 3. artifact classes take a str
class _FolderLike:
    """An ``os.PathLike`` that is no ``Path``."""

    def __init__(self, p: str):
        self.p = p

    def __fspath__(self) -> str:
        return self.p


@pytest.mark.parametrize("stage", list(STAGE_ARTIFACTS))
def test_every_stage_artifact_class_takes_a_str_or_path_like(stage, tmp_path):
    cls = artifact_classes()[stage]
    assert getattr(pipeline, cls.__name__) is cls
    by_path = cls(tmp_path)
    for given in (str(tmp_path), _FolderLike(str(tmp_path))):
        art = cls(given)
        assert isinstance(art.path, Path) and art.path == tmp_path and art == by_path and hash(art) == hash(by_path)
        paths = {k: getattr(art, k) for k, v in vars(cls).items() if isinstance(v, property)}
        assert paths and all(isinstance(p, Path) and p.parent == tmp_path for p in paths.values()), paths
    with pytest.raises(dataclasses.FrozenInstanceError):
        by_path.path = tmp_path  # type: ignore[misc]
    with pytest.raises(TypeError, match=rf"{cls.__name__}\(path\): expected the artifact folder as a str or os.PathLike, got int"):
        cls(3)


def test_an_artifact_reader_works_from_a_str_folder(tmp_path):
    (tmp_path / "model_info.json").write_text(json.dumps({"eos_token_ids": [2], "architecture": "LlamaForCausalLM"}))
    info = pipeline.ExportArtifact(str(tmp_path)).model_info()
    assert tuple(info.eos_token_ids) == (2,) and info.architecture == "LlamaForCausalLM"


# --------------------------------------------------------------------------- 4. plan validates first
BAD_LENGTHS = ["model=llama31_8b", "target.gpu=h100_sxm", "quant=fp8", "build.max_input_len=4096", "build.max_seq_len=1024"]


def test_plan_refuses_what_validate_refuses_with_its_message():
    from pipeline.validation import validate

    cfg = pipeline.compose(BAD_LENGTHS)
    problems = validate(cfg, raise_on_error=False)
    assert "build.max_input_len" in [p.field for p in problems]
    with pytest.raises(ConfigError) as e:
        pipeline.plan(cfg)
    assert e.value.exit_code == EXIT_INPUT and str(e.value) == str(ConfigError(problems))
    assert pipeline.plan(pipeline.compose(BAD_LENGTHS[:3])).status == "ok"  # a valid config still plans


def test_pipeline_plan_refuses_it_without_a_plan(capsys):
    from pipeline.plan_cli import main as plan_main
    from pipeline.validation import validate

    want = str(ConfigError(validate(pipeline.compose(BAD_LENGTHS), raise_on_error=False)))
    assert plan_main(["--json", *BAD_LENGTHS]) == EXIT_INPUT
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == EXIT_INPUT and doc["error"] == want and doc["problems"] and "plan" not in doc, doc
    assert plan_main(BAD_LENGTHS) == EXIT_INPUT
    got = capsys.readouterr()
    err = " ".join(got.err.split())
    assert err.startswith("error (exit 2): 2 configuration problem(s): - build.max_input_len=4096: must be below"), err
    assert not got.out.strip(), got.out  # no plan table above the refusal
