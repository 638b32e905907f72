"""Whole-config validation before any work: the config layer's field checks, then the checks of every stage that
will run (each stage's ``checks.py``, :attr:`pipeline.core.stage.Stage.checks`), all problems reported together.

Layers point one way (cli -> runner -> stages -> domain modules -> config): :mod:`pipeline.core.config` checks fields
only and never imports a stage; this module, used by the runner and ``pipeline plan``, imports the stages normally,
so a broken module fails loudly instead of silently skipping its checks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from .core.config import STAGES, ConfigError, PipelineConfig, Problem
from .core.config import validate as validate_fields

if TYPE_CHECKING:
    from .planner.base import Plan

log = logging.getLogger("pipeline.validation")


def with_run_order(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with ``stages`` replaced by the stages that will run: the requested ones plus their dependencies, in
    pipeline order (:func:`pipeline.core.stage.resolve_order`), so that every check of a stage that will run is run
    (``stages=[package]`` runs export, quantize, build and evaluate, whose fields are then checked before any work).
    The order of the request does not matter: ``stages=[quantize,export]`` runs export, then quantize (the runner says
    so, :func:`order_note`).  ``cfg`` itself when a requested name is unknown or repeated (the field check reports it)."""
    from omegaconf import OmegaConf

    from .core.stage import resolve_order

    requested = list(cfg.stages or [])
    if not requested or any(s not in STAGES for s in requested) or len(set(requested)) < len(requested):
        return cfg
    order = resolve_order(requested, cfg)
    if order == requested:
        return cfg
    run = OmegaConf.merge(cfg, {"stages": order})
    return run  # type: ignore[return-value]


def order_note(cfg: PipelineConfig) -> str | None:
    """One line when ``cfg.stages`` names known stages, each once, in an order other than the pipeline's (they run in
    pipeline order, :func:`with_run_order`); None otherwise."""
    requested = [str(s) for s in cfg.stages or []]
    in_order = [s for s in STAGES if s in requested]
    if len(set(requested)) < len(requested) or len(in_order) != len(requested) or in_order == requested:
        return None
    return f"stages=[{','.join(requested)}]: stages run in pipeline order ({', '.join(in_order)}), whatever the order written"


def stage_problems(cfg: PipelineConfig, by_stage: dict[str, list[Problem]] | None = None) -> list[Problem]:
    """The checks of every stage in ``cfg.stages`` (unknown names skipped: the field check reports them), in pipeline
    order; a problem already reported with the same field and message is not repeated.  Never raises for bad values.
    ``by_stage``, when given, receives each stage's own problems (repeats included) under its name."""
    from .core.stage import get_stage

    problems: list[Problem] = []
    for name in (s for s in STAGES if s in set(cfg.stages or [])):
        found = get_stage(name).checks(cfg)
        if by_stage is not None:
            by_stage[name] = found
        problems.extend(p for p in found if not any(q.field == p.field and q.message == p.message for q in problems))
    return problems


