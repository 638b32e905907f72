"""Checks of command-line overrides (``key=value``, ``group=preset``, ``+key=value``, ``~key``) against the pipeline's
schema and presets, before Hydra composes the config: the ``pipeline`` command (:mod:`pipeline.cli`) and
:func:`pipeline.core.config.compose` share them, so both refuse the same overrides with the same message (the
override, the valid names, closest first, and the fix) instead of Hydra's, which suggests ``+key=...`` (a field
nothing reads), lists the internal ``base_<group>`` schemas among the presets and points to ``HYDRA_FULL_ERROR``.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
from typing import Any

from .common import BOOL_WORDS, Problem
from .schema import CONFIG_DIR, GROUPS, PipelineConfig


@dataclasses.dataclass
class OverrideProblem(Problem):
    """A :class:`Problem` of one override (``field`` = its key, ``value`` = its value), said as the command line says
    it (``text``: the override, what is wrong and the fix)."""

    text: str = ""

    def __str__(self) -> str:
        return self.text


def _grammar_problem(parser: Any, arg: str) -> OverrideProblem | None:
    """``arg`` as an override Hydra's grammar cannot parse (``model.name=a=b``, ``model.name=模型``: an unquoted ``=``
    or non-ASCII letter), with the fix: the value quoted (``'model.name="a=b"'``); None when it parses or is no
    override (no ``=``, or an option: ``-...``)."""
    from hydra.errors import HydraException

    if arg.startswith("-") or "=" not in arg:
        return None
    try:
        parser.parse_override(arg)
        return None
    except HydraException as e:
        why = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
    key, value = arg.split("=", 1)
    try:
        parser.parse_override(f"{key}=x")
    except HydraException:
        fix = "a key is a dotted name of ASCII letters, digits and _ (e.g. model.name=my-model); `pipeline --cfg job` lists them"
    else:
        quoted = f"{key}='{value}'" if '"' in value else f'{key}="{value}"'
        fix = f"quote the value, as Hydra's override grammar needs for '=' and non-ASCII text: {shlex.quote(quoted)}"
    text = f"{arg}: Hydra cannot parse this override ({why}). Fix: {fix}."
    return OverrideProblem(key.lstrip("+~"), value, "Hydra cannot parse this override.", fix, text=text)


def override_problems(argv: list[str]) -> list[OverrideProblem]:
    """Every problem of the overrides in ``argv`` (the ``pipeline`` command's arguments, or the list
    :func:`pipeline.core.config.compose` takes): each one Hydra's grammar cannot parse (:func:`_grammar_problem`),
    then the schema's problems (:func:`check_overrides`) of the others."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out: list[OverrideProblem] = []
    parsed: list[str] = []
    for arg in argv:
        bad = _grammar_problem(parser, arg)
        if bad is None:
            parsed.append(arg)
        else:
            out.append(bad)
    return out + _problems(parsed)


