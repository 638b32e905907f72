"""Release vs exploratory mode through the real pipeline on a tiny checkpoint: a 4-item eval set cannot show
non-inferiority.  Release mode exits 3 naming the items needed; exploratory mode finishes the evaluate stage
with exit 0 and a loud warning, and the package stage still refuses to release the candidate."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from pipeline.core.config import compose
from pipeline.errors import EXIT_GATE, EXIT_OK
from pipeline.runner import run_pipeline


def _run(store: Path, *overrides: str):
    cfg = compose([f"store_dir={store}", "progress=false", *overrides])
    buf = io.StringIO()
    summary = run_pipeline(cfg, overrides=list(overrides), console=Console(file=buf, width=240))
    return summary, buf.getvalue()


def test_small_set_release_fails_exploratory_runs_but_is_not_packaged(tmp_path, tiny_llama):
    rows = [
        {"id": f"q{i}", "prompt": f"Where is order ORD-{i}?", "reference": f"ORD-{i}", "metric": "exact_match", "slice": f"s{i}"}
        for i in range(4)
    ]
    es = tmp_path / "e.jsonl"
    es.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    common = [
        f"model.path={tiny_llama}",
        "model.dtype=float32",
        "quant=none",
        f"eval.eval_set={es}",
        "eval.max_new_tokens=4",
        "build.max_input_len=96",
        "build.max_seq_len=128",
    ]
    store = tmp_path / "store"

    summary, out = _run(store, "stages=[evaluate]", *common)
    assert summary.exit_code == EXIT_GATE, out
    assert "inconclusive" in summary.error and "paired items would be needed" in summary.error
    # trial 3: the run's final line called it failed ("evaluation gate failed: ... inconclusive")
    assert summary.error.startswith("evaluation gate inconclusive (not failed") and "gate failed" not in summary.error, summary.error
    assert "non-inferiority inconclusive" in out

    summary, out = _run(store, "stages=[evaluate]", "eval.gate.mode=exploratory", *common)
    assert summary.exit_code == EXIT_OK, (summary.error, out)
    assert "EXPLORATORY RUN" in out and "not releasable" in out and "exit 0, but a package stage would refuse" in out
    ev = next(s for s in summary.stages if s.stage == "evaluate")
    rep = json.loads((Path(ev.path) / "eval_report.json").read_text())
    assert rep["gate"]["mode"] == "exploratory" and rep["gate"]["verdict"] == "inconclusive" and rep["gate"]["passed"] is False
    assert "EXPLORATORY RUN" in (Path(ev.path) / "eval_report.md").read_text()

    summary, out = _run(store, "stages=[package]", "eval.gate.mode=exploratory", *common)
    assert summary.exit_code == EXIT_GATE, out
    # the banner tells this run's outcome (a fresh-user trial read "exit 0" here, then got exit 3)
    assert "the package stage of this run will refuse to release this candidate: exit 3" in out and "exit 0" not in out, out
    pkg = next(s for s in summary.stages if s.stage == "package")
    assert pkg.status == "failed" and "gate" in (pkg.error or "")
    # the refusal names the first slice and counts the rest (evaluate printed them all), and gives each fix once
    err = pkg.error or ""
    assert "slice:s0" in err and "and 3 more slice(s) (eval_report.json)" in err and "slice:s3" not in err, err
    assert err.count("package.allow_failed_gate=true") == 1, err

    # told to package anyway, the exploratory warning says so (it said "will refuse" while the package went ahead)
    summary, out = _run(
        store, "stages=[package]", "eval.gate.mode=exploratory", "package.allow_failed_gate=true", "package.parity=false", *common
    )
    assert summary.exit_code == EXIT_OK, (summary.error, out)
    assert "packages it anyway because package.allow_failed_gate=true" in out and "will refuse" not in out
    assert next(s for s in summary.stages if s.stage == "package").status == "ran"
