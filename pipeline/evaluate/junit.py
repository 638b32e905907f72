"""CI-readable gate results: JUnit XML (one testcase per gate check) and the GitHub Actions step summary.

JUnit XML is the test-report format every CI system renders (GitLab "Unit test reports", Jenkins' JUnit plugin,
GitHub Actions through test-report actions). The elements written are the common subset of the de-facto schema
(the Jenkins/Ant ``junit-10.xsd``: ``testsuites > testsuite[name, tests, failures, errors, skipped] > testcase[
classname, name, time] > failure[message, type] | skipped[message]``).

One ``testcase`` per check of ``gate.judge`` (``eval_report.json`` ``gate.checks``): ``non-inferiority`` (the
``max_drop`` check) overall and per slice, ``min_score``, ``min_agreement``, the fidelity checks ``max_kld`` /
``min_top1`` (when thresholds are set) and ``engine_errors``; plus ``serving parity`` when the package stage ran.

- a check whose verdict is ``fail`` is a ``<failure type="fail">``; its text gives the value (the drop), the
  upper bound, the threshold (the allowance) and the fix;
- ``inconclusive`` is a ``<failure type="inconclusive">`` in ``eval.gate.mode=release`` (the run exits 3) and
  ``<skipped>`` in ``exploratory`` mode (the run exits 0; the result is still not releasable);
- parity ``not run here`` (a TensorRT-LLM package) and ``disabled`` are ``<skipped>`` with the command / the key.

``$GITHUB_STEP_SUMMARY`` (GitHub Actions, "Adding a job summary": a file path per step; Markdown appended to it is
rendered on the run's page): :func:`append_step_summary` appends the gate table of ``eval_report.md``.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from ..core.contracts.evaluate import EvalReport, GateCheck, ReportGate
from ..core.contracts.package import ParityRecord
from .report import gate_table_markdown

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
CHECK_LABELS = {
    "max_drop": "non-inferiority",
    "min_score": "min_score",
    "min_agreement": "min_agreement",
    "max_kld": "fidelity max_kld",
    "min_top1": "fidelity min_top1",
    "engine_errors": "engine_errors",
}
"""``gate.Check.check`` -> the testcase name's check part."""
FIXES = {
    "max_drop": "a less lossy recipe (quant=int8_wo, quant=none, quant.sensitive_preset=first_last) or better calibration; "
    "or, if the larger drop is acceptable, an explicit allowance (eval.gate.max_drop / eval.gate.slice_max_drop)",
    "min_score": "a better candidate, or lower eval.gate.min_score",
    "min_agreement": "a less lossy recipe, or lower eval.gate.min_agreement",
    "max_kld": "a less lossy recipe, or raise eval.gate.max_kld",
    "min_top1": "a less lossy recipe, or lower eval.gate.min_top1",
    "engine_errors": "see eval_report.json items[].error and the evaluate log; the engine must answer every item",
}
"""The fix a failed check's testcase names (an inconclusive non-inferiority check names ``gate.fix`` instead)."""


def _pp(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.2f} pp"


def _check_text(c: GateCheck, gate: ReportGate) -> str:
    """The failure text of one check: detail, value / bound / threshold and the fix."""
    lines = [str(c.detail)]
    if c.check == "max_drop":
        lines.append(f"drop {_pp(c.value)}; upper bound {_pp(c.upper)}; allowance {_pp(c.threshold)}")
        if c.items_needed is not None:
            lines.append(f"items needed: about {c.items_needed}")
    else:
        lines.append(f"value {c.value}; threshold {c.threshold}")
    fix = gate.fix if c.verdict == "inconclusive" and gate.fix else FIXES.get(str(c.check), "")
    lines.append(f"Fix: {fix}")
    return "\n".join(lines)


