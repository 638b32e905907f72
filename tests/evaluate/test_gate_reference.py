"""The baseline is an independent reference: it runs the user's *source* checkpoint (``model.path``) in the
declared reference precision, never the export artifact, so a defect of the export cannot be shared by
baseline and candidate (issue 11: a bf16 checkpoint exported as float16 with an overflowing weight made
both emit token 0, and the gate passed)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from pipeline.core.config import compose
from pipeline.errors import EXIT_GATE
from pipeline.runner import run_pipeline


def _run(store: Path, *overrides: str):
    cfg = compose([f"store_dir={store}", "progress=false", *overrides])
    buf = io.StringIO()
    summary = run_pipeline(cfg, overrides=list(overrides), console=Console(file=buf, width=200))
    return summary, buf.getvalue()


def _eval_set(path: Path) -> Path:
    rows = [
        {"id": f"q{i}", "prompt": p, "reference": "ORD-1", "metric": "exact_match", "slice": "s"}
        for i, p in enumerate(
            [
                "Where is my order ORD-12345?",
                "Cancel order ORD-99871.",
                "Refund 129.50 dollars.",
                "Change the address to 12 Main Street.",
                "My parcel is late.",
                "Reset my password.",
            ]
        )
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_broken_export_fails_the_gate_because_the_baseline_runs_the_source(tmp_path, tiny_llama):
    """Export, then corrupt the export artifact (negated lm_head: every argmax becomes an argmin), then build
    and evaluate from it.  The candidate engine inherits the corruption; the baseline, loaded from the
    source checkpoint, does not, so the fidelity checks fail.  With the old baseline (the export's ``hf/``)
    both sides were the same broken model: KLD 0, top-1 100 %, gate passed."""
    from safetensors.torch import load_file, save_file

    store = tmp_path / "store"
    common = [
        f"model.path={tiny_llama}",
        "model.dtype=float32",
        "quant=none",
        f"eval.eval_set={_eval_set(tmp_path / 'e.jsonl')}",
        "eval.max_new_tokens=6",
        "build.max_input_len=96",
        "build.max_seq_len=128",
        "eval.gate.mode=exploratory",
    ]
    summary, out = _run(store, "stages=[export]", *common)
    assert summary.exit_code == 0, summary.error
    export_dir = Path(next(s for s in summary.stages if s.stage == "export").path)
    wfile = export_dir / "hf" / "model.safetensors"
    tensors = load_file(str(wfile))
    tensors["lm_head.weight"] = -tensors["lm_head.weight"]
    wfile.chmod(0o644)
    save_file(tensors, str(wfile), metadata={"format": "pt"})

    summary, out = _run(store, "stages=[evaluate]", *common)
    assert summary.exit_code == EXIT_GATE, (summary.error, out)
    ev = next(s for s in summary.stages if s.stage == "evaluate")
    rep = json.loads((Path(ev.path) / "eval_report.json").read_text())
    assert rep["reference"]["checkpoint"] == str(tiny_llama) and rep["reference"]["dtype"] == "float32"
    failed = {c["check"] for c in rep["gate"]["checks"] if c["verdict"] == "fail"}
    assert {"max_kld", "min_top1"} <= failed, rep["gate"]["reason"]
    assert rep["fidelity"]["overall"]["top1"] < 0.5 and rep["fidelity"]["overall"]["kld"]["mean"] > 1.0
    assert "gate" in out and "fidelity: mean KLD" in out


def test_reference_dtype_checkpoint_follows_the_source_config(tmp_path):
    from pipeline.evaluate.runners import reference_dtype

    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert reference_dtype(tmp_path, "checkpoint") == "bfloat16"
    assert reference_dtype(tmp_path, "float32") == "float32"
    (tmp_path / "config.json").write_text(json.dumps({}))
    assert reference_dtype(tmp_path, "checkpoint") == "float32"


def test_reference_checkpoint_enters_the_evaluate_key(tmp_path, tiny_llama):
    """The source checkpoint is an external input of evaluate: its content digest is in the key."""
    from pipeline.preflight import all_externals as _all_externals

    cfg = compose([f"model.path={tiny_llama}"])
    ext = _all_externals(["evaluate"], cfg)["evaluate"]
    assert ext["reference_checkpoint"] == Path(tiny_llama)
