"""Whole-config validation: the config layer's field checks, then the cross-layer rules that need the layers
above it (the planner's model limits, the resolved target's capabilities and checks, the model family's rules).

Layers point one way (cli -> runner -> stages -> domain modules -> config): :mod:`pipeline.config` checks fields
only and never imports the planner or the targets; this module, used by the runner and ``pipeline plan``, imports
them normally, so a broken module fails loudly instead of silently skipping its checks.
"""

from __future__ import annotations

from .config import ConfigError, PipelineConfig, Problem
from .config import validate as validate_fields
from .families import config_problems as family_problems
from .planner.validate import cross_field_problems
from .targets import config_problems as target_problems


def validate(cfg: PipelineConfig, *, raise_on_error: bool = True) -> list[Problem]:
    """Field checks (:func:`pipeline.config.validate`), then cross-field checks (``pipeline.planner.validate``),
    then the resolved target's ``check_config`` (skipped when ``target.name`` itself is wrong), then the model
    family's rules (a problem already reported with the same field and message is not repeated).

    Returns every problem; raises :class:`~pipeline.config.ConfigError` listing them all when ``raise_on_error``
    and any were found.
    """
    problems = validate_fields(cfg, raise_on_error=False)
    problems.extend(cross_field_problems(cfg))
    if not any(p.field == "target.name" for p in problems):
        problems.extend(target_problems(cfg))
    problems.extend(p for p in family_problems(cfg) if not any(q.field == p.field and q.message == p.message for q in problems))
    if problems and raise_on_error:
        raise ConfigError(problems)
    return problems


__all__ = ["validate"]
