"""A downstream artifact is not reused when the upstream it was computed from was re-produced, and a stored artifact
that no longer matches its manifest is moved aside with one line saying why (fresh-user trial, cache findings 1-2).

Keys are input-addressed (an upstream enters a downstream key by its key), so a rebuilt upstream keeps every
downstream key; the runner refuses the hit instead.  Real stages (export, quantize, the onnxruntime-genai CPU build,
evaluate with the engine runner) on a tiny real checkpoint through the real runner and store.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import compose
from pipeline.runner import run_pipeline


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    import tiny

    return tiny.make_checkpoint(tmp_path_factory.mktemp("tiny_upstream") / "llama", "llama")


def _eval_set(path: Path) -> Path:
    rows = [
        {"id": f"o{i}", "prompt": f"Where is my order ORD-1234{i}?", "reference": f"ORD-1234{i}", "metric": "exact_match", "slice": "order"}
        for i in range(3)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _run(tmp_path: Path, ckpt: Path, stages: str, *extra: str, run_dir: Path | None = None):
    cfg = compose(
        [
            f"stages={stages}",
            f"store_dir={tmp_path / 'store'}",
            "progress=false",
            f"model.path={ckpt}",
            "model.dtype=float32",
            "quant=none",
            f"eval.eval_set={_eval_set(tmp_path / 'eval.jsonl')}",
            "eval.runners=[baseline,engine]",
            "eval.max_new_tokens=4",
            "build.max_input_len=128",
            "build.max_seq_len=160",
            "eval.gate.max_drop=1.0",
            *extra,
        ]
    )
    buf = io.StringIO()
    summary = run_pipeline(cfg, overrides=list(extra), summary_dir=run_dir, console=Console(file=buf, width=2000))
    assert summary.exit_code == 0, (summary.error, buf.getvalue()[-3000:])
    return {r.stage: r for r in summary.stages}, buf.getvalue()


def _manifest(path: str | None) -> dict:
    assert path
    return json.loads((Path(path) / "manifest.json").read_text())


def test_verify_cache_reruns_evaluate_when_its_build_was_rebuilt(tmp_path, tiny_ckpt):
    reps, _ = _run(tmp_path, tiny_ckpt, "[build]")
    build_dir = Path(reps["build"].path)
    info = build_dir / "build_info.json"
    text = info.read_text()
    edited = text.replace('"max_seq_len": 160', '"max_seq_len": 120')
    assert edited != text and len(edited) == len(text)  # same size: only a re-hash can tell
    info.write_text(edited)
    # without verify_cache the edit is not seen: evaluate is computed from the edited build
    a, _ = _run(tmp_path, tiny_ckpt, "[evaluate]")
    assert a["build"].status == "cached" and a["evaluate"].status == "ran"
    old_eval = _manifest(a["evaluate"].path)

    b, out = _run(tmp_path, tiny_ckpt, "[evaluate]", "verify_cache=true", run_dir=tmp_path / "runB")
    assert b["build"].status == "ran" and b["build"].key == a["build"].key  # tampered: rebuilt, same key
    assert json.loads((Path(b["build"].path) / "build_info.json").read_text())["limits"]["max_seq_len"] == 160
    new_build = _manifest(b["build"].path)["output_digest"]
    assert b["evaluate"].key == a["evaluate"].key
    assert b["evaluate"].status == "ran", "evaluate was reused although the build it was computed from was rebuilt"
    # a rebuild is reproducible (docs/reproducibility.md): the rebuilt build has the digest the tampered one's manifest
    # still recorded; evaluate re-ran all the same, since it was computed from the tampered bytes
    assert _manifest(b["evaluate"].path)["inputs"]["build"]["digest"] == new_build == old_eval["inputs"]["build"]["digest"]
    # one line for each folder that was not reused, before the stage runs again, and in the summary's notes
    lines = out.splitlines()
    (bline,) = [ln for ln in lines if ln.startswith(f"build {a['build'].key[:24]}: the stored artifact does not match its manifest")]
    assert "build_info.json: sha256 " in bline and "moved aside to " in bline and bline.endswith(", rebuilding")
    (eline,) = [ln for ln in lines if ln.startswith(f"evaluate {a['evaluate'].key[:24]}: not reused:")]
    assert "its input build was re-produced in this run" in eline and eline.endswith(", re-running")
    assert lines.index(eline) < next(i for i, ln in enumerate(lines) if ln.startswith("✓ evaluate"))
    summary = json.loads((tmp_path / "runB" / "summary.json").read_text())
    notes = {s["stage"]: s["notes"] for s in summary["stages"]}
    assert notes["build"] == [bline] and notes["evaluate"] == [eline] and notes["export"] == notes["quantize"] == []
    aside = Path(eline.split("moved aside to ", 1)[1].split(", re-running")[0])
    assert aside.is_dir() and aside.name.startswith(".stale-") and _manifest(str(aside))["key"] == a["evaluate"].key

    # the next run reuses everything: the rebuilt build and the evaluate computed from it
    c, _ = _run(tmp_path, tiny_ckpt, "[evaluate]", "verify_cache=true")
    assert {s: r.status for s, r in c.items()} == dict.fromkeys(("export", "quantize", "build", "evaluate"), "cached")


def test_a_deterministic_upstream_rebuilt_in_this_run_still_reruns_its_dependents(tmp_path, tiny_ckpt):
    """The re-produced export may have the very digest quantize recorded; quantize was perhaps computed from the
    damaged bytes all the same, so it is not reused."""
    reps, _ = _run(tmp_path, tiny_ckpt, "[quantize]")
    weights = Path(reps["export"].path) / "hf" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = bytes(4)
    weights.unlink()  # a new file: the quantize artifact may share the old one's inode (a hard link)
    weights.write_bytes(bytes(data))
    b, out = _run(tmp_path, tiny_ckpt, "[quantize]", "verify_cache=true")
    assert b["export"].status == "ran" and b["quantize"].status == "ran"
    assert _manifest(b["export"].path)["output_digest"] == _manifest(b["quantize"].path)["inputs"]["export"]["digest"]
    (line,) = [ln for ln in out.splitlines() if ln.startswith(f"quantize {reps['quantize'].key[:24]}: not reused:")]
    assert "export was re-produced in this run" in line and line.endswith(", re-running")


def test_an_artifact_that_lost_its_size_is_moved_aside_with_one_line(tmp_path, tiny_ckpt):
    reps, _ = _run(tmp_path, tiny_ckpt, "[export]")
    info = Path(reps["export"].path) / "model_info.json"
    before = info.stat().st_size
    info.write_text(info.read_text() + "\n\n\n")
    again, out = _run(tmp_path, tiny_ckpt, "[export]", run_dir=tmp_path / "run")
    assert again["export"].status == "ran"
    (line,) = [ln for ln in out.splitlines() if "the stored artifact does not match its manifest" in ln]
    assert line.startswith(f"export {reps['export'].key[:24]}: the stored artifact does not match its manifest ")
    assert f"(model_info.json: size {before + 3} != {before} recorded); moved aside to " in line and line.endswith(", rebuilding")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stages"][0]["notes"] == [line]


def test_dry_run_predicts_the_reruns_the_real_run_makes(tmp_path, tiny_ckpt):
    """dry_run=true takes the real run's reuse decision: a damaged upstream would be rebuilt and its dependents would
    re-run, each said with why (dry_run used to show every stored artifact as reusable); nothing is moved or run."""
    reps, _ = _run(tmp_path, tiny_ckpt, "[quantize]")
    info = Path(reps["export"].path) / "model_info.json"
    info.write_text(info.read_text() + "\n")
    d, out = _run(tmp_path, tiny_ckpt, "[quantize]", "dry_run=true", run_dir=tmp_path / "dry")
    notes = {s["stage"]: s["notes"] for s in json.loads((tmp_path / "dry" / "summary.json").read_text())["stages"]}
    (exp,) = notes["export"]
    assert exp.startswith(f"would run: {reps['export'].key[:24]}: the stored artifact does not match its manifest")
    assert exp.endswith("it would be moved aside, rebuilding")
    (qnt,) = notes["quantize"]
    assert qnt.startswith(f"would run: {reps['quantize'].key[:24]}: not reused: its input export was re-produced in this run")
    assert f"dry run: quantize: {qnt}" in out
    assert Path(reps["export"].path).is_dir() and Path(reps["quantize"].path).is_dir()  # nothing moved aside
    # an intact store: the dry run says nothing would run
    again, _ = _run(tmp_path, tiny_ckpt, "[quantize]")
    assert again["export"].status == "ran" and again["quantize"].status == "ran"
    _, out = _run(tmp_path, tiny_ckpt, "[quantize]", "dry_run=true", run_dir=tmp_path / "dry2")
    notes = {s["stage"]: s["notes"] for s in json.loads((tmp_path / "dry2" / "summary.json").read_text())["stages"]}
    assert notes == {"export": [], "quantize": []} and "would run" not in out


def test_a_downstream_a_concurrent_run_made_from_this_runs_upstream_is_reused(tmp_path, tiny_ckpt, monkeypatch):
    """Two runs share a store: run A produces the export; run B starts meanwhile, reuses A's export and publishes
    quantize before A gets there. A then reuses B's quantize: it records the very production of the export A made
    (``production`` id), so it is not "computed from unknown bytes" (which moved it aside under B's feet before)."""
    import pipeline.runner as runner

    original = runner._run_or_reuse
    other: dict = {}

    def run_b_after_export(stage, ctx, store, key, t0, state):
        art = original(stage, ctx, store, key, t0, state)
        if stage.name == "export" and not other:  # run B, started while A is between export and quantize
            other["started"] = True
            other["reports"], _ = _run(tmp_path, tiny_ckpt, "[quantize]")
        return art

    monkeypatch.setattr(runner, "_run_or_reuse", run_b_after_export)
    a, out = _run(tmp_path, tiny_ckpt, "[quantize]")
    b = other["reports"]
    assert a["export"].status == "ran" and b["export"].status == "cached" and b["quantize"].status == "ran"
    assert a["quantize"].status == "cached" and a["quantize"].path == b["quantize"].path, out
    assert "not reused" not in out and not list((tmp_path / "store").rglob(".stale-*"))
    rec = _manifest(a["quantize"].path)["inputs"]["export"]
    assert rec["production"] == _manifest(a["export"].path)["production"]
