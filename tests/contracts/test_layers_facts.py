"""Layers point one way (cli -> runner -> stages -> domain modules -> config/store/errors) and no own module is
imported behind ``except ImportError`` (a broken module must fail loudly, never silently skip its checks).
Issue 15, item 5. Static checks over the source (ast), plus the exit-code state the cli reads from the runner."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "pipeline"

# Not yet converted: owned by another work item (quantize.py's GPU facts; recipe tables), listed so the test
# names what is left instead of passing silently. Remove entries as they are fixed; never add one.
KNOWN_GUARDS: set[str] = set()


def _imports(path: Path) -> list[str]:
    """Absolute module names imported anywhere in ``path`` (relative imports resolved against the package)."""
    pkg_parts = list(path.relative_to(PKG.parent).parts[:-1])  # the package this file belongs to
    out: list[str] = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            out += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                mod = ".".join(pkg_parts[: len(pkg_parts) - (n.level - 1)] + ([n.module] if n.module else []))
                out += [mod] + [f"{mod}.{a.name}" for a in n.names]
            else:
                out += [n.module or ""]
    return out


def test_config_layer_imports_nothing_above_it():
    above = (
        "pipeline.planner",
        "pipeline.core.targets",
        "pipeline.facts.families",
        "pipeline.core.stage",
        "pipeline.runner",
        "pipeline.cli",
        "pipeline.validation",
    )
    files = sorted((PKG / "core" / "config").glob("*.py"))
    assert len(files) > 5, "the config schemas moved: point this test at them"
    for f in files:
        bad = [m for m in _imports(f) if m.startswith(above)]
        assert not bad, f"{f.name} imports {bad} (cross-layer checks belong in pipeline/validation.py)"


def test_facts_import_nothing_of_ours_but_errors():
    """facts/ (recipes, families, geometry, GPUs, RoPE, TensorRT-LLM) is the floor every stage reads: it imports nothing
    of ours but :mod:`pipeline.errors` and itself (issue 35; before, facts/families.py and facts/gpus.py imported core/)."""
    files = sorted((PKG / "facts").glob("*.py"))
    assert len(files) >= 5, "facts/ moved: point this test at it"
    for f in files:
        bad = [m for m in _imports(f) if m.startswith("pipeline.") and not m.startswith(("pipeline.errors", "pipeline.facts"))]
        assert not bad, f"facts/{f.name} imports {bad}"


#: the stage packages; what two of them share lives a floor below (core/, facts/, data/, release/, errors).
STAGES = ("export", "quantize", "build", "evaluate", "package", "benchmark", "planner", "serve")
#: serve/ is a floor for the two stages that start servers (package's parity check, benchmark's Triton mode).
MAY_IMPORT = {"package": {"serve"}, "benchmark": {"serve"}}


def _top(m: str) -> str | None:
    parts = m.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pipeline" else None


def test_no_stage_package_imports_another():
    """Issue 35: 23 pairs of stage packages imported each other (lazy imports included); none may."""
    bad = []
    for stage in STAGES:
        for f in sorted((PKG / stage).rglob("*.py")):
            for m in _imports(f):
                t = _top(m)
                if t in STAGES and t != stage and t not in MAY_IMPORT.get(stage, set()):
                    bad.append(f"{f.relative_to(PKG).as_posix()} imports {m}")
    assert not bad, "\n".join(bad)


def test_floors_import_no_stage_package():
    """core/, data/, release/ and facts/ sit below every stage package."""
    bad = []
    for floor in ("core", "data", "release", "facts"):
        for f in sorted((PKG / floor).rglob("*.py")):
            bad += [f"{f.relative_to(PKG).as_posix()} imports {m}" for m in _imports(f) if _top(m) in STAGES]
    assert not bad, "\n".join(bad)


def test_the_package_level_import_graph_is_acyclic():
    """Before issue 35, 10 of 16 top-level packages sat in one import loop (core/config -> package.artifact for one
    file name). Nodes are the top-level packages and modules of pipeline/; every import counts, lazy ones too."""
    import networkx as nx

    g = nx.DiGraph()
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).parts
        if rel[0] == "__init__.py":
            continue
        here = rel[0].removesuffix(".py")
        for m in _imports(f):
            t = _top(m)
            if t and (PKG / t).exists() or t and (PKG / f"{t}.py").exists():
                if t != here:
                    g.add_edge(here, t)
    cycles = list(nx.simple_cycles(g))
    assert g.number_of_nodes() >= 10 and not cycles, cycles


def test_runner_does_not_import_the_cli():
    """Old behaviour: runner.MultirunComparison wrote ``cli._state`` (a cli <-> runner cycle); it now lives in
    report.py, which does not import the cli either."""
    for mod in ("runner.py", "report.py"):
        assert not [m for m in _imports(PKG / mod) if m == "pipeline.cli" or m.startswith("pipeline.cli.")], mod


def test_benchmark_stage_does_not_import_the_evaluate_stage():
    assert not [m for m in _imports(PKG / "benchmark" / "stage.py") if m.startswith("pipeline.evaluate.stage")]


def test_no_own_module_behind_except_importerror():
    found = []
    for f in sorted(PKG.rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not isinstance(n, ast.Try):
                continue
            catches = any(h.type is None or "ImportError" in ast.unparse(h.type) for h in n.handlers)
            own = [
                x
                for m in n.body
                for x in ast.walk(m)
                if isinstance(x, ast.ImportFrom) and (x.level > 0 or (x.module or "").startswith("pipeline"))
            ]
            if catches and own:
                found.append(f"{f.relative_to(PKG).as_posix()}:{n.lineno}")
    assert {x.split(":")[0] for x in found} <= KNOWN_GUARDS, found


def test_exit_code_state_lives_below_the_cli():
    from pipeline import report as runner

    before = runner.worst_exit_code()
    runner.record_exit_code(0)
    assert runner.worst_exit_code() == before
    runner.record_exit_code(3)
    runner.record_exit_code(2)
    assert runner.worst_exit_code() == max(before, 3)
    runner._WORST_EXIT[0] = before


def test_planner_model_imports_no_layer_above_the_stage_checks():
    """The stage checks import the planner (``shape_or_none``), so the planner's model must not import the runner,
    the CLI or :mod:`pipeline.validation` (a lazy upward import there was how ``plan()`` validated; the public
    ``pipeline.plan`` is ``pipeline.validation.checked_plan`` instead).  ``pipeline/plan_cli.py`` is the CLI layer."""
    files = sorted((PKG / "planner").glob("*.py"))
    assert len(files) >= 3, "the planner moved: point this test at it"
    for f in files:
        bad = [m for m in _imports(f) if m.startswith(("pipeline.runner", "pipeline.cli", "pipeline.validation"))]
        assert not bad, f"planner/{f.name} imports {bad}"
