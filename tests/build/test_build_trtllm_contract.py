"""Build stage, tensorrt_llm target: contract tests against the reference facts (docs/reference/tensorrt_llm.md and the upstream files it names).

TensorRT-LLM cannot be installed here, so these tests check every generated ``trtllm-build`` argument and
``BuildConfig`` field against the documented flags/choices/rules, what happens when the package or the binary
is missing (PreflightError, exit code 4, the fix and the exact command), and the orchestration around the
binary.  For orchestration only, a test double stands in for ``trtllm-build`` (a tiny script on PATH that
records its arguments); what it writes is test data, never reported as a built engine.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.build.targets.tensorrt_llm import engine, runtime, versions
from pipeline.core.config import ConfigError, compose
from pipeline.core.contracts.build import BuildInfo
from pipeline.core.contracts.export import ModelInfo
from pipeline.core.targets import get_target
from pipeline.errors import EXIT_PREFLIGHT, PipelineError, PreflightError
from pipeline.validation import validate

# Reference facts (sec. 1a/1b: flags; sec. 4c: BuildConfig fields; sec. 4d: KvCacheConfig fields)
REF_FLAGS = {
    "--checkpoint_dir",
    "--model_config",
    "--build_config",
    "--output_dir",
    "--max_batch_size",
    "--max_input_len",
    "--max_seq_len",
    "--max_beam_width",
    "--max_num_tokens",
    "--opt_num_tokens",
    "--kv_cache_type",
    "--input_timing_cache",
    "--output_timing_cache",
    "--profiling_verbosity",
    "--strip_plan",
    "--workers",
    "--log_level",
    "--logits_dtype",
    "--speculative_decoding_mode",
    "--max_draft_len",
    "--gpt_attention_plugin",
    "--gemm_plugin",
    "--context_fmha",
    "--remove_input_padding",
    "--tokens_per_block",
    "--use_paged_context_fmha",
    "--use_fused_mlp",
    "--multiple_profiles",
    "--gather_context_logits",
}
REF_CHOICES = {
    "--kv_cache_type": {"continuous", "paged", "disabled"},
    "--gpt_attention_plugin": {"auto", "float16", "float32", "bfloat16", "int32", "disable"},
    "--gemm_plugin": {"auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"},
    "--context_fmha": {"enable", "disable"},
    "--remove_input_padding": {"enable", "disable"},
    "--use_paged_context_fmha": {"enable", "disable"},
    "--use_fused_mlp": {"enable", "disable"},
    "--multiple_profiles": {"enable", "disable"},
    "--speculative_decoding_mode": {"draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"},
    "--logits_dtype": {"float16", "float32"},
    "--log_level": {"internal_error", "error", "warning", "info", "verbose", "debug", "trace"},
}
REF_BUILD_CONFIG_FIELDS = {
    "max_input_len",
    "max_seq_len",
    "opt_batch_size",
    "max_batch_size",
    "max_beam_width",
    "max_num_tokens",
    "opt_num_tokens",
    "max_prompt_embedding_table_size",
    "kv_cache_type",
    "gather_context_logits",
    "gather_generation_logits",
    "strongly_typed",
    "force_num_profiles",
    "profiling_verbosity",
    "enable_debug_output",
    "max_draft_len",
    "speculative_decoding_mode",
    "use_refit",
    "input_timing_cache",
    "output_timing_cache",
    "lora_config",
    "weight_sparsity",
    "weight_streaming",
    "plugin_config",
    "use_strip_plan",
    "max_encoder_input_len",
    "dry_run",
    "visualize_network",
    "monitor_memory",
    "use_mrope",
    "logits_dtype",
}
REF_PLUGIN_FIELDS = {
    "gpt_attention_plugin",
    "gemm_plugin",
    "remove_input_padding",
    "context_fmha",
    "paged_kv_cache",
    "tokens_per_block",
    "use_paged_context_fmha",
    "use_fused_mlp",
    "multiple_profiles",
}
REF_KV_CACHE_CONFIG = {
    "enable_block_reuse",
    "max_tokens",
    "max_attention_window",
    "sink_token_length",
    "free_gpu_memory_fraction",
    "host_cache_size",
    "onboard_blocks",
    "enable_partial_reuse",
    "dtype",
    "tokens_per_block",
}
REF_LLM_ARGS = {
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "max_input_len",
    "max_beam_width",
    "enable_chunked_prefill",
    "cuda_graph_config",
    "kv_cache_config",
    "scheduler_config",
    "speculative_config",
}

PRESETS = ["latency", "throughput", "long_context", "cpu_default"]


def _cfg(*over: str):
    return compose(["target=tensorrt_llm", *over])


STORE_TRUE = {"--gather_context_logits"}  # documented bare flags (sec. 1a)


def _pairs(args: list[str]) -> dict[str, str]:
    args = [a for a in args if a not in STORE_TRUE]
    assert len(args) % 2 == 0, args  # every other flag takes a value in our command
    return dict(zip(args[::2], args[1::2]))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("quant", ["none", "int4_awq", "fp8"])
def test_every_generated_flag_is_a_documented_flag_with_a_valid_value(preset, quant, tmp_path):
    cfg = _cfg(f"build={preset}", f"quant={quant}", f"build.timing_cache={tmp_path / 't.cache'}")
    args = engine.build_args(cfg, tmp_path / "ckpt", tmp_path / "out", tmp_path / "t.cache")
    kv = _pairs(args)
    assert set(kv) <= REF_FLAGS, set(kv) - REF_FLAGS
    for flag, val in kv.items():
        assert flag.startswith("--")
        if flag in REF_CHOICES:
            assert val in REF_CHOICES[flag], (flag, val)
        if flag in engine.INT_FLAGS:
            assert int(val) >= 1, (flag, val)
    # in-flight batching needs these, always on (sec. 1b, 7)
    assert kv["--kv_cache_type"] == "paged" and kv["--remove_input_padding"] == "enable"
    assert kv["--gpt_attention_plugin"] != "disable" and kv["--context_fmha"] == "enable"
    t = int(kv["--tokens_per_block"])
    assert t & (t - 1) == 0
    assert kv["--input_timing_cache"] == kv["--output_timing_cache"]  # the timing cache persists across builds
    assert "--paged_kv_cache" not in kv  # deprecated alias
    assert not ("--opt_num_tokens" in kv and kv["--multiple_profiles"] == "enable")  # RuntimeError in trtllm-build
    assert int(kv["--max_input_len"]) <= int(kv["--max_seq_len"])
    assert cfg.build.name == preset and not get_target("tensorrt_llm").check_config(cfg)


def test_buildconfig_fields_and_runtime_knobs_match_the_facts():
    cfg = _cfg("build=throughput")
    bc = engine.build_config_dict(cfg)
    assert set(bc) <= REF_BUILD_CONFIG_FIELDS, set(bc) - REF_BUILD_CONFIG_FIELDS
    assert set(bc["plugin_config"]) <= REF_PLUGIN_FIELDS
    assert bc["kv_cache_type"] == "PAGED" and bc["plugin_config"]["paged_kv_cache"] and bc["plugin_config"]["remove_input_padding"]
    rk = runtime.runtime_knobs(cfg)
    for k in (
        "cuda_graph_mode",
        "cuda_graph_cache_size",
        "kv_cache_free_gpu_mem_fraction",
        "enable_kv_cache_reuse",
        "batch_scheduler_policy",
    ):
        assert k in rk
    assert rk["batch_scheduler_policy"] in ("guaranteed_no_evict", "max_utilization")  # Triton's values (sec. 9)
    assert 0 < rk["kv_cache_free_gpu_mem_fraction"] <= 1


def test_speculative_decoding_flags():
    cfg = _cfg("build.speculative.mode=medusa", "build.speculative.max_draft_len=4")
    kv = _pairs(engine.build_args(cfg, "c", "o", "t"))
    assert kv["--speculative_decoding_mode"] == "medusa" and kv["--max_draft_len"] == "4"
    cfg = _cfg("build.speculative.mode=draft_tokens_external", "build.speculative.max_draft_len=3")
    assert _pairs(engine.build_args(cfg, "c", "o", "t"))["--speculative_decoding_mode"] == "draft_tokens_external"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["build.multiple_profiles=true", "build.opt_num_tokens=256"], "build.opt_num_tokens"),
        (["build.kv_cache_type=continuous"], "build.kv_cache_type"),
        (["build.enable_chunked_context=true", "build.use_paged_context_fmha=false"], "build.enable_chunked_context"),
        (["build.enable_kv_cache_reuse=true", "build.use_paged_context_fmha=false"], "build.enable_kv_cache_reuse"),
        (["build.max_input_len=512", "build.max_seq_len=256"], "build.max_input_len"),
        (["build.max_num_tokens=128", "build.max_input_len=256", "build.enable_chunked_context=false"], "build.max_num_tokens"),
        (["build.speculative.mode=eagle"], "build.speculative.max_draft_len"),
        (["build.speculative.max_draft_len=4"], "build.speculative.max_draft_len"),
        (["build.cuda_graph_batch_sizes=[0,2]"], "build.cuda_graph_batch_sizes"),
        (["build.gemm_plugin=fp8", "quant=int4_awq"], "build.gemm_plugin"),
    ],
)
def test_cross_field_rules_are_problems_naming_the_field(overrides, field):
    """Each rule is said once: the target's own (check_config) or, for the length and chunked-context rules every
    target shares, pipeline/build/checks.py, both in validate."""
    probs = validate(_cfg(*overrides), raise_on_error=False)
    assert len([p for p in probs if p.field == field]) == 1, [str(p) for p in probs]
    assert any(p.field == field for p in probs), [str(p) for p in probs]
    assert all(p.fix for p in probs)


def test_the_position_limit_reads_either_rope_spelling():
    """transformers 5's save_pretrained writes rope_parameters only: its factor counts as rope_scaling's does (a
    trial: a linear x2 checkpoint was limited to 256 positions in that spelling and 512 in the legacy one)."""
    from pipeline.facts.geometry import ModelShape

    base = {"max_position_embeddings": 256, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 512}
    for rope in (
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
    ):
        assert runtime.max_positions({**base, **rope})[0] == 512, rope
        assert ModelShape.from_hf_config({**base, **rope}).max_seq_len_limit == 512, rope
    llama3 = {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}}
    assert runtime.max_positions({**base, **llama3})[0] == ModelShape.from_hf_config({**base, **llama3}).max_seq_len_limit == 256


def test_max_seq_len_limited_by_positions_times_rope_factor(make_checkpoint):
    assert runtime.max_positions({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}})[0] == 8192
    assert runtime.max_positions({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})[0] == 131072
    assert runtime.max_positions({"max_position_embeddings": 2048})[0] == 2048
    ckpt = make_checkpoint("llama")  # 256 positions
    bad = _cfg(f"model.path={ckpt}", "build.max_seq_len=512", "build.max_input_len=128")
    with pytest.raises(ConfigError) as e:
        validate(bad)
    assert "build.max_seq_len" in str(e.value)
    ok = _cfg(f"model.path={ckpt}", "build.max_seq_len=256", "build.max_input_len=200", "build.max_batch_size=8")
    assert not [p for p in validate(ok, raise_on_error=False) if p.field.startswith("build.")]


def test_pytorch_backend_emits_llm_api_options():
    cfg = _cfg("target=tensorrt_llm_pytorch", "build=throughput")
    assert cfg.target.backend == "pytorch"
    opts = runtime.llm_api_options(cfg)
    assert set(opts) <= REF_LLM_ARGS, set(opts) - REF_LLM_ARGS
    assert set(opts["kv_cache_config"]) <= REF_KV_CACHE_CONFIG
    assert opts["cuda_graph_config"]["batch_sizes"] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    small = runtime.llm_api_options(_cfg("target=tensorrt_llm_pytorch", "build.max_batch_size=4"))
    assert small["cuda_graph_config"]["batch_sizes"] == [1, 2, 4]  # sizes above max_batch_size are dropped
    assert opts["scheduler_config"]["capacity_scheduler_policy"] == "MAX_UTILIZATION"
    assert yaml.safe_load(yaml.safe_dump(opts)) == opts
    plan = get_target("tensorrt_llm").plan(cfg, None, None, None)
    assert plan["command"] is None and plan["llm_api_options"] == opts


# ----------------------------------------------------------------------------- missing package / binary
def test_missing_package_and_binary_stop_in_preflight_with_fix_and_command(tmp_path):
    cfg = _cfg("quant=int4_awq", "target.trtllm_build=trtllm-build-not-here", f"build.timing_cache={tmp_path / 'tc'}")
    with pytest.raises(PreflightError) as e:
        get_target("tensorrt_llm").preflight(cfg, tmp_path / "quant", tmp_path / "out")
    msg = str(e.value)
    assert e.value.exit_code == EXIT_PREFLIGHT == 4
    assert "tensorrt_llm package is not installed" in msg and "pypi.nvidia.com" in msg and "nvcr.io/nvidia/tritonserver" in msg
    assert "trtllm-build-not-here" in msg and "not on PATH" in msg
    assert "no NVIDIA GPU" in msg
    assert f"--checkpoint_dir {tmp_path / 'quant' / 'trtllm_checkpoint'}" in msg  # the exact command it would run
    assert get_target("tensorrt_llm").available()[0] is False


def _fake_gpu(monkeypatch, cc="9.0", version="1.2.1"):
    import pipeline.core.hostinfo as hi

    monkeypatch.setattr(
        hi, "gpus", lambda: [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": cc, "memory_mib": 81559.0, "driver": "580"}]
    )
    monkeypatch.setattr(versions, "installed_version", lambda: version)


def test_version_out_of_range_and_compute_capability(monkeypatch, tmp_path):
    _fake_gpu(monkeypatch, cc="8.0", version="1.3.0rc5")
    cfg = _cfg("quant=fp8", f"target.trtllm_build={sys.executable}", f"build.timing_cache={tmp_path / 'tc'}")
    with pytest.raises(PreflightError) as e:
        get_target("tensorrt_llm").preflight(cfg, tmp_path, tmp_path)
    msg = str(e.value)
    assert "1.3.0rc5 is outside the supported engine-path range 1.2.0-1.2.1" in msg
    assert "compute capability 8.0" in msg and "8.9" in msg


# ----------------------------------------------------------------------------- orchestration (test double)
def _double(tmp_path: Path, rc: int = 0, write_engine: bool = True) -> Path:
    """A stand-in for trtllm-build: records argv, prints a log line, optionally writes placeholder files."""
    exe = tmp_path / "bin" / "trtllm-build"
    exe.parent.mkdir(parents=True, exist_ok=True)
    body = f"""#!{sys.executable}
