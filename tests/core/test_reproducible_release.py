"""Reproducible releases (issue 36): a forced rebuild of every stage from the same inputs, into another store, gives
the same release archive byte for byte, and the quantize cache key takes only the ``quant`` fields the recipe reads.

Old behaviour: ``build_info.json`` recorded ``build_s``, the builder's peak RSS and the staging folder's path,
``quant_report.json`` its step timings and peaks, ``eval_report.json`` / ``outputs.jsonl`` the runners' wall times and
latencies; each run gave the build and evaluate artifacts new digests, so ``release_manifest.json`` (inside the
archive) and the archive differed.  ``quant.group_size`` on fp8 changed the quantize key.
Real stages (export, quantize, the onnxruntime-genai CPU build, evaluate, package) on the session's tiny Llama.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import compose
from pipeline.runner import compute_key, run_pipeline

STAGES = ("export", "quantize", "build", "evaluate", "package")


def _run(store: Path, ckpt: Path, eval_set: Path):
    overrides = [
        f"stages=[{','.join(STAGES)}]",
        "force=true",
        f"store_dir={store}",
        "progress=false",
        f"model.path={ckpt}",
        "model.dtype=float32",
        "quant=int4_awq",  # the default recipe: calibration, AWQ, resmooth and an int4 engine
        "calibration.calib_size=16",
        "calibration.min_samples=16",
        "calibration.calib_max_seq_length=64",
        f"eval.eval_set={eval_set}",
        "eval.runners=[baseline,engine]",
        "eval.max_new_tokens=4",
        "build.max_input_len=128",
        "build.max_seq_len=160",
        "eval.gate.max_drop=1.0",
        "eval.gate.max_kld=100",  # random weights: the gate is not what this test is about
        "eval.gate.min_top1=0",
    ]
    buf = io.StringIO()
    summary = run_pipeline(compose(overrides), overrides=overrides, console=Console(file=buf, width=2000))
    assert summary.exit_code == 0, (summary.error, buf.getvalue()[-3000:])
    return {r.stage: r for r in summary.stages}


def test_forced_rebuild_into_another_store_gives_the_same_release_archive(tmp_path, tiny_llama):
    rows = [
        {"id": f"o{i}", "prompt": f"Where is my order ORD-1234{i}?", "reference": f"ORD-1234{i}", "metric": "exact_match", "slice": "order"}
        for i in range(3)
    ]
    eval_set = tmp_path / "eval.jsonl"
    eval_set.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    a = _run(tmp_path / "store_a", tiny_llama, eval_set)
    b = _run(tmp_path / "store_b", tiny_llama, eval_set)
    assert all(a[s].status == b[s].status == "ran" for s in STAGES)
    manifests = {s: [json.loads((Path(r[s].path) / "manifest.json").read_text()) for r in (a, b)] for s in STAGES}
    for s, (ma, mb) in manifests.items():  # same key, same content digest for every stage
        assert ma["key"] == mb["key"] and ma["output_digest"] == mb["output_digest"], s

    def archive(reps):
        (tgz,) = sorted((Path(reps["package"].path) / "release").glob("*.tar.gz"))
        return hashlib.sha256(tgz.read_bytes()).hexdigest()

    assert archive(a) == archive(b)
    # the measurements are still there for users: in each manifest
    build_m = manifests["build"][0]["measurements"]
    assert build_m["build_s"] >= 0 and "build_s" not in json.loads((Path(a["build"].path) / "build_info.json").read_text())
    qm = manifests["quantize"][0]["measurements"]
    assert set(qm["timings_s"]) >= {"load_s", "calibration_s", "total_s"} and qm["batch_size_reason"].startswith("calibration.batch_size=")
    ev = manifests["evaluate"][0]["measurements"]["runners"]
    assert set(ev) == {"baseline", "engine"} and len(ev["engine"]["latency_s_by_item"]) == 3
    assert str(tmp_path) not in (Path(a["build"].path) / "build_info.json").read_text()


def _quantize_key(*overrides: str) -> str:
    from pipeline.core.stage import get_stage

    return compute_key(get_stage("quantize"), compose(list(overrides)), {}, {})[0]


@pytest.mark.parametrize(
    ("recipe", "unused", "used"),
    [
        ("fp8", ["quant.group_size=64", "quant.smoothquant_alpha=0.8", "quant.resmooth=false"], ["quant.exclude_modules=[]"]),
        ("int4_awq", ["quant.smoothquant_alpha=0.8", "quant.auto.effective_bits=6"], ["quant.group_size=64", "quant.resmooth=false"]),
        ("int8_sq", ["quant.group_size=64"], ["quant.smoothquant_alpha=0.8"]),
        ("none", ["quant.group_size=64", "quant.resmooth=false"], ["quant.export_dtype=float32"]),
    ],
)
def test_quantize_key_takes_only_the_fields_the_recipe_reads(recipe, unused, used):
    base = _quantize_key(f"quant={recipe}")
    for o in unused:
        assert _quantize_key(f"quant={recipe}", o) == base, o
    for o in used:
        assert _quantize_key(f"quant={recipe}", o) != base, o


def test_quantize_key_of_auto_follows_its_formats():
    base = ["quant=auto", "quant.auto.formats=[int4_awq,int8_wo]"]
    assert _quantize_key(*base, "quant.group_size=64") != _quantize_key(*base)
    assert _quantize_key(*base, "quant.smoothquant_alpha=0.8") == _quantize_key(*base)
    sq = ["quant=auto", "quant.auto.formats=[int8_sq,int8_wo]"]
    assert _quantize_key(*sq, "quant.smoothquant_alpha=0.8") != _quantize_key(*sq)
