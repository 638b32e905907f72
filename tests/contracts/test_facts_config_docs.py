"""Every config field is documented (issue 15, item 6; the same rule as vLLM's ``tests/config/test_config_docstrings``):
each field of every dataclass reachable from :class:`pipeline.core.config.PipelineConfig` has an attribute docstring, the
string literal right after the field in the class body.

Old behaviour: 63 fields had none (``build.opt_num_tokens``, ``benchmark.input_len``, ``package.instance_count``, the
group presets' ``name`` fields, ...), so ``--cfg job`` showed keys no page explained.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing

import pytest

from pipeline.core.config import PipelineConfig


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of the attribute docstrings in ``cls``'s class body (not inherited)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for stmt, nxt in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[stmt.target.id] = nxt.value.value
    return out


def config_classes(root: type = PipelineConfig) -> list[type]:
    """``root`` and every dataclass type of its fields, recursively (Optional/List/Dict unwrapped)."""
    seen: list[type] = []

    def visit(cls: type) -> None:
        if cls in seen:
            return
        seen.append(cls)
        for hint in typing.get_type_hints(cls).values():
            stack = [hint]
            while stack:
                t = stack.pop()
                if dataclasses.is_dataclass(t) and isinstance(t, type):
                    visit(t)
                stack.extend(typing.get_args(t))

    visit(root)
    return seen


def test_the_walk_reaches_nested_groups():
    names = {c.__name__ for c in config_classes()}
    assert {"PipelineConfig", "QuantConfig", "AutoQuantConfig", "ParallelConfig", "GateConfig", "SpeculativeConfig", "LengthDist"} <= names


@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_every_config_field_has_a_docstring(cls):
    docs = attribute_docs(cls)
    missing = [
        f.name for f in dataclasses.fields(cls) if f.name in vars(cls).get("__annotations__", {}) and not docs.get(f.name, "").strip()
    ]
    assert not missing, f"{cls.__module__}.{cls.__name__}: fields without an attribute docstring: {missing}"