import json, sys, pathlib
args = sys.argv[1:]
out = pathlib.Path(args[args.index('--output_dir') + 1])
(pathlib.Path({str(tmp_path)!r}) / 'argv.json').write_text(json.dumps(args))
print('[TRT-LLM] test double: not a real build')
print('some warning on stderr', file=sys.stderr)
if {write_engine!r} and {rc} == 0:
    out.mkdir(parents=True, exist_ok=True)
    (out / 'rank0.engine').write_bytes(b'test-double')
    (out / 'config.json').write_text('{{"version": "test-double"}}')
sys.exit({rc})
"""
    exe.write_text(body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def _quant_dir(tmp_path: Path) -> Path:
    q = tmp_path / "quant"
    (q / "trtllm_checkpoint").mkdir(parents=True)
    (q / "trtllm_checkpoint" / "config.json").write_text(
        json.dumps({"architecture": "LlamaForCausalLM", "quantization": {"quant_algo": "W4A16_AWQ"}})
    )
    (q / "hf").mkdir()
    (q / "hf" / "tokenizer.json").write_text("{}")
    return q


def test_orchestration_passes_args_keeps_log_and_records_runtime_knobs(monkeypatch, tmp_path):
    _fake_gpu(monkeypatch)
    exe = _double(tmp_path)
    cfg = _cfg("quant=int4_awq", "build=latency", f"target.trtllm_build={exe}", f"build.timing_cache={tmp_path / 'tc' / 'h100.cache'}")
    q, out = _quant_dir(tmp_path), tmp_path / "out"
    info = get_target("tensorrt_llm").build(cfg, q, out)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv == engine.build_args(cfg, q / "trtllm_checkpoint", out / "engine", tmp_path / "tc" / "h100.cache")
    log = (out / "build.log").read_text()
    assert "test double" in log and "some warning on stderr" in log and log.startswith("$ ")
    assert info["runtime"]["cuda_graph_mode"] is True and info["runtime"]["cuda_graph_cache_size"] == 3
    assert info["host"]["compute_capability"] == "9.0" and info["versions"]["python"]
    assert info["limits"]["max_batch_size"] == 4 and info["engine_bytes"] > 0
    assert (out / "engine" / "tokenizer.json").is_file()  # trtllm-build does not copy the tokenizer


def test_orchestration_surfaces_failures(monkeypatch, tmp_path):
    _fake_gpu(monkeypatch)
    q = _quant_dir(tmp_path)
    cfg = _cfg(f"target.trtllm_build={_double(tmp_path, rc=3)}", f"build.timing_cache={tmp_path / 'tc'}")
    with pytest.raises(PipelineError) as e:
        get_target("tensorrt_llm").build(cfg, q, tmp_path / "o1")
    assert "exit 3" in str(e.value) and "test double" in str(e.value)
    cfg = _cfg(f"target.trtllm_build={_double(tmp_path, rc=0, write_engine=False)}", f"build.timing_cache={tmp_path / 'tc'}")
    with pytest.raises(PipelineError) as e:
        get_target("tensorrt_llm").build(cfg, q, tmp_path / "o2")
    assert "wrote no engine" in str(e.value)


def test_build_stage_dry_run_prints_the_command_and_key_includes_target(tmp_path):
    import logging

    from rich.console import Console

    from pipeline.core.stage import StageContext, get_stage

    st = get_stage("build")
    cfg = _cfg("build=latency", f"build.timing_cache={tmp_path / 'tc'}")
    assert st.key_extras(cfg, {})["target"] == "tensorrt_llm"
    assert st.key_extras(compose(["target=onnxruntime_genai"]), {})["target"] == "onnxruntime_genai"
    con = Console(record=True, width=400)
    ctx = StageContext(cfg=cfg, inputs={}, external={}, out=None, manifest={}, console=con, log=logging.getLogger("t"), show_progress=False)
    info = st.dry_run(ctx)
    text = con.export_text()
    assert "trtllm-build --checkpoint_dir" in text and "--max_batch_size 4" in text and "build target: tensorrt_llm" in text
    assert info["command"][0] == "trtllm-build" and info["headline"]["target"] == "tensorrt_llm"


# ----------------------------------------------------------------------------- serving knobs (package.runtime)
def test_sliding_window_is_passed_through_as_max_attention_window_size(make_checkpoint, tmp_path):
    """A Mistral-style window smaller than max_seq_len reaches the package as max_attention_window_size; a window that
    no sequence can exceed is full attention (nothing passed); Qwen2's use_sliding_window=false is no window."""
    ck = make_checkpoint("mistral", sliding_window=16)
    cfg = _cfg(f"model.path={ck}", "build.max_seq_len=256", "build.max_input_len=128")
    assert runtime.sliding_window(runtime.model_hf_config(cfg)) == 16
    assert runtime.runtime_knobs(cfg)["max_attention_window_size"] == 16
    assert not get_target("tensorrt_llm").check_config(cfg)
    wide = make_checkpoint("mistral", name="wide", sliding_window=4096)
    assert "max_attention_window_size" not in runtime.runtime_knobs(
        _cfg(f"model.path={wide}", "build.max_seq_len=256", "build.max_input_len=128")
    )
    assert runtime.sliding_window({"sliding_window": 4096, "use_sliding_window": False}) is None
    from pipeline.package.repository import settings_from_build

    bi = {
        "target": "tensorrt_llm",
        "backend": "tensorrt",
        "limits": {"max_batch_size": 8, "max_input_len": 128, "max_seq_len": 256},
        "runtime": runtime.runtime_knobs(cfg),
    }
    s = settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json({"eos_token_ids": [2]}), cfg.package, cfg.build, cfg.target)
    assert s.trtllm["parameters"]["max_attention_window_size"] == "16"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["package.runtime.max_attention_window_size=1000", "build.max_seq_len=384"], "package.runtime.max_attention_window_size"),
        (["build.speculative.mode=medusa", "build.speculative.max_draft_len=4"], "package.runtime.medusa_choices"),
        (
            ["build.speculative.mode=lookahead_decoding", "build.speculative.max_draft_len=8", "package.runtime.lookahead_window_size=4"],
            "package.runtime.lookahead_ngram_size",
        ),
        (["package.runtime.medusa_choices='{0}, {1}'"], "package.runtime.medusa_choices"),
        (
            ["build.speculative.mode=eagle", "build.speculative.max_draft_len=4", "package.runtime.decoding_mode=medusa"],
            "package.runtime.decoding_mode",
        ),
        (
            ["package.runtime.kv_cache_host_memory_bytes=1073741824", "build.enable_kv_cache_reuse=false"],
            "package.runtime.kv_cache_host_memory_bytes",
        ),
        (
            ["build.speculative.mode=draft_tokens_external", "build.speculative.max_draft_len=4", "build.speculative.draft_model_path=/d"],
            "eval.draft_model_path",
        ),
        (
            [
                "build.speculative.mode=draft_tokens_external",
                "build.speculative.max_draft_len=4",
                "build.speculative.draft_model_path=/d",
                "eval.draft_model_path=/other",
            ],
            "eval.draft_model_path",
        ),
        (
            [
                "build.speculative.mode=draft_tokens_external",
                "build.speculative.max_draft_len=6",
                "build.speculative.draft_model_path=/d",
                "eval.draft_model_path=/d",
            ],
            "eval.draft_tokens",
        ),
    ],
)
def test_runtime_knobs_are_checked_across_fields(overrides, field):
    probs = get_target("tensorrt_llm").check_config(_cfg(*overrides))
    hit = [p for p in probs if p.field == field]
    assert hit, [str(p) for p in probs]
    assert all(p.fix for p in hit)


