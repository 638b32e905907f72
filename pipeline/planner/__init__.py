"""Preflight planner: memory/speed plan, cross-field validation and the GPU catalogue.

Public API:

* :func:`plan` (``plan(cfg) -> Plan``): the memory and speed plan of a validated config (the public
  ``pipeline.plan`` is :func:`pipeline.validation.checked_plan`: the run's checks first); see :mod:`pipeline.planner.plan`.
* :func:`plan_for_run` (``plan_for_run(cfg, console) -> dict``): what the runner calls at the start
  of every run; prints the plan and raises :class:`~pipeline.errors.PreflightError` when it is refused.
* :func:`host_memory_bandwidth_gbs`: measured host memory bandwidth in GB/s (cached per process),
  for CPU rooflines.
* the stages' config checks live with each stage (``pipeline/<stage>/checks.py``), run by :func:`pipeline.validation.validate`.
* :mod:`pipeline.facts.gpus`: ``CATALOGUE``, ``lookup(name)``.

Importing this package does not import torch or transformers.
"""

from __future__ import annotations

from typing import Any

from ..core.sizing import host_memory_bandwidth_gbs
from ..errors import PipelineError, PreflightError
from ..facts.geometry import ModelShape
from ..facts.gpus import CATALOGUE, GPU, lookup
from .base import Plan
from .plan import plan
from .weights import weight_bytes


class PlanRefused(PreflightError):
    """The plan cannot work on the target (weights do not fit, zero sequences fit, format unsupported)."""


def host_check(p: Plan, cfg: Any, stages: list[str]) -> None:
    """Add to ``p`` the host-memory verdict of the ``stages`` that will run (:func:`pipeline.core.sizing.stage_refusals`:
    each stage's predicted peak against this host's RAM). A config with a checkpoint (``model.path``) can run here,
    so a stage that does not fit refuses the plan (``status = "refused"``: exit 4, as the run itself would); a
    shapes-only preset cannot run here anyway, so the same figures are warnings (``status`` at least ``warn``)."""
    from ..core.sizing import stage_refusals

    if not stages or not p.stages:
        return
    more = stage_refusals(p.stages.predicted, stages, p.stages.host_total_bytes)
    if not more:
        return
    if getattr(cfg.model, "path", None):
        p.refusals.extend(more)
        p.status = "refused"
    else:
        p.warnings.extend(f"on this host (shapes-only preset, so nothing runs here): {m}" for m in more)
        if p.status == "ok":
            p.status = "warn"


def plan_for_run(cfg: Any, console: Any, stages: list[str] | None = None) -> dict[str, Any]:
    """Plan at the start of a run: print the compact plan and return it as JSON (run summary / manifests).

    Raises :class:`PlanRefused` (exit code 4) with the numbers when the plan cannot work, or when a stage in
    ``stages`` (the run order) is predicted to need more host memory than the host has
    (:func:`pipeline.core.sizing.stage_refusals`).  A model whose config.json cannot be read yields
    ``{"status": "unavailable", "error": ...}`` (the export stage reports that input problem itself)."""
    from .render import render

    try:
        p = plan(cfg)  # the runner validated cfg before any stage (runner._run_stages)
    except PipelineError as e:
        return {"schema": "pipeline.plan/v1", "status": "unavailable", "error": str(e)}
    host_check(p, cfg, list(stages or []))
    render(p, console, compact=True)
    doc = p.to_json()
    if p.status == "refused":
        raise PlanRefused("the plan cannot work: " + " | ".join(p.refusals) + "  (see `pipeline plan` with the same overrides)")
    return doc


__all__ = [
    "CATALOGUE",
    "GPU",
    "ModelShape",
    "Plan",
    "PlanRefused",
    "host_check",
    "host_memory_bandwidth_gbs",
    "lookup",
    "plan",
    "plan_for_run",
    "weight_bytes",
]