def _case(suite: ET.Element, classname: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", {"classname": classname, "name": name, "time": "0"})


def _parity_case(suite: ET.Element, classname: str, parity: ParityRecord) -> str:
    """The serving-parity testcase; returns its outcome (``pass`` | ``fail`` | ``skip``)."""
    tc = _case(suite, classname, "serving parity (served == evaluated)")
    status = str(parity.status)
    if status == "passed":
        return "pass"
    if status in ("not run here", "disabled"):
        why = parity.disabled_by or f"{status if parity.reason is None else parity.reason}; run: {parity.command}"
        ET.SubElement(tc, "skipped", {"message": f"{status}: {why}"})
        return "skip"
    msg = f"served == evaluated: {parity.matched}/{parity.total}"
    f = ET.SubElement(tc, "failure", {"message": msg, "type": "fail"})
    f.text = f"{msg}\nfirst difference: {parity.first_mismatch}\nFix: see docs/package.md (serving parity)"
    return "fail"


def to_junit(rep: EvalReport, parity: ParityRecord | None = None) -> str:
    """JUnit XML (str, UTF-8 declaration) of the gate in ``rep`` (``eval_report.json``, schema
    ``pipeline.eval_report/v1``) and, when given, the package stage's ``parity`` record (``packaging.parity``).

    The suite is named ``gate: <eval set>``; testcases ``<scope> <check>`` (``overall non-inferiority``,
    ``slice:<name> non-inferiority``, ...), classname ``pipeline.gate.<recipe>``. Times are 0: the gate checks are
    computed, not timed."""
    gate = rep.gate
    exploratory = gate.mode == "exploratory"
    classname = f"pipeline.gate.{rep.recipe}"
    suites = ET.Element("testsuites", {"name": "pipeline release gate"})
    suite = ET.SubElement(suites, "testsuite", {"name": f"gate: {rep.eval_set.name}"})
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    for c in gate.checks:
        tc = _case(suite, classname, f"{c.scope} {CHECK_LABELS.get(c.check, c.check)}")
        counts["tests"] += 1
        if c.verdict == "pass":
            continue
        text = _check_text(c, gate)
        if c.verdict == "inconclusive" and exploratory:
            ET.SubElement(tc, "skipped", {"message": f"inconclusive (eval.gate.mode=exploratory, not releasable): {c.detail}"})
            counts["skipped"] += 1
            continue
        f = ET.SubElement(tc, "failure", {"message": str(c.detail), "type": c.verdict})
        f.text = text
        counts["failures"] += 1
    if parity is not None:
        counts["tests"] += 1
        outcome = _parity_case(suite, classname, parity)
        counts["failures"] += outcome == "fail"
        counts["skipped"] += outcome == "skip"
    attrs = {"tests": str(counts["tests"]), "failures": str(counts["failures"]), "errors": "0", "skipped": str(counts["skipped"])}
    suite.attrib.update(attrs)
    suites.attrib.update({k: v for k, v in attrs.items() if k != "skipped"})
    _xml_safe(suites)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


#: characters XML 1.0 cannot hold even escaped (W3C XML 1.0 section 2.2 ``Char``); ElementTree writes them raw
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_safe(root: ET.Element) -> None:
    """Replace, in every attribute and text of ``root``, each character XML 1.0 cannot hold (a control character of a
    user's slice name or item id) by its ``\\xNN`` spelling, so the report stays well-formed for CI readers."""

    def fix(v: str | None) -> str | None:
        return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", v) if v else v

    for el in root.iter():
        el.text, el.tail = fix(el.text), fix(el.tail)
        for k, v in list(el.attrib.items()):
            el.attrib[k] = fix(v) or ""


def write_junit(path: Path, rep: EvalReport, parity: ParityRecord | None = None) -> Path:
    """Write :func:`to_junit` to ``path`` (UTF-8); returns ``path``."""
    path.write_text(to_junit(rep, parity), encoding="utf-8")
    return path


def step_summary_markdown(rep: EvalReport, parity: ParityRecord | None = None) -> str:
    """The Markdown a run appends to ``$GITHUB_STEP_SUMMARY``: verdict, the gate table, the reason, parity."""
    lines = [
        f"### Release gate: **{rep.gate.verdict.upper()}** - {rep.eval_set.name}, recipe `{rep.recipe}`, target `{rep.target}`",
        "",
        *gate_table_markdown(rep),
        "",
        f"**Gate:** {rep.gate.reason}",
    ]
    if parity is not None:
        lines += [
            "",
            f"**Served == evaluated:** {parity.matched}/{parity.total}"
            if parity.total is not None
            else f"**Served == evaluated:** {parity.status}",
        ]
    return "\n".join(lines) + "\n\n"


def append_step_summary(rep: EvalReport, parity: ParityRecord | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """Append :func:`step_summary_markdown` to the file ``$GITHUB_STEP_SUMMARY`` names; None (nothing written) when
    the variable is unset or empty. Raises ``OSError`` when the file cannot be written."""
    target = (os.environ if env is None else env).get(STEP_SUMMARY_ENV)
    if not target:
        return None
    p = Path(target)
    with p.open("a", encoding="utf-8") as f:
        f.write(step_summary_markdown(rep, parity))
    return p


__all__ = ["CHECK_LABELS", "FIXES", "STEP_SUMMARY_ENV", "append_step_summary", "step_summary_markdown", "to_junit", "write_junit"]
