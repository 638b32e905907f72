"""What passes between stages is typed (issue 35, "typed contracts"): every stage's ``run`` returns its result class
from ``pipeline/core/contracts/`` (``ExportResult`` ... ``BenchmarkResult``), a stored artifact gives that class back
(``Artifact.result``), and no module outside core/contracts reads a stage result by its JSON keys. Plus the module
size limit the runner split (runner.py -> runner.py + report.py + preflight.py) brought under.

Static checks over the source (ast) and the registered ``STAGE`` objects; no stage runs."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from pipeline.core.contracts.result import STAGE_RESULTS, StageResult, result_class
from pipeline.core.stage import STAGE_MODULES, get_stage
from pipeline.core.store import Artifact

PKG = Path(__file__).resolve().parents[2] / "pipeline"
MAX_MODULE_LINES = 800


@pytest.mark.parametrize("name", list(STAGE_MODULES))
def test_every_stage_run_returns_its_result_class(name):
    """``Stage.run`` of each registered stage is annotated with the stage's result class (``STAGE_RESULTS``), a frozen
    :class:`StageResult` dataclass defined in pipeline/core/contracts/."""
    assert set(STAGE_RESULTS) == set(STAGE_MODULES), "every stage has a result class in core/contracts/result.py"
    cls = result_class(name)
    returned = typing.get_type_hints(get_stage(name).run).get("return")
    assert returned is cls, f"{name}: STAGE.run returns {returned!r}, not {cls.__name__}"
    assert issubclass(cls, StageResult) and cls.__module__.startswith("pipeline.core.contracts.")
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(STAGE_MODULES))
def test_a_stored_result_reads_back_typed(name, tmp_path):
    """``Artifact.result`` parses the manifest's ``result`` with the stage's class; ``to_json`` gives the stored
    document back (the manifest bytes, hence the artifacts and their keys, stay as they were)."""
    cls = result_class(name)
    doc = cls(headline={"n": 1}).to_json()
    art = Artifact(name, "k" * 64, tmp_path, {"result": doc})
    assert type(art.result) is cls and art.result.headline == {"n": 1}
    assert art.result.to_json() == doc
    assert type(Artifact(name, "k" * 64, tmp_path, {}).result) is cls  # a dry run's provisional artifact


def test_package_result_json_keeps_the_release_fields_flat():
    """A package result's JSON is the dict the stage returned before results were typed: the release archive's
    fields at the top level, none of them without an archive."""
    from pipeline.core.contracts.package import PackageResult, ReleaseArchive

    rel = ReleaseArchive("release/a.tar.gz", "ab" * 32, "release/provenance.intoto.json")
    d = PackageResult(models=["m"], parity={"status": "passed"}, release=rel).to_json()
    assert d["archive"] == "release/a.tar.gz" and d["signature"] is None and "release" not in d
    assert PackageResult.from_json(d) == PackageResult(models=["m"], parity={"status": "passed"}, release=rel)
    assert not {"archive", "archive_sha256", "provenance", "signature", "signed_by"} & set(PackageResult().to_json())


def _reads_result_by_key(node: ast.AST) -> bool:
    """``<x>.result.get(...)`` / ``result.get(...)`` / ``<x>.result["..."]`` / ``result["..."]``."""

    def is_result(e: ast.AST) -> bool:
        return (isinstance(e, ast.Name) and e.id == "result") or (isinstance(e, ast.Attribute) and e.attr == "result")

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return is_result(node.func.value)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return is_result(node.value)
    return False


def test_no_stage_result_is_read_by_key_outside_core_contracts():
    contracts = PKG / "core" / "contracts"
    found = []
    for f in sorted(PKG.rglob("*.py")):
        if contracts in f.parents:
            continue
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if _reads_result_by_key(n):
                found.append(f"{f.relative_to(PKG).as_posix()}:{n.lineno}: {ast.unparse(n)}")
    assert not found, "stage results are typed: read attributes (ExportResult.headline ...), not keys:\n" + "\n".join(found)


def test_the_result_scan_sees_key_reads():
    """The checker itself: the spellings the runner used before results were typed are found."""
    for src in ('art.result.get("headline", {})', 'result["archive"]', "result.get('x')"):
        assert any(_reads_result_by_key(n) for n in ast.walk(ast.parse(src))), src
    for src in ("art.result.headline", "cmp.result(0, 4)", "result.pop('measurements')"):
        assert not any(_reads_result_by_key(n) for n in ast.walk(ast.parse(src))), src


def test_no_module_over_the_line_limit():
    sizes = {f.relative_to(PKG).as_posix(): len(f.read_text(encoding="utf-8").splitlines()) for f in PKG.rglob("*.py")}
    too_long = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {too_long}"
