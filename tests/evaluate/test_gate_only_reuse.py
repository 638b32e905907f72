"""A change of ``eval.gate`` only reuses the stored answers (pipeline/evaluate/running.py ``stored_runs``): the
evaluate stage runs again under its new key without generating (no runner is loaded), and writes what a fresh run
with that gate writes; a change of any other evaluate field still generates. Real runs on a tiny checkpoint."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pipeline.core.config import compose
from pipeline.core.contracts.evaluate import EvalArtifact
from pipeline.core.contracts.manifest import ArtifactManifest
from pipeline.errors import EXIT_GATE, EXIT_OK
from pipeline.evaluate import running
from pipeline.evaluate.runners import EngineAdapter, HFRunner
from pipeline.runner import run_pipeline

FILES = (EvalArtifact.REPORT_JSON, EvalArtifact.OUTPUTS, EvalArtifact.JUNIT_XML, EvalArtifact.REPORT_MD, EvalArtifact.REPORT_HTML)


def _run(store: Path, *overrides: str) -> tuple[Any, Any, str]:
    cfg = compose(["stages=[evaluate]", f"store_dir={store}", "progress=false", *overrides])
    buf = io.StringIO()
    summary = run_pipeline(cfg, overrides=list(overrides), console=Console(file=buf, width=200))
    assert summary.exit_code in (EXIT_OK, EXIT_GATE), (summary.error, buf.getvalue()[-3000:])
    ev = next(s for s in summary.stages if s.stage == "evaluate")
    return ev, Path(ev.path) if ev.path else None, buf.getvalue()  # a dry run has no path


@pytest.fixture
def generations(monkeypatch) -> list[str]:
    """Every runner loaded and every generation / teacher-forced pass, in order (the real ones still run)."""
    calls: list[str] = []

    def spy(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def wrapped(*a: Any, **k: Any) -> Any:
            calls.append(f"{getattr(owner, '__name__', 'running')}.{name}")
            return real(*a, **k)

        monkeypatch.setattr(owner, name, wrapped)

    spy(running, "_make_runner")
    for cls in (HFRunner, EngineAdapter):
        spy(cls, "run")
        spy(cls, "teacher_forced_logits")
    return calls


def test_a_gate_only_change_reuses_the_answers_and_writes_what_a_fresh_run_writes(tiny_llama, tmp_path, generations):
    evs = tmp_path / "eval.jsonl"
    rows = [
        {"id": f"o{i}", "prompt": f"Where is order ORD-1{i}?", "reference": f"ORD-1{i}", "metric": "exact_match", "slice": "order"}
        for i in range(3)
    ] + [{"id": "r1", "prompt": "I want a refund.", "reference": "refund", "metric": "contains", "slice": "refund"}]
    evs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    base = [
        f"model.path={tiny_llama}",
        "model.dtype=float32",
        "quant=int8_wo",
        "calibration.calib_size=8",
        "calibration.min_samples=4",
        f"eval.eval_set={evs}",
        "eval.runners=[baseline,engine,simulated]",
        "eval.max_new_tokens=4",
        "eval.fidelity_heldout=2",
        "build.max_input_len=128",
        "build.max_seq_len=160",
        "eval.gate.mode=exploratory",
    ]
    store = tmp_path / "store"
    first, first_dir, _ = _run(store, *base)
    assert first.status == "ran" and "pipeline.evaluate.running._make_runner" in generations and "HFRunner.run" in generations
    assert "EngineAdapter.run" in generations and "HFRunner.teacher_forced_logits" in generations

    generations.clear()
    gate = ["eval.gate.max_drop=0.5", "eval.gate.min_score=0.01"]
    # a dry run says the real run would reuse them (and only for a gate-only change)
    _, _, out = _run(store, *base, *gate, "dry_run=true")
    assert f"would reuse the generation of {first.key[:24]}" in " ".join(out.split()) and generations == []
    _, _, out = _run(store, *base, *gate, "eval.max_new_tokens=3", "dry_run=true")
    assert "would reuse" not in out and generations == []
    second, second_dir, out = _run(store, *base, *gate)
    assert second.status == "ran" and second.key != first.key
    assert generations == []  # no runner loaded, nothing generated, no teacher-forced pass
    assert f"reusing the answers and fidelity of artifact {first.key}" in out
    mf = ArtifactManifest.from_json(json.loads((second_dir / "manifest.json").read_text()))
    first_mf = ArtifactManifest.from_json(json.loads((first_dir / "manifest.json").read_text()))
    assert mf.generation_key == first_mf.generation_key and isinstance(mf.generation_key, str)
    assert mf.measurements["answers_reused_from"] == first.key

    # the same config in an empty store generates and writes the same files, byte for byte
    fresh, fresh_dir, fresh_out = _run(tmp_path / "fresh", *base, *gate)
    assert fresh.key == second.key and "reusing the answers" not in fresh_out and "HFRunner.run" in generations
    for name in FILES:
        assert (second_dir / name).read_bytes() == (fresh_dir / name).read_bytes(), name
    assert (
        json.loads((second_dir / "manifest.json").read_text())["result"] == json.loads((fresh_dir / "manifest.json").read_text())["result"]
    )

    # any other evaluate field generates again
    generations.clear()
    third, _, out = _run(store, *base, *gate, "eval.max_new_tokens=3")
    assert third.status == "ran" and "reusing the answers" not in out
    assert "pipeline.evaluate.running._make_runner" in generations and "HFRunner.run" in generations

    # a stored artifact whose files do not match its manifest is not reused: the runners generate
    for d in (first_dir, second_dir):
        p = d / EvalArtifact.OUTPUTS
        p.chmod(0o644)
        data = p.read_bytes()
        p.write_bytes(data.replace(b'"text": "', b'"text": "X', 1)[: len(data)])  # same size, other bytes
    generations.clear()
    fourth, _, out = _run(store, *base, "eval.gate.max_drop=0.4")
    assert fourth.status == "ran" and "reusing the answers" not in out and "HFRunner.run" in generations
