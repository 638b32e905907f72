"""Typed configuration: one dataclass schema per stage, registered in Hydra's ConfigStore.

The YAML presets under ``build_configs/<group>/`` extend these schemas through their Defaults
List (``- base_<group>``), so unknown keys and wrong types fail at compose time with the key
named.  :func:`compose` gives the same composed object outside a Hydra app (planner, tests).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.nodes import BooleanNode

from . import benchmark as _benchmark
from . import build as _build
from . import calibration as _calibration
from . import eval as _eval
from . import model as _model
from . import package as _package
from . import parallel as _parallel
from . import quant as _quant
from . import target as _target
from .benchmark import BenchmarkConfig
from .build import BuildConfig, SpeculativeConfig
from .calibration import CalibrationConfig
from .common import BOOL_WORDS, REPO_ROOT, ConfigError, ConfigTypeError, Problem, key_fields, resolve_path, runtime
from .eval import EvalConfig, GateConfig
from .model import ModelConfig
from .package import PackageConfig
from .parallel import ParallelConfig
from .quant import QuantConfig
from .schema import CONFIG_DIR, GROUPS, PipelineConfig
from .target import TargetConfig

STAGES = ("export", "quantize", "build", "evaluate", "package", "benchmark")


def register() -> None:
    """Register every schema in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="pipeline_schema", node=PipelineConfig)
    for group, schema in GROUPS.items():
        cs.store(group=group, name=f"base_{group}", node=schema)


def _alias_fields(root: Any, obj: Any = None, prefix: str = ""):
    """(dotted alias path, dotted new path, owning dataclass, alias name, new field's owner, new name) of every
    deprecated alias field (:func:`pipeline.core.config.common.deprecated_alias`) in the config tree ``root``.

    ``alias_of`` without a dot names a field of the same group (``quant.kv_cache`` -> ``quant.kv_cache_dtype``); with
    dots it is the new field's path from the root (``quant.tp_size`` -> ``parallel.tp_size``, a cross-group alias).
    """
    obj = root if obj is None else obj
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            yield from _alias_fields(root, v, f"{prefix}{f.name}.")
        elif "alias_of" in f.metadata:
            target = f.metadata["alias_of"]
            if "." in target:
                parent, new = target.rsplit(".", 1)
                new_owner = root
                for part in parent.split("."):
                    new_owner = getattr(new_owner, part)
                yield prefix + f.name, target, obj, f.name, new_owner, new
            else:
                yield prefix + f.name, prefix + target, obj, f.name, obj, target


def alias_paths(cfg: Any) -> dict[str, str]:
    """``{deprecated alias path: path of the field it stands for}`` of the config tree ``cfg``
    (e.g. ``{"quant.kv_cache": "quant.kv_cache_dtype", "quant.tp_size": "parallel.tp_size", ...}``)."""
    return {old: new for old, new, *_ in _alias_fields(cfg)}


def _override_key(o: str) -> str:
    """``calibration.calib_size`` of the Hydra override ``++calibration.calib_size=64``."""
    return o.lstrip("+~").split("=", 1)[0].strip()


def resolve_aliases(cfg: PipelineConfig, explicit: Optional[list[str]] = None) -> list[str]:
    """Copy every deprecated alias that is set into its new field; return one warning per alias used.

    ``explicit``: the command-line overrides (``key=value`` strings).  A preset or the schema default of the new
    field gives way to the alias; a new field the user set explicitly (in ``explicit``; when ``explicit`` is None:
    any value other than the schema default) must agree with the alias.  Idempotent (the alias keeps its value).
    Raises :class:`ConfigError` (exit 2) naming both spellings when they disagree.
    """
    given = None if explicit is None else {_override_key(o) for o in explicit}
    problems: list[Problem] = []
    notes: list[str] = []
    for old_path, new_path, owner, old, new_owner, new in _alias_fields(cfg):
        value = getattr(owner, old)
        if value is None:
            continue
        current = getattr(new_owner, new)
        if current != value:
            default = next(f.default for f in dataclasses.fields(new_owner) if f.name == new)
            user_set_new = (new_path in given) if given is not None else current != default
            if user_set_new:
                problems.append(
                    Problem(
                        old_path,
                        value,
                        f"is a deprecated alias of {new_path}, which is set to {current!r}.",
                        f"set only {new_path} (drop {old_path})",
                    )
                )
                continue
            setattr(new_owner, new, value)
        notes.append(
            f"{old_path} is a deprecated alias of {new_path} (removed in the next release); "
            f"{new_path}={value!r} is used. Fix: write {new_path}={value}"
        )
    if problems:
        raise ConfigError(problems)
    return notes


