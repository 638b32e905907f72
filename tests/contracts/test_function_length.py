"""No function in pipeline/ is longer than MAX_LINES unless ALLOWED names it with a reason (issue 15 item 5).

A long function mixes steps; stage bodies and domain functions are split into named steps with typed results
(torchtune's recipe interface is the model). Length = ``end_lineno - lineno + 1`` of the ``def`` (decorators and
docstring included), as ``ast`` reports it. Nested functions count on their own and inside their parent.
"""

from __future__ import annotations

import ast
from pathlib import Path

MAX_LINES = 80
PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"

#: "module:function" (module path relative to pipeline/, without .py; nested functions as outer.inner) -> why it
#: may be longer than MAX_LINES. Keep this short: split a function rather than list it.
ALLOWED: dict[str, str] = {}


def function_lengths(package: Path = PACKAGE) -> dict[str, int]:
    """``{"module:qualified.name": lines}`` of every function and method under ``package``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                out[f"{module}:{name}"] = child.end_lineno - child.lineno + 1
                visit(child, module, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, module, f"{prefix}{child.name}.")
            else:
                visit(child, module, prefix)

    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).with_suffix("").as_posix()
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), module, "")
    return out


def test_no_function_over_the_limit_unless_allowed() -> None:
    lengths = function_lengths()
    too_long = {name: n for name, n in lengths.items() if n > MAX_LINES and name not in ALLOWED}
    assert not too_long, (
        f"{len(too_long)} function(s) over {MAX_LINES} lines; split them into named steps (or, for a declarative table "
        f"or a renderer, add 'module:function' -> reason to ALLOWED in {Path(__file__).name}): "
        + ", ".join(f"{k} ({v})" for k, v in sorted(too_long.items(), key=lambda kv: -kv[1]))
    )


def test_allowlist_has_no_stale_entries() -> None:
    """Every ALLOWED entry names an existing function that is still over the limit (else remove it)."""
    lengths = function_lengths()
    stale = {name: lengths.get(name) for name in ALLOWED if lengths.get(name, 0) <= MAX_LINES}
    assert not stale, f"ALLOWED entries that are missing or no longer over {MAX_LINES} lines: {stale}"
    assert all(reason.strip() and "\n" not in reason for reason in ALLOWED.values()), "every ALLOWED entry needs a one-line reason"


def test_the_measure_catches_a_long_function(tmp_path: Path) -> None:
    """The checker itself: a module with one 81-line function (nested in a class) is reported at 81 lines."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES - 1))
    (pkg / "sub" / "m.py").write_text(f"class C:\n    def long(self):\n{body}\n\n\ndef short():\n    return 1\n", encoding="utf-8")
    lengths = function_lengths(pkg)
    assert lengths == {"sub/m:C.long": MAX_LINES, "sub/m:short": 2}
    (pkg / "sub" / "m.py").write_text(f"def long():\n{body}\n        y = 1\n", encoding="utf-8")
    assert function_lengths(pkg)["sub/m:long"] == MAX_LINES + 1
