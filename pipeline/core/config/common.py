"""Helpers shared by the per-stage config schemas.

A field created with :func:`runtime` is excluded from the stage's cache key: it changes how
a stage runs (progress bars, paths, worker counts), never the bytes it writes.  Paths are
always runtime fields: the *content* behind them is digested into the key instead.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import field
from pathlib import Path
from typing import Any

from ...errors import InputError, grouped

#: the spellings of a boolean this pipeline accepts: OmegaConf's (omegaconf/nodes.py BooleanNode) without its
#: "any other integer is true" (``package.parity=2``), which would accept a typo silently
BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "y", "n", "1", "0"})


def runtime(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, doc: str = "") -> Any:
    """A dataclass field that does not enter the cache key (see module docstring)."""
    kw: dict[str, Any] = {"metadata": {"cache": False, "doc": doc}}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, **kw)
    return field(default=default, **kw)


def deprecated_alias(of: str) -> Any:
    """A field kept for one release as the old spelling of the field ``of``: default None.

    ``of`` is a field name of the same group (``"kv_cache_dtype"``), or a dotted path from the config root for a
    field that moved to another group (``"parallel.tp_size"``).

    It is not part of the cache key (``runtime``), so both spellings of one config give the same keys.
    :func:`pipeline.core.config.resolve_aliases` copies a value set here into ``of`` when the config is resolved
    (warning with both spellings) and refuses the config when both are set to different values.
    """
    return field(default=None, metadata={"cache": False, "alias_of": of, "doc": f"deprecated alias of {of}, removed in the next release"})


def key_fields(obj: Any) -> dict[str, Any]:
    """The fields of a config dataclass that affect an artifact's bytes (recursively)."""
    if not dataclasses.is_dataclass(obj):
        return obj
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if f.metadata.get("cache", True) is False:
            continue
        v = getattr(obj, f.name)
        out[f.name] = key_fields(v) if dataclasses.is_dataclass(v) else v
    return out


@dataclasses.dataclass
class Problem:
    """One validation problem: the config field, the offending value, what is wrong and the fix."""

    field: str
    value: Any
    message: str
    fix: str = ""

    def __str__(self) -> str:
        s = f"{self.field}={self.value!r}: {self.message}"
        return s + (f" Fix: {self.fix}" if self.fix else "")


def file_problems(field: str, value: Any, texts: list[str], more: str, default_fix: str = "") -> list[Problem]:
    """The problems a data file's reader found (``texts``: ``file:line: ... Fix: ...``) as :class:`Problem` s of
    ``field``: the texts :func:`~pipeline.errors.grouped` (one mistake on many lines is one problem naming them all),
    the first :data:`~pipeline.errors.MAX_REPORTED_PROBLEMS` of them, each split at ``" Fix: "`` (``default_fix``
    when a text has none), and one saying how many more ``more`` there are."""
    from ...errors import MAX_REPORTED_PROBLEMS, grouped

    out, shown = [], grouped(texts)
    for text in shown[:MAX_REPORTED_PROBLEMS]:
        message, _, fix = text.partition(" Fix: ")
        out.append(Problem(field, value, message, fix or default_fix))
    if len(shown) > MAX_REPORTED_PROBLEMS:
        extra = f"... and {len(shown) - MAX_REPORTED_PROBLEMS} more {more} (not listed here)."
        out.append(Problem(field, value, extra, "fix the ones above, then run again to list the rest"))
    return out


def problems_where(*rules: tuple[Any, str, Any, str, str]) -> list[Problem]:
    """A table of checks: the :class:`Problem` ``(field, value, message, fix)`` of each rule
    ``(condition, field, value, message, fix)`` whose condition holds, in order."""
    return [Problem(*rule[1:]) for rule in rules if rule[0]]


class ConfigError(InputError):
    """Raised with every :class:`Problem` found, reported together: bad input, ``exit_code`` 2 (an
    :class:`~pipeline.errors.InputError`, so a ``ValueError`` too)."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {t}" for t in grouped([str(p) for p in self.problems]))  # one line per distinct message
        super().__init__(f"{len(self.problems)} configuration problem(s):\n{lines}")


class ConfigTypeError(ConfigError, TypeError):
    """A :class:`ConfigError` (exit 2) for an argument of the wrong Python type given to the API (a str where a list
    of overrides goes, a dict where a config goes); a ``TypeError`` too."""


def choice(problems: list[Problem], name: str, value: Any, choices: list | tuple, fix: str = "") -> None:
    """Append a Problem if ``value`` is not one of ``choices``."""
    if value not in choices:
        problems.append(Problem(name, value, f"must be one of {list(choices)}.", fix or f"set {name} to one of {list(choices)}"))


#: the repository root (relative user paths fall back to it)
REPO_ROOT = Path(__file__).resolve().parents[3]


def resolve_path(p: str | None) -> Path | None:
    """Resolve a user path: absolute as is; relative against the cwd, else the repo root."""
    if p is None:
        return None
    path = Path(os.path.expanduser(str(p)))
    if path.is_absolute():
        return path
    cwd = Path.cwd() / path
    if cwd.exists():
        return cwd.resolve()
    repo = REPO_ROOT / path
    return repo.resolve() if repo.exists() else cwd
