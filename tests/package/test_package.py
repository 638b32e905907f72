"""Package stage: repository generation from the templates, validation, release files, safe extraction.

No server here (tests/serve/test_serving.py starts the real one). One real onnxruntime-genai engine is built from a tiny
checkpoint for the whole module (about 20 s on a 2-core box).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.core.contracts.build import BuildInfo
from pipeline.core.contracts.export import ModelInfo
from pipeline.errors import GateFailed, InputError, PreflightError
from pipeline.facts import versions as V
from pipeline.package.repository import MODEL_HELPERS, Settings, generate_repository, settings_from_build
from pipeline.package.validate import check_repository, ensemble_interface, parse_config, sibling_problems, validate_repository
from pipeline.release.archive import make_archive, safe_extract, write_sha256sums

# TensorRT-LLM in-flight-batcher ensemble interface: docs/reference/triton.md §2 (tensorrtllm_backend v0.19.0 templates),
# name -> (data type, dims without the batch dim, optional)
EXPECTED_INPUTS = {
    "text_input": ("TYPE_STRING", [1], False),
    "decoder_text_input": ("TYPE_STRING", [1], True),
    "max_tokens": ("TYPE_INT32", [1], False),
    **{
        n: ("TYPE_INT32", [1], True)
        for n in ("num_return_sequences", "end_id", "pad_id", "top_k", "min_length", "beam_width", "prompt_vocab_size")
    },
    **{n: ("TYPE_STRING", [-1], True) for n in ("bad_words", "stop_words", "embedding_bias_words")},
    **{
        n: ("TYPE_BOOL", [1], True)
        for n in (
            "exclude_input_in_output",
            "return_log_probs",
            "return_context_logits",
            "return_generation_logits",
            "return_perf_metrics",
            "stream",
        )
    },
    **{
        n: ("TYPE_FP32", [1], True)
        for n in ("top_p", "temperature", "length_penalty", "repetition_penalty", "presence_penalty", "frequency_penalty")
    },
    **{n: ("TYPE_UINT64", [1], True) for n in ("random_seed", "prompt_table_extra_id", "lora_task_id")},
    "prompt_embedding_table": ("TYPE_FP16", [-1, -1], True),
    "embedding_bias_weights": ("TYPE_FP32", [-1], True),
    "lora_weights": ("TYPE_FP16", [-1, -1], True),
    "lora_config": ("TYPE_INT32", [-1, 3], True),
    "guided_decoding_guide_type": ("TYPE_STRING", [1], True),
    "guided_decoding_guide": ("TYPE_STRING", [1], True),
}
EXPECTED_OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1], False),
    "cum_log_probs": ("TYPE_FP32", [-1], False),
    "output_log_probs": ("TYPE_FP32", [-1, -1], False),
    "context_logits": ("TYPE_FP32", [-1, -1], False),
    "generation_logits": ("TYPE_FP32", [-1, -1, -1], False),
    **{
        n: ("TYPE_INT32", [1], False)
        for n in (
            "batch_index",
            "sequence_index",
            "kv_cache_alloc_new_blocks",
            "kv_cache_reused_blocks",
            "kv_cache_alloc_total_blocks",
            "total_accepted_draft_tokens",
            "total_draft_tokens",
        )
    },
    **{n: ("TYPE_INT64", [1], False) for n in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")},
    "acceptance_rate": ("TYPE_FP32", [1], False),
}
MODEL_INFO = {"eos_token_ids": [2], "pad_token_id": 3, "bos_token_id": 1, "architecture": "LlamaForCausalLM"}


def pkg_cfg(**kw):
    base = dict(
        name="default",
        version="1",
        max_batch_size=None,
        max_input_len=None,
        max_beam_width=None,
        decoupled=True,
        exclude_input_in_output=True,
        instance_count=1,
        allow_failed_gate=False,
        archive=True,
        serving_image=None,
    )
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.fixture(scope="module")
def ort_build(tmp_path_factory, tiny_llama):
    """A real onnxruntime-genai engine (fp32, CPU) of the tiny Llama + its build_info.json."""
    out = tmp_path_factory.mktemp("ort_build")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(tiny_llama),
            "-o",
            str(out / "engine"),
            "-p",
            "fp32",
            "-e",
            "cpu",
            "-c",
            str(out / "cache"),
        ],
        check=True,
        capture_output=True,
    )
    bi = {
        "target": "onnxruntime_genai",
        "execution_provider": "cpu",
        "limits": {"max_batch_size": 4, "max_input_len": 96, "max_seq_len": 192},
        "versions": {"onnxruntime-genai": "0.18.0"},
    }
    (out / "build_info.json").write_text(json.dumps(bi))
    return out


def make_repo(dst: Path, ort_build: Path, tiny_llama: Path, **pkg) -> tuple[Path, Settings]:
    bi = json.loads((ort_build / "build_info.json").read_text())
    s = settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json(MODEL_INFO), pkg_cfg(**pkg))
    repo = dst / "model_repository"
    generate_repository(repo, s, engine_dir=ort_build / "engine", tokenizer_dirs=[tiny_llama])
    return repo, s


def ort_limits(ort_build: Path) -> dict:
    return json.loads((ort_build / "build_info.json").read_text())["limits"]


# --------------------------------------------------------------------------- repository + interface
def test_ort_repository_parses_validates_and_matches_trtllm_ensemble_interface(tmp_path, ort_build, tiny_llama):
    repo, s = make_repo(tmp_path, ort_build, tiny_llama)
    assert sorted(p.name for p in repo.iterdir()) == [
        "ensemble",
        "onnxruntime_genai",
        "postprocessing",
        "preprocessing",
        "tensorrt_llm_bls",
    ]
    assert validate_repository(repo, limits=ort_limits(ort_build), target="onnxruntime_genai") == []
    iface = ensemble_interface(repo)
    # plus the documented extension input (trtllm_backend_table.EXTENSION_INPUTS): server-side chat rendering
    assert iface["inputs"] == {**EXPECTED_INPUTS, "messages": ("TYPE_STRING", [1], True)}
    # plus our sequence_length (generated ids per response; OpenAI usage counts them): triton_models/ensemble/config.pbtxt
    assert iface["outputs"] == {**EXPECTED_OUTPUTS, "sequence_length": ("TYPE_INT32", [-1], False)}
    eng = parse_config(repo / "onnxruntime_genai" / "config.pbtxt")
    assert eng.backend == "python" and eng.model_transaction_policy.decoupled is True
    assert eng.max_batch_size == 4 and eng.parameters["max_input_len"].string_value == "96"
    assert (repo / "onnxruntime_genai" / "1" / "engine" / "genai_config.json").is_file()
    assert (repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json").is_file()
    # CPU target: `ensemble` and `tensorrt_llm_bls` are Python models with the ensemble's interface (docs/package.md)
    for name in ("ensemble", "tensorrt_llm_bls"):
        cfg = parse_config(repo / name / "config.pbtxt")
        assert cfg.backend == "python" and not cfg.HasField("ensemble_scheduling") and cfg.model_transaction_policy.decoupled
        assert (repo / name / "1" / "model.py").is_file() and (repo / name / "1" / "tokenization.py").is_file()
    for name in ("ensemble", "tensorrt_llm_bls", "onnxruntime_genai"):  # the served model's sibling modules (one list)
        assert all((repo / name / "1" / f).is_file() for f in MODEL_HELPERS), name
    (repo / "ensemble" / "1" / "genai_sending.py").unlink()  # a missing sibling is a validation problem
    assert [p.where for p in sibling_problems(repo)] == ["ensemble/1/model.py"]
    for name in ("ensemble", "tensorrt_llm_bls", "onnxruntime_genai"):  # package.stream_* reach every engine-running model
        params = parse_config(repo / name / "config.pbtxt").parameters
        assert (params["stream_interval"].string_value, params["stream_coalescing"].string_value) == ("1", "true"), name


def test_trtllm_repository_fills_every_parameter_from_the_build(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    # the validation only checks these files exist; a real TensorRT-LLM engine cannot be built on this machine
    (engine / "config.json").write_text(json.dumps({"version": "1.1.0"}))
    (engine / "rank0.engine").write_bytes(b"\0")
    tok = tmp_path / "tok"
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import tiny

    tiny.make_tokenizer(tok)
    bi = {
        "target": "tensorrt_llm",
        "backend": "tensorrt",
        "limits": {"max_batch_size": 64, "max_input_len": 2048, "max_seq_len": 4096, "max_beam_width": 2},
        "knobs": {
            "kv_cache_free_gpu_mem_fraction": 0.85,
            "enable_kv_cache_reuse": True,
            "batch_scheduler_policy": "max_utilization",
            "cuda_graph_mode": True,
            "cuda_graph_cache_size": 4,
        },
        "versions": {"tensorrt_llm": "1.1.0", "tensorrt": "10.13.3.9"},
    }
    s = settings_from_build(
        BuildInfo.from_json(bi), ModelInfo.from_json(MODEL_INFO), pkg_cfg(max_batch_size=32, exclude_input_in_output=False)
    )
    repo = tmp_path / "repo"
    info = generate_repository(repo, s, engine_dir=engine, tokenizer_dirs=[tok])
    assert info["models"] == ["ensemble", "postprocessing", "preprocessing", "tensorrt_llm", "tensorrt_llm_bls"]
    image = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert (
        validate_repository(repo, limits=bi["limits"], target="tensorrt_llm", build_info=BuildInfo.from_json(bi), serving_image=image) == []
    )
    t = parse_config(repo / "tensorrt_llm" / "config.pbtxt")
    p = {k: v.string_value for k, v in t.parameters.items()}
    assert t.backend == "tensorrtllm" and t.max_batch_size == 32 and t.model_transaction_policy.decoupled
    assert p["gpt_model_type"] == "inflight_fused_batching" and p["gpt_model_path"] == "/models/tensorrt_llm/1/engine"
    assert (p["max_beam_width"], p["kv_cache_free_gpu_mem_fraction"], p["enable_kv_cache_reuse"]) == ("2", "0.85", "true")
    assert (p["batch_scheduler_policy"], p["cuda_graph_mode"], p["cuda_graph_cache_size"]) == ("max_utilization", "true", "4")
    assert p["exclude_input_in_output"] == "false" and p["tokenizer_dir"] == "/models/preprocessing/1/tokenizer"
    assert ensemble_interface(repo)["inputs"] == EXPECTED_INPUTS
    # the engine was built with 1.1.0; a 25.09 image ships 1.0.0 -> refused, both versions named
    probs = validate_repository(
        repo,
        limits=bi["limits"],
        target="tensorrt_llm",
        build_info=BuildInfo.from_json(bi),
        serving_image="nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3",
    )
    assert len(probs) >= 1 and "1.1.0" in str(probs[0]) and "1.0.0" in str(probs[0])
    with pytest.raises(PreflightError, match="TensorRT-LLM 1.1.0"):
        check_repository(
            repo,
            limits=bi["limits"],
            target="tensorrt_llm",
            build_info=BuildInfo.from_json(bi),
            serving_image="nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3",
        )
    assert "not a known" in str(
        validate_repository(
            repo,
            limits=bi["limits"],
            target="tensorrt_llm",
            build_info=BuildInfo.from_json(bi),
            serving_image="nvcr.io/nvidia/tritonserver:25.03-trtllm-python-py3",
        )[0]
    )
    # without versions in build_info, the engine's own config.json "version" is compared
    no_vers = {k: v for k, v in bi.items() if k != "versions"}
    probs = validate_repository(
        repo,
        limits=bi["limits"],
        target="tensorrt_llm",
        build_info=BuildInfo.from_json(no_vers),
        serving_image="nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3",
    )
    assert any("TensorRT-LLM 1.1.0" in str(p) for p in probs)


def test_serve_prints_the_ngc_container_command_for_trtllm(tmp_path, capsys):
    from pipeline.serve import serve

    repo = tmp_path / "model_repository"
    (repo / "tensorrt_llm" / "1" / "engine").mkdir(parents=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\nbackend: "tensorrtllm"\n')
    for r in range(2):
        (repo / "tensorrt_llm" / "1" / "engine" / f"rank{r}.engine").write_bytes(b"\0")
    image = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert serve.main([str(tmp_path), f"package.serving_image='{image}'", "package.grpc_port=9001"]) == 0
    out = capsys.readouterr().out
    assert "docker run --rm -it --gpus all --shm-size=2g" in out and f"-v {repo}:/models {image}" in out
    assert "launch_triton_server.py --world_size=2 --model_repo=/models --grpc_port=9001" in out


def test_pytorch_backend_gets_llmapi_layout(tmp_path, tiny_llama):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_llama, ckpt)
    bi = {"target": "tensorrt_llm", "backend": "pytorch", "limits": {"max_batch_size": 16, "max_input_len": 512, "max_seq_len": 1024}}
    s = settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json(MODEL_INFO), pkg_cfg())
    repo = tmp_path / "repo"
    assert generate_repository(repo, s, engine_dir=ckpt, tokenizer_dirs=[tiny_llama])["layout"] == "llmapi"
    text = (repo / "tensorrt_llm" / "1" / "model.yaml").read_text()
    assert "max_batch_size: 16" in text and "max_seq_len: 1024" in text and "${" not in text
    assert (repo / "tensorrt_llm" / "1" / "checkpoint" / "config.json").is_file()
    assert validate_repository(repo, limits=bi["limits"], target="tensorrt_llm") == []
    # with the build's llm_api_options.yaml (engine/ = options + hf/), its LLM() options win
    import yaml

    eng = tmp_path / "engine"
    shutil.copytree(tiny_llama, eng / "hf")
    (eng / "llm_api_options.yaml").write_text(yaml.safe_dump({"max_batch_size": 8, "kv_cache_config": {"free_gpu_memory_fraction": 0.5}}))
    repo2 = tmp_path / "repo2"
    generate_repository(repo2, s, engine_dir=eng, tokenizer_dirs=[tiny_llama])
    opts = yaml.safe_load((repo2 / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert opts["max_batch_size"] == 8 and opts["kv_cache_config"] == {"free_gpu_memory_fraction": 0.5}
    assert opts["model"] == "/models/tensorrt_llm/1/checkpoint" and opts["tokenizer"] == "/models/tensorrt_llm/1/tokenizer"
    assert (repo2 / "tensorrt_llm" / "1" / "checkpoint" / "config.json").is_file()
    assert parse_config(repo / "tensorrt_llm" / "config.pbtxt").model_transaction_policy.decoupled


def test_versions_table_and_comparison():
    assert V.image_versions("nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3")["tensorrt_llm"] == "1.1.0"
    assert V.image_versions("nvcr.io/nvidia/tritonserver:25.12-py3") is None
    assert V.same_version("1.1", "1.1.0") and not V.same_version("1.1.0", "1.0.0")
    assert V.same_prefix("10.0.1", "10.0.1.6") and not V.same_prefix("10.0.1", "10.1.0")
    assert V.images_for("0.20.0") == ["25.06", "25.07"]


# --------------------------------------------------------------------------- validation catches
def test_validation_names_placeholder_file_and_line(tmp_path, ort_build, tiny_llama):
    repo, _ = make_repo(tmp_path, ort_build, tiny_llama)
    cfgp = repo / "preprocessing" / "config.pbtxt"
    lines = cfgp.read_text().splitlines()
    lines.append('parameters { key: "x" value: { string_value: "${forgotten_key}" } }')
    cfgp.write_text("\n".join(lines) + "\n")
    probs = validate_repository(repo, limits=ort_limits(ort_build), target="onnxruntime_genai")
    assert any(p.where == f"preprocessing/config.pbtxt:{len(lines)}" and "${forgotten_key}" in p.message for p in probs)
    # a structural placeholder also breaks parsing, with Triton's own parser's line:column
    cfgp.write_text(cfgp.read_text().replace("max_batch_size: 4", "max_batch_size: ${triton_max_batch_size}"))
    probs = validate_repository(repo, limits=ort_limits(ort_build), target="onnxruntime_genai")
    assert any("does not parse as a Triton ModelConfig" in p.message for p in probs)
    with pytest.raises(InputError, match="failed validation"):
        check_repository(repo, limits=ort_limits(ort_build), target="onnxruntime_genai")


def test_user_limits_above_engine_are_errors_naming_both_numbers(tmp_path, ort_build, tiny_llama):
    repo, _ = make_repo(tmp_path, ort_build, tiny_llama, max_batch_size=8, max_input_len=500)
    msgs = [str(p) for p in validate_repository(repo, limits=ort_limits(ort_build), target="onnxruntime_genai")]
    assert any("max_batch_size 8 exceeds the engine's max_batch_size 4" in m for m in msgs)
    assert any("max_input_len 500 exceeds the engine's max_input_len 96" in m for m in msgs)


def test_validation_catches_broken_ensemble_decoupled_and_tokenizer(tmp_path, ort_build, tiny_llama):
    repo, _ = make_repo(tmp_path, ort_build, tiny_llama)
    lim = ort_limits(ort_build)
    eng = repo / "onnxruntime_genai" / "config.pbtxt"
    eng.write_text(eng.read_text().replace("decoupled: true", "decoupled: false"))
    (repo / "postprocessing" / "1" / "tokenizer" / "tokenizer.json").unlink()
    ens = repo / "ensemble" / "config.pbtxt"  # CPU target: a Python model with the ensemble's interface
    ens.write_text(ens.read_text().replace('name: "text_output"', 'name: "text_out"'))
    msgs = "\n".join(str(p) for p in validate_repository(repo, limits=lim, target="onnxruntime_genai", streaming=True))
    assert "decoupled differs between models" in msgs
    assert "tokenizer.json is missing" in msgs
    assert "output 'text_output' is missing" in msgs
    # the ensemble graph checks (TensorRT-LLM target's three-step ensemble)
    from pipeline.package.repository import TEMPLATES, Settings, fill, template_values

    trt = tmp_path / "trt"
    (trt / "ensemble").mkdir(parents=True)
    for m in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm"):
        (trt / m / "1").mkdir(parents=True, exist_ok=True)
        text = fill((TEMPLATES / m / "config.pbtxt").read_text(), template_values(Settings(target="tensorrt_llm")))
        if m == "preprocessing":
            text = text.replace(
                '{ name: "REQUEST_OUTPUT_LEN" data_type: TYPE_INT32 dims: [ 1 ] }',
                '{ name: "REQUEST_OUTPUT_LEN" data_type: TYPE_FP32 dims: [ 1 ] }',
            )
        if m == "ensemble":
            text = text.replace('output_map { key: "OUTPUT" value: "text_output" }', "")
        (trt / m / "config.pbtxt").write_text(text)
    msgs = "\n".join(str(p) for p in validate_repository(trt, limits=lim, target="tensorrt_llm", streaming=True))
    assert "'max_tokens' is TYPE_INT32 but preprocessing.REQUEST_OUTPUT_LEN expects TYPE_FP32" in msgs
    assert "ensemble output 'text_output' is produced by no step" in msgs


# --------------------------------------------------------------------------- release files
def test_archive_is_reproducible_and_sums_verify(tmp_path, ort_build, tiny_llama):
    repo, _ = make_repo(tmp_path, ort_build, tiny_llama)
    a1 = make_archive(tmp_path / "r1" / "m-1.tar.gz", [(repo, "m-1/model_repository")])
    # same inputs, different file mtimes and a fresh copy -> the same bytes
    copy = tmp_path / "copy" / "model_repository"
    shutil.copytree(repo, copy)
    for p in copy.rglob("*"):
        p.touch()
    a2 = make_archive(tmp_path / "r2" / "m-1.tar.gz", [(copy, "m-1/model_repository")])
    assert a1 == a2
    sums = write_sha256sums(tmp_path / "r1" / "SHA256SUMS", [tmp_path / "r1" / "m-1.tar.gz"])
    assert sums == {"m-1.tar.gz": a1}
    subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "r1", check=True, capture_output=True)
    with tarfile.open(tmp_path / "r1" / "m-1.tar.gz") as t:
        names = t.getnames()
        assert names == sorted(names)
        assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in t.getmembers())
    out = tmp_path / "unpacked"
    safe_extract(tmp_path / "r1" / "m-1.tar.gz", out)
    assert (out / "m-1" / "model_repository" / "ensemble" / "config.pbtxt").read_bytes() == (
        repo / "ensemble" / "config.pbtxt"
    ).read_bytes()


def _tar(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for m in members:
            data = b"pwned" if m.isfile() else None
            if data is not None:
                m.size = len(data)
            t.addfile(m, io.BytesIO(data) if data is not None else None)
    return path


def _ti(name: str, type_=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = type_, link
    return ti


@pytest.mark.parametrize(
    "members,match",
    [
        ([_ti("/tmp/evil_abs.txt")], "absolute path"),
        ([_ti("ok/../../evil_dotdot.txt")], r"contains '\.\.'"),
        ([_ti("link", tarfile.SYMTYPE, "/etc/passwd")], "symbolic link"),
        ([_ti("d/link", tarfile.SYMTYPE, "../../outside")], "symbolic link"),
        ([_ti("hard", tarfile.LNKTYPE, "../outside.txt")], "hard link"),
        ([_ti("dev", tarfile.CHRTYPE)], "device"),
        ([_ti("fifo", tarfile.FIFOTYPE)], "device/FIFO"),
    ],
)
def test_safe_extract_rejects_malicious_archives(tmp_path, members, match):
    arch = _tar(tmp_path / "evil.tar.gz", [_ti("good.txt")] + members)
    dest = tmp_path / "dest"
    with pytest.raises(InputError, match=match):
        safe_extract(arch, dest)
    assert not (dest / "good.txt").exists()  # every member is checked before anything is written
    assert not (tmp_path / "outside").exists() and not (tmp_path / "outside.txt").exists()


def test_safe_extract_keeps_links_inside(tmp_path):
    arch = _tar(tmp_path / "ok.tar.gz", [_ti("a/file.txt"), _ti("a/link", tarfile.SYMTYPE, "file.txt")])
    names = safe_extract(arch, tmp_path / "dest")
    assert names == ["a/file.txt", "a/link"] and (tmp_path / "dest" / "a" / "file.txt").read_bytes() == b"pwned"


# --------------------------------------------------------------------------- stable streaming deltas (postprocessing)
def test_stream_deltas_concatenate_to_full_text_with_chinese(tiny_llama):
    # the served models stream with TextCodec.stream_decoder (pipeline/core/tokenization.py, copied next to them)
    from pipeline.core.tokenization import TextCodec

    codec = TextCodec.from_dir(tiny_llama)
    text = "我的订单 ORD-55555 什么时候到？ refund 129.50 dollars"
    ids = codec.encode_text(text)
    assert len(ids) > len(text.split())  # byte-level BPE: Chinese characters span several tokens
    dec = codec.stream_decoder()
    deltas = [dec.push([i]) for i in ids] + [dec.flush()]
    assert "".join(deltas) == codec.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)  # a character is emitted only once all its bytes arrived
    # decoding single tokens independently (the upstream postprocessing behaviour) breaks the characters
    assert "".join(codec.decode([i]) for i in ids) != text
    # a sequence cut inside a character: the flush carries the replacement char, like the non-streamed text
    cut = ids[:2]
    dec = codec.stream_decoder()
    assert "".join([dec.push([i]) for i in cut] + [dec.flush()]) == codec.decode(cut)


# --------------------------------------------------------------------------- the stage
def _ctx(tmp_path, ort_build, tiny_llama, gate, **pkg):
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.core.stage import StageContext
    from pipeline.core.store import Artifact

    pkg.setdefault("parity", "false")  # this hand-made evaluate artifact has no answers to replay (tests/package/test_parity.py)
    cfg = compose(["stages=[package]", "quant=none", "model.name=tiny"] + [f"package.{k}={v}" for k, v in pkg.items()])
    exp = tmp_path / "export"
    shutil.copytree(tiny_llama, exp / "hf")
    (exp / "model_info.json").write_text(json.dumps(MODEL_INFO))
    arts = {
        "export": Artifact("export", "e" * 64, exp, {"output_digest": "e" * 64, "result": {}}),
        "build": Artifact("build", "b" * 64, ort_build, {"output_digest": "b" * 64, "result": {}}),
        "evaluate": Artifact(
            "evaluate", "v" * 64, tmp_path, {"output_digest": "v" * 64, "result": {"gate": gate, "headline": {"score": 0.5}}}
        ),
    }
    out = tmp_path / "out"
    out.mkdir()
    return StageContext(
        cfg=cfg,
        inputs=arts,
        external={},
        out=out,
        manifest={},
        console=Console(quiet=True),
        log=logging.getLogger("test"),
        show_progress=False,
    )


def test_stage_refuses_failed_gate_and_records_override(tmp_path, ort_build, tiny_llama):
    from pipeline.core.stage import get_stage

    stage = get_stage("package")
    assert stage.deps == ("export", "build", "evaluate")
    failed = {"passed": False, "reason": "score drop 0.12 > 0.05"}
    with pytest.raises(GateFailed, match="score drop 0.12 > 0.05"):
        stage.run(_ctx(tmp_path / "a", ort_build, tiny_llama, failed))
    ctx = _ctx(tmp_path / "b", ort_build, tiny_llama, failed, allow_failed_gate="true")
    res = stage.run(ctx)
    man = json.loads((ctx.out / "release_manifest.json").read_text())
    assert res.gate_override is True and man["evaluation"]["gate"]["override"] is True
    assert man["evaluation"]["gate"]["reason"] == "score drop 0.12 > 0.05"
    assert man["build"]["target"] == "onnxruntime_genai" and man["quant"]["recipe"] == "none"
    assert set(man["sources"]) >= {"export", "build", "evaluate", "engine", "model_repository"}
    rel = ctx.out / "release"
    assert sorted(p.name for p in rel.iterdir()) == [
        "SHA256SUMS",
        "provenance.intoto.json",
        "release_manifest.json",
        "sbom.cdx.json",
        "tiny-none-1.tar.gz",
    ]
    assert hashlib.sha256((rel / "tiny-none-1.tar.gz").read_bytes()).hexdigest() == res.archive_sha256
    # same inputs -> same archive bytes
    ctx2 = _ctx(tmp_path / "c", ort_build, tiny_llama, failed, allow_failed_gate="true")
    ctx2.inputs = ctx.inputs
    assert stage.run(ctx2).archive_sha256 == res.archive_sha256


@pytest.mark.parametrize(
    "name,want",
    [("tiny", "tiny-none-1"), ("a/b", "a-b-none-1"), ("模型", None), ("-x", "x-none-1"), (".hidden", "hidden-none-1")],
)
def test_release_names_are_safe_file_names(name, want):
    """Never a leading '-' or '.' (tar would read an option); a name of no ASCII letter gets a digest, so two such
    names do not share an archive (fresh-user trial: '模型' gave release/--1.tar.gz)."""
    from pipeline.core.config import compose
    from pipeline.package.release import release_name

    got = release_name(compose([f"model.name='{name}'", "quant=none"]))
    if want is None:
        assert got.startswith("model-") and got.endswith("-none-1") and got != release_name(compose(["model.name='其他'", "quant=none"]))
    else:
        assert got == want
    assert not got.startswith(("-", "."))


def test_two_recipes_of_one_model_never_share_an_archive_name():
    """Fresh-user trial: three different archives of model ``tq`` were all ``tq-1.tar.gz``; a release pipeline that
    uploads them to one place would overwrite one with another."""
    from pipeline.core.config import compose
    from pipeline.package.release import release_name

    names = {
        release_name(compose(["model.name=tq", *o])) for o in ([f"quant={r}"] for r in ("none", "int8_wo", "int4_awq", "fp8", "int8_sq"))
    } | {release_name(compose(["model.name=tq", "quant=int8_sq", "quant.kv_cache_dtype=int8"]))}
    assert len(names) == 6 and "tq-int8_sq-kvint8-1" in names and "tq-int4_awq-1" in names, names