def test_window_larger_than_the_models_window_is_refused(make_checkpoint):
    ck = make_checkpoint("mistral", sliding_window=16)
    probs = get_target("tensorrt_llm").check_config(
        _cfg(f"model.path={ck}", "build.max_seq_len=256", "build.max_input_len=128", "package.runtime.max_attention_window_size=32")
    )
    assert any(p.field == "package.runtime.max_attention_window_size" and "sliding_window=16" in p.message for p in probs)


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ("package.runtime.kv_cache_free_gpu_mem_fraction=1.5", "package.runtime.kv_cache_free_gpu_mem_fraction"),
        ("package.runtime.gpu_device_ids='0;x'", "package.runtime.gpu_device_ids"),
        ("package.runtime.decoding_mode=greedy", "package.runtime.decoding_mode"),
        ("package.runtime.medusa_choices='0,1'", "package.runtime.medusa_choices"),
        ("package.speculative.min_acceptance_rate=2", "package.speculative.min_acceptance_rate"),
        ("package.runtime.encoder_model_path=relative/enc", "package.runtime.encoder_model_path"),
    ],
)
def test_runtime_field_errors_exit_2_naming_field_value_and_fix(over, field):
    from pipeline.validation import validate as cfg_validate

    with pytest.raises(ConfigError) as e:
        cfg_validate(compose([over]))
    assert field in str(e.value) and "Fix:" in str(e.value)
    assert e.value.problems and all(p.fix for p in e.value.problems if p.field == field)