def deprecations(cfg: PipelineConfig) -> list[str]:
    """The deprecation warnings of the aliases set in an already resolved ``cfg`` (for the run summary)."""
    return [
        f"{old_path} is a deprecated alias of {new_path} (removed in the next release); write {new_path}={getattr(new_owner, new)}"
        for old_path, new_path, owner, old, new_owner, new in _alias_fields(cfg)
        if getattr(owner, old) is not None
    ]


def defaults_problem(missing: list[str], *, schema: bool = False, value: Any = None) -> Problem:
    """The one message (exit 2) for a user YAML whose ``defaults`` list composes no pipeline config: it does not start
    from the pipeline schema (``schema`` False; :func:`to_object`, and ``pipeline.cli.user_config_argv`` before Hydra
    reads the file, where a command-line override gave Hydra's "Could not override ...") or starts from it but
    selects no preset for the groups ``missing`` (``schema`` True; OmegaConf said "missing mandatory value")."""
    what = f"selects no preset for {missing}" if schema else f"does not start from the pipeline schema (missing: {missing})"
    return Problem(
        "defaults",
        value,
        f"the composed config is not a pipeline config: its defaults list {what}.",
        "drop the defaults list from your YAML (the pipeline's defaults then apply, your values on top), or start "
        "it like build_configs/pipeline.yaml: `- pipeline_schema` then one preset per group "
        f"({', '.join(f'{g}: <preset>' for g in GROUPS)}) and `- _self_`",
    )


def to_object(cfg: DictConfig | PipelineConfig, explicit: Optional[list[str]] = None) -> PipelineConfig:
    """DictConfig (from Hydra) -> PipelineConfig dataclass instance, every ``${...}`` resolved and deprecated aliases
    resolved (:func:`resolve_aliases`; ``explicit`` = the command-line overrides; each alias used is logged as a
    warning).  Raises :class:`ConfigError` (exit 2) for an interpolation that cannot be resolved, naming the override
    (:func:`pipeline.core.config.interpolation.interpolation_problems`) or the field, and the fix."""
    if isinstance(cfg, PipelineConfig):
        return cfg
    from .interpolation import ERRORS, interpolation_problem, interpolation_problems

    bad = _numeric_bools(cfg, explicit or []) + interpolation_problems(cfg, explicit or [])
    if bad:
        raise ConfigError(bad)
    unselected = [g for g in GROUPS if OmegaConf.is_missing(cfg, g)]  # the schema, no preset for the group: `???`
    if unselected:
        raise ConfigError([defaults_problem(unselected, schema=True)])
    try:
        obj = OmegaConf.to_object(cfg)  # resolves every interpolation
    except ERRORS as e:  # one no override set (a preset's, a user YAML's)
        raise ConfigError([interpolation_problem(e, cfg)]) from e
    if not isinstance(obj, PipelineConfig):
        raise ConfigError([defaults_problem([g for g in GROUPS if g not in (obj if isinstance(obj, dict) else {})])])
    for note in resolve_aliases(obj, explicit):
        logging.getLogger("pipeline.core.config").warning(note)
    for note in relabel_custom_data(obj):
        logging.getLogger("pipeline.core.config").info(note)
    return obj


