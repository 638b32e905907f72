"""The evaluate stage through the real pipeline (export -> quantize (ModelOpt) -> build
(onnxruntime-genai engine) -> evaluate), on a tiny checkpoint (always) and on the embedded default
model (when ``models/support-llama`` exists)."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import REPO_ROOT, compose
from pipeline.errors import EXIT_GATE, EXIT_OK
from pipeline.runner import run_pipeline

sys.path.insert(0, os.path.join(REPO_ROOT, "evaluation"))
import generate_data as gd

DEFAULT_MODEL = Path(os.environ.get("PIPELINE_TEST_DEFAULT_MODEL", REPO_ROOT / "models" / "support-llama"))


def _have_stages() -> str | None:
    import importlib

    for m in ("pipeline.quantize.stage", "pipeline.build.stage", "pipeline.core.targets"):
        try:
            mod = importlib.import_module(m)
        except ImportError as e:
            return f"{m} not available yet ({e})"
        if m == "pipeline.core.targets" and not hasattr(mod, "get_target"):
            return "pipeline.core.targets.get_target not available yet"
    return None


needs_stages = pytest.mark.skipif(_have_stages() is not None, reason=str(_have_stages()))


def run(tmp_path: Path, *overrides: str):
    """Run stages=[evaluate] (and its upstream stages) with the artifact store under ``tmp_path``."""
    cfg = compose(["stages=[evaluate]", f"store_dir={tmp_path / 'store'}", "progress=false", *overrides])
    buf = io.StringIO()
    summary = run_pipeline(cfg, overrides=list(overrides), console=Console(file=buf, width=160))
    ev = next((s for s in summary.stages if s.stage == "evaluate"), None)
    report = json.loads((Path(ev.path) / "eval_report.json").read_text()) if ev and ev.path else None
    return summary, report, buf.getvalue()


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    import tiny

    return tiny.make_checkpoint(tmp_path_factory.mktemp("tiny_eval") / "llama", "llama")


def _tiny_eval_set(path: Path) -> Path:
    """A small eval set with every metric family, a chat item and one over-long prompt."""
    rows = [
        {"id": "a1", "prompt": "Where is my order ORD-12345?", "reference": "ORD-12345", "metric": "exact_match", "slice": "order"},
        {"id": "a2", "prompt": "Please cancel order ORD-99871.", "reference": "ORD-99871", "metric": "contains", "slice": "order"},
        # slice names are user data: one that reads as Rich markup, one that reads as an emoji code (":a:")
        {"id": "b1", "prompt": "Refund 129.50 dollars.", "reference": "129.50", "metric": "numeric", "slice": "[/red]"},
        {
            "id": "b2",
            "messages": [{"role": "user", "content": "I want a refund for the damaged item."}],
            "reference": "refund",
            "metric": "rouge_l",
            "slice": "a",
            "max_new_tokens": 12,
            "stop": ["\n"],
        },
        {
            "id": "c1",
            "prompt": "Change the shipping address to 12 Main Street." * 30,
            "reference": "x",
            "metric": "exact_match",
            "slice": "order",
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@needs_stages
def test_tiny_end_to_end_engine_and_report(tmp_path, tiny_ckpt, monkeypatch):
    # the planner refuses configs whose eval set has prompts over build.max_input_len (exit 2); switch that
    # pre-check off to show the stage itself counts such an item as "skipped: too long" and never crashes
    monkeypatch.setenv("PIPELINE_SKIP_EVAL_LENGTH_CHECK", "1")
    es = _tiny_eval_set(tmp_path / "tiny_eval.jsonl")
    summary, rep, out = run(
        tmp_path,
        f"model.path={tiny_ckpt}",
        "model.dtype=float32",
        "quant=int4_wo",
        "calibration.calib_size=32",
        "calibration.min_samples=8",
        f"eval.eval_set={es}",
        "eval.runners=[baseline,engine,simulated]",
        "eval.max_new_tokens=8",
        "build.max_input_len=128",
        "build.max_seq_len=160",
        "eval.gate.max_drop=1.0",
        "eval.gate.max_kld=100",
        "eval.gate.min_top1=0",
        f"eval.draft_model_path={tiny_ckpt}",
        "eval.draft_tokens=3",
        "target.accuracy_level=1",
    )  # fp32 activations: the engine's exact numerics are checked below
    assert summary.exit_code in (EXIT_OK, EXIT_GATE), summary.error
    assert rep["schema"] == "pipeline.eval_report/v1"
    assert rep["candidate"] == "engine" and set(rep["runners"]) == {"baseline", "engine", "simulated"}
    assert rep["skipped"]["too_long"] == ["c1"] and rep["runners"]["engine"]["n"] == 4
    ev = next(s for s in summary.stages if s.stage == "evaluate")
    art = Path(ev.path)
    html = (art / "eval_report.html").read_text()
    assert "data:image/png;base64," in html and "Worst regressions" in html
    assert "| scope |" in (art / "eval_report.md").read_text()
    lines = [json.loads(l) for l in (art / "outputs.jsonl").read_text().splitlines()]
    assert {l["runner"] for l in lines if "runner" in l} == {"baseline", "engine", "simulated"}
    assert all(l["finish_reason"] in ("eos", "stop", "length") for l in lines if "runner" in l)
    # greedy, same prompts: the int4 engine reproduces ModelOpt's simulated int4 model (same integers and scales)
    eng = {l["id"]: l["output_ids"] for l in lines if l.get("runner") == "engine"}
    sim = {l["id"]: l["output_ids"] for l in lines if l.get("runner") == "simulated"}
    assert sum(eng[i] == sim[i] for i in eng) >= 3, (eng, sim)
    assert rep["pairwise_agreement"]["engine~simulated"] >= 0.75
    mf = json.loads((art / "manifest.json").read_text())
    assert mf["result"]["gate"]["passed"] is True
    assert set(mf["result"]["headline"]) >= {"score", "baseline", "drop", "agreement", "gate"}
    assert "gate" in out
    # the draft model is the target itself: every proposed draft token matches the target's greedy token
    sp = rep["speculative"]
    assert sp["acceptance_rate"] == 1.0 and sp["proposed"] > 0 and set(sp["slices"]) == {"order", "[/red]", "a"}
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("[/red]", "a "))]
    assert [r[:2] for r in rows] == [["[/red]", "1"], ["a", "1"]], out  # the slice table shows them as text (no MarkupError)
    assert "\U0001f170" not in out  # and ":a:" never became an emoji


# The default-model runs share one store (the export artifact is reused) and evaluate a round-robin
# subset of the eval set over all slices; calibration is shortened to keep AWQ fast on this CPU.
DEFAULT_LIMIT = [f"model.path={DEFAULT_MODEL}", "eval.limit=36", "eval.batch_size=36", "calibration.calib_size=64"]


@pytest.fixture(scope="module")
def default_store(tmp_path_factory):
    return tmp_path_factory.mktemp("default_model_store")


@pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="models/support-llama not trained yet (models/train.py)")
@needs_stages
@pytest.mark.parametrize("recipe", ["none", "int4_awq"])
def test_default_model_passes_gate(default_store, recipe):
    # recipe none: the whole eval set (720 items, 80 per slice), enough to show non-inferiority on every slice,
    # and the default model held to its recorded accuracy; int4_awq: a 36-item round-robin subset with a short
    # calibration (AWQ on CPU), too small to show non-inferiority per slice: run as exploratory (exit 0, recorded
    # inconclusive, not releasable), and never a measured drop or a fidelity failure
    overrides = [f"quant={recipe}", *DEFAULT_LIMIT]
    if recipe == "none":
        overrides = [o for o in overrides if not o.startswith(("eval.limit", "eval.batch_size"))]
    else:
        overrides.append("eval.gate.mode=exploratory")
    summary, rep, out = run(default_store, *overrides)
    assert summary.exit_code == EXIT_OK, (summary.error, out)
    assert rep["candidate"] == "engine"
    if recipe == "none":
        assert rep["gate"]["passed"] and rep["gate"]["verdict"] == "pass", rep["gate"]["reason"]
    else:
        assert rep["gate"]["verdict"] == "inconclusive" and not rep["gate"]["passed"] and rep["gate"]["mode"] == "exploratory"
        assert "EXPLORATORY RUN" in out
    assert not [c for c in rep["gate"]["checks"] if c["verdict"] == "fail"], rep["gate"]["reason"]
    base = rep["runners"]["baseline"]
    if recipe == "none":
        eval_set = Path(REPO_ROOT) / compose([]).eval.eval_set
        assert base["n"] == len(eval_set.read_text(encoding="utf-8").splitlines()), base
    if recipe == "none":
        # the baseline (fp32 source checkpoint) scores what models/train.py recorded, slice by slice, on the items it
        # was recorded on: the first EVAL_PER_SLICE of each slice (the v2 slices grew after training)
        recorded = json.loads((DEFAULT_MODEL / "training_info.json").read_text())["eval"]
        rows = [
            json.loads(x)
            for x in (Path(next(s.path for s in summary.stages if s.stage == "evaluate")) / "outputs.jsonl").read_text().splitlines()
        ]
        first = [r for r in rows if r["runner"] == "baseline" and int(r["id"].rsplit("-", 1)[1]) <= gd.EVAL_PER_SLICE]
        per_slice = {s: [r["score"] for r in first if r["slice"] == s] for s in {r["slice"] for r in first}}
        assert sum(r["score"] for r in first) / len(first) == pytest.approx(recorded["overall"], abs=1e-9), recorded
        assert {s: sum(v) / len(v) for s, v in per_slice.items()} == pytest.approx(recorded["per_slice"], abs=1e-9)
    # the fp32 engine reproduces transformers' greedy answers; int4_awq changed 16 of 720 (measured 97.8 %)
    assert rep["comparison"]["overall"]["agreement"] >= (0.99 if recipe == "none" else 0.9)
    assert rep["fidelity"]["overall"]["positions"] > 0 and rep["fidelity"]["overall"]["top1"] >= 0.95
    assert "served == evaluated" in out and "fidelity: mean KLD" in out


@needs_stages
def test_destructive_recipe_fails_gate_with_exit_3(tmp_path, tiny_ckpt):
    """int4 weight-only on every linear (lm_head included) of a small, unconfident model changes its
    greedy answers; a release policy that requires the baseline's answers (``min_agreement=0.99``) must
    fail it: exit 3, the report still published and naming the failed check, and the package stage
    refusing the artifact.

    The trained default model loses at most a few items per slice under every shipped recipe (measured,
    docs/evaluate.md), so the destructive case runs on the tiny random-weight Llama.
    """
    summary, rep, out = run(
        tmp_path,
        f"model.path={tiny_ckpt}",
        "model.dtype=float32",
        *DESTRUCTIVE,
        "calibration.calib_size=32",
        "calibration.min_samples=8",
        "eval.limit=24",
        "eval.max_new_tokens=12",
        "build.max_input_len=160",
        "build.max_seq_len=200",
        "stages=[evaluate,package]",
    )
    assert summary.exit_code == EXIT_GATE, (summary.error, out)
    assert rep["gate"]["passed"] is False and "min_agreement" in rep["gate"]["reason"]
    assert rep["comparison"]["overall"]["agreement"] < 0.99
    assert "gate FAILED" in out
    pkg = next(s for s in summary.stages if s.stage == "package")
    assert pkg.status == "failed" and "gate" in (pkg.error or "")


DESTRUCTIVE = ["quant=int4_wo", "quant.exclude_modules=[]", "eval.gate.min_agreement=0.99"]


def test_candidate_auto_falls_back_to_simulated_when_target_cannot_run_recipe(tmp_path):
    """eval.candidate=auto: the engine when the target runs the recipe and an engine exists, else simulated."""
    from pipeline.core.store import Artifact
    from pipeline.evaluate.inputs import resolve_runners

    build = tmp_path / "build"
    (build / "engine").mkdir(parents=True)
    (build / "build_info.json").write_text(json.dumps({"target": "onnxruntime_genai", "limits": {"max_input_len": 64}}))
    art = Artifact("build", "k", build, {})
    runners, cand, notes = resolve_runners(compose(["quant=int4_awq"]), art)
    assert (runners, cand) == (["baseline", "engine"], "engine")
    runners, cand, notes = resolve_runners(compose(["quant=fp8"]), art)
    assert (runners, cand) == (["baseline", "simulated"], "simulated")
    assert "cannot run recipe 'fp8'" in notes["candidate"] and "engine" in notes
    runners, cand, _ = resolve_runners(compose(["quant=int4_awq", "eval.candidate=simulated"]), art)
    assert (runners, cand) == (["baseline", "simulated", "engine"], "simulated")
    runners, cand, notes = resolve_runners(compose(["quant=int4_awq"]), Artifact("build", "k", tmp_path / "nothing", {}))
    assert cand == "simulated" and "no engine/" in notes["candidate"]
