"""The gate section of the run summary: non-inferiority verdict with its bound, fidelity, serving parity."""

from __future__ import annotations

import io
import json

from rich.console import Console

from pipeline.core.store import Artifact
from pipeline.report import RunSummary, print_summary
from pipeline.report import parity_record as _parity_record

EV = {
    "passed": False,
    "verdict": "inconclusive",
    "mode": "release",
    "reason": "r",
    "bound": {"drop": 0.0, "upper": 0.0327, "allowance": 0.02},
    "scopes": {"pass": 1, "inconclusive": 6, "fail": 0},
    "fidelity": {"kld_mean": 0.000142, "kld_se": 0.00009, "top1": 1.0, "ln_ppl_ratio": 0.0001, "positions": 4051},
}


def _print(gate):
    buf = io.StringIO()
    print_summary(RunSummary([], 3, [], 1.0, None, "evaluation gate failed", gate=gate), Console(file=buf, width=200))
    return buf.getvalue()


def test_gate_section_shows_verdict_bound_fidelity_and_parity():
    out = _print({"evaluate": EV, "parity": {"status": "passed", "matched": 64, "total": 64}})
    assert "non-inferiority inconclusive" in out and "upper bound +3.3 pp vs allowed 2.0 pp" in out
    assert "1 pass, 6 inconclusive" in out
    assert "mean KLD 0.000142 ± 9e-05" in out and "same top token 100.00%" in out
    assert "served == evaluated: 64/64" in out


def test_parity_placeholder_and_status():
    assert "served == evaluated: not checked in this run" in _print({"evaluate": EV})
    assert "served == evaluated: not run here" in _print(
        {"evaluate": EV, "parity": {"status": "not run here", "matched": None, "total": None}}
    )


def test_parity_read_from_release_manifest(tmp_path):
    (tmp_path / "release_manifest.json").write_text(json.dumps({"parity": {"matched": 3, "total": 4}}))
    assert _parity_record(Artifact("package", "k", tmp_path, {"result": {}})) == {"matched": 3, "total": 4}
    assert _parity_record(Artifact("package", "k", tmp_path, {"result": {"parity": {"matched": 1, "total": 1}}}))["total"] == 1
    assert _parity_record(Artifact("package", "k", tmp_path / "none", {"result": {}})) is None


def test_summary_json_carries_the_gate():
    s = RunSummary([], 0, [], 1.0, None, None, gate={"evaluate": EV})
    assert s.to_json()["gate"]["evaluate"]["verdict"] == "inconclusive"