def _numeric_bools(cfg: DictConfig, explicit: list[str]) -> list[Problem]:
    """Overrides that set a boolean field to something other than :data:`BOOL_WORDS` which OmegaConf still took: a
    number other than 0 or 1 (OmegaConf refuses other strings itself).  The ``pipeline`` command and :func:`compose`
    refuse these earlier (:mod:`pipeline.core.config.overrides`); this covers a DictConfig composed otherwise."""
    problems = []
    for o in explicit:
        key, sep, raw = o.lstrip("+~").partition("=")
        v = raw.strip().strip("'\"")
        if not sep or v.lower() in BOOL_WORDS or not v.lstrip("+-").isdigit():
            continue
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        node = parent._get_node(leaf) if isinstance(parent, DictConfig) else None
        if isinstance(node, BooleanNode):
            problems.append(Problem(key, raw, "is a boolean; a number other than 0 or 1 is not one.", f"{key}=true or {key}=false"))
    return problems


DATA_PRESETS = (("eval", "eval_set"), ("calibration", "path"))
"""(group, path field) of the groups whose ``name`` labels a shipped data file (build_configs/<group>/<name>.yaml)."""


def relabel_custom_data(cfg: PipelineConfig) -> list[str]:
    """Keep a data group's ``name`` from claiming a shipped set it does not read: when ``<group>.name`` is a preset
    under ``build_configs/<group>/`` whose file is not the configured ``<group>.<path field>`` (e.g.
    ``eval.eval_set=my.jsonl`` on the default ``eval=support_v2``), the name becomes the file's name.  The name
    enters the stage key, so the key follows the label; the file's content digest is keyed as before.
    Returns one note per relabelled group."""
    notes = []
    for group, field_name in DATA_PRESETS:
        g: Any = getattr(cfg, group, None)
        path = getattr(g, field_name, None) if g is not None else None
        preset = CONFIG_DIR / group / f"{getattr(g, 'name', '')}.yaml"
        if g is None or not path or not preset.is_file():
            continue
        try:
            loaded = OmegaConf.load(preset)
            shipped = loaded.get(field_name) if isinstance(loaded, DictConfig) else None
        except Exception:
            continue
        if not shipped or resolve_path(str(shipped)) == resolve_path(str(path)):
            continue
        label = Path(os.path.expanduser(str(path))).name
        notes.append(
            f"{group}.name: {g.name!r} names the shipped set {shipped}; {group}.{field_name}={path} is another file, labelled {label!r}"
        )
        g.name = label
    return notes


