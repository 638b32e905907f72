"""``${...}`` interpolations of a composed config, resolved eagerly: an override (or a YAML value) whose interpolation
cannot be resolved (an unknown key, a cycle, an unknown resolver, a value of the wrong type) is a :class:`Problem`
naming the override, what it refers to and the fix, instead of OmegaConf's ``InterpolationKeyError`` raised
wherever the value is first read.  :func:`pipeline.core.config.to_object` (the ``pipeline`` command and
:func:`pipeline.core.config.compose`) calls :func:`interpolation_problems` first, so both refuse these with exit 2.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    GrammarParseError,
    InterpolationKeyError,
    InterpolationResolutionError,
    InterpolationToMissingValueError,
    InterpolationValidationError,
    UnsupportedInterpolationType,
)

from .common import Problem
from .overrides import OverrideProblem

#: the errors of an interpolation that cannot be resolved (InterpolationKeyError and the others subclass the first)
ERRORS = (InterpolationResolutionError, GrammarParseError)

_ESCAPE = r"or write a literal ${...} as \${...}"


def _first_line(e: Exception) -> str:
    return (str(getattr(e, "msg", None) or e).strip().splitlines() or [type(e).__name__])[0]


#: (error, pattern whose group 1 is the name the interpolation refers to (when it does not match: ``fallback``, None = the
#: error's message), what is wrong, the fix): :func:`_why_and_fix` answers with the first whose error ``e`` is
_NAMED: tuple[tuple[type[Exception], str, str | None, str, str], ...] = (
    (InterpolationToMissingValueError, r"key '([^']*)'", "?", "the key {!r} it refers to has no value (???).", "set that key too"),
    (
        InterpolationKeyError,
        r"Interpolation key '([^']*)' not found",
        None,
        "it refers to {!r}, which is no key of the config.",
        "reference an existing key, e.g. ${model.path} (pipeline --cfg job prints them all)",
    ),
    (
        UnsupportedInterpolationType,
        r"Unsupported interpolation type (\S+)",
        None,
        "it calls the resolver {!r}, which is not registered.",
        "use a registered resolver (e.g. ${oc.env:HOME})",
    ),
)


def _why_and_fix(e: Exception) -> tuple[str, str]:
    """What is wrong with the interpolation that raised ``e``, and the fix."""
    msg = _first_line(e)
    for error, pattern, fallback, why, fix in _NAMED:
        if isinstance(e, error):
            m = re.search(pattern, msg)
            return why.format(m.group(1) if m else fallback or msg), f"{fix}, {_ESCAPE}"
    if isinstance(e, InterpolationValidationError):
        return f"the value it resolves to does not fit the field ({msg}).", "reference a key whose value has the field's type"
    if isinstance(e, InterpolationResolutionError) and "Recursive interpolation" in msg:
        return "it refers to itself (a cycle).", f"reference another key, {_ESCAPE}"
    m = re.search(r"Environment variable '([^']*)' not found", msg)
    if m:
        return (
            f"the environment variable {m.group(1)!r} it reads is not set.",
            f"set it, or give a default: ${{oc.env:{m.group(1)},<default>}}",
        )
    if isinstance(e, GrammarParseError):
        return f"it is no valid interpolation ({msg}).", f"close each ${{ with }}, {_ESCAPE}"
    return f"{msg}.", f"reference an existing key without a cycle, {_ESCAPE}"


def _raw_value(cfg: DictConfig, key: str) -> Any:
    """The value at the dotted ``key`` of ``cfg`` as written (``${...}`` unresolved); None when it cannot be read."""
    parent_key, _, leaf = key.rpartition(".")
    try:
        parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False) if parent_key else cfg
        node = parent._get_node(leaf) if OmegaConf.is_config(parent) else None
        return node._value() if node is not None else None
    except Exception:
        return None


def interpolation_problems(cfg: DictConfig, overrides: Sequence[str]) -> list[Problem]:
    """One problem per override of ``overrides`` (``key=value``) whose value holds a ``${...}`` that cannot be
    resolved in ``cfg`` (the config composed with them), naming the override; empty when all resolve."""
    out: list[Problem] = []
    for arg in overrides:
        if arg.startswith(("~", "-")) or "=" not in arg:
            continue
        key, value = arg.lstrip("+").split("=", 1)
        key = key.strip()
        if "${" not in value or key.startswith(("hydra.", "hydra/")):
            continue
        try:
            node = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
            if OmegaConf.is_config(node):
                OmegaConf.to_container(node, resolve=True)
        except ERRORS as e:
            why, fix = _why_and_fix(e)
            what = f"its ${{...}} interpolation cannot be resolved: {why}"
            out.append(OverrideProblem(key, value, what, fix, text=f"{arg}: {what} Fix: {fix}."))
    return out


def interpolation_problem(e: Exception, cfg: DictConfig) -> Problem:
    """The :class:`Problem` of the interpolation error ``e`` raised while resolving ``cfg`` (a value no override
    set: a preset's or a user YAML's), naming the field (OmegaConf's ``full_key``) and its value as written."""
    key = str(getattr(e, "full_key", None) or "?")
    why, fix = _why_and_fix(e)
    return Problem(key, _raw_value(cfg, key), f"its ${{...}} interpolation cannot be resolved: {why}", fix)
