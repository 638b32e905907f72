"""No import cycles in ``pipeline/``, counting every import: module level, inside functions and under
``TYPE_CHECKING`` (issue "one package per stage": a lazy import that closes a cycle still ties two rooms together).
The graph is built from the source with :mod:`ast`; its strongly connected components come from networkx (a torch
dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PKG = Path(__file__).resolve().parents[2] / "pipeline"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in mods else mod)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in mods and m != name}


def test_the_package_has_no_import_cycle():
    mods = _modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        g.add_edges_from((name, dep) for dep in _imports(name, path, mods))
    cycles = sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)
    assert not cycles, f"import cycles: {cycles}"


def test_the_check_sees_a_lazy_cycle(tmp_path, monkeypatch):
    """The checker itself: two modules that import each other inside functions form a cycle."""
    pkg = tmp_path / "pipeline"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from .y import g\n")
    (pkg / "a" / "y.py").write_text("def g():\n    from . import x\n")
    monkeypatch.setattr(__import__(__name__), "PKG", pkg)
    mods = _modules()
    assert _imports("pipeline.a.x", mods["pipeline.a.x"], mods) == {"pipeline.a.y"}
    assert _imports("pipeline.a.y", mods["pipeline.a.y"], mods) == {"pipeline.a.x"}
