"""Config findings of a new-user trial, one per test.

Old behaviour:
* a ``-m`` sweep with about 14 overrides crashed with ``OSError: [Errno 36] File name too long``: each job folder
  joined every override (``0-build.max_batch_size=16,...``) and a path value nested folders;
* ``pipeline.compose(['+eval.gate.confdence=1.5', '+build.foo=1'])`` composed (``validate`` gave [], ``run`` exit 0)
  while the CLI refuses ``+`` keys; ``compose(['build.foo=1'])`` raised Hydra's ``ConfigCompositionException``
  (suggesting ``+build.foo=1``), ``compose(['quant=int4_awk'])`` Hydra's ``MissingConfigException`` listing the
  internal ``base_quant``; ``ConfigError`` had no ``exit_code``;
* ``pipeline model.name=a=b`` / ``model.name=模型`` printed Hydra's raw parse error and "Set HYDRA_FULL_ERROR=1";
* ``stages=[export,export]`` and ``stages=[quantize,export]`` were accepted without a word.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from cli_run import run_pipeline_cli
from rich.console import Console

import pipeline
from pipeline.cli import MAX_JOB_DIRNAME, job_dirname, sweep_dirname_argv
from pipeline.core.config import ConfigError
from pipeline.errors import EXIT_INPUT, InputError

ROOT = Path(__file__).resolve().parents[2]
EXCLUDE = "hydra.job.config.override_dirname.exclude_keys="


# --------------------------------------------------------------------------- 1. sweep job folder names
def test_job_dirname_is_flat_short_and_redacted():
    assert job_dirname(0, "quant=none") == "0-quant=none"
    assert job_dirname(3, "") == "3"
    assert job_dirname(1, "model.path=/data/m,quant=fp8") == "1-model.path=_data_m,quant=fp8"  # no nested folder
    long = "model.path=/" + "a" * 300
    name = job_dirname(12, long)
    assert len(name) == len("12-") + MAX_JOB_DIRNAME and "/" not in name and re.fullmatch(r"12-model\.path=_a+-[0-9a-f]{8}", name)
    assert job_dirname(12, long + "b") != name  # the hash keeps two long names apart
    token = "hf_" + "Ab3" * 12
    assert token not in job_dirname(0, f"model.name={token}")


def test_sweep_names_only_the_swept_keys():
    argv = ["-m", "quant=none,int8_wo", "model.path=/tmp/x", "model.name=tq", "eval.eval_set=/tmp/e.jsonl", "stages=[export]"]
    out = sweep_dirname_argv(argv)
    (extra,) = [a for a in out if a.startswith(EXCLUDE)]
    assert extra == EXCLUDE + "[model.path,model.name,eval.eval_set,stages]"
    assert out.index(extra) == 2  # inside the run of overrides (Hydra's argparse takes one)
    assert sweep_dirname_argv(argv[1:]) == argv[1:]  # no sweep: unchanged
    own = [*argv, EXCLUDE + "[]"]
    assert sweep_dirname_argv(own) == own  # the user's own exclude list wins


def test_a_sweep_with_many_overrides_and_swept_paths_writes_flat_short_job_folders(tiny_llama, tmp_path):
    """The trial's shape: fourteen overrides with path values, and here the swept values are paths too (one over the
    name limit); the real CLI runs both export jobs and the comparison finds them."""
    long_link = tmp_path / ("checkpoint-with-a-long-descriptive-name-" + "x" * 60)
    long_link.symlink_to(tiny_llama, target_is_directory=True)
    sweep = tmp_path / "sweep"
    r = run_pipeline_cli(
        "-m",
        f"model.path={tiny_llama},{long_link}",
        "target=onnxruntime_genai",
        f"eval.eval_set={tmp_path / 'e.jsonl'}",
        "build.max_batch_size=16",
        "build.max_seq_len=256",
        "build.max_input_len=128",
        "eval.limit=8",
        "eval.gate.mode=exploratory",
        "calibration.calib_size=16",
        "package.parity=false",
        "model.dtype=float32",
        f"store_dir={tmp_path / 'store'}",
        "progress=false",
        "stages=[export]",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert [j.split("-", 1)[0] for j in jobs] == ["0", "1"], jobs
    for j in jobs:
        assert re.fullmatch(r"[01]-model\.path=[A-Za-z0-9._,=+-]+", j) and len(j) <= 2 + MAX_JOB_DIRNAME, j
        assert (sweep / j / "summary.json").is_file()
    doc = json.loads((sweep / "comparison.json").read_text())
    assert sorted(row["job"] for row in doc["rows"]) == jobs and {row["exit_code"] for row in doc["rows"]} == {0}


# --------------------------------------------------------------------------- 2. compose refuses as the CLI does
@pytest.mark.parametrize(
    "overrides,field,said",
    [
        (["+eval.gate.confdence=1.5", "+build.foo=1"], "eval.gate.confdence", "did you mean eval.gate.confidence?"),
        (["build.foo=1"], "build.foo", "no such field in build"),
        (["quant=int4_awk"], "quant", "did you mean int4_awq"),
    ],
)
def test_compose_refuses_what_the_cli_refuses(overrides, field, said):
    with pytest.raises(ConfigError) as e:
        pipeline.compose(overrides)
    err = e.value
    assert isinstance(err, InputError) and err.exit_code == EXIT_INPUT
    assert err.problems[0].field == field and said in str(err) and "Fix:" in str(err), str(err)
    assert "base_quant" not in str(err) and "+build.foo" not in str(err) and "HYDRA_FULL_ERROR" not in str(err)
    assert len(err.problems) == len(overrides)


def test_config_error_is_exit_2_in_the_run_summary(tmp_path):
    """A ConfigError from validation is the documented exit 2 of the Python API's run, with no stage blamed."""
    cfg = pipeline.compose(["stages=[export,export]", f"store_dir={tmp_path}", "progress=false"])
    summary = pipeline.run(cfg, console=Console(file=io.StringIO()))
    assert summary.exit_code == EXIT_INPUT and "listed more than once" in str(summary.error)
    assert not (tmp_path / "export").exists()


