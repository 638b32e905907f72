"""Issue 26: the TensorRT-LLM PyTorch backend as the forward path, packaged on a CPU host for a named GPU.

What runs for real here: export, ModelOpt quantization, the ModelOpt simulated-quantization evaluation, the package
stage writing the LLM-API model repository (tiny real Llama checkpoint, the real CLI). What does NOT run: TensorRT-LLM
and a GPU (this machine has neither): nothing here claims the served engine ran; the manifest says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.build.targets.tensorrt_llm import builder as trt
from pipeline.build.targets.tensorrt_llm import checks as trt_checks
from pipeline.build.targets.tensorrt_llm import versions as trt_versions
from pipeline.core.config import ConfigError, compose
from pipeline.core.config.target import DEFAULT_SERVING_IMAGE
from pipeline.facts import versions as V
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]


def _cli(tmp: Path, *over: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *over, f"store_dir={tmp / 'store'}", f"hydra.run.dir={tmp / 'run'}"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from tiny import make_checkpoint

    d = tmp_path_factory.mktemp("f26") / "ck"
    make_checkpoint(d, max_position_embeddings=1024)  # the default build limits (max_seq_len 384) must fit
    return d


@pytest.mark.parametrize("quant", ["fp8", "int4_awq"])
def test_pytorch_backend_packages_on_a_cpu_host_for_a_named_gpu(tmp_path, ckpt, quant):
    from pipeline.core.hostinfo import gpus

    if gpus():
        pytest.skip("this test is about a host without a GPU")
    # int4 on the random-weight tiny model misses the fidelity floors (mean KLD 0.062 vs 0.05, top-1 47 % vs 95 %: the
    # gate fails, exit 3), so int4_awq runs on the embedded trained default model (models/support-llama, 18 MB)
    model = [f"model.path={ckpt}"] if quant == "fp8" else []
    r = _cli(tmp_path, "target=tensorrt_llm_pytorch", "target.gpu=h100_sxm", f"quant={quant}", *model)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]  # was exit 4 at export ("tensorrt_llm ... not installed")
    (pkg,) = [p.parent for p in (tmp_path / "store" / "package").glob("*/release_manifest.json")]
    repo = pkg / "model_repository"
    # the LLM-API model plus the ensemble / tensorrt_llm_bls adapter for NVIDIA's ensemble clients (test_llmapi_adapter.py)
    assert sorted(p.name for p in repo.iterdir()) == ["ensemble", "tensorrt_llm", "tensorrt_llm_bls"]
    assert (repo / "tensorrt_llm" / "config.pbtxt").is_file()
    opts = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text(encoding="utf-8"))
    assert opts["max_batch_size"] == 16 and "kv_cache_config" in opts
    m = json.loads((pkg / "release_manifest.json").read_text(encoding="utf-8"))
    ev = m["evaluation"]
    assert ev["candidate"] == "simulated"
    # auto -> simulated is the documented CPU-host path: allowed, but said loudly (console and manifest)
    assert "not the engine this package ships" in ev["warning"] and "not the engine this package ships" in r.stdout
    assert "tensorrt_llm is not installed" in ev["candidate_note"]
    assert "target.gpu=h100_sxm" in ev["gpu_host_check"] and "simulated" in ev["gpu_host_check"]
    assert m["parity"]["command"] in ev["gpu_host_check"] and m["parity"]["status"] == "not run here"
    assert m["serving"]["layout"] == "llmapi" and m["build"]["backend"] == "pytorch" and m["serving"]["ensemble"] == "ensemble"
    rep = json.loads(next((tmp_path / "store" / "evaluate").glob("*/eval_report.json")).read_text(encoding="utf-8"))
    assert rep["candidate"] == "simulated" and rep["notes"]["candidate"].startswith("auto -> simulated")


@pytest.mark.parametrize(
    "over, field, words",
    [
        (["quant=int8_sq"], "quant.recipe", ["#3701", "quant=fp8", "quant=int4_awq", "target=tensorrt_llm "]),
        (["quant=int8_wo"], "quant.recipe", ["#3701", "quant=int4_awq", "target=tensorrt_llm "]),
        (["quant=fp8", "quant.kv_cache_dtype=int8"], "quant.kv_cache_dtype", ["fp8", "target=tensorrt_llm "]),
    ],
)
def test_recipes_the_pytorch_backend_lacks_are_refused_at_config_time(ckpt, over, field, words):
    cfg = compose(["target=tensorrt_llm_pytorch", "target.gpu=h100_sxm", f"model.path={ckpt}", *over])
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    (p,) = [p for p in e.value.problems if p.field == field]
    text = str(p)
    assert all(w in text for w in words), text
    # the engine path still takes them (one table: the PyTorch backend's refusals only)
    eng = compose(["target=tensorrt_llm", "target.gpu=h100_sxm", f"model.path={ckpt}", *over])
    assert not [p for p in validate(eng, raise_on_error=False) if p.field == field]


def test_int8_sq_on_the_pytorch_backend_exits_2_from_the_cli(tmp_path, ckpt):
    r = _cli(tmp_path, "target=tensorrt_llm_pytorch", "target.gpu=h100_sxm", "quant=int8_sq", f"model.path={ckpt}")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "quant=int4_awq" in r.stdout + r.stderr


@pytest.mark.parametrize("backend", ["tensorrt", "pytorch"])
def test_the_default_serving_image_passes_the_version_check_of_both_backends(backend):
    img = V.image_versions(DEFAULT_SERVING_IMAGE)
    assert img is not None and trt_versions.accepts_version(backend, str(img["tensorrt_llm"]))
    cfg = compose([f"target=tensorrt_llm{'_pytorch' if backend == 'pytorch' else ''}"])
    assert cfg.target.serving_image == DEFAULT_SERVING_IMAGE and trt_checks.serving_image_problems(cfg) == []


def test_the_old_default_image_and_an_unknown_tag_are_refused_with_the_table():
    old = compose(["target=tensorrt_llm", "target.serving_image=nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"])
    (p,) = trt_checks.serving_image_problems(old)
    assert "1.1.0" in str(p) and "'26.05'" in str(p)  # 25.12 ships 1.1.0: no engine of the 1.2.x path loads there
    unknown = compose(["target=tensorrt_llm_pytorch", "target.serving_image=nvcr.io/nvidia/tritonserver:99.01-trtllm-python-py3"])
    (p,) = trt_checks.serving_image_problems(unknown)
    assert p.field == "target.serving_image" and "26.05=1.2.1" in str(p) and "25.12=1.1.0" in str(p)


def test_pytorch_backend_without_a_gpu_needs_target_gpu(tmp_path):
    from pipeline.core.hostinfo import gpus
    from pipeline.errors import PreflightError

    if gpus():
        pytest.skip("this test is about a host without a GPU")
    with pytest.raises(PreflightError, match="target.gpu=h100_sxm"):
        trt.TARGET.preflight(compose(["target=tensorrt_llm_pytorch", "quant=fp8"]), tmp_path)
    with pytest.raises(PreflightError, match="tensorrt_llm package is not installed"):  # the engine path still needs it
        trt.TARGET.preflight(compose(["target=tensorrt_llm", "target.gpu=h100_sxm", "quant=fp8"]), tmp_path)
    cfg = compose(["target=tensorrt_llm_pytorch", "target.gpu=a100_80gb", "quant=fp8"])  # SM 8.0: no FP8
    with pytest.raises(PreflightError, match="compute capability 8.0"):
        trt.TARGET.preflight(cfg, tmp_path)
