"""CI-readable gate results (issue 27, item 1): the evaluate stage's JUnit XML (one testcase per gate check), the
run's ``junit.xml`` next to ``summary.json``, the ``$GITHUB_STEP_SUMMARY`` append, and the CI examples in
``examples/ci/`` (structure checked with PyYAML, not run)."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from pipeline.core.config import REPO_ROOT, compose
from pipeline.core.contracts.evaluate import EvalReport
from pipeline.core.contracts.package import ParityRecord
from pipeline.errors import EXIT_GATE, EXIT_OK
from pipeline.evaluate.junit import to_junit
from pipeline.report import JUNIT_FILE
from pipeline.runner import run_pipeline


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    import tiny

    return tiny.make_checkpoint(tmp_path_factory.mktemp("tiny_ci") / "llama", "llama")


def _eval_set(path: Path) -> Path:
    rows = [
        {"id": f"o{i}", "prompt": f"Where is my order ORD-1234{i}?", "reference": f"ORD-1234{i}", "metric": "exact_match", "slice": "order"}
        for i in range(4)
    ] + [
        {"id": f"r{i}", "prompt": f"Refund {i}9.50 dollars.", "reference": f"{i}9.50", "metric": "numeric", "slice": "refund|amount"}
        for i in range(4)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _run(tmp_path: Path, run_dir: Path, ckpt: Path, *extra: str):
    cfg = compose(
        [
            "stages=[evaluate]",
            f"store_dir={tmp_path / 'store'}",
            "progress=false",
            f"model.path={ckpt}",
            "model.dtype=float32",
            "quant=none",
            f"eval.eval_set={_eval_set(tmp_path / 'eval.jsonl')}",
            "eval.runners=[baseline,simulated]",
            "eval.max_new_tokens=6",
            "build.max_input_len=128",
            "build.max_seq_len=160",
            "eval.gate.max_drop=1.0",  # overall: passes (0 drop, any bound within 100 pp)
            "eval.gate.slice_max_drop=0.0",  # per slice: a 0 drop cannot be shown to be <= 0 on 4 items: inconclusive
            *extra,
        ]
    )
    buf = io.StringIO()
    summary = run_pipeline(cfg, summary_dir=run_dir, console=Console(file=buf, width=160))
    return summary, buf.getvalue()


def _cases(xml_path: Path) -> dict[str, ET.Element]:
    root = ET.parse(xml_path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = {tc.get("name"): tc for tc in suite.findall("testcase")}
    assert int(suite.get("tests")) == len(cases) == len(suite.findall("testcase"))
    assert int(suite.get("failures")) == sum(1 for tc in cases.values() if tc.find("failure") is not None)
    assert int(suite.get("skipped")) == sum(1 for tc in cases.values() if tc.find("skipped") is not None)
    return cases


def test_evaluate_writes_junit_and_the_run_appends_the_step_summary(tmp_path, tiny_ckpt, monkeypatch):
    """Real chain (export -> quantize -> evaluate, baseline vs ModelOpt's model): one testcase per gate check; the
    inconclusive slices are failures with drop, bound, allowance and fix; the step summary gets the gate table."""
    step = tmp_path / "step_summary.md"
    step.write_text("earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    summary, out = _run(tmp_path, tmp_path / "run", tiny_ckpt)
    assert summary.exit_code == EXIT_GATE, (summary.error, out)
    ev = Path(next(s for s in summary.stages if s.stage == "evaluate").path)
    rep = json.loads((ev / "eval_report.json").read_text())
    for xml_path in (ev / "eval_junit.xml", tmp_path / "run" / JUNIT_FILE):
        cases = _cases(xml_path)
        assert len(cases) == len(rep["gate"]["checks"])  # no package stage ran: no parity testcase
        assert {f"{c['scope']}" for c in rep["gate"]["checks"]} == {"overall", "slice:order", "slice:refund|amount"}
        assert cases["overall non-inferiority"].find("failure") is None
        for s in ("order", "refund|amount"):
            f = cases[f"slice:{s} non-inferiority"].find("failure")
            assert f is not None and f.get("type") == "inconclusive"
            assert "upper bound +" in f.text and "allowance +0.00 pp" in f.text and "Fix:" in f.text
            assert "eval.gate.mode=exploratory" in f.text  # the gate's own inconclusive fix
    md = step.read_text(encoding="utf-8")
    assert md.startswith("earlier step\n")  # appended, not overwritten
    assert "Release gate: **INCONCLUSIVE**" in md and "| scope | n | baseline |" in md
    assert "| refund\\|amount |" in md  # a slice name is data: its pipe cannot break the table

    # exploratory: exit 0; the inconclusive checks are skipped (not releasable), not failed
    summary, out = _run(tmp_path, tmp_path / "run2", tiny_ckpt, "eval.gate.mode=exploratory")
    assert summary.exit_code == EXIT_OK, (summary.error, out)
    cases = _cases(tmp_path / "run2" / JUNIT_FILE)
    sk = cases["slice:order non-inferiority"].find("skipped")
    assert sk is not None and "not releasable" in sk.get("message")
    assert md.count("Release gate:") == 1 and step.read_text().count("Release gate:") == 2


def test_no_step_summary_without_the_variable(tmp_path, monkeypatch):
    from pipeline.evaluate.junit import append_step_summary

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    rep = EvalReport.from_json({"gate": {"checks": [], "passed": True, "reason": "all checks passed"}, "eval_set": {"name": "x"}})
    assert append_step_summary(rep) is None
    assert append_step_summary(rep, env={"GITHUB_STEP_SUMMARY": ""}) is None


PARITY_CASES = [
    ({"status": "passed", "matched": 4, "total": 4}, None),
    ({"status": "failed", "matched": 3, "total": 4, "first_mismatch": {"id": "a"}}, "failure"),
    ({"status": "not run here", "matched": None, "total": None, "reason": "GPU host", "command": "pipeline client --parity X"}, "skipped"),
    ({"status": "disabled", "disabled_by": "package.parity=false", "matched": None, "total": None}, "skipped"),
]


@pytest.mark.parametrize("parity,child", PARITY_CASES)
def test_parity_testcase(parity, child):
    """The package stage's parity record (shape of ``pipeline.serve.parity.run_parity``) becomes one testcase."""
    rep = {"gate": {"checks": [], "mode": "release"}, "eval_set": {"name": "x"}, "recipe": "int4_awq"}
    root = ET.fromstring(to_junit(EvalReport.from_json(rep), ParityRecord.from_json(parity)).split("?>", 1)[1])
    (tc,) = root.iter("testcase")
    assert tc.get("name") == "serving parity (served == evaluated)"
    kids = [c.tag for c in tc]
    assert kids == ([] if child is None else [child])
    if child == "skipped":
        assert ("pipeline client --parity" in tc[0].get("message")) or ("package.parity=false" in tc[0].get("message"))


# ----------------------------------------------------------------------------------------------- examples/ci
CI = REPO_ROOT / "examples" / "ci"


def _load(name: str) -> dict:
    doc = yaml.safe_load((CI / name).read_text(encoding="utf-8"))
    assert isinstance(doc, dict), name
    return doc


def _script_lines(steps: list) -> str:
    return "\n".join(str(s.get("run", "")) if isinstance(s, dict) else str(s) for s in steps)


def test_github_actions_workflow_structure():
    """GitHub Actions workflow syntax: ``on`` (PyYAML reads the bare key as True), ``jobs.<id>.runs-on`` and ``steps``
    each with exactly one of ``uses`` / ``run``; the job evaluates, packages, verifies and publishes the JUnit XML."""
    doc = _load("github-actions.yml")
    assert (True in doc) or ("on" in doc)
    jobs = doc["jobs"]
    assert jobs
    for name, job in jobs.items():
        assert "runs-on" in job and isinstance(job["steps"], list), name
        for st in job["steps"]:
            assert isinstance(st, dict) and (("uses" in st) ^ ("run" in st)), (name, st)
    text = _script_lines([s for j in jobs.values() for s in j["steps"]])
    assert "pipeline" in text and "stages=[export,quantize,build,evaluate,package]" in text
    assert "pipeline verify" in text and "package.sign_key=" in text
    uses = [s["uses"] for j in jobs.values() for s in j["steps"] if "uses" in s]
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert any("junit.xml" in json.dumps(s) for j in jobs.values() for s in j["steps"])
    assert any("gpu" in json.dumps(j["runs-on"]).lower() for j in jobs.values())


def test_gitlab_ci_structure():
    """GitLab CI syntax: ``stages`` lists every job's ``stage``; jobs have a ``script`` list; the evaluate job
    publishes ``artifacts.reports.junit``; the GPU job carries a runner tag."""
    doc = _load("gitlab-ci.yml")
    stages = doc["stages"]
    reserved = {"stages", "variables", "default", "include", "workflow", "image", "services", "cache", "before_script", "after_script"}
    jobs = {k: v for k, v in doc.items() if k not in reserved and not k.startswith(".")}
    assert jobs
    for name, job in jobs.items():
        assert job["stage"] in stages, name
        assert isinstance(job["script"], list) and all(isinstance(s, str) for s in job["script"]), name
    reports = [j.get("artifacts", {}).get("reports", {}).get("junit") for j in jobs.values()]
    assert any(r and "junit.xml" in json.dumps(r) for r in reports)
    assert any(j.get("tags") and any("gpu" in t for t in j["tags"]) for j in jobs.values())
    text = "\n".join("\n".join(j["script"]) for j in jobs.values())
    assert "stages=[export,quantize,build,evaluate,package]" in text
    assert "pipeline verify" in text and "package.sign_key=" in text


def test_junit_stays_well_formed_with_control_characters_in_user_names():
    """A slice name or eval-set name is user text: XML 1.0 cannot hold a control character even escaped, so it is
    written as its \\xNN spelling (fresh-user trial: a slice named "sl\\x00ice" broke every JUnit reader)."""
    name = "sl\x00ice\x01<&>"
    check = {"scope": f"slice:{name}", "check": "max_drop", "verdict": "fail", "value": 0.3, "upper": 0.4, "threshold": 0.1}
    check["detail"] = f"slice {name} \x1b dropped"
    rep = {"gate": {"checks": [check], "mode": "release"}, "eval_set": {"name": f"set\x02{name}"}, "recipe": "int4_awq"}
    xml = to_junit(
        EvalReport.from_json(rep),
        ParityRecord.from_json({"status": "failed", "matched": 0, "total": 1, "first_mismatch": {"id": "a\x03b"}}),
    )
    root = ET.fromstring(xml.split("?>", 1)[1])  # well-formed
    texts = " ".join([*(v for el in root.iter() for v in el.attrib.values()), *(el.text or "" for el in root.iter())])
    assert "\\x00" in texts and "<&>" in texts and "\x00" not in texts