def sweep_problems(argv: list[str], *, cli: bool = False) -> list[OverrideProblem]:
    """Each override in ``argv`` that is a sweep (``quant=none,fp8``, ``build.max_seq_len=range(1,3)``): one config
    has one value, so :func:`pipeline.core.config.compose` refuses them (Hydra's compose API says only "Ambiguous
    value"); the ``pipeline -m`` command runs a sweep (``cli``: the fix is said for the command line without ``-m``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out: list[OverrideProblem] = []
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        try:
            o = parser.parse_override(arg)
        except HydraException:
            continue  # a grammar problem: override_problems says it
        if o.is_sweep_override():
            key = o.get_key_element()
            values = [_show(e) for e in _elements(arg.split("=", 1)[1])]
            what = f"is a sweep of {len(values)} values; a config has one value per key."
            one = "set one value" if cli else "compose one config per value"
            fix = f"{one} (e.g. {key}={values[0]}), or run the sweep with `pipeline -m {arg}`"
            out.append(OverrideProblem(key, arg.split("=", 1)[1], what, fix, text=f"{arg}: {what} Fix: {fix}."))
    return out


def repeated_key_notes(argv: list[str]) -> list[str]:
    """One note per key given more than once in ``argv`` (``quant=fp8 ... quant=none``): Hydra applies them in order,
    so the last value is the one used (``make bench ARGS=quant=fp8`` relies on that to override the target's own
    ``quant=``); the note says so instead of the earlier value being dropped unseen."""
    seen: dict[str, list[str]] = {}
    for kv in (_key_value(a) for a in argv if not a.startswith("~")):
        if kv is not None:
            seen.setdefault(kv[0], []).append(kv[1])
    return [
        f"note: {k} is given {len(vs)} times ({', '.join(vs)}); the last, {k}={vs[-1]}, is used." for k, vs in seen.items() if len(vs) > 1
    ]


def check_overrides(argv: list[str]) -> list[str]:
    """Problems with plain ``key=value`` / ``group=preset`` overrides, found before Hydra composes the config, each
    naming the override, the valid names (closest first) and the fix. Hydra's own messages for these cases suggest
    ``+key=...`` (which would add an unknown field) and point to ``HYDRA_FULL_ERROR``. ``+key=`` / ``++key=`` are
    checked the same way (an added field nothing reads would be silently ignored); ``~`` overrides, ``hydra.*`` keys
    and runs with a user ``--config-dir`` (other presets) are left to Hydra."""
    return [str(p) for p in _problems(argv)]


def _problems(argv: list[str]) -> list[OverrideProblem]:
    """:func:`check_overrides`' problems as :class:`OverrideProblem` objects."""
    if any(a in ("--config-dir", "-cd") or a.startswith("--config-dir=") for a in argv):
        return []
    out: list[OverrideProblem] = []
    for arg in argv:
        if arg.startswith("~") and not arg.startswith("~hydra"):
            out += _deletion_problem(arg)
            continue
        # ``+key=v`` / ``++key=v`` make Hydra add a key the schema lacks, which the pipeline would never read:
        # checked like a plain override (a dict-valued field, where adding a key is meaningful, stops the walk below)
        kv = _key_value(arg)
        if kv is not None:
            out += _value_problems(*kv)
    return out


def _key_value(arg: str) -> tuple[str, str] | None:
    """``(key, value)`` of a ``key=value`` / ``+key=value`` / ``++key=value`` override, ``+`` stripped; None for an
    option (``-...``), an argument without ``=``, an empty key or a ``hydra.*`` key."""
    if arg.startswith("-") or "=" not in arg:
        return None
    key, value = arg.lstrip("+").split("=", 1)
    return None if key.startswith(("hydra.", "hydra/")) or not key else (key, value)


def _deletion_problem(arg: str) -> list[OverrideProblem]:
    """``~model``: deleting a group or a top-level field the schema needs."""
    key = arg[1:].split("=", 1)[0]
    if key.split(".", 1)[0] not in GROUPS and key not in _schema_fields(PipelineConfig):
        return []
    fix = f"set it instead ({key}=<value>), or drop the override"
    text = f"{arg}: deletes {key}, which the pipeline's schema needs. Fix: {fix}."
    return [OverrideProblem(key, None, "deletes a key the pipeline's schema needs.", fix, text=text)]


