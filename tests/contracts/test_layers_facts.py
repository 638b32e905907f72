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


def test_facts_import_nothing_above_core():
    """facts/ (recipes, families, geometry, GPUs, versions) is the floor every stage reads: it may import core/ and
    itself, never a stage, the planner, the runner or the CLI (issue 25). Its family refusals live in
    pipeline/export/checks.py, the onnxruntime_genai model checks in that target's checks.py."""
    files = sorted((PKG / "facts").glob("*.py"))
    assert len(files) >= 5, "facts/ moved: point this test at it"
    for f in files:
        bad = [m for m in _imports(f) if m.startswith("pipeline.") and not m.startswith(("pipeline.core", "pipeline.facts"))]
        assert not bad, f"facts/{f.name} imports {bad}"


def test_runner_does_not_import_the_cli():
    """Old behaviour: runner.MultirunComparison wrote ``cli._state`` (a cli <-> runner cycle)."""
    assert not [m for m in _imports(PKG / "runner.py") if m == "pipeline.cli" or m.startswith("pipeline.cli.")]


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


def test_exit_code_state_lives_in_the_runner():
    from pipeline import runner

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
    ``pipeline.plan`` is ``pipeline.validation.checked_plan`` instead).  ``planner/cli.py`` is the CLI layer."""
    files = sorted(f for f in (PKG / "planner").glob("*.py") if f.name != "cli.py")
    assert len(files) >= 3, "the planner moved: point this test at it"
    for f in files:
        bad = [m for m in _imports(f) if m.startswith(("pipeline.runner", "pipeline.cli", "pipeline.validation"))]
        assert not bad, f"planner/{f.name} imports {bad}"