def validate(
    cfg: PipelineConfig, *, raise_on_error: bool = True, read_with_transformers: bool = False, list_inputs: bool = False
) -> list[Problem]:
    """For the stages that will run (:func:`with_run_order`): the field checks (:func:`pipeline.core.config.validate`),
    ``target.name`` against the build-target registry (every stage after export reads it), then each stage's checks
    (:func:`stage_problems`).  With ``read_with_transformers`` (``pipeline plan``, ``pipeline.plan``) also the export
    stage's reading of ``config.json`` by transformers (:func:`transformers_problems`; it imports transformers, so a
    run leaves it to its export stage), ``store_dir`` as the run opens it (:func:`pipeline.preflight.store_dir_problem`,
    creating nothing) and the data files the stages after export read (:func:`pipeline.preflight.input_problems`: an
    eval set or calibration file that is not there; a shapes-only preset's missing checkpoint is what a plan is for).
    With ``list_inputs`` (a run), when any problem is found, the missing inputs of every stage that will run are
    listed with them, so nothing found before work starts waits for a second run (fresh-user trial).

    Returns every problem; raises :class:`~pipeline.core.config.ConfigError` listing them all when ``raise_on_error``
    and any were found.
    """
    from .core.targets import name_problems
    from .preflight import input_problems, store_dir_problem

    cfg = with_run_order(cfg)
    problems = validate_fields(cfg, raise_on_error=False) + name_problems(cfg)
    by_stage: dict[str, list[Problem]] = {"export": []}
    refused = [f"{q.field}={q.value}" for q in problems]  # a stage's check built on a refused value is not reported:
    problems.extend(  # "build.max_input_len < -5" after "build.max_seq_len=-5: must be >= 1" (a recheck)
        p
        for p in stage_problems(cfg, by_stage)
        if not any(q.field == p.field and q.message == p.message for q in problems)
        and not any(f"{p.field}={p.value}" == r or r in p.message for r in refused)
    )
    if read_with_transformers and not by_stage["export"]:
        problems.extend(transformers_problems(cfg))  # the export stage stops at its own refusals before transformers reads
    said = bool(problems)  # what the run checks before its first stage, the store (preflight.open_store) and the data
    if read_with_transformers or (list_inputs and said):  # files, a run lists with its problems (one ConfigError, not a
        store = store_dir_problem(cfg.store_dir)  # second round: trials); a plan leaves the checkpoint to the
        problems.extend([store] if store is not None and all(q.field != "store_dir" for q in problems) else [])
        order = [  # and export's when its checks refused the checkpoint: its input check repeats them in one text
            s for s in STAGES if s in set(cfg.stages or []) and not (s == "export" and (read_with_transformers or by_stage["export"]))
        ]
        try:  # export's checks (a shapes-only preset's missing checkpoint is what a plan is for)
            problems.extend(input_problems(order, cfg, said=problems))
        except Exception:  # listing the inputs of a config already refused never hides the problems found
            if not said:
                raise
            log.debug("input check skipped after configuration problems", exc_info=True)
    if problems and raise_on_error:
        raise ConfigError(problems)
    return problems


def transformers_problems(cfg: PipelineConfig) -> list[Problem]:
    """The export stage's refusals when transformers reads the checkpoint (:func:`pipeline.export.write.load_tokenizer`:
    a ``config.json`` transformers cannot read, :func:`pipeline.core.modelio.transformers_config`; a tokenizer it cannot
    load, or with more tokens than the embedding has rows; a special-token id of the tokenizer's outside the
    vocabulary), its message as a ``model.path`` problem; none for a shapes-only preset or a folder without a readable
    ``config.json``.  :func:`validate` calls it only when the export
    stage's config checks found nothing (an unsupported architecture): the export stage stops at those before
    transformers reads the file."""
    from .core.config import resolve_path
    from .core.modelio import read_model_config
    from .errors import InputError
    from .export.write import load_tokenizer

    path = getattr(cfg.model, "path", None)
    config = read_model_config(path)
    if config is None:
        return []
    src = resolve_path(str(path)) or Path(str(path))
    try:
        load_tokenizer(src, config, bool(cfg.model.trust_remote_code))
    except InputError as e:
        why, _, fix = str(e).partition(" Fix: ")
        return [Problem("model.path", path, why, fix)]
    return []


def checked_plan(cfg: PipelineConfig, *, check: bool = True) -> Plan:
    """The public ``pipeline.plan``: :func:`validate` (when ``check``), then the memory and speed plan
    (:func:`pipeline.planner.plan.plan`, a :class:`~pipeline.planner.base.Plan`), so a config a run refuses is never
    planned as ``ok`` (fresh-user trial: ``build.max_input_len=4096 build.max_seq_len=1024`` planned as ``ok``).

    Raises:
        ConfigError: ``check`` and :func:`validate` found problems (exit 2, the run's message).
        InputError: the model's config.json cannot be read or ``target.gpu`` is unknown (the planner's own).
    """
    from .planner.plan import plan

    if check:
        validate(cfg, read_with_transformers=True)
    return plan(cfg)


__all__ = ["checked_plan", "order_note", "stage_problems", "transformers_problems", "validate", "with_run_order"]
