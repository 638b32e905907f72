# `pipeline --help` prints this docstring: plain text, no reStructuredText markup.
"""The pipeline command.

pipeline [hydra overrides] runs the configured stages (a Hydra app: --cfg job, -m sweeps and launcher plugins
work as in any Hydra app).  pipeline --cfg job prints the config with its interpolations resolved (the values the
run would use: Hydra's --resolve is added).  Subcommands that are not a pipeline run:

    pipeline plan [overrides]         memory/speed plan and cross-field checks, no GPU needed
    pipeline doctor                   what is installed and which targets can run here
    pipeline serve [overrides]        start Triton on the packaged model repository
    pipeline verify RELEASE [--key K] check a release: signature, SHA256SUMS, manifest, provenance
    pipeline migrate RELEASE [overrides]  the TensorRT-LLM PyTorch-backend package of an engine release (same
                                      checkpoint and recipe; pipeline/package/migrate.py)
    pipeline client ...               gRPC client for the served ensemble
    pipeline benchmark compare A B    compare two benchmark JSON results

Exit codes: docs/cli.md (pipeline/errors.py)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core.registry import Registry
from .errors import INTERRUPT

if TYPE_CHECKING:
    from .core.config import Problem

SUBCOMMANDS: Registry[str] = Registry(
    "subcommand",
    {
        "plan": "pipeline.plan_cli",
        "doctor": "pipeline.doctor",
        "serve": "pipeline.serve.serve",
        "client": "pipeline.serve.client_cli",
        "benchmark": "pipeline.benchmark.cli",
        "verify": "pipeline.release.verify",
    },
)
"""``pipeline <name> ...`` -> the module whose ``main(argv)`` runs it (imported on use)."""

_state = {"task_started": False}


#: The longest sweep job folder name :func:`job_dirname` makes after the job number (a longer one keeps its first
#: part and a hash of the whole); far below the 255 bytes a file name may hold.
MAX_JOB_DIRNAME = 64


def job_dirname(num: Any, override_dirname: Any) -> str:
    """The folder name of sweep job ``num`` (``hydra.sweep.subdir``, build_configs/pipeline.yaml): the number, then
    Hydra's ``override_dirname`` (``quant=none``: the swept overrides only, :func:`sweep_dirname_argv`) with secrets
    masked (:func:`pipeline.core.store.redact_text`), every character but letters, digits and ``._,=+-`` as ``_`` (a
    ``/`` of a path value would nest folders) and, over :data:`MAX_JOB_DIRNAME` characters, cut with a short hash of
    the whole (``0-model.path=_data_ckpt...-1a2b3c4d``)."""
    import hashlib
    import re

    from .core.store import redact_text

    text = re.sub(r"[^A-Za-z0-9._,=+-]", "_", redact_text(str(override_dirname or "")))
    if len(text) > MAX_JOB_DIRNAME:
        text = f"{text[: MAX_JOB_DIRNAME - 9]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return f"{num}-{text}" if text else str(num)


def _register_resolvers() -> None:
    """``${job_dirname:num,override_dirname}`` (:func:`job_dirname`) and ``${redact:...}``
    (pipeline.core.store.redact_text) for Hydra's sweep folder names (build_configs/pipeline.yaml); registered at
    import so joblib/Ray/SLURM job processes that unpickle ``_task`` have them too."""
    from omegaconf import OmegaConf

    from .core.store import redact_text

    OmegaConf.register_new_resolver("redact", lambda s: redact_text(str(s)), replace=True)
    OmegaConf.register_new_resolver("job_dirname", job_dirname, replace=True)


_register_resolvers()


def _task(cfg) -> int:  # DictConfig
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .core.config import to_object
    from .errors import EXIT_INPUT, EXIT_INTERRUPTED
    from .report import record_exit_code
    from .runner import run_pipeline

    _state["task_started"] = True
    hc = HydraConfig.get()
    from omegaconf import OmegaConf

    # unresolved: an override holding a bad ${...} interpolation must reach to_object (exit 2), not fail here (exit 1)
    overrides = [str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False)]  # type: ignore[union-attr]
    out_dir = Path(hc.runtime.output_dir)
    from .core.store import install_log_redaction
    from .report import redact_run_outputs

    install_log_redaction()
    redact_run_outputs(out_dir)  # Hydra wrote .hydra/*.yaml with the config verbatim
    if hc.mode == RunMode.MULTIRUN:
        from .core.store import redact_files

        redact_files([Path(hc.sweep.dir) / "multirun.yaml"])
    if INTERRUPT["received"]:  # a sweep whose earlier job was interrupted (Ctrl-C, SIGTERM): the rest do not run
        code = EXIT_INTERRUPTED
        _write_error_summary(out_dir, overrides, code, "interrupted: not run (an earlier job of this sweep was interrupted)")
        return code
    try:
        obj = to_object(cfg, overrides)
    except Exception as e:  # a bad ${...} interpolation included: a ConfigError naming the override (to_object)
        print(f"error (exit {EXIT_INPUT}): {e}", file=sys.stderr)
        code = EXIT_INPUT
        _write_error_summary(out_dir, overrides, code, f"configuration error: {e}")
        logging.getLogger("pipeline").info("error (exit %d): %s", code, e)  # pipeline.log ends with the result too
    else:
        code = run_pipeline(obj, overrides=overrides, summary_dir=out_dir).exit_code
    record_exit_code(code)
    if hc.mode == RunMode.RUN:
        sys.exit(code)
    return code


def _write_error_summary(out_dir: Path, overrides: list[str], code: int, error: str) -> None:
    """A summary.json for a job that failed before the runner started (multirun comparisons read it)."""
    from .core.store import redact, write_json_atomic
    from .report import RunSummary

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out_dir / "summary.json", redact(RunSummary([], code, overrides, 0.0, None, error).to_json()))
    except Exception as e:
        print(f"could not write {out_dir / 'summary.json'}: {e}", file=sys.stderr)


_CONFIG_NAME_FLAGS = ("--config-name", "-cn")
_CONFIG_DIR_FLAGS = ("--config-dir", "-cd")


def _flag_value(argv: list[str], flags: tuple[str, ...]) -> tuple[int, int, str] | None:
    """(start, end, value) of ``--flag VALUE`` / ``--flag=VALUE`` in ``argv`` (end exclusive), or None."""
    for i, a in enumerate(argv):
        for f in flags:
            if a == f and i + 1 < len(argv):
                return i, i + 2, argv[i + 1]
            if a.startswith(f + "="):
                return i, i + 1, a.split("=", 1)[1]
    return None


#: Limits on a user YAML (``--config-dir/--config-name``), checked before OmegaConf reads it: its size in bytes, and
#: the number of nodes once every alias is expanded (a 700-byte file of nested aliases expands to 10^6 leaves).
MAX_USER_YAML_BYTES = 1 << 20
MAX_USER_YAML_NODES = 100_000


def check_yaml_size(path: Path) -> None:
    """Raise InputError (exit 2) when the YAML at ``path`` is over :data:`MAX_USER_YAML_BYTES`, or would expand to
    over :data:`MAX_USER_YAML_NODES` nodes, or has an alias that refers to itself.  The node graph is composed with
    PyYAML's safe loader (an alias is a shared node there, so nothing is expanded) and the expanded size is counted
    once per node."""
    import yaml

    from .errors import InputError

    size = path.stat().st_size
    if size > MAX_USER_YAML_BYTES:
        raise InputError(
            f"{path}: {size:,} bytes, over the limit of {MAX_USER_YAML_BYTES:,} for a config file. Fix: keep config values only."
        )
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid YAML ({e}). Fix: correct the file.") from e
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)] if root is not None else []
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        kids = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
        kids = kids if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) else []
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = total = 1 + sum(sizes[id(c)] for c in kids)
            if total > MAX_USER_YAML_NODES:
                raise InputError(
                    f"{path}:{node.start_mark.line + 1}: its aliases expand to over {MAX_USER_YAML_NODES:,} values, the "
                    f"limit for a config file. Fix: write the values out instead of nesting aliases (&anchor / *alias)."
                )
        elif id(node) not in sizes:
            if id(node) in open_nodes:
                raise InputError(f"{path}:{node.start_mark.line + 1}: an alias refers to itself. Fix: remove the recursive alias.")
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in kids if id(c) not in sizes)


def config_dir_problems(argv: list[str]) -> list[str]:
    """The ``--config-dir`` of ``argv`` that is no folder (:func:`pipeline.core.config.config_dir_problem`), as
    messages; [] when it is one or none is given."""
    from .core.config import config_dir_problem

    cdir = _flag_value(argv, _CONFIG_DIR_FLAGS)
    problem = config_dir_problem(cdir[2]) if cdir else None
    return [str(problem)] if problem is not None else []


def user_config_argv(argv: list[str], tmp_root: Path, *, probe_run_dir: bool = True) -> list[str]:
    """Let ``--config-dir D --config-name NAME`` name a plain YAML of values (no ``defaults`` list).

    Hydra would make such a file the *primary* config, so none of the pipeline's defaults (presets, schema) apply
    and the run fails.  This rewrites the arguments so the pipeline's own config stays primary and the file is
    merged on top: top-level ``group: preset`` strings (``quant: int4_awq``) become ``group=preset`` overrides,
    everything else goes into ``tmp_root/user_config/NAME.yaml``, appended as ``+user_config@_global_=NAME``
    (so command-line overrides still win).  ``tmp_root`` is also the search path (it links the entries of ``D``,
    so presets kept there, e.g. ``D/model/mine.yaml``, resolve too).

    A file that has a ``defaults`` list is left to Hydra (it composes it as written).  With ``probe_run_dir`` (a run;
    ``pipeline plan`` writes no run folder) a ``hydra.run.dir`` / ``hydra.sweep.dir`` the file sets is checked as on
    the command line (:func:`run_dir_problems`; a path under /proc gave Hydra's traceback: a recheck).

    Returns the new argv; raises :class:`pipeline.errors.InputError` (exit 2) when the file is missing or is
    not a YAML mapping, naming the file and the fix.
    """
    from omegaconf import OmegaConf

    from .core.config import CONFIG_DIR, GROUPS
    from .errors import InputError

    name = _flag_value(argv, _CONFIG_NAME_FLAGS)
    if name is None:
        return argv
    problems = config_dir_problems(argv)
    if problems:
        raise InputError(problems[0])
    cdir = _flag_value(argv, _CONFIG_DIR_FLAGS)
    base = Path(cdir[2]).expanduser() if cdir else CONFIG_DIR
    stem = name[2][:-5] if name[2].endswith(".yaml") else name[2]
    path = base / f"{stem}.yaml"
    if not path.is_file():
        if cdir is None:
            return argv  # a config of the pipeline's own folder: Hydra reports a missing one
        raise InputError(
            f"--config-name={name[2]}: no {path}. Fix: pass the YAML's name without .yaml and the folder "
            f"holding it as --config-dir (found there: {sorted(p.name for p in base.glob('*.yaml'))[:10]})."
        )
    check_yaml_size(path)
    try:
        doc = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as e:
        raise InputError(f"{path}: not valid YAML ({e}). Fix: correct the file.") from e
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a mapping of config values (e.g. `model: {{path: /ckpt}}`), got {type(doc).__name__}.")
    if "defaults" in doc:
        problem = _defaults_problem(doc)
        if problem is not None:
            raise InputError(f"{path}: {problem}")
        return argv
    problems = check_overrides(_yaml_as_overrides(doc))
    if probe_run_dir:  # a `hydra: {run: {dir: /proc/x}}` block: the command line's check, not Hydra's traceback
        block = doc["hydra"] if "hydra" in doc else None
        problems += run_dir_problems([f"hydra.{o}" for o in _yaml_as_overrides(block)] if isinstance(block, dict) else [])
    if problems:
        raise InputError(f"{path}: " + ("\n  - ".join(["", *problems]) if len(problems) > 1 else problems[0]))
    overrides = []
    for g in list(doc):
        if g in GROUPS and isinstance(doc[g], str):
            overrides.append(f"{g}={doc.pop(g)}")
    ucfg = tmp_root / "user_config"
    ucfg.mkdir(parents=True, exist_ok=True)
    (ucfg / f"{stem}.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(doc)), encoding="utf-8")
    if cdir is not None:
        for entry in base.iterdir():
            if entry.name != "user_config" and not (tmp_root / entry.name).exists():
                (tmp_root / entry.name).symlink_to(entry.resolve())
    drop = {i for r in (name, cdir) if r for i in range(r[0], r[1])}
    options, positionals = _split_hydra_args([a for i, a in enumerate(argv) if i not in drop])
    given = {o.lstrip("+~").split("=", 1)[0].split("@", 1)[0] for o in positionals}
    overrides = [o for o in overrides if o.split("=", 1)[0] not in given]  # the command line wins over the file
    # Hydra's argparse takes the overrides as one run of positionals: options first, then every override
    return [f"--config-dir={tmp_root}", *options, *overrides, f"+user_config@_global_={stem}", *positionals]


def _defaults_problem(doc: dict[Any, Any]) -> Problem | None:
    """What a user YAML's ``defaults`` list lacks when it names no config but, at most, ``pipeline_schema`` (the rest
    ``_self_``, ``group: preset`` and ``override ...`` entries): the pipeline schema, or a preset for some groups
    (:func:`pipeline.core.config.defaults_problem`, said before Hydra reads the file: a command-line override of a key
    or group the file does not set got Hydra's "Could not override ..."); None when it lacks neither, or names
    another config (``- pipeline``, a YAML of the user's: the composed config is checked then)."""
    import dataclasses

    from omegaconf import MISSING

    from .core.config import GROUPS, PipelineConfig, defaults_problem

    entries = doc["defaults"] if isinstance(doc["defaults"], list) else []
    names = {e.strip().lstrip("/") for e in entries if isinstance(e, str)} - {"_self_"}
    if names - {"pipeline_schema"}:
        return None
    schema = "pipeline_schema" in names
    chosen = {str(k).split()[-1].split("@")[0].lstrip("/") for e in entries if isinstance(e, dict) for k in e}
    unset = {f.name for f in dataclasses.fields(PipelineConfig) if f.default == MISSING}  # the schema has no default
    missing = [g for g in GROUPS if g not in chosen and g not in doc and (g in unset or not schema)]
    return defaults_problem(missing, schema=schema, value=doc["defaults"]) if missing or not schema else None


def user_config_compose_args(
    config_dir: str | None, config_name: str | None, overrides: list[str], tmp_root: Path
) -> tuple[str | None, str, list[str]]:
    """``(config_dir, config_name, overrides)`` for :func:`pipeline.core.config.compose` that compose what
    ``pipeline --config-dir DIR --config-name NAME overrides...`` runs: the same :func:`user_config_argv` (its size
    and alias limits, its checks of the YAML's values, its messages), with its files under ``tmp_root`` (the caller
    removes it).  ``pipeline plan`` plans a user YAML with it."""
    argv = [*(["--config-dir", config_dir] if config_dir else []), *(["--config-name", config_name] if config_name else [])]
    argv = user_config_argv([*argv, *overrides], tmp_root, probe_run_dir=False)
    cdir, cname = _flag_value(argv, _CONFIG_DIR_FLAGS), _flag_value(argv, _CONFIG_NAME_FLAGS)
    drop = {i for r in (cdir, cname) if r for i in range(r[0], r[1])}
    rest = [a for i, a in enumerate(argv) if i not in drop]
    return (cdir[2] if cdir else None), (cname[2] if cname else "pipeline"), rest


def _yaml_as_overrides(doc: dict[Any, Any], prefix: str = "") -> list[str]:
    """A user YAML's values as the ``key=value`` overrides they amount to, so :func:`check_overrides` judges a file
    as it judges the command line (unknown keys, wrong types, ``stages`` that is not a list)."""
    out: list[str] = []
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if key == "hydra" or key.startswith("hydra."):
            continue
        if isinstance(v, dict) and v:
            out += _yaml_as_overrides(v, f"{key}.")
        elif isinstance(v, list):
            out.append(f"{key}=[{','.join(str(x) for x in v)}]")
        else:
            out.append(f"{key}={'null' if v is None else str(v).lower() if isinstance(v, bool) else v}")
    return out


def resolve_printed_config(argv: list[str]) -> list[str]:
    """``argv`` with Hydra's ``--resolve`` added in front when it asks to print the job config (``--cfg job``,
    ``-c job``, ``--cfg=job``) without it: Hydra prints interpolations such as ``${checkpoint_name:${.path}}`` as
    written otherwise, while the pipeline's docs promise the resolved values (``model.name: support-llama``)."""
    options, _ = _split_hydra_args(argv)
    wants_job = any(
        (a in ("--cfg", "-c") and i + 1 < len(options) and options[i + 1] == "job") or a in ("--cfg=job", "-c=job")
        for i, a in enumerate(options)
    )
    return ["--resolve", *argv] if wants_job and "--resolve" not in options else argv


def alias_notes_for_printed_config(argv: list[str]) -> list[str]:
    """One note per deprecated alias among ``argv``'s overrides when ``argv`` asks Hydra to print the job config.

    Hydra prints the config as composed, before the run copies an alias into its new field
    (:func:`pipeline.core.config.resolve_aliases`), so ``--cfg job quant.tp_size=2`` shows ``parallel.tp_size: 1``;
    the note says which field the run uses.  Empty when no config is printed or no alias is given."""
    options = [a for a in argv if a.startswith("-")] + [a for i, a in enumerate(argv) if i and argv[i - 1] in ("--cfg", "-c")]
    if not any(a in ("job", "--cfg=job", "-c=job") for a in options):
        return []
    import dataclasses
    import typing

    from .core.config import PipelineConfig, alias_paths

    hints = typing.get_type_hints(PipelineConfig)
    groups: dict[str, Any] = {n: t() for n, t in hints.items() if isinstance(t, type) and dataclasses.is_dataclass(t)}
    aliases = alias_paths(PipelineConfig(**groups))
    given = {a.lstrip("+~").split("=", 1)[0].strip(): a.split("=", 1)[1] for a in argv if "=" in a and not a.startswith("-")}
    notes = []
    for a in argv:
        if "=" not in a or a.startswith("-"):
            continue
        key, value = a.lstrip("+~").split("=", 1)
        if key.strip() in aliases:
            new = aliases[key.strip()]
            if new in given and given[new] != value:
                notes.append(
                    f"note: {key.strip()}={value} is a deprecated alias of {new}, which is set to {given[new]}: the run "
                    f"refuses this (exit 2). Fix: set only {new}."
                )
                continue
            notes.append(
                f"note: {key.strip()} is a deprecated alias of {new}; the printed config shows the composed values, "
                f"the run uses {new}={value}. Fix: set {new} instead."
            )
    return notes


#: Hydra command-line options that take a value (hydra/_internal/utils.py get_args_parser, Hydra 1.3).
_HYDRA_VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--experimental-rerun")
_HYDRA_INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def _split_hydra_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(options with their values, overrides) of a Hydra command line, each in its original order."""
    options: list[str] = []
    positionals: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-"):  # overrides never start with "-" (key=value, +key=, ~key)
            options.append(a)
            takes = a in _HYDRA_VALUE_FLAGS or (a in ("--info", "-i") and i + 1 < len(argv) and argv[i + 1] in _HYDRA_INFO_CHOICES)
            if takes and i + 1 < len(argv):
                options.append(argv[i + 1])
                i += 1
        else:
            positionals.append(a)
        i += 1
    return options, positionals


def check_overrides(argv: list[str]) -> list[str]:
    """:func:`pipeline.core.config.overrides.check_overrides` (shared with :func:`pipeline.core.config.compose`),
    imported on use so ``pipeline doctor`` / ``client`` do not load the config schemas."""
    from .core.config.overrides import check_overrides as check

    return check(argv)


_EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"
_SWEEPER_PARAMS = "hydra.sweeper.params."


def sweep_dirname_argv(argv: list[str]) -> list[str]:
    """``argv`` of a ``-m`` sweep with ``hydra.job.config.override_dirname.exclude_keys=[...]`` added, listing every
    override key that is not swept, so each job's folder (``hydra.job.override_dirname`` via :func:`job_dirname`)
    names only what differs between the jobs (``0-quant=none``), not every override of the command line (fourteen
    overrides made a name over the 255 bytes a file name may hold).  A key swept anywhere on the line (or in
    ``hydra.sweeper.params``) is never excluded, even when it is also given a fixed value (``quant=none ...
    quant=none,int8_sq``).  Unchanged when it is no sweep, when the user
    sets the exclude list, or when every override is swept."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    options, positionals = _split_hydra_args(argv)
    if not ({"-m", "--multirun"} & set(options)) or any(a.lstrip("+").startswith(_EXCLUDE_KEYS + "=") for a in positionals):
        return argv
    parser = OverridesParser.create()
    fixed: list[str] = []
    swept: set[str] = set()
    for a in positionals:
        try:
            o = parser.parse_override(a)
        except HydraException:
            continue  # refused before this runs (pipeline.core.config.overrides.override_problems)
        if o.key_or_group.startswith(_SWEEPER_PARAMS):  # a sweeper plugin's search space (Optuna, Nevergrad, ...)
            swept.add(o.key_or_group[len(_SWEEPER_PARAMS) :])
        elif o.is_sweep_override():
            swept.add(o.key_or_group)
        elif not o.is_hydra_override() and o.key_or_group not in fixed:
            fixed.append(o.key_or_group)
    # a key swept anywhere on the line stays in the name, even when it is also given a fixed value (`quant=none ...
    # quant=none,int8_sq`): excluding it would name both jobs alike (`0`, `1`; `${hydra.job.override_dirname}`: '')
    fixed = [k for k in fixed if k not in swept]
    if not fixed:
        return argv
    at = argv.index(next(a for a in positionals if "=" in a)) + 1  # in the overrides' run: Hydra's argparse takes one
    return [*argv[:at], f"{_EXCLUDE_KEYS}=[{','.join(fixed)}]", *argv[at:]]


def run_dir_problems(argv: list[str]) -> list[str]:
    """``hydra.run.dir=`` / ``hydra.sweep.dir=`` given on the command line (without interpolations) that cannot be
    created or written (``/proc/x``, a read-only or full filesystem): one message each, naming the override, the
    reason and the fix, found before Hydra prints its tracebacks.  The folder is created (Hydra would create it) and
    a 4 KiB probe file is written, synced and removed in it."""
    import os
    import secrets

    out: list[str] = []
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key not in ("hydra.run.dir", "hydra.sweep.dir") or not value or "${" in value:
            continue
        probe = Path(value) / f".pipeline-write-probe-{secrets.token_hex(4)}"
        try:
            Path(value).mkdir(parents=True, exist_ok=True)
            with open(probe, "wb") as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            out.append(
                f"{key}={value!r}: the run folder cannot be created or written ({e.strerror or e}). Fix: set {key} to a "
                f"writable folder with free space, e.g. {key}=runs/my-run."
            )
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
    return out


def _subcommand(argv: list[str]) -> None:
    """Run ``pipeline <subcommand> ...``, print the help, or refuse a mistyped subcommand (exit 2); each exits.
    Returns only when ``argv`` is a run (Hydra overrides)."""
    if argv[:1] in (["--version"], ["-V"]):  # Hydra's own --version printed "Hydra 1.3.8"
        from . import __version__

        print(f"pipeline {__version__}")
        sys.exit(0)
    is_help = bool(argv) and argv[0] in ("-h", "--help", "help")
    if is_help or (argv and argv[0] in SUBCOMMANDS):
        try:
            if is_help:
                print(__doc__.strip())
                print("\nConfig groups and overrides: pipeline --cfg job (resolved config), pipeline --hydra-help; docs/cli.md.")
                code = 0
            else:
                code = importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:]) or 0
        except KeyboardInterrupt:  # Ctrl-C in a subcommand (client, plan, ...): the documented 130, no traceback
            from .errors import EXIT_INTERRUPTED

            print(f"pipeline {argv[0]}: interrupted", file=sys.stderr)
            code = EXIT_INTERRUPTED
        sys.exit(code)
    # `migrate` is run by main() itself (the pipeline chain with a release's config), not by a module's main(argv)
    known = Registry("subcommand", {**{n: SUBCOMMANDS[n] for n in SUBCOMMANDS}, "migrate": "pipeline.package.migrate"})
    if argv and argv[0] != "migrate" and argv[0][:1] not in "-+~" and "=" not in argv[0]:
        # a bare word is no Hydra override (`pipeline plna`, `pipeline frobnicate`): not Hydra's "missing EQUAL"
        from .errors import EXIT_INPUT

        print(f"pipeline: {known.miss(argv[0])} (or pass overrides as key=value{_bare_word_hint(argv[0])})", file=sys.stderr)
        sys.exit(EXIT_INPUT)


