"""Issue 26 part B: one LLM-API options source for several servers, structural checks against the recorded upstream
files, target=auto by TensorRT-LLM version, fail-closed option preflight.

Real here: the package's files generated from a tiny real Llama checkpoint, Triton's own protobuf parser, the real
validators. NOT real: TensorRT-LLM (none on this host). ``tensorrt_llm`` in the target=auto tests is a TEST DOUBLE (a
stand-in package whose only content is ``__version__``) and the GPU probe is injected; nothing here ran on a GPU.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import yaml

from pipeline.core.config import compose
from pipeline.core.contracts.build import BuildInfo
from pipeline.core.contracts.export import ModelInfo
from pipeline.errors import InputError
from pipeline.package import llmapi_options as O
from pipeline.package import llmapi_schema as S
from pipeline.package import option_support as OS
from pipeline.package.repository import generate_repository, settings_from_build
from pipeline.package.validate import parse_config, validate_repository

MODEL_INFO = {"eos_token_ids": [2], "pad_token_id": 3, "bos_token_id": 1, "architecture": "LlamaForCausalLM"}
LIMITS = {"max_batch_size": 16, "max_input_len": 256, "max_seq_len": 384, "max_num_tokens": 2048, "max_beam_width": 1}


def _package(tmp_path: Path, *over: str) -> tuple[Path, Path, object]:
    """An LLM-API package folder (model_repository + servers) from a tiny real checkpoint and the build stage's own
    ``llm_api_options`` for the config ``over``."""
    from tiny import make_checkpoint

    from pipeline.build.targets.tensorrt_llm.runtime import llm_api_options

    cfg = compose(["target=tensorrt_llm_pytorch", "target.gpu=h100_sxm", *over])
    eng = tmp_path / "engine"
    make_checkpoint(eng / "hf", "llama")
    (eng / O.LLM_OPTIONS_FILE).write_text(yaml.safe_dump(llm_api_options(cfg)), encoding="utf-8")
    bi = {"target": "tensorrt_llm", "backend": "pytorch", "limits": LIMITS}
    s = settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json(MODEL_INFO), cfg.package, cfg.build, cfg.target)
    pkg = tmp_path / "pkg"
    repo = pkg / "model_repository"
    generate_repository(repo, s, engine_dir=eng, tokenizer_dirs=[eng / "hf"])
    O.write_servers(pkg, repo, s, eng, bench_cfg=cfg.benchmark, trtllm_version="1.2.1")
    return pkg, repo, s


@pytest.mark.parametrize("quant", ["fp8", "int4_awq"])
def test_one_options_source_feeds_model_yaml_trtllm_serve_and_bench(tmp_path, quant):
    pkg, repo, _ = _package(tmp_path, f"quant={quant}", "quant.kv_cache_dtype=fp8" if quant == "fp8" else "quant.kv_cache_dtype=none")
    assert validate_repository(repo, limits=LIMITS, target="tensorrt_llm") == []
    assert O.check_servers(pkg) == []
    my = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text(encoding="utf-8"))
    serve = yaml.safe_load((pkg / "servers" / O.SERVE_YAML).read_text(encoding="utf-8"))
    # the same options in both files: model.yaml = triton_config + container paths + exactly the trtllm-serve YAML
    assert {k: v for k, v in my.items() if k not in ("triton_config", "model", "tokenizer")} == serve
    assert my["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert serve["max_batch_size"] == 16 and serve["backend"] == "pytorch" and serve["trust_remote_code"] is False
    assert ("dtype" in serve["kv_cache_config"]) == (quant == "fp8")
    bench = json.loads((pkg / "servers" / O.BENCH_JSON).read_text(encoding="utf-8"))
    for cmd in ("trtllm_serve", "trtllm_bench"):
        assert bench[cmd][bench[cmd].index("--extra_llm_api_options") + 1] == "servers/trtllm_serve.yaml"
    assert "--concurrency" in bench["aiperf"] and bench["aiperf"][bench["aiperf"].index("--concurrency") + 1] == "16"
    cfg = parse_config(repo / "tensorrt_llm" / "config.pbtxt")
    outs = [t.name for t in cfg.output]
    assert cfg.max_batch_size == 0 and outs[0] == "text_output" and set(outs) <= set(S.LLMAPI_OUTPUTS)  # upstream's outputs


def test_mutated_files_fail_with_the_key_and_the_upstream_file(tmp_path):
    pkg, repo, _ = _package(tmp_path, "quant=fp8")
    my_path = repo / "tensorrt_llm" / "1" / "model.yaml"
    good = yaml.safe_load(my_path.read_text(encoding="utf-8"))

    def problems_with(doc):
        my_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        return [str(p) for p in validate_repository(repo, limits=LIMITS, target="tensorrt_llm")]

    (p,) = problems_with({**good, "max_batch_sise": 4})  # unknown key (typo)
    assert "unknown key 'max_batch_sise'" in p and "llm_args.py" in p
    (p,) = problems_with({**good, "kv_cache_config": {**good["kv_cache_config"], "free_gpu_memory_fraction": "0.9"}})
    assert "'kv_cache_config.free_gpu_memory_fraction' is str" in p and "float" in p
    (p,) = problems_with({**good, "kv_cache_config": {**good["kv_cache_config"], "enable_block_reuse": 1}})
    assert "enable_block_reuse" in p and "bool" in p
    (p,) = problems_with({**good, "triton_config": {"decoupled": True, "max_batch_size": 0, "cancelation_check_period_ms": 5}})
    assert "unknown key 'triton_config.cancelation_check_period_ms'" in p and "model.py" in p
    ps = problems_with({**good, "triton_config": {"max_batch_size": 8, "decoupled": True}})
    assert any("triton_config.max_batch_size=8" in p and "1-D text_input" in p for p in ps)
    problems_with(good)
    assert validate_repository(repo, limits=LIMITS, target="tensorrt_llm") == []
    pb = repo / "tensorrt_llm" / "config.pbtxt"
    text = pb.read_text(encoding="utf-8")
    pb.write_text(text.replace('{ name: "text_input" data_type: TYPE_STRING dims: [ -1 ] },', ""), encoding="utf-8")
    ps = [str(p) for p in validate_repository(repo, limits=LIMITS, target="tensorrt_llm")]
    assert any("required input 'text_input' is missing" in p and "config.pbtxt" in p for p in ps), ps
    pb.write_text(text.replace('"sampling_param_top_k" data_type: TYPE_INT32', '"top_k" data_type: TYPE_INT32'), encoding="utf-8")
    ps = [str(p) for p in validate_repository(repo, limits=LIMITS, target="tensorrt_llm")]
    assert any("unknown input 'top_k'" in p and "helpers.py" in p for p in ps), ps
    pb.write_text(
        text.replace('"sampling_param_seed" data_type: TYPE_UINT64', '"sampling_param_seed" data_type: TYPE_INT32'), encoding="utf-8"
    )
    ps = [str(p) for p in validate_repository(repo, limits=LIMITS, target="tensorrt_llm")]
    assert any("'sampling_param_seed' is TYPE_INT32" in p for p in ps), ps
    # the trtllm-serve YAML and commands
    sy = pkg / "servers" / O.SERVE_YAML
    sy.write_text(yaml.safe_dump({**yaml.safe_load(sy.read_text(encoding="utf-8")), "enable_turbo": True}), encoding="utf-8")
    (p,) = O.check_servers(pkg)
    assert "unknown key 'enable_turbo'" in p and "trtllm_serve.yaml" in p
    bj = pkg / "servers" / O.BENCH_JSON
    doc = json.loads(bj.read_text(encoding="utf-8"))
    doc["trtllm_serve"] += ["--port", "eighty"]
    bj.write_text(json.dumps(doc), encoding="utf-8")
    assert any("'--port' value 'eighty' is not int" in p for p in O.check_servers(pkg))


@pytest.mark.parametrize(
    "over, words",
    [
        (["package.runtime.guided_decoding_backend=xgrammar"], ["guided_decoding_backend='xgrammar'", "#4855"]),
        (["build.speculative.mode=lookahead_decoding", "build.speculative.max_draft_len=4"], ["Lookahead", "supports_backend"]),
    ],
)
def test_package_refuses_options_the_pinned_trtllm_is_not_known_to_honour(tmp_path, over, words):
    with pytest.raises(InputError) as e:
        _package(tmp_path, "quant=fp8", *over)
    assert e.value.exit_code == 2 and all(w in str(e.value) for w in words), str(e.value)
    assert "Fix:" in str(e.value)


def test_unrecorded_trtllm_line_refuses_every_option():
    problems = OS.package_option_problems({"max_batch_size": 8}, "1.3.0rc5")
    assert problems and "no recorded option verdicts" in problems[0] and "max_batch_size=8" in problems[0]
    assert OS.package_option_problems({"max_batch_size": 8, "kv_cache_config": {"dtype": "fp8"}}, "1.2.1") == []
    assert "kv_cache_config.dtype='int8'" in OS.package_option_problems({"kv_cache_config": {"dtype": "int8"}}, "1.2.1")[0]


def test_client_options_are_refused_unless_known_honoured():
    OS.refuse_client_options({"temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "seed": 3, "beam_width": 1, "min_p": 0.0}, "1.2.1")
    OS.refuse_client_options({"response_format": None}, "1.2.1")  # not sent
    with pytest.raises(OS.RefusedOption, match=r"response_format=.*ignored.*#4855"):
        OS.refuse_client_options({"temperature": 0.7, "response_format": {"type": "json_object"}}, "1.2.1")
    with pytest.raises(OS.RefusedOption) as e:
        OS.refuse_client_options({"beam_width": 4, "min_p": 0.1, "made_up": 1}, "1.2.1")
    assert all(w in str(e.value) for w in ("beam_width=4", "min_p=0.1", "made_up=1", "not known to be honoured"))
    with pytest.raises(OS.RefusedOption, match="no recorded option verdicts"):
        OS.refuse_client_options({"temperature": 0.7}, "1.4.0rc1")


@pytest.fixture
def trtllm_double(tmp_path, monkeypatch):
    """TEST DOUBLE: a stand-in ``tensorrt_llm`` package on sys.path with nothing but ``__version__`` (no metadata)."""

    def make(version: str) -> None:
        d = tmp_path / f"double-{version}" / "tensorrt_llm"
        d.mkdir(parents=True)
        (d / "__init__.py").write_text(f'"""TEST DOUBLE of tensorrt_llm: only a version."""\n__version__ = "{version}"\n')
        monkeypatch.syspath_prepend(str(d.parent))
        importlib.invalidate_caches()
        monkeypatch.setattr("pipeline.core.hostinfo.installed_version", lambda dist: None)  # no wheel metadata: read the source

    return make


H100 = [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_mib": 81559.0, "driver": "x"}]


@pytest.mark.parametrize(
    "version, backend, word",
    [("1.3.0rc5", "pytorch", "no engine builder"), ("1.4.0rc1", "pytorch", "tensorrt_llm_pytorch"), ("1.2.1", "tensorrt", "engines")],
)
def test_auto_picks_the_backend_by_the_installed_trtllm_version(trtllm_double, version, backend, word):
    from pipeline.core.targets import resolve_target

    trtllm_double(version)
    cfg = compose(["target=auto"])
    name, reason = resolve_target(cfg, gpus=lambda: H100)
    assert name == "tensorrt_llm" and cfg.target.backend == backend
    assert version in reason and word in reason and "H100" in reason


def test_auto_on_a_cpu_host_keeps_the_cpu_engine(trtllm_double):
    from pipeline.core.targets import resolve_target

    trtllm_double("1.3.0rc5")
    cfg = compose(["target=auto"])
    name, reason = resolve_target(cfg, gpus=lambda: [])
    assert name == "onnxruntime_genai" and "no NVIDIA GPU is visible" in reason and cfg.target.backend == "tensorrt"
