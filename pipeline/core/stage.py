"""Stage interface and registry.

A stage is a plain function from (config, input artifacts) to files in an output folder plus a
small typed result (``pipeline/core/contracts/<stage>.py``).  Each stage module (``pipeline/stages/<name>.py``) defines a module-level
``STAGE = Stage(...)``; modules are imported lazily by :func:`get_stage` so that ``pipeline plan``
or a cache hit never pays for importing torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .contracts.result import StageResult
from .registry import Registry

if TYPE_CHECKING:
    from rich.console import Console

    from .config import PipelineConfig
    from .config.common import Problem
    from .store import Artifact


@dataclasses.dataclass
class StageContext:
    """What a stage function receives.

    Attributes:
        cfg: the whole resolved config (stages read their own group and may read others).
        inputs: upstream artifacts by stage name (each has ``.path`` and ``.manifest``).
        external: external input files/folders by name (model checkpoint, calibration set, eval set),
            already resolved to absolute paths; their content digests are in the cache key.
        out: the folder to write into (a temporary folder, published atomically on success);
            ``None`` in dry-run mode.
        manifest: the manifest under construction; stages may add keys (e.g. ``plan``).
        resume_dir: a folder for work that outlives a killed run of the same key (the store's
            :meth:`pipeline.core.store.ArtifactStore.resume_dir`; removed when the artifact is published); None in
            dry-run mode and outside the runner.
        prior: a trusted artifact of this stage with the same generation key (:attr:`Stage.generation_key`) whose
            costly work the stage may reuse instead of doing it again; None when there is none.
        outputs: the run's own output folders (the store, the run folder): inside an external input folder they are
            not its input (:func:`pipeline.core.store.input_files`); empty outside the runner.
    """

    cfg: PipelineConfig
    inputs: dict[str, Artifact]
    external: dict[str, Path]
    out: Path | None
    manifest: dict[str, Any]
    console: Console
    log: logging.Logger
    show_progress: bool = True
    resume_dir: Path | None = None
    prior: Artifact | None = None
    outputs: tuple[Path, ...] = ()

    def upstream(self, stage: str) -> Artifact | None:
        """The artifact of the upstream ``stage``; None when this run gives the stage none (an optional input)."""
        return self.inputs.get(stage)

    def external_path(self, name: str) -> Path | None:
        """The external input ``name`` (a file or folder outside the store); None when this run has none."""
        return self.external.get(name)

    @contextlib.contextmanager
    def progress(self, description: str, total: float | None) -> Iterator[Callable[[float], None]]:
        """A rich progress bar; yields ``advance(n)``. Silent when progress is off."""
        if not self.show_progress:

            def _noop(n: float = 1) -> None:
                return None

            yield _noop
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        ) as prog:
            task = prog.add_task(description, total=total)

            def _advance(n: float = 1) -> None:
                prog.advance(task, n)

            yield _advance


def _no_external(cfg: PipelineConfig) -> dict[str, Path]:
    return {}


def _no_checks(cfg: PipelineConfig) -> list[Problem]:
    return []


def _no_extras(cfg: PipelineConfig, inputs: dict[str, Artifact]) -> dict[str, Any]:
    return {}


R = TypeVar("R", bound=StageResult)
"""A stage's result class (``pipeline.core.contracts.<stage>``: ``ExportResult`` ... ``BenchmarkResult``)."""