def _bare_word_hint(word: str) -> str:
    """What a bare word that is no subcommand most likely meant, as the override that does it: a config group
    (``pipeline quant``: ``quant=<preset>`` and the presets) or a stage (``pipeline quantize``: ``stages=[quantize]``,
    which runs it with the stages it needs); "" when it is close to neither (difflib, cutoff 0.6)."""
    import difflib

    from .core.config import CONFIG_DIR, STAGES

    groups = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name != "hydra")
    group = word if word in groups else None
    stage = None if group else next(iter(difflib.get_close_matches(word, STAGES, n=1)), None)
    group = group or (None if stage else next(iter(difflib.get_close_matches(word, groups, n=1)), None))
    if stage:
        return f"; to run the stages up to {stage}: pipeline stages=[{stage}]"
    if group:
        presets = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
        return f"; to choose a {group} preset: pipeline {group}=<preset>, one of {presets}"
    return ""


def _interrupt_on(sig: signal.Signals, handler: Any = signal.default_int_handler) -> None:
    """Make ``sig`` raise KeyboardInterrupt, so it stops a run as Ctrl-C does (exit 130, the stage's temporary folder
    removed, the summary written). SIGINT: a job started in the background of a non-interactive shell (CI runners,
    ``cmd &``) inherits it as *ignored*, and Python then never raises KeyboardInterrupt. SIGTERM (a cancelled CI job,
    ``timeout``, ``kill``; set for a run only, ``pipeline serve`` has its own): its default handler left the folder in
    the store for good (a trial). SIGHUP (a dropped SSH session) likewise, unless it is ignored (``nohup``: the user
    asked the run to outlive the terminal)."""
    if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN:
        signal.signal(sig, handler)