def test_draft_model_build_runs_a_second_trtllm_build_for_the_draft(monkeypatch, tmp_path):
    _fake_gpu(monkeypatch)
    exe = _double(tmp_path)
    draft = tmp_path / "draft"
    (draft / "trtllm_checkpoint").mkdir(parents=True)
    (draft / "trtllm_checkpoint" / "config.json").write_text("{}")
    cfg = _cfg(
        "quant=int4_awq",
        f"target.trtllm_build={exe}",
        f"build.timing_cache={tmp_path / 'tc'}",
        "build.speculative.mode=draft_tokens_external",
        "build.speculative.max_draft_len=4",
        f"build.speculative.draft_model_path={draft}",
    )
    out = tmp_path / "out"
    info = get_target("tensorrt_llm").build(cfg, _quant_dir(tmp_path), out)
    argv = json.loads((tmp_path / "argv.json").read_text())  # the last call: the draft
    kv = _pairs(argv)
    assert kv["--checkpoint_dir"] == str(draft / "trtllm_checkpoint") and kv["--output_dir"] == str(out / "draft_engine")
    assert "--speculative_decoding_mode" not in kv and info["draft"]["engine"] == "draft_engine"
    assert info["runtime"]["speculative"] == {"mode": "draft_tokens_external", "max_draft_len": 4, "draft_model_path": str(draft)}
    assert (out / "draft_engine" / "rank0.engine").is_file()


def test_gather_context_logits_flag_and_its_speculative_conflict(tmp_path):
    args = engine.build_args(_cfg("build.gather_context_logits=true"), "c", "o", "t")
    assert "--gather_context_logits" in args and set(_pairs(args)) <= REF_FLAGS
    assert "--gather_context_logits" not in engine.build_args(_cfg(), "c", "o", "t")
    probs = get_target("tensorrt_llm").check_config(
        _cfg(
            "build.gather_context_logits=true",
            "build.speculative.mode=medusa",
            "build.speculative.max_draft_len=4",
            "package.runtime.medusa_choices='{0}'",
        )
    )
    assert [p.field for p in probs] == ["build.gather_context_logits"]