def _closest(name: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    return (f"did you mean {' or '.join(near)}? " if near else "") + f"valid: {', '.join(sorted(choices))}"


def _closest_key(key: str, valid_here: list[str]) -> str:
    near = _close_keys(key, _dotted_keys(PipelineConfig))
    return (f"did you mean {' or '.join(near)}? " if near else "") + f"valid: {', '.join(sorted(valid_here))}"


def _value_problems(key: str, value: str) -> list[OverrideProblem]:
    """The problems of one ``key=value`` (``+`` stripped, not a ``hydra.*`` key): ``stages`` without brackets, an
    unknown preset of a group, an unknown field, a value the field's type cannot take."""
    if key == "stages" and not value.startswith("["):
        what, fix = "stages is a list of stage names.", f"stages=[{value}] (quoted in a shell: 'stages=[{value}]')"
        return [OverrideProblem(key, value, what, fix, text=f"stages={value}: {what} Fix: {fix}.")]
    if key in GROUPS:
        presets = sorted(p.stem for p in (CONFIG_DIR / key).glob("*.yaml"))
        if not value.strip():  # Hydra would look for the file `<group>/.yaml` and list its internal schemas
            what = f"names no {key} preset; valid: {', '.join(presets)}."
            fix = f"name one (e.g. {key}={presets[0]}), or drop the override for the default"
            return [OverrideProblem(key, value, what, fix, text=f"{key}=: {what} Fix: {fix}.")]
        out = []
        for v in (_show(e) for e in _elements(value)):
            if v and v not in presets:
                what = f"no such {key} preset ({CONFIG_DIR / key}/). {_closest(v, presets)}."
                fix = f"pick a preset, or set fields directly (e.g. {key}.<field>=...)"
                out.append(OverrideProblem(key, v, what, fix, text=f"{key}={v}: {what} Fix: {fix}."))
        return out
    cls: Any = PipelineConfig
    path: list[str] = []
    for part in key.split("."):
        fields = _schema_fields(cls)
        if not fields:
            return []  # a dict-valued field (e.g. per-recipe tables) or a plain value: Hydra checks the rest
        if part not in fields:
            where = ".".join(path) or "the top level"
            what = f"no such field in {where}; {_closest_key('.'.join([*path, part]), _current_names(cls))}."
            fix = "use one of those names (pipeline --cfg job prints the whole config)"
            return [OverrideProblem(key, value, what, fix, text=f"{key}: {what} Fix: {fix}.")]
        path.append(part)
        cls = GROUPS.get(part, fields[part]) if len(path) == 1 else fields[part]
    bad = _scalar_problem(key, value, cls)
    return [bad] if bad else []


def _schema_fields(cls: Any) -> dict[str, Any]:
    """``{field name: resolved type}`` of a config dataclass (empty when ``cls`` is not one)."""
    import typing

    if not dataclasses.is_dataclass(cls):
        return {}
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        hints = {}
    return {f.name: hints.get(f.name) for f in dataclasses.fields(cls)}


def _dotted_keys(cls: Any, prefix: str = "") -> dict[str, str]:
    """``{dotted key: the key to write}`` of every field of the config schema ``cls``, nested groups included; a
    deprecated alias maps to its new field (``quant.tp_size`` -> ``parallel.tp_size``), every other key to itself."""
    out: dict[str, str] = {}
    if not dataclasses.is_dataclass(cls):
        return out
    hints = _schema_fields(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        target = f.metadata.get("alias_of")
        out[key] = (target if "." in target else prefix + target) if target else key
        out.update(_dotted_keys(hints.get(f.name), key + "."))
    return out


def _current_names(cls: Any) -> list[str]:
    """Field names of the config dataclass ``cls`` without its deprecated aliases (the names to write)."""
    return [f.name for f in dataclasses.fields(cls) if "alias_of" not in f.metadata]


_KEY_HINTS = {"eval.path": ("eval.eval_set",)}
"""Unknown keys whose intended key no spelling similarity finds: ``model.path`` and ``calibration.path`` make
``eval.path`` a natural guess, but the eval group's file field is ``eval.eval_set``."""


def _close_keys(typed: str, keys: dict[str, str]) -> list[str]:
    """Up to three keys to suggest for the unknown dotted key ``typed``: whole keys at least 80 % alike
    (difflib ratio) whose last parts are at least 75 % alike, so a shared group prefix alone never makes a match
    (``eval.path`` is not close to ``eval.gate``); deprecated spellings are offered as their new names.  First the
    targeted hints of ``_KEY_HINTS`` (``eval.path`` -> ``eval.eval_set``), then keys of the same group whose last part
    starts with the typed one (``parallel.tp`` -> ``parallel.tp_size``)."""
    leaf = typed.rsplit(".", 1)[-1]
    parent = typed.rsplit(".", 1)[0] if "." in typed else ""
    out: list[str] = [keys[h] for h in _KEY_HINTS.get(typed, ()) if h in keys]
    # a leaf the user shortened (parallel.tp -> parallel.tp_size): same group, the key's leaf starts with it
    for k in keys:
        kp, _, kl = k.rpartition(".")
        if kp == parent and len(leaf) >= 2 and kl != leaf and kl.startswith(leaf) and keys[k] not in out:
            out.append(keys[k])
    for k in difflib.get_close_matches(typed, list(keys), n=6, cutoff=0.8):
        if difflib.SequenceMatcher(None, leaf, k.rsplit(".", 1)[-1]).ratio() >= 0.75 and keys[k] not in out:
            out.append(keys[k])
    return out[:3]


def _elements(value: str) -> list[Any]:
    """The values of one override's right-hand side as Hydra's grammar reads them (``1,2`` a sweep of two ints,
    ``[1,2]`` one list, ``{a:1}`` one dict, ``null`` None, ``'a,b'`` one str); the comma-split text when the grammar
    cannot read it (reported by :func:`_grammar_problem`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Transformer
    from hydra.errors import HydraException

    try:
        o = OverridesParser.create().parse_override(f"k={value}")
        return list(o.sweep_iterator(transformer=Transformer.identity)) if o.is_sweep_override() else [o.value()]
    except (HydraException, ValueError, TypeError):
        return value.split(",")


def _show(v: Any) -> str:
    """An override value as it was written: ``null``, ``true``, ``[a, b]``, ``{a: 1}``, ``3``."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_show(x)}" for k, x in v.items()) + "}"
    return str(v)


def _shape_problem(key: str, v: Any, base: Any, optional: bool, written: str) -> tuple[str, str]:
    """(what is wrong, the fix) when the parsed value ``v`` has the wrong shape for a field of type ``base``: null
    for a field that cannot be null, a list or dict for a scalar, a scalar for a list, a mapping or a group of fields;
    ``("", "")`` when the shape fits (the scalar's own conversion is :func:`_scalar_problem`'s).  ``written``: the
    override's right-hand side (a list field's fix brackets all of it: ``a,b`` -> ``[a,b]``)."""
    import typing

    origin = typing.get_origin(base)
    if v is None:
        return ("", "") if optional or base is Any else ("cannot be null.", "set a value, or drop the override to keep the default")
    if dataclasses.is_dataclass(base):
        names = ", ".join(_current_names(base))
        return (
            ("", "")
            if isinstance(v, dict)
            else (f"is a group of fields ({names}), not a single value.", f"set one of its fields, e.g. {key}.<field>=...")
        )
    if origin in (list, tuple):
        return ("", "") if isinstance(v, list) else ("is a list.", f"{key}=[{written}] (quoted in a shell: '{key}=[{written}]')")
    if origin is dict:
        return ("", "") if isinstance(v, dict) else ("is a mapping.", f"{key}={{name: value}}, or {key}.<name>=<value>")
    if base in (str, int, float, bool) and isinstance(v, (list, dict)):
        kind = "a list" if isinstance(v, list) else "a mapping"
        want, slot = {
            str: ("text", "text"),
            int: ("a whole number", "integer"),
            float: ("a number", "number"),
            bool: ("a boolean", "true|false"),
        }[base]
        quote = f" (text with brackets or braces is quoted: {key}='\"{_show(v)}\"')" if base is str else ""
        return (f"takes {want}, not {kind}.", f"{key}=<{slot}>{quote}")
    return ("", "")


def _scalar_problem(key: str, value: str, typ: Any) -> OverrideProblem | None:
    """A value OmegaConf cannot take for the field's type, said with the fix instead of Hydra's bare conversion or
    merge error: a scalar that does not convert (``package.parity=maybe``, ``eval.gate.max_drop=abc``), a value of the
    wrong shape (:func:`_shape_problem`: ``model.name=[a]``, ``eval.gate=3``, ``quant.exclude_modules=3``,
    ``build.speculative=null``); None when every value fits (each value of a sweep is checked) or the value is an
    interpolation."""
    import typing

    if "${" in value:
        return None
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    optional = type(None) in typing.get_args(typ)
    base = args[0] if optional and len(args) == 1 else typ
    null = " or null" if optional else ""
    for el in _elements(value):
        what, fix = _shape_problem(key, el, base, optional, value)
        v = value if what else _show(el)  # a shape problem is the whole value's
        if not what and base in (bool, int, float) and el is not None:
            if base is bool and v.lower() not in BOOL_WORDS:
                what, fix = "not a boolean.", f"{key}=true or {key}=false"
            elif base is int and (isinstance(el, float) or not _converts(int, v)):
                what, fix = "not a whole number.", f"{key}=<integer>{null}"
            elif base is float and not _converts(float, v):
                what, fix = "not a number.", f"{key}=<number>{null}"
        if what:
            return OverrideProblem(key, v, what, fix, text=f"{key}={v}: {what} Fix: {fix}.")
    return None


def _converts(typ: Any, v: str) -> bool:
    try:
        typ(v)
    except ValueError:
        return False
    return True
