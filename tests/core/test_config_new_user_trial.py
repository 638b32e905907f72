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

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline
from pipeline.core.config import ConfigError
from pipeline.core.errors import EXIT_INPUT, InputError

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


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


# --------------------------------------------------------------------------- 3. override grammar errors
@pytest.mark.parametrize("arg,fix", [("model.name=a=b", """'model.name="a=b"'"""), ("model.name=模型", """'model.name="模型"'""")])
def test_an_override_hydra_cannot_parse_is_refused_in_the_pipelines_format(arg, fix, tmp_path):
    r = _cli(arg, "stages=[export]", f"store_dir={tmp_path / 'store'}", cwd=tmp_path)
    assert r.returncode == EXIT_INPUT, r.stderr[-2000:]
    err = r.stderr.strip()
    assert err.startswith(f"error (exit 2): {arg}: Hydra cannot parse this override") and err.endswith(f"{fix}."), err
    assert "HYDRA_FULL_ERROR" not in err and "Exception" not in err and "Traceback" not in err
    with pytest.raises(ConfigError, match=re.escape(fix)):
        pipeline.compose([arg])
    assert pipeline.compose([fix.strip("'")]).model.name == arg.split("=", 1)[1]  # the fix works