@dataclasses.dataclass(frozen=True)
class Stage(Generic[R]):
    """A pipeline stage.

    Attributes:
        name: stage name (``export`` ...).
        deps: upstream stages whose artifacts are inputs.
        config_groups: config groups whose cache-relevant fields enter the key (see ``config.common.runtime``).
        libraries: distributions whose versions enter the key and the manifest.
        run: ``run(ctx) -> R``, the stage's typed result (:class:`pipeline.core.contracts.result.StageResult`;
            recorded as ``manifest.json`` ``result``). Writes into ``ctx.out``. Its ``headline`` is shown in run
            summaries and multirun comparisons.
        version: bump when the stage's output format changes (invalidates old artifacts).
        external_inputs: ``f(cfg) -> {name: path}`` of files/folders outside the store (digested).
        key_extras: ``f(cfg, inputs) -> dict`` of further facts that change the bytes (e.g. the
            resolved target, the target GPU).
        key_config: ``f(cfg) -> {group: fields}``, the config part of the key when a group's fields enter it resolved
            (evaluate: ``eval.reference_dtype=auto`` as the dtype it resolves to); default: ``key_fields`` of each of
            ``config_groups``.
        dry_run: ``f(ctx) -> dict`` describing what would be done, without writing (optional).
        cacheable: ``False`` for measurements (benchmark) that must run every time.
        select_deps: ``f(cfg) -> deps`` when the inputs depend on the config (e.g. evaluate needs no
            engine when only the baseline and simulated runners are asked for); a subset of ``deps``.
        runtime_reads: dotted config fields outside the key that the stage reads but that never change its
            output (paths whose content is digested, scheduling knobs); checked by tests/contracts/test_gate_key_reads.py.
        checks: ``f(cfg) -> [Problem]``, the stage's config checks (its ``checks.py``), run by
            :func:`pipeline.validation.validate` before any work whenever the stage is in the run order.
        generation_key: ``f(key document) -> document``, the part of the key its costly work depends on (evaluate:
            the key less the ``eval.gate`` fields); the runner records its digest as the manifest's ``generation_key``
            and, when the key misses, gives the stage the newest trusted artifact with the same one
            (:attr:`StageContext.prior`).
    """

    name: str
    deps: tuple[str, ...]
    config_groups: tuple[str, ...]
    libraries: tuple[str, ...]
    run: Callable[[StageContext], R]
    version: str = "1"
    external_inputs: Callable[[PipelineConfig], dict[str, Path]] = _no_external
    key_extras: Callable[[PipelineConfig, dict[str, Artifact]], dict[str, Any]] = _no_extras
    key_config: Callable[[PipelineConfig], dict[str, Any]] | None = None
    dry_run: Callable[[StageContext], dict[str, Any]] | None = None
    cacheable: bool = True
    select_deps: Callable[[PipelineConfig], tuple[str, ...]] | None = None
    runtime_reads: tuple[str, ...] = ()
    checks: Callable[[PipelineConfig], list[Problem]] = _no_checks
    generation_key: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def deps_for(self, cfg: PipelineConfig) -> tuple[str, ...]:
        """The upstream stages this run needs (``select_deps(cfg)`` when given, else ``deps``)."""
        return tuple(self.select_deps(cfg)) if self.select_deps is not None else self.deps


def _stage_modules() -> Registry[str]:
    from .config import STAGES

    return Registry("stage", {name: f"pipeline.{name}.stage" for name in STAGES})


STAGE_MODULES: Registry[str] = _stage_modules()
"""Stage name -> the module defining its ``STAGE`` (``pipeline.<name>.stage``), in pipeline order."""


def get_stage(name: str) -> Stage[Any]:
    """Import ``pipeline.<name>.stage`` and return its ``STAGE``.

    Raises :class:`~pipeline.core.registry.UnknownName` (a ``KeyError``) listing the known stages for an unknown name.
    """
    mod = importlib.import_module(STAGE_MODULES[name])
    stage: Stage[Any] = mod.STAGE
    return stage


def resolve_order(requested: list[str], cfg: PipelineConfig | None = None) -> list[str]:
    """Requested stages plus their transitive dependencies (for this ``cfg``), in pipeline order."""
    need: set[str] = set()

    def add(name: str) -> None:
        if name in need:
            return
        need.add(name)
        stage = get_stage(name)
        for d in stage.deps_for(cfg) if cfg is not None else stage.deps:
            add(d)

    for s in requested:
        add(s)
    from .config import STAGES

    return [s for s in STAGES if s in need]
