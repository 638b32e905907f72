"""Conformance of the generated TensorRT-LLM model repository with the pinned backend templates (TensorRT-LLM 1.2.1).

The upstream names are data (``pipeline/package/trtllm_backend_table.py`` ``UPSTREAM``, written from the upstream
files); every name has a disposition (set / cond / default / n/a / renamed). These tests generate real repositories
(Triton's own protobuf parses them) for several build variants and fail when an upstream parameter is neither set nor
documented, when a documented default is overridden, when a feature's parameter is missing, or when the rendered
reference page is stale. Engine files are test data (the package stage only copies them; nothing runs them here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiny

from pipeline.core.config import compose
from pipeline.core.contracts.build import BuildInfo
from pipeline.core.contracts.export import ModelInfo
from pipeline.package import trtllm_backend_table as T
from pipeline.package import trtllm_config as TC
from pipeline.package.repository import TEMPLATES, generate_repository, settings_from_build
from pipeline.package.validate import parse_config, validate_repository

ROOT = Path(__file__).resolve().parents[2]
MODEL_INFO = {"eos_token_ids": [2], "pad_token_id": 3, "bos_token_id": 1, "architecture": "LlamaForCausalLM"}
LIMITS = {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 384, "max_beam_width": 1}

RUNTIME_ALL = {
    "encoder_model_path": "/models/encoder/1/engine",
    "max_tokens_in_paged_kv_cache": 4096,
    "sink_token_length": 4,
    "cross_kv_cache_fraction": 0.5,
    "kv_cache_host_memory_bytes": 1 << 30,
    "kv_cache_onboard_blocks": True,
    "enable_trt_overlap": False,
    "cancellation_check_period_ms": 50,
    "stats_check_period_ms": 200,
    "iter_stats_max_iterations": 100,
    "request_stats_max_iterations": 10,
    "gpu_device_ids": "0,1",
    "participant_ids": "1,2",
    "num_nodes": 1,
    "lora_cache_optimal_adapter_size": 8,
    "lora_cache_max_adapter_size": 64,
    "lora_cache_gpu_memory_fraction": 0.05,
    "lora_cache_host_memory_bytes": 1 << 30,
    "lora_prefetch_dir": "/models/lora",
    "gpu_weights_percent": 1.0,
    "enable_context_fmha_fp32_acc": True,
    "multi_block_mode": False,
    "speculative_decoding_fast_logits": False,
    "guided_decoding_backend": "xgrammar",
    "xgrammar_tokenizer_info_path": "/models/xgrammar.json",
}
assert set(RUNTIME_ALL) == set(TC.RUNTIME_PASSTHROUGH)

VARIANTS = {
    # name: (package.runtime overrides, build speculative, build window, active conditions)
    "default": ({}, {"mode": "none"}, None, set()),
    "runtime": (RUNTIME_ALL, {"mode": "none"}, None, {"runtime"}),
    "window": ({}, {"mode": "none"}, 16, {"window"}),
    "medusa": ({"medusa_choices": "{0}, {0, 0}, {1}"}, {"mode": "medusa", "max_draft_len": 3}, None, {"speculative", "medusa"}),
    "eagle": ({"eagle_choices": "{0}, {0, 0}"}, {"mode": "eagle", "max_draft_len": 3}, None, {"speculative", "eagle"}),
    "lookahead": (
        {"lookahead_window_size": 4, "lookahead_ngram_size": 3, "lookahead_verification_set_size": 4},
        {"mode": "lookahead_decoding", "max_draft_len": 8},
        None,
        {"speculative", "lookahead"},
    ),
    "draft": ({}, {"mode": "draft_tokens_external", "max_draft_len": 4, "draft_model_path": "/d"}, None, {"draft"}),
}


def _repo(tmp_path: Path, runtime: dict, spec: dict, window: int | None) -> Path:
    build = tmp_path / "build"
    for d in ("engine", "draft_engine"):
        (build / d).mkdir(parents=True, exist_ok=True)
        (build / d / "config.json").write_text(json.dumps({"version": "1.2.1"}))
        (build / d / "rank0.engine").write_bytes(b"test data, not an engine")
    tok = tmp_path / "tok"
    tiny.make_tokenizer(tok)
    rt = {
        "cuda_graph_mode": True,
        "cuda_graph_cache_size": 2,
        "kv_cache_free_gpu_mem_fraction": 0.9,
        "enable_kv_cache_reuse": True,
        "batch_scheduler_policy": "guaranteed_no_evict",
        "enable_chunked_context": False,
        "speculative": spec,
    }
    if window is not None:
        rt["max_attention_window_size"] = window
    bi = {
        "target": "tensorrt_llm",
        "backend": "tensorrt",
        "limits": LIMITS,
        "runtime": rt,
        "versions": {"tensorrt_llm": "1.2.1", "tensorrt": "10.14.1.48"},
    }
    cfg = compose(
        ["target=tensorrt_llm", *[f"package.runtime.{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in runtime.items()]]
    )
    s = settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json(MODEL_INFO), cfg.package, cfg.build, cfg.target)
    repo = tmp_path / "repo"
    generate_repository(repo, s, engine_dir=build / "engine", tokenizer_dirs=[tok])
    # version pairing (engine vs serving image) is pipeline/facts/versions.py's concern, not this table's
    probs = validate_repository(
        repo,
        limits=LIMITS,
        target="tensorrt_llm",
        build_info=BuildInfo.from_json(bi),
        serving_image="nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3",
    )
    assert [p for p in probs if p.kind != "version"] == []
    return repo


def _present_params(cfg) -> set[str]:
    # the backends treat an empty value (or a leftover ${...}) as unset
    return {k for k, v in cfg.parameters.items() if v.string_value and not v.string_value.startswith("${")}


def test_table_has_an_entry_for_every_upstream_parameter_and_no_stray_entries():
    assert T.missing_entries() == []
    assert len(T.UPSTREAM["tensorrt_llm"]["parameters"]) == 46 and len(T.UPSTREAM["tensorrt_llm"]["inputs"]) == 62


def test_reference_page_is_rendered_from_the_table():
    page = ROOT / "docs" / "reference" / "tensorrt_llm_backend_parameters.md"
    assert page.read_text(encoding="utf-8") == T.render_markdown(), (
        "stale: run python -c 'from pipeline.package.trtllm_backend_table import render_markdown as r; print(r(), end=\"\")' > " + str(page)
    )
    text = page.read_text(encoding="utf-8")
    for _model, secs in T.UPSTREAM.items():
        for n in secs["parameters"]:
            assert f"`{n}`" in text


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_generated_configs_conform_to_the_table(tmp_path, variant):
    runtime, spec, window, active = VARIANTS[variant]
    repo = _repo(tmp_path, runtime, spec, window)
    checked = 0
    for model, secs in T.UPSTREAM.items():
        path = repo / model / "config.pbtxt"
        if not path.is_file():
            assert model == "tensorrt_llm_bls" and not (TEMPLATES / "tensorrt_llm_bls").is_dir(), f"{model} missing from the package"
            continue
        checked += 1
        cfg = parse_config(path)
        params = _present_params(cfg)
        for name in secs["parameters"]:
            d = T.disposition(model, "parameters", name)
            where = f"{variant}: {model} parameter {name} ({d['kind']})"
            if d["kind"] == "set":
                assert name in params, where + " is documented as set but not written"
            elif d["kind"] == "cond":
                assert (name in params) == (d["when"] in active), where + f" when={d['when']} active={sorted(active)}"
            else:
                assert name not in params, where + " overrides the documented backend default"
        if model == "tensorrt_llm":
            extra = params - set(secs["parameters"])
            assert extra <= set(T.TENSORRT_LLM_EXTRAS), f"undocumented tensorrt_llm parameters: {sorted(extra)}"
        for sec, field in (("inputs", "input"), ("outputs", "output")):
            declared = {t.name for t in getattr(cfg, field)}
            for name in secs[sec]:
                d = T.disposition(model, sec, name)
                if d["kind"] == "set":
                    assert name in declared, f"{variant}: {model} {sec[:-1]} {name} not declared"
                elif d["kind"] == "renamed":
                    assert d["ours"] in declared and name not in declared, f"{model} {name} -> {d['ours']}"
    assert checked >= 4


def test_tensorrt_llm_tensors_match_upstream_exactly(tmp_path):
    repo = _repo(tmp_path, {}, {"mode": "none"}, None)
    cfg = parse_config(repo / "tensorrt_llm" / "config.pbtxt")
    assert [t.name for t in cfg.input] == T.UPSTREAM["tensorrt_llm"]["inputs"]
    assert [t.name for t in cfg.output] == T.UPSTREAM["tensorrt_llm"]["outputs"]
    req = {t.name for t in cfg.input if not t.optional}
    assert req == {"input_lengths", "request_output_len"}  # as upstream 1.2 (input_ids optional for encoder inputs)


def test_medusa_without_choices_and_wrong_mode_settings_are_refused_naming_the_field(tmp_path):
    from pipeline.errors import InputError

    with pytest.raises(InputError, match="package.runtime.medusa_choices"):
        _repo(tmp_path / "a", {}, {"mode": "medusa", "max_draft_len": 3}, None)
    with pytest.raises(InputError, match="lookahead_window_size"):
        _repo(tmp_path / "b", {"lookahead_window_size": 4}, {"mode": "none"}, None)
    with pytest.raises(InputError, match="max_attention_window_size=999"):
        _repo(tmp_path / "c", {"max_attention_window_size": 999}, {"mode": "none"}, None)


def test_pytorch_layout_states_container_and_files_in_readme_and_serve(tmp_path, capsys):
    """The LLM-API layout names the container and NVIDIA's model.py/helpers.py it needs, in the package and in `pipeline serve`;
    model.yaml carries the triton_config block NVIDIA's model.py reads."""
    import yaml

    from pipeline.serve import serve

    ckpt = tmp_path / "ckpt"
    tiny.make_checkpoint(ckpt, "llama")
    cfg = compose(["target=tensorrt_llm_pytorch", "package.serving_image='nvcr.io/nvidia/tritonserver:26.01-trtllm-python-py3'"])
    bi = {"target": "tensorrt_llm", "backend": "pytorch", "limits": LIMITS}
    s = settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json(MODEL_INFO), cfg.package, cfg.build, cfg.target)
    repo = tmp_path / "model_repository"
    generate_repository(repo, s, engine_dir=ckpt, tokenizer_dirs=[ckpt])
    readme = (repo / "tensorrt_llm" / "README.md").read_text()
    assert "nvcr.io/nvidia/tritonserver:26.01-trtllm-python-py3" in readme
    assert "/app/all_models/llmapi/tensorrt_llm/1/model.py" in readme and "/app/all_models/llmapi/tensorrt_llm/1/helpers.py" in readme
    my = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert my["triton_config"] == {"max_batch_size": 0, "decoupled": True}  # upstream model.py: one 1-D text_input per request
    assert serve.main([str(repo), "package.serving_image='nvcr.io/nvidia/tritonserver:26.01-trtllm-python-py3'"]) == 0
    out = capsys.readouterr().out
    assert "helpers.py" in out and "model.py" in out and "cp /app/all_models/llmapi/tensorrt_llm/1/model.py" in out
    assert f"-v {repo}:/models nvcr.io/nvidia/tritonserver:26.01-trtllm-python-py3" in out


