"""Whole-config validation: the config layer's field checks, then the cross-layer rules that need the layers
above it (the planner's model limits, the resolved target's capabilities and checks, the model family's rules).

Layers point one way (cli -> runner -> stages -> domain modules -> config): :mod:`pipeline.core.config` checks fields
only and never imports the planner or the targets; this module, used by the runner and ``pipeline plan``, imports
them normally, so a broken module fails loudly instead of silently skipping its checks.
"""

from __future__ import annotations

from .build.targets import config_problems as target_problems
from .core.config import ConfigError, PipelineConfig, Problem
from .core.config import validate as validate_fields
from .facts.families import config_problems as family_problems
from .planner.validate import cross_field_problems


def with_run_order(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with ``stages`` replaced by the stages that will run: the requested ones plus their dependencies, in
    pipeline order (:func:`pipeline.core.stage.resolve_order`), so that every check of a stage that will run is run
    (``stages=[package]`` runs export, quantize, build and evaluate, whose fields are then checked before any work).
    ``cfg`` itself when a requested name is unknown (the field check reports it)."""
    from omegaconf import OmegaConf

    from .core.config import STAGES
    from .core.stage import resolve_order

    requested = list(cfg.stages or [])
    if not requested or any(s not in STAGES for s in requested):
        return cfg
    order = resolve_order(requested, cfg)
    if order == requested:
        return cfg
    run = OmegaConf.merge(cfg, {"stages": order})
    return run  # type: ignore[return-value]


def validate(cfg: PipelineConfig, *, raise_on_error: bool = True) -> list[Problem]:
    """For the stages that will run (:func:`with_run_order`): field checks (:func:`pipeline.core.config.validate`), then cross-field checks (``pipeline.planner.validate``),
    then the resolved target's ``check_config`` (skipped when ``target.name`` itself is wrong), then the model
    family's rules (a problem already reported with the same field and message is not repeated).

    Returns every problem; raises :class:`~pipeline.core.config.ConfigError` listing them all when ``raise_on_error``
    and any were found.
    """
    cfg = with_run_order(cfg)
    problems = validate_fields(cfg, raise_on_error=False)
    problems.extend(cross_field_problems(cfg))
    if not any(p.field == "target.name" for p in problems):
        problems.extend(target_problems(cfg))
    problems.extend(p for p in family_problems(cfg) if not any(q.field == p.field and q.message == p.message for q in problems))
    if problems and raise_on_error:
        raise ConfigError(problems)
    return problems


__all__ = ["validate"]
