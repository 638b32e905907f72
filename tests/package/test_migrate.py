"""``pipeline migrate <engine release>``: from an engine release of ours to the PyTorch-backend (LLM-API) package.

What is real: export and ModelOpt FP8 quantization of a tiny Llama (real CLI, real store), the package stage writing
the engine release (its repository, manifest, provenance and archive), and the migration run (real CLI: export and
quantize reused from the store, the PyTorch-backend build, evaluate with ModelOpt's simulated model, the LLM-API
package with its adapter).

What is a STAND-IN: the engine release's build artifact. TensorRT-LLM cannot run here, so its ``engine/`` holds
``config.json`` + ``rank0.engine`` test data (never loaded) and its evaluate artifact is a hand-made passed gate; only
how the release is packaged and then migrated is checked, never an engine's output.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _artifact(store: Path, stage: str):
    from pipeline.core.store import Artifact

    (d,) = [p.parent for p in (store / stage).glob("*/manifest.json")]
    m = json.loads((d / "manifest.json").read_text())
    return Artifact(stage, m.get("key", d.name), d, m)


def _engine_release(tmp: Path, ckpt: Path, store: Path, *, recipe: str = "fp8") -> Path:
    """An engine release of ours (target=tensorrt_llm) whose build artifact is a stand-in (module docstring);
    returns its package artifact folder."""
    from rich.console import Console

    from pipeline.build.targets.tensorrt_llm.runtime import runtime_knobs
    from pipeline.core.config import compose
    from pipeline.core.stage import StageContext, get_stage
    from pipeline.core.store import Artifact

    base = ["target=tensorrt_llm", "target.gpu=h100_sxm", f"quant={recipe}", f"model.path={ckpt}", "model.name=tiny"]
    cfg = compose([*base, f"store_dir={store}", "package.parity=false"])
    export, quant = _artifact(store, "export"), _artifact(store, "quantize")
    build = tmp / "engine_build"
    (build / "engine").mkdir(parents=True)
    (build / "engine" / "config.json").write_text(json.dumps({"version": "1.2.1"}))
    (build / "engine" / "rank0.engine").write_bytes(b"test data standing in for trtllm-build output, not an engine")
    bi = {
        "target": "tensorrt_llm",
        "backend": "tensorrt",
        "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 384, "max_beam_width": 1},
        "runtime": runtime_knobs(cfg),
        "versions": {"tensorrt_llm": "1.2.1", "tensorrt": "10.13.3.9"},
        "host": {"gpus": [{"name": "stand-in"}]},
    }
    (build / "build_info.json").write_text(json.dumps(bi))
    bman = {
        "output_digest": "b" * 64,
        "result": {},
        "inputs": {"quantize": {"path": str(quant.path), "digest": quant.digest, "key": quant.key}},
    }
    (build / "manifest.json").write_text(json.dumps(bman))
    ev = tmp / "engine_eval"
    ev.mkdir()
    (ev / "eval_report.json").write_text(json.dumps({"candidate": "engine"}))
    arts = {
        "export": export,
        "build": Artifact("build", "b" * 64, build, bman),
        "evaluate": Artifact("evaluate", "v" * 64, ev, {"output_digest": "v" * 64, "result": {"gate": {"passed": True, "reason": "ok"}}}),
    }
    out = tmp / "engine_package"
    out.mkdir()
    ctx = StageContext(
        cfg=cfg,
        inputs=arts,
        external={},
        out=out,
        manifest={},
        console=Console(quiet=True),
        log=logging.getLogger("t"),
        show_progress=False,
    )
    get_stage("package").run(ctx)
    (out / "manifest.json").write_text(json.dumps({"inputs": {"build": {"path": str(build), "digest": "b" * 64}}}))
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from tiny import make_checkpoint

    d = tmp_path_factory.mktemp("mig") / "ck"
    make_checkpoint(d, max_position_embeddings=1024)
    return d


def test_migrate_an_engine_release_to_the_pytorch_backend(tmp_path, ckpt):
    from pipeline.core.hostinfo import gpus

    if gpus():
        pytest.skip("this test is about a host without a GPU")
    store = tmp_path / "store"
    r = _cli(tmp_path, "target=tensorrt_llm_pytorch", "target.gpu=h100_sxm", "quant=fp8", f"model.path={ckpt}", "model.name=tiny",
             "stages=[export,quantize]", f"store_dir={store}", f"hydra.run.dir={tmp_path / 'run0'}")  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    engine = _engine_release(tmp_path, ckpt, store)
    eman = json.loads((engine / "release_manifest.json").read_text())
    assert eman["serving"]["layout"] == "inflight_batcher_llm" and eman["build"]["backend"] == "tensorrt"
    n_quant = len(list((store / "quantize").glob("*/manifest.json")))
    r = _cli(tmp_path, "migrate", str(engine), f"store_dir={store}", f"hydra.run.dir={tmp_path / 'run1'}", "package.parity=true")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(list((store / "quantize").glob("*/manifest.json"))) == n_quant  # the quantize artifact was reused
    (pkg,) = [p.parent for p in (store / "package").glob("*/release_manifest.json")]
    m = json.loads((pkg / "release_manifest.json").read_text())
    assert m["serving"]["layout"] == "llmapi" and m["build"]["backend"] == "pytorch" and m["serving"]["ensemble"] == "ensemble"
    mig = m["migration"]
    assert mig["from"]["release"] == eman["name"] and mig["from"]["layout"] == "inflight_batcher_llm"
    assert mig["from"]["archive_sha256"] and mig["from"]["engine_versions"]["tensorrt_llm"] == "1.2.1"
    assert mig["same_recipe"] and mig["same_export"] and mig["same_quantize"] is True  # same checkpoint, same recipe
    assert mig["to"]["quantize"] == _artifact(store, "quantize").digest
    cmds = mig["parity_commands"]
    assert cmds["pytorch_package"].startswith("pipeline client --parity") and "<engine release" in cmds["against_engine_answers"]
    assert m["parity"]["status"] == "not run here" and (pkg / "parity_expected.jsonl").is_file()
    assert sorted(p.name for p in (pkg / "model_repository").iterdir()) == ["ensemble", "tensorrt_llm", "tensorrt_llm_bls"]
    # the archive holds the migration record too (the manifest is part of the reproducible release)
    assert json.loads((pkg / "release" / "release_manifest.json").read_text())["migration"] == mig


def _fake_release(d: Path, build: dict, quant: dict) -> Path:
    """A minimal release folder (manifest + provenance with a config): enough for the refusals, nothing is built."""
    d.mkdir(parents=True)
    (d / "release_manifest.json").write_text(json.dumps({"name": "x-1", "build": build, "quant": quant}))
    st = {"predicate": {"buildDefinition": {"externalParameters": {"config": {"model": {"name": "x"}}}}}}
    (d / "provenance.intoto.json").write_text(json.dumps(st))
    return d


@pytest.mark.parametrize(
    "build, quant, words",
    [
        (
            {"target": "tensorrt_llm", "backend": "tensorrt"},
            {"recipe": "int8_sq"},
            ["quant=int8_sq", "#3701", "quant=fp8", "quant=int4_awq"],
        ),
        ({"target": "tensorrt_llm", "backend": "tensorrt"}, {"recipe": "fp8", "kv_cache_dtype": "int8"}, ["kv_cache_dtype=int8", "FP8 KV"]),
        ({"target": "onnxruntime_genai", "backend": None}, {"recipe": "int4_awq"}, ["nothing to migrate"]),
        ({"target": "tensorrt_llm", "backend": "pytorch"}, {"recipe": "fp8"}, ["nothing to migrate"]),
    ],
)
def test_migrate_refuses_what_the_pytorch_backend_cannot_take_with_exit_2(tmp_path, build, quant, words):
    rel = _fake_release(tmp_path / "release", build, quant)
    r = _cli(tmp_path, "migrate", str(rel), f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert all(w in r.stderr for w in words), r.stderr


def test_migrate_needs_a_release(tmp_path):
    r = _cli(tmp_path, "migrate", str(tmp_path))
    assert r.returncode == 2 and "no release_manifest.json there" in r.stderr
    r = _cli(tmp_path, "migrate")
    assert r.returncode == 2 and "needs the engine release first" in r.stderr
