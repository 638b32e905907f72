"""Artifact file names live in each stage's pipeline/core/contracts/<stage>.py only (issue 15, item 2): no code path outside it spells
``release_manifest.json``, ``quant_report.json``, ``trtllm_checkpoint``, ``benchmark.json``, ... as a string
literal; it imports the artifact class's constant. Docstrings and messages may name the files (prose), so the
scan flags a literal only when, stripped of ``/`` and ``*``, it *is* a file name (``out / "x.json"``,
``f"{name}/x.json"``, ``glob("*/x.json")``). Generic names that are also config values elsewhere (``hf``,
``engine``, ``release``, ``model_repository``) are left out of the scan."""

from __future__ import annotations

import ast
from pathlib import Path

from pipeline.core import artifacts as A

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"
GENERIC = {"hf", "engine", "release", "model_repository"}
#: (file relative to pipeline/, name) -> why the literal is not an artifact's file name.
ALLOWED = {
    ("benchmark/reference.py", "build.log"): "the benchmark's own reference builder log in its work folder, not a build artifact",
    ("package/validate.py", "build_info.json"): "a Problem's field label (prose in the message)",
    ("serve/models/onnxruntime_genai_model.py", "decoding.json"): "the served model runs in Triton's Python stub without "
    "the pipeline package; packaging/repository.py writes the file under ExportArtifact.DECODING's name",
}


def _names() -> set[str]:
    names = {v for cls in A.artifact_classes().values() for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)}
    return names - GENERIC


def _prose(tree: ast.AST) -> set[int]:
    """ids of docstring constants (module/class/function docstrings and attribute docstrings)."""
    out = set()
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        for s in body if isinstance(body, list) else []:
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
                out.add(id(s.value))
    return out


def _literal_file_names(names: set[str], package: Path = PACKAGE) -> list[str]:
    hits = []
    for py in sorted(package.rglob("*.py")):
        rel = py.relative_to(package).as_posix()
        if rel == "core/artifacts.py" or rel.startswith("core/contracts/"):
            continue
        tree = ast.parse(py.read_text(encoding="utf-8"))
        prose = _prose(tree)
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Constant) and isinstance(n.value, str)) or id(n) in prose:
                continue
            name = n.value.strip("/*")
            if name in names and (rel, name) not in ALLOWED:
                hits.append(f"pipeline/{rel}:{n.lineno} {n.value!r}")
    return hits


def test_the_issue_names_are_artifact_constants():
    names = _names()
    for f in ("release_manifest.json", "llm_api_options.yaml", "quant_report.json", "trtllm_checkpoint", "benchmark.json"):
        assert f in names, f


def test_no_artifact_file_name_literal_outside_artifacts():
    """Old behaviour: stages/package.py, packaging/release.py, packaging/repository.py, quantize.py, bench/report.py,
    runner.py and evaluation/trtllm_runner.py spelled these names as literals."""
    hits = _literal_file_names(_names())
    assert not hits, (
        "artifact file names spelled outside the stages' artifact.py modules (import the artifact class's constant):\n" + "\n".join(hits)
    )


def test_the_scan_finds_a_literal(tmp_path):
    """The scanner is not vacuous: a code-path literal is found, the same name in a docstring or message is not."""
    pkg = tmp_path / "pipeline"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        '"""Writes release_manifest.json."""\n'
        "def f(out, name):\n"
        '    """quant_report.json"""\n'
        '    print(f"{out}: no quant_report.json there")\n'
        '    return out / "quant_report.json", f"{name}/release_manifest.json"\n',
        encoding="utf-8",
    )
    hits = _literal_file_names(_names(), pkg)
    assert [h.split(" ", 1)[1] for h in hits] == ["'quant_report.json'", "'/release_manifest.json'"]