def _interrupt_once(signum: int, frame: Any) -> None:
    """A run's handler of SIGINT, SIGTERM and SIGHUP: the first raises KeyboardInterrupt; later ones are ignored, so a
    second Ctrl-C cannot abort the cleanup and the summary the first one started (Ctrl-C twice, 50 ms apart, left a
    KeyboardInterrupt traceback in write_summary and no summary.json: a trial). It stops a sweep too: the jobs after
    the interrupted one are not run (:func:`_task`; a SIGTERM-ed CI job ran the rest of its sweep, a recheck).

    The first one sets the signals this handler holds to SIG_IGN at the OS level (SIGHUP under ``nohup`` is ignored
    already): Python's handlers are gone while the interpreter shuts down, and a second SIGTERM landing there turned
    the run's exit 130 into 143 (a trial: the cleanup ended 17 ms after the first). ``kill -9`` still stops it."""
    if not INTERRUPT["received"]:
        INTERRUPT["received"] = True
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is _interrupt_once:
                signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt


class _DropWhenReaderGone:
    """``sys.stdout`` while a ``pipeline`` command runs: once its reader has gone (``pipeline plan ... | head -1``),
    what it writes is dropped (stdout onto ``os.devnull``, Python's recipe in the ``signal`` docs), so the command runs
    on to its own exit code: a refused plan still exits 4, ``doctor --require`` 4, a run writes its summary.  Before,
    the BrokenPipeError ended the command there (rich's Console: exit 1, or 0 by our own catch; ``print``: a
    traceback) and its exit code was lost (trials)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self.stream.write(text))
        except OSError:  # EPIPE; ENOSPC (a log redirected to a full disk) must not fail the build either
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        with contextlib.suppress(OSError):
            self.stream.flush()  # what was still buffered goes to os.devnull

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding ...: the stream's
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> None:
    """``pipeline ...``: :func:`_main` with stdout and stderr :class:`_DropWhenReaderGone` (``2>&1 | head``: a progress
    bar on stderr ended the run with exit 1 and no summary; a closed stdout, ``>&-``, is os.devnull)."""
    streams = (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = (_DropWhenReaderGone(s if s is not None else open(os.devnull, "w")) for s in streams)
    try:
        _main(argv)
    finally:
        for wrapped in (sys.stdout, sys.stderr):
            wrapped.flush()
        sys.stdout, sys.stderr = streams


def _main(argv: list[str] | None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _interrupt_on(signal.SIGINT)
    _subcommand(argv)  # exits when argv names a subcommand, help, or a mistyped subcommand
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        _interrupt_on(sig, _interrupt_once)
    from .core.memory import tune_allocator

    tune_allocator()  # freed weights go back to the OS (docs/memory.md)
    # `target_gpu=X` is accepted as an alias of `target.gpu=X` (as in `pipeline plan`)
    argv = [f"target.gpu={a.split('=', 1)[1]}" if a.startswith("target_gpu=") else a for a in argv]
    import shutil
    import tempfile

    import hydra

    from .core.config import CONFIG_DIR, register
    from .errors import EXIT_INPUT, InputError

    register()
    migrate_tmp = None
    if argv and argv[0] == "migrate":  # `pipeline migrate <engine release>`: the same chain for the PyTorch backend
        from .package.migrate import USAGE, pipeline_argv

        if argv[1:2] in (["-h"], ["--help"]):
            print(USAGE)
            sys.exit(0)

        migrate_tmp = Path(tempfile.mkdtemp(prefix="pipeline-migrate-"))
        try:
            argv = pipeline_argv(argv[1:], migrate_tmp)
        except InputError as e:
            shutil.rmtree(migrate_tmp, ignore_errors=True)
            print(f"error (exit {EXIT_INPUT}): {e}", file=sys.stderr)
            sys.exit(EXIT_INPUT)
    from .core.config.overrides import override_problems, repeated_key_notes, sweep_problems

    problems = [str(p) for p in override_problems(argv)] + run_dir_problems(argv) + config_dir_problems(argv)
    if not problems and not ({"-m", "--multirun"} & set(argv)) and not any(a.startswith("hydra.mode=") for a in argv):
        problems = [str(p) for p in sweep_problems(argv, cli=True)]  # Hydra's own message names no key's fix
    if problems:
        for msg in problems:
            print(f"error (exit {EXIT_INPUT}): {msg}", file=sys.stderr)
        sys.exit(EXIT_INPUT)
    for note in [*repeated_key_notes(argv), *alias_notes_for_printed_config(argv)]:
        print(note, file=sys.stderr)
    argv = resolve_printed_config(argv)
    # only a --config-name YAML needs the folder: a run killed before its finally would leave an empty one behind
    tmp_root = Path(tempfile.mkdtemp(prefix="pipeline-user-config-")) if _flag_value(argv, _CONFIG_NAME_FLAGS) else None
    try:
        argv = user_config_argv(argv, tmp_root) if tmp_root is not None else argv
    except InputError as e:
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
        print(f"error (exit {EXIT_INPUT}): {e}", file=sys.stderr)
        sys.exit(EXIT_INPUT)
    sys.argv = [sys.argv[0], *sweep_dirname_argv(argv)]
    app = hydra.main(config_path=str(CONFIG_DIR), config_name="pipeline", version_base="1.3")(_task)
    try:
        app()
    except SystemExit as e:
        if not _state["task_started"] and e.code not in (0, None):
            # Hydra reports composition errors (unknown key, wrong type, unknown preset) and exits 1;
            # they are configuration errors for a CI job.
            sys.exit(EXIT_INPUT)
        raise
    finally:
        import shutil

        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
        if migrate_tmp is not None:
            shutil.rmtree(migrate_tmp, ignore_errors=True)
    from .report import worst_exit_code

    sys.exit(worst_exit_code())


if __name__ == "__main__":
    main()