def _override_list(overrides: Any) -> list[str]:
    """``compose``'s ``overrides`` as a list: None is ``[]``, a list or tuple of str is taken as is; anything else (a
    str, whose characters Hydra would read as one override each; a dict; a non-str item) raises
    :class:`ConfigTypeError` (exit 2) saying to pass a list."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        example = repr(overrides.split()) if overrides.split() else '["model.name=x"]'
        raise ConfigTypeError(
            [
                Problem(
                    "overrides",
                    overrides,
                    "is a str; compose takes a list of overrides, one per item (a str would be read one character at a time).",
                    f"pass a list: compose({example})",
                )
            ]
        )
    if not isinstance(overrides, (list, tuple)):
        fix = (
            'pass a list of "key=value" str: compose([f"{k}={v}" for k, v in overrides.items()])'
            if isinstance(overrides, Mapping)
            else 'pass a list, e.g. compose(["quant=int4_awq", "stages=[export,quantize]"])'
        )
        what = f"is of type {type(overrides).__name__}; compose takes a list (or tuple) of 'key=value' str overrides."
        raise ConfigTypeError([Problem("overrides", overrides, what, fix)])
    bad = [(i, o) for i, o in enumerate(overrides) if not isinstance(o, str)]
    if bad:
        what = "is of type {}; each item of the overrides list is one 'key=value' str."
        fix = 'write it as one str, e.g. "build.max_batch_size=8"'
        raise ConfigTypeError([Problem(f"overrides[{i}]", o, what.format(type(o).__name__), fix) for i, o in bad])
    return list(overrides)


def config_dir_problem(config_dir: str | Path) -> Problem | None:
    """Why ``config_dir`` (``--config-dir``) is no folder of YAML files, or None: the one check of the run
    (``pipeline.cli``), of ``pipeline plan`` and of :func:`compose`, so they refuse a file or a missing path alike
    (exit 2; Hydra said only "Additional config directory ... not found")."""
    d = Path(os.path.abspath(Path(config_dir).expanduser()))
    if d.is_dir():
        return None
    if d.is_file():
        fix = "name the folder holding your YAML"
        if d.suffix in (".yaml", ".yml"):
            fix = f"pass the file's folder and its name without .yaml: --config-dir={d.parent} --config-name={d.stem}"
        return Problem("--config-dir", str(config_dir), "is a file, not a folder.", fix)
    what = f"is a symbolic link to a missing path, {d.parent / os.readlink(d)}." if d.is_symlink() else "no such folder."
    return Problem("--config-dir", str(config_dir), what, "name the folder holding your YAML (--config-name names the file in it)")


def _add_config_dir(config_dir: str | Path) -> None:
    """Put ``config_dir`` on the search path of the initialized Hydra where ``pipeline --config-dir`` puts it (after
    the pipeline's own folder, before the schemas), as Hydra's ``run_hydra`` does: the path extended, then Hydra
    created with it (its config repository is made from the path once).  A folder that is not there is a
    ConfigError, as the command line refuses it.  (A ``hydra.searchpath`` override does not do: Hydra looks the
    primary config up, and caches it as missing, before it reads that override.)"""
    from hydra._internal.hydra import Hydra
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    problem = config_dir_problem(config_dir)
    if problem is not None:
        raise ConfigError([problem])
    d = os.path.abspath(Path(config_dir).expanduser())
    gh = GlobalHydra.instance()
    search = gh.config_loader().get_search_path()
    search.prepend(provider="command-line", path=f"file://{d}", anchor=SearchPathQuery(provider="schema"))
    gh.clear()  # initialize_config_dir's exit restores the GlobalHydra it found
    Hydra.create_main_hydra2(task_name="app", config_search_path=search)


def compose(overrides: list[str] | None = None, config_name: str = "pipeline", config_dir: str | Path | None = None) -> PipelineConfig:
    """Compose the config as the ``pipeline`` command would, outside a Hydra app.

    ``config_dir`` is the command's ``--config-dir``: a folder added to Hydra's search path after the pipeline's own
    (its presets and ``config_name`` found there too); with it, as on the command line, the overrides' schema checks
    are left to Hydra (``pipeline.cli.user_config_compose_args`` turns a user YAML into these arguments).

    Raises :class:`ConfigError` (exit code 2) with the ``pipeline`` command's messages (the override, the valid
    names, closest first, and the fix; :mod:`pipeline.core.config.overrides`) for an override Hydra's grammar cannot
    parse, an unknown key (``+key=value`` included), a value of the wrong type and an unknown preset; any other
    composition error of Hydra or OmegaConf is a ConfigError too.  Every ``${...}`` is resolved here (an override
    whose interpolation cannot be resolved is a ConfigError naming it, :func:`to_object`), and ``overrides`` must be a
    list (or tuple) of str: a str is refused (:class:`ConfigTypeError`, a ConfigError and a TypeError).
    """
    overrides = _override_list(overrides)
    from hydra import compose as _compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    from .hydra_settings import refuse_hydra_settings
    from .overrides import override_problems, sweep_problems

    refuse_hydra_settings(list(overrides or []))  # Hydra's compose API drops hydra.* overrides without a word
    marker = [f"--config-dir={config_dir}"] if config_dir is not None else []  # as the command line: presets of its own
    problems = override_problems([*marker, *(overrides or [])]) or sweep_problems(list(overrides or []))
    if problems:
        raise ConfigError(list(problems))
    register()
    gh = GlobalHydra.instance()
    if gh.is_initialized():
        gh.clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            if config_dir is not None:
                _add_config_dir(config_dir)
            cfg = _compose(config_name=config_name, overrides=list(overrides or []))
    except (ValueError, TypeError, AttributeError, KeyError, HydraException) as e:
        from omegaconf.errors import OmegaConfBaseException

        if isinstance(e, (OmegaConfBaseException, ConfigError)):
            raise
        # Hydra raises a bare ValueError for some override shapes (found by tests/contracts/test_fuzz.py: ``build=0``), and
        # OmegaConf a bare AttributeError for others (``+build.max_seq_len=0 ~build``, also found by the fuzz test)
        raise ConfigError(
            [
                Problem(
                    "overrides",
                    list(overrides or []),
                    f"{type(e).__name__}: {e}.",
                    "use group=<preset name> for config groups and key=value for fields",
                )
            ]
        ) from e
    return to_object(cfg, list(overrides or []))


_VALIDATORS: dict[str, Callable[..., list[Problem]]] = {
    "model": _model.validate,
    "calibration": _calibration.validate,
    "quant": _quant.validate,
    "parallel": _parallel.validate,
    "target": _target.validate,
    "build": _build.validate,
    "eval": _eval.validate,
    "package": _package.validate,
    "benchmark": _benchmark.validate,
}


def validate(cfg: PipelineConfig, *, raise_on_error: bool = True) -> list[Problem]:
    """Run every group's field checks (this layer's rules only); collect all problems.

    Cross-layer rules (the model's limits, the target's capabilities, the model family) belong to the layers
    above: :func:`pipeline.validation.validate` runs these field checks and then those, and is what the runner
    and the planner call.

    Raises :class:`ConfigError` listing them all when ``raise_on_error`` and any were found.
    """
    problems: list[Problem] = []
    if not cfg.stages:
        problems.append(Problem("stages", [], "no stage to run.", f"use a subset of {list(STAGES)}, e.g. stages=[export,quantize]"))
    for i, s in enumerate(cfg.stages):
        if s not in STAGES:
            close = difflib.get_close_matches(str(s), STAGES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(Problem("stages", s, "unknown stage.", f"{hint}use a subset of {list(STAGES)}"))
        elif s in cfg.stages[:i] and s not in cfg.stages[i + 1 :]:  # one problem per repeated name
            once = list(dict.fromkeys(cfg.stages))
            problems.append(Problem("stages", s, "is listed more than once.", f"list each stage once: stages=[{','.join(once)}]"))
    needs = set(cfg.stages)
    for group, fn in _VALIDATORS.items():
        if group == "calibration" and ("quantize" not in needs or cfg.quant.recipe == "none"):
            continue
        if group == "eval" and "evaluate" not in needs:
            continue
        problems.extend(fn(getattr(cfg, group)))
    if problems and raise_on_error:
        raise ConfigError(problems)
    return problems


__all__ = [
    "BenchmarkConfig",
    "BuildConfig",
    "CalibrationConfig",
    "ConfigError",
    "ConfigTypeError",
    "EvalConfig",
    "GateConfig",
    "ModelConfig",
    "PackageConfig",
    "ParallelConfig",
    "PipelineConfig",
    "Problem",
    "QuantConfig",
    "SpeculativeConfig",
    "TargetConfig",
    "CONFIG_DIR",
    "REPO_ROOT",
    "STAGES",
    "alias_paths",
    "compose",
    "deprecations",
    "key_fields",
    "register",
    "resolve_aliases",
    "resolve_path",
    "runtime",
    "to_object",
    "validate",
]
