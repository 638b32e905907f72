"""An inconclusive gate says it is inconclusive (not failed) and gives the fixes that apply: a larger eval set,
an explicit allowance, or eval.gate.mode=exploratory; a real fail keeps "improve the candidate"."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from pipeline.core.config.eval import GateConfig
from pipeline.core.store import Artifact
from pipeline.errors import GateFailed
from pipeline.evaluate.gate import judge, paired_stats
from pipeline.evaluate.results import gate_summary
from pipeline.package.gate import release_gate
from pipeline.report import print_gate


def _stats(n: int, lost: int, conf: float = 0.95):
    base = [1.0] * n
    cand = [1.0] * (n - lost) + [0.0] * lost
    return paired_stats(base, cand, binary=True, agree=None, confidence=conf, samples=200, seed=0)


def _verdict(lost_on_slice: int, gate: GateConfig | None = None):
    """int8_wo on the shipped shape: 720 items overall, one 80-item slice with ``lost_on_slice`` lost items."""
    gate = gate or GateConfig()
    stats = {"overall": _stats(720, lost_on_slice), "slice:orders": _stats(80, lost_on_slice)}
    return gate, judge(gate, "int8_wo", stats, {"overall": 0.9, "slice:orders": 0.9})


def _package(gate_record: dict):
    inputs = {"evaluate": Artifact("evaluate", "v" * 64, Path("."), {"result": {"gate": gate_record}})}
    ctx = SimpleNamespace(
        inputs=inputs,
        upstream=inputs.get,  # StageContext.upstream
        cfg=SimpleNamespace(package=SimpleNamespace(allow_failed_gate=False)),
        log=logging.getLogger("test"),
    )
    with pytest.raises(GateFailed) as e:
        release_gate(ctx)
    return str(e.value)


def test_inconclusive_names_scope_allowance_source_items_and_fixes():
    gate, v = _verdict(1)
    assert v["verdict"] == "inconclusive"
    fix = v["fix"]
    assert "INCONCLUSIVE, not failed" in fix
    assert "slice:orders" in fix and "allowance 4.0 pp" in fix
    assert "eval.gate.max_drop_by_recipe.int8_wo" in fix and "slice_max_drop" in fix
    assert "items needed (it has 80)" in fix
    assert "larger eval set" in fix and "eval.gate.slice_max_drop=<drop>" in fix and "eval.gate.mode=exploratory" in fix

    record = {"passed": v["passed"], "reason": v["reason"], **gate_summary(v, {})}
    msg = _package(record)
    assert "inconclusive" in msg and "improve the candidate" not in msg
    assert "eval.gate.mode=exploratory" in msg and "items needed" in msg and "package.allow_failed_gate=true" in msg

    buf = io.StringIO()
    print_gate({"evaluate": record}, Console(file=buf, width=400))
    out = buf.getvalue()
    assert "INCONCLUSIVE, not failed" in out and "eval.gate.slice_max_drop=<drop>" in out


def test_in_exploratory_mode_the_fix_names_what_packages_it_not_the_mode_already_set():
    _, v = _verdict(1, GateConfig(mode="exploratory"))
    assert "eval.gate.mode=exploratory (exit 0" not in v["fix"]
    assert "package.allow_failed_gate=true to package it anyway (eval.gate.mode=exploratory is already set" in v["fix"]


def test_explicit_allowance_is_named_as_such():
    _, v = _verdict(1, GateConfig(slice_max_drop=0.04))
    assert "from eval.gate.slice_max_drop (set explicitly)" in v["fix"]


def test_real_fail_keeps_the_improve_fix():
    _, v = _verdict(8)  # 10 % measured drop on the slice: above the allowance itself
    assert v["verdict"] == "fail" and v["fix"] is None
    msg = _package({"passed": False, "reason": v["reason"], **gate_summary(v, {})})
    assert "improve the candidate" in msg and "INCONCLUSIVE" not in msg


def test_evaluate_console_says_inconclusive_not_failed():
    from pipeline.core.contracts.evaluate import EvalReport
    from pipeline.evaluate.report import print_console

    _, v = _verdict(1)
    rep = {
        "gate": v,
        "eval_set": {"name": "support_v2"},
        "candidate": "engine",
        "recipe": "int8_wo",
        "runners": {"engine": {"score": 0.9, "n": 720, "slices": {}}},
        "skipped": {"too_long": []},
    }
    buf = io.StringIO()
    print_console(EvalReport.from_json(rep), Console(file=buf, width=600))
    out = buf.getvalue()
    assert "gate FAILED" not in out and "gate INCONCLUSIVE" in out
    assert "about 138 items needed (it has 80)" in out and "eval.gate.mode=exploratory" in out


def test_the_reason_leads_with_the_failed_check_not_the_inconclusive_scopes():
    """Fresh-user trial: only min_top1 failed, and every shortened reason (serve warning, sweep table, headline) began
    with the inconclusive max_drop scopes and was cut before min_top1. The reason now lists fails first."""
    gate = GateConfig()
    stats = {"overall": _stats(720, 1), "slice:orders": _stats(80, 1)}
    fidelity = {"kld": {"mean": 0.01, "se": 0.001}, "top1": 0.80, "positions": 1000, "ln_ppl_ratio": 0.0}
    v = judge(gate, "int8_wo", stats, {"overall": 0.9, "slice:orders": 0.9}, fidelity=fidelity)
    assert v["verdict"] == "fail" and v["non_inferiority"] == "inconclusive"
    assert v["reason"].startswith("overall min_top1"), v["reason"]
    assert [c["verdict"] for c in v["failed_checks"]][0] == "fail"