def test_pytorch_backend_maps_runtime_knobs_into_model_yaml_and_refuses_the_rest(tmp_path):
    import yaml

    from pipeline.core.targets import get_target
    from pipeline.errors import InputError

    ckpt = tmp_path / "ckpt"
    tiny.make_checkpoint(ckpt, "llama")
    over = [
        "target=tensorrt_llm_pytorch",
        "package.runtime.max_tokens_in_paged_kv_cache=4096",
        "package.runtime.kv_cache_host_memory_bytes=1073741824",
        "package.runtime.max_attention_window_size=64",
        "package.runtime.cancellation_check_period_ms=50",
        "package.runtime.guided_decoding_backend=xgrammar",
    ]
    cfg = compose(over)
    s = settings_from_build(
        BuildInfo.from_json({"target": "tensorrt_llm", "backend": "pytorch", "limits": LIMITS}),
        ModelInfo.from_json(MODEL_INFO),
        cfg.package,
        cfg.build,
        cfg.target,
    )
    repo = tmp_path / "repo"
    generate_repository(repo, s, engine_dir=ckpt, tokenizer_dirs=[ckpt])
    my = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert my["kv_cache_config"]["max_tokens"] == 4096 and my["kv_cache_config"]["host_cache_size"] == 1 << 30
    assert my["kv_cache_config"]["max_attention_window"] == [64] and my["guided_decoding_backend"] == "xgrammar"
    assert my["triton_config"]["cancellation_check_period_ms"] == 50 and my["kv_cache_config"]["enable_block_reuse"] is False
    bad = compose(["target=tensorrt_llm_pytorch", "package.runtime.multi_block_mode=false"])
    assert any(p.field == "package.runtime.multi_block_mode" for p in get_target("tensorrt_llm").check_config(bad))
    with pytest.raises(InputError, match="package.runtime.multi_block_mode"):
        settings_from_build(
            BuildInfo.from_json({"target": "tensorrt_llm", "backend": "pytorch", "limits": LIMITS}),
            ModelInfo.from_json(MODEL_INFO),
            bad.package,
            bad.build,
            bad.target,
        )
