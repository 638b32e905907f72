"""``hydra.*`` overrides where no Hydra app runs: ``pipeline.compose`` (the Python API), ``pipeline plan`` and
``pipeline serve`` composed the config with Hydra's compose API, which drops them without a word, so
``hydra.run.dir=/x`` was accepted and ignored (fresh-user trial).  They are refused: ``ConfigError`` / exit 2, naming
the override and what to use instead."""

from __future__ import annotations

import pytest

import pipeline
from pipeline.core.config import ConfigError


@pytest.mark.parametrize("arg", ["hydra.run.dir=/tmp/x", "+hydra.job.name=mine", "hydra/launcher=basic", "~hydra.verbose"])
def test_compose_refuses_a_hydra_setting_naming_it_and_the_api_argument(arg):
    with pytest.raises(ConfigError) as e:
        pipeline.compose(["quant=none", arg])
    assert e.value.exit_code == 2
    [p] = e.value.problems
    msg = str(e.value)
    assert f"{arg}: a Hydra setting" in msg and "compose() runs no Hydra app" in msg, msg
    assert "Fix: drop it" in msg and "summary_dir=" in msg and "store_dir=" in msg, msg
    assert p.field == arg.lstrip("+~").split("=")[0]


def test_compose_without_a_hydra_setting_still_composes():
    assert pipeline.compose(["quant=none", "store_dir=/tmp/x"]).store_dir == "/tmp/x"


def test_pipeline_plan_refuses_a_hydra_setting_with_its_own_fix(capsys):
    from pipeline.plan_cli import main

    assert main(["--json", "hydra.run.dir=/tmp/x"]) == 2
    out = capsys.readouterr().out
    assert "hydra.run.dir=/tmp/x: a Hydra setting" in out and "`pipeline plan` runs no Hydra app" in out, out
    assert "pipeline plan --json > plan.json" in out and "summary_dir" not in out, out


@pytest.mark.parametrize("arg", ["hydra.run.dir=/tmp/x", "~hydra.verbose"])
def test_pipeline_serve_refuses_a_hydra_setting_before_looking_for_a_package(tmp_path, capsys, arg):
    """Refused before the path is looked at (nothing is served with the override silently dropped); ``~hydra.verbose``,
    which holds no ``=``, is no path either."""
    from pipeline.serve.serve import main

    assert main([str(tmp_path / "no-package"), arg]) == 2
    err = capsys.readouterr().err
    assert f"{arg}: a Hydra setting" in err and "`pipeline serve` runs no Hydra app" in err, err
    assert "Fix: drop it; the server log goes to runs/serve-<time>/" in err and "not found" not in err, err