# --------------------------------------------------------------------------- 3. override grammar errors
@pytest.mark.parametrize("arg,fix", [("model.name=a=b", """'model.name="a=b"'"""), ("model.name=模型", """'model.name="模型"'""")])
def test_an_override_hydra_cannot_parse_is_refused_in_the_pipelines_format(arg, fix, tmp_path):
    r = run_pipeline_cli(arg, "stages=[export]", f"store_dir={tmp_path / 'store'}", cwd=tmp_path)
    assert r.returncode == EXIT_INPUT, r.stderr[-2000:]
    err = r.stderr.strip()
    assert err.startswith(f"error (exit 2): {arg}: Hydra cannot parse this override") and err.endswith(f"{fix}."), err
    assert "HYDRA_FULL_ERROR" not in err and "Exception" not in err and "Traceback" not in err
    with pytest.raises(ConfigError, match=re.escape(fix)):
        pipeline.compose([arg])
    assert pipeline.compose([fix.strip("'")]).model.name == arg.split("=", 1)[1]  # the fix works


# --------------------------------------------------------------------------- 4. stages: repeated, out of order
def test_a_stage_listed_twice_is_refused_naming_it():
    problems = pipeline.validate(pipeline.compose(["stages=[export,quantize,export]"]), raise_on_error=False)
    (p,) = [p for p in problems if p.field == "stages"]
    assert p.value == "export" and "more than once" in p.message and "stages=[export,quantize]" in p.fix


def test_stages_out_of_order_run_in_pipeline_order_and_say_so(tmp_path):
    cfg = pipeline.compose(["stages=[quantize,export]", f"store_dir={tmp_path}", "dry_run=true", "progress=false"])
    assert pipeline.validate(cfg, raise_on_error=False) == []
    out = io.StringIO()
    summary = pipeline.run(cfg, console=Console(file=out, width=200))
    assert summary.exit_code == 0, summary.error
    assert [s.stage for s in summary.stages] == ["export", "quantize"]
    notes = [ln for ln in out.getvalue().splitlines() if "pipeline order" in ln]
    assert notes == ["note: stages=[quantize,export]: stages run in pipeline order (export, quantize), whatever the order written"]
    quiet = io.StringIO()
    pipeline.run(pipeline.compose(["stages=[export,quantize]", f"store_dir={tmp_path}", "dry_run=true"]), console=Console(file=quiet))
    assert "pipeline order" not in quiet.getvalue()


def test_a_failed_runs_error_line_goes_to_stderr_and_the_summary_to_stdout(tmp_path):
    """Issue 36: the run summary's ``error (exit N): ...`` line was printed with the table on stdout (every other
    error line of the CLI is on stderr); now stdout keeps the table and stderr has the error line, unwrapped."""
    r = run_pipeline_cli(
        "model.path=/nonexistent/ckpt", "stages=[export]", f"store_dir={tmp_path / 'store'}", "progress=false", cwd=tmp_path
    )
    assert r.returncode == EXIT_INPUT, r.stdout[-2000:] + r.stderr[-2000:]
    assert "error (exit" not in r.stdout and "│ export │ failed" in r.stdout, r.stdout
    line = next((ln for ln in r.stderr.splitlines() if ln.startswith("error (exit 2): ")), None)
    assert line is not None, r.stderr
    assert "model.path='/nonexistent/ckpt': not found" in line and "Fix: point model.path" in line, line  # one line, unwrapped


# --------------------------------------------------------------------------- an empty model.path
@pytest.mark.parametrize(("value", "shown"), [("", "''"), ("'  '", "'  '"), ("null", "None")], ids=["empty", "blank", "null"])
def test_an_empty_model_path_is_a_configuration_problem_for_the_run_and_the_plan(tmp_path, value, shown):
    """A fresh-user trial: ``pipeline model.path= stages=[export]`` looked for ``<cwd>/config.json`` (from the repo
    root it complained about a .venv symlink), titled "model model (checkpoint folder)"; ``pipeline plan model.path=``
    said "neither model.path nor model.hf_config is set". Both now refuse it with one message (exit 2), naming the
    field, the value and the fix, before any stage (the store is not created). ``model.path=null`` likewise, once."""
    expected = f"model.path={shown}: " + ("no checkpoint given." if value == "null" else "is empty; it must name a checkpoint folder")
    store = tmp_path / "store"
    run = run_pipeline_cli(
        f"model.path={value}", "stages=[export]", f"store_dir={store}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path
    )
    planned = run_pipeline_cli("plan", f"model.path={value}", cwd=tmp_path)
    for r in (run, planned):
        assert r.returncode == EXIT_INPUT and expected in r.stderr and "Fix: pass model.path=" in r.stderr, r.stderr[-2000:]
        assert "config.json" not in r.stderr and "neither model.path" not in r.stderr
        assert "1 configuration problem(s)" in r.stderr  # model.path=null: the run listed it twice, in two wordings
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stages"][0]["status"] == "not-run"
    assert not store.exists()
    # the title names no model where there is none (it read "model model (checkpoint folder), dtype float32 (checkpoint
    # torch_dtype)", "model model (config)" for null)
    assert "pipeline run" in [ln.strip() for ln in run.stdout.splitlines()] and "model model" not in run.stdout, run.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["model"] is None
    with pytest.raises(ConfigError, match=re.escape(expected)):
        pipeline.plan(pipeline.compose([f"model.path={value}"]))
