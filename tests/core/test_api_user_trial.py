"""Findings of a fresh-user trial of the Python API and sweeps, one section each.

Old behaviour:
* ``pipeline -m quant=none ... quant=none,int8_sq``: the swept key was also a fixed override, so
  :func:`pipeline.cli.sweep_dirname_argv` excluded it from the job folder names (``0``, ``1``); with
  ``hydra.sweep.subdir=${hydra.job.override_dirname}`` both jobs wrote into one folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.cli import sweep_dirname_argv

ROOT = Path(__file__).resolve().parents[2]
EXCLUDE = "hydra.job.config.override_dirname.exclude_keys="


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


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
        r = _cli("-m", "quant=none", "quant=none,int8_sq", *common, f"hydra.sweep.dir={sweep}", *extra, cwd=tmp_path)
        assert r.returncode == 2, r.stderr[-3000:]  # both jobs refused (no checkpoint), after their folders were made
        jobs = {p.name for p in sweep.iterdir() if p.is_dir()}
        assert jobs == want, jobs
        assert all((sweep / j / "summary.json").is_file() for j in jobs)
