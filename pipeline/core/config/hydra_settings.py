"""``hydra.*`` overrides given where no Hydra app runs: :func:`pipeline.core.config.compose` (the Python API,
``pipeline plan``) and ``pipeline serve`` compose the config without Hydra's app, which alone reads ``hydra.run.dir``,
``hydra.job.name``, ``hydra/launcher=...`` and the like; Hydra's compose API drops them without a word, so a user's
``hydra.run.dir=/x`` would be ignored.  They are refused instead (:class:`ConfigError`, exit 2), naming the override
and what to use.
"""

from __future__ import annotations

from .common import ConfigError, Problem
from .overrides import OverrideProblem

#: the fix of a ``hydra.*`` override given to :func:`pipeline.core.config.compose`
API_FIX = (
    "drop it; in Python, pipeline.run(cfg, summary_dir=<folder>) sets where the run summary is written and "
    "store_dir=<folder> where the artifacts go (hydra.* overrides apply to the `pipeline` command)"
)


def hydra_key(arg: str) -> str | None:
    """The key of ``arg`` when it is a Hydra setting (``hydra.run.dir=/x``, ``+hydra.job.name=n``, ``~hydra.verbose``,
    ``hydra/launcher=joblib``), else None."""
    key = arg.lstrip("+~").split("=", 1)[0].strip()
    return key if key == "hydra" or key.startswith(("hydra.", "hydra/")) else None


def hydra_setting_problems(overrides: list[str], where: str = "compose()", fix: str = API_FIX) -> list[Problem]:
    """One problem per Hydra setting among ``overrides`` (:func:`hydra_key`), saying that ``where`` runs no Hydra app,
    with ``fix``."""
    out: list[Problem] = []
    for arg in overrides:
        key = hydra_key(arg)
        if key is None:
            continue
        what = f"a Hydra setting, which only the `pipeline` command's Hydra app reads; {where} runs no Hydra app, so it would be ignored."
        value = arg.split("=", 1)[1] if "=" in arg else None
        out.append(OverrideProblem(key, value, what, fix, text=f"{arg}: {what} Fix: {fix}."))
    return out


def refuse_hydra_settings(overrides: list[str], where: str = "compose()", fix: str = API_FIX) -> None:
    """Raise :class:`ConfigError` (exit 2) listing :func:`hydra_setting_problems` when there are any."""
    problems = hydra_setting_problems(overrides, where, fix)
    if problems:
        raise ConfigError(problems)
