"""RoPE scaling on the build targets (issue 36): a ``rope_scaling`` the target does not honour, or would crash on, is
refused at config time (exit 2, naming rope_scaling, the type, the target and the fix); a scaling it honours builds
an engine whose greedy tokens equal transformers'.

Before: Llama ``linear``/``yarn`` built on onnxruntime_genai without a word and ignored the scaling; Qwen2 ``yarn``
without betas ended exit 1 (ZeroDivisionError in the builder), with betas exit 1 (``AssertionError 0 < low < high <
d_half - 1``); a Phi-3 ``longrope`` with equal lengths exit 1 (NotImplementedError)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tiny

from pipeline.core.config import compose
from pipeline.core.targets import get_target
from pipeline.core.targets.base import GenerationRequest
from pipeline.errors import InputError
from pipeline.facts.rope import rope_refusal
from pipeline.validation import stage_problems

ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _checkpoint(tmp: Path, arch: str, rope_scaling: dict | None, **config) -> Path:
    """A tiny real checkpoint whose config.json carries ``rope_scaling`` as a user's would (legacy spelling kept)."""
    ckpt = tiny.make_checkpoint(tmp / arch, arch)
    c = json.loads((ckpt / "config.json").read_text())
    c.pop("rope_parameters", None)
    c.update(rope_theta=10000.0, **config)
    if rope_scaling is not None:
        c["rope_scaling"] = rope_scaling
    (ckpt / "config.json").write_text(json.dumps(c))
    return ckpt


def _rope_msgs(ckpt: Path, target: str = "onnxruntime_genai", max_seq_len: int = 200) -> list[str]:
    cfg = compose([f"model.path={ckpt}", f"target={target}", "quant=none", "build.max_input_len=160", f"build.max_seq_len={max_seq_len}"])
    return [str(p) for p in stage_problems(cfg) if "rope" in str(p).lower() or "original_max_position" in str(p)]


@pytest.mark.parametrize(
    "arch, rope, expect",
    [
        ("llama", {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64}, "applies only llama3 scaling"),
        ("qwen2", {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64}, "low=-1.99, high=4.03"),
        (
            "qwen2",
            {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1},
            "0 < low < high < d_half - 1",
        ),
        ("qwen2", {"type": "llama3", **{k: v for k, v in LLAMA3.items() if k != "rope_type"}}, "NotImplementedError"),
        ("mistral", {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}, "does not"),
    ],
)
def test_unhonoured_rope_scaling_is_refused_at_config_time(tmp_path, arch, rope, expect):
    import transformers as tf

    ckpt = _checkpoint(tmp_path, arch, rope)
    tf.AutoConfig.from_pretrained(str(ckpt))  # a config transformers itself accepts
    msgs = _rope_msgs(ckpt)
    assert len(msgs) == 1, msgs
    m = msgs[0]
    assert "rope_scaling" in m and repr(rope["type"]) in m and "onnxruntime_genai" in m and expect in m, m
    assert "Fix: target=tensorrt_llm" in m and "remove rope_scaling" in m, m
    assert not _rope_msgs(ckpt, "tensorrt_llm_pytorch")  # TensorRT-LLM's RotaryScalingType handles it


@pytest.mark.parametrize(
    "arch, rope",
    [
        ("qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
        ("llama", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    ],
)
def test_a_rope_refusal_names_rope_parameters_when_the_checkpoint_spells_it_so(tmp_path, arch, rope):
    """A transformers-5 checkpoint holds its scaling in rope_parameters (with rope_theta) and has no rope_scaling; the
    refusal said "rope_scaling type ..." and "remove rope_scaling" (a key the file does not have; removing
    rope_parameters would drop rope_theta too). It names the spelling the checkpoint uses, and the fix keeps it."""
    ckpt = tiny.make_checkpoint(tmp_path / arch, arch)
    c = json.loads((ckpt / "config.json").read_text())
    assert "rope_scaling" not in c and c["rope_parameters"]["rope_type"] == "default"
    c["rope_parameters"] = {**c["rope_parameters"], **rope}
    (ckpt / "config.json").write_text(json.dumps(c))
    msgs = _rope_msgs(ckpt, max_seq_len=300)
    assert len(msgs) == 1, msgs
    assert f"rope_parameters type {rope['rope_type']!r}" in msgs[0] and "rope_scaling" not in msgs[0], msgs
    assert 'set rope_parameters.rope_type to "default" in config.json (keep its rope_theta)' in msgs[0], msgs


def test_phi3_long_rope_with_equal_lengths_is_refused(tmp_path):
    rope = {"type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16}
    ckpt = _checkpoint(tmp_path, "phi3", rope, max_position_embeddings=256, original_max_position_embeddings=256)
    msgs = _rope_msgs(ckpt)
    assert len(msgs) == 1 and "'longrope'" in msgs[0] and "NotImplementedError" in msgs[0], msgs
    assert not _rope_msgs(ckpt, "tensorrt_llm_pytorch")


def test_qwen2_yarn_exits_2_before_any_work(tmp_path):
    ckpt = _checkpoint(tmp_path, "qwen2", {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64})
    r = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", f"model.path={ckpt}", "target=onnxruntime_genai", "quant=none",
         f"store_dir={tmp_path / 'store'}", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "rope_scaling type 'yarn'" in out, out[-2000:]
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").glob("*/*"))  # nothing ran


def test_ort_yarn_equals_transformers_only_without_truncation():
    """Why YaRN on onnxruntime_genai needs ``truncate: false``: the builder's own function against transformers'."""
    import types

    import onnxruntime_genai.models.builder  # noqa: F401 - puts the builder's package on sys.path
    import torch
    import transformers as tf
    from builders.base import Model
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for truncate in (True, False):
        rp = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4096, "truncate": truncate}
        c = tf.Qwen2Config(hidden_size=1024, num_attention_heads=8, max_position_embeddings=16384, rope_parameters=rp)
        hf, _ = ROPE_INIT_FUNCTIONS["yarn"](c, "cpu")
        me = types.SimpleNamespace(
            head_size=128,
            original_context_length=4096,
            rope_attrs={"theta": 10000.0, "rescale_inv_freq": {"factor": 4.0, "ntk_alpha": 1, "ntk_beta": 32}},
        )
        ort = Model.make_inv_freq_rescaled_with_ntk(me, 1.0 / (10000.0 ** (torch.arange(0, 128, 2).float() / 128)))
        assert torch.equal(hf, ort) is (not truncate)
        cfg = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 1024, "num_attention_heads": 8}
        cfg.update(max_position_embeddings=16384, rope_scaling=dict(rp))
        assert (rope_refusal(cfg, "onnxruntime_genai") is None) is (not truncate)


def _greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)[0, len(ids) :].tolist()
    return out[: out.index(2)] if 2 in out else out


@pytest.mark.parametrize("arch, rope", [("llama", LLAMA3), ("llama", {"type": "linear", "factor": 4.0})])
def test_honoured_rope_scaling_builds_and_equals_transformers(tmp_path, arch, rope):
    import transformers as tf

    ckpt = _checkpoint(tmp_path, arch, rope)
    cfg = compose([f"model.path={ckpt}", "target=onnxruntime_genai", "quant=none", "build.max_input_len=160", "build.max_seq_len=200"])
    assert not _rope_msgs(ckpt)
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "hf").symlink_to(ckpt, target_is_directory=True)
    (tmp_path / "b").mkdir()
    get_target("onnxruntime_genai").build(cfg, tmp_path / "q", tmp_path / "b", export_dir=tmp_path / "q")
    model = tf.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    plain = tf.AutoModelForCausalLM.from_pretrained(str(ckpt), rope_parameters={"rope_type": "default", "rope_theta": 10000.0}).eval()
    prompts = [list(range(5, 5 + n)) for n in (40, 90)]
    want = [_greedy(model, p, 10) for p in prompts]
    assert want != [_greedy(plain, p, 10) for p in prompts]  # the scaling changes the tokens: the test can tell
    with get_target("onnxruntime_genai").load_runner(tmp_path / "b" / "engine") as runner:
        got = runner.generate([GenerationRequest(p, 10, [2], f"r{i}") for i, p in enumerate(prompts)])
    assert [r.output_ids for r in got] == want


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_dynamic_rope_is_plain_rope_within_max_position_embeddings(tmp_path, arch):
    """transformers' dynamic NTK scaling leaves RoPE plain up to max_position_embeddings (256 in the tiny checkpoint):
    with build.max_seq_len=200 the onnxruntime_genai engine (built without the scaling: Qwen2's builder raised
    NotImplementedError on 'dynamic') gives transformers' greedy tokens; with 300 it is refused, naming the limit."""
    import transformers as tf

    ckpt = _checkpoint(tmp_path, arch, {"type": "dynamic", "factor": 4.0})
    over = _rope_msgs(ckpt, max_seq_len=300)
    assert len(over) == 1 and "'dynamic'" in over[0] and "max_position_embeddings=256" in over[0], over
    assert "Fix: set build.max_seq_len <= 256" in over[0], over
    assert not _rope_msgs(ckpt, "tensorrt_llm_pytorch", max_seq_len=300)
    assert not _rope_msgs(ckpt)
    cfg = compose([f"model.path={ckpt}", "target=onnxruntime_genai", "quant=none", "build.max_input_len=160", "build.max_seq_len=200"])
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "hf").symlink_to(ckpt, target_is_directory=True)
    (tmp_path / "b").mkdir()
    info = get_target("onnxruntime_genai").build(cfg, tmp_path / "q", tmp_path / "b", export_dir=tmp_path / "q")
    assert any("dynamic RoPE scaling built as plain RoPE" in c for c in info["builder_config_changes"])  # the build says what it did
    assert json.loads((ckpt / "config.json").read_text())["rope_scaling"]["type"] == "dynamic"  # the source is untouched
    model = tf.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    assert model.config.rope_parameters["rope_type"] == "dynamic"
    prompts = [list(range(5, 5 + n)) for n in (40, 150)]
    want = [_greedy(model, p, 40) for p in prompts]
    with get_target("onnxruntime_genai").load_runner(tmp_path / "b" / "engine") as runner:
        got = runner.generate([GenerationRequest(p, 40, [2], f"r{i}") for i, p in enumerate(prompts)])
    assert [r.output_ids for r in got] == want


def test_dynamic_rope_past_every_limit_is_one_problem_whose_fixes_work(tmp_path):
    """Dynamic x2 on onnxruntime_genai with build.max_seq_len=600, past max_position_embeddings=256 and the model's
    512 positions: two problems for one cause, and the first one's fix (allow_unsafe_lengths=true) left the RoPE
    refusal standing. Now one problem; allow_unsafe_lengths does not lift it (past 256 transformers rescales and the
    engine would not), so it is offered only for the targets that honour dynamic; each fix offered clears it."""
    ckpt = _checkpoint(tmp_path, "llama", {"type": "dynamic", "factor": 2.0})

    def problems(*over: str) -> list[str]:
        cfg = compose([f"model.path={ckpt}", "quant=none", "build.max_input_len=160", *over])
        return [str(p) for p in stage_problems(cfg) if p.field in ("model.path", "build.max_seq_len")]

    one = problems("target=onnxruntime_genai", "build.max_seq_len=600")
    assert len(one) == 1 and "'dynamic'" in one[0], one
    assert "Fix: set build.max_seq_len <= 256, or target=tensorrt_llm or target=tensorrt_llm_pytorch (there also " in one[0], one
    assert "build.max_seq_len <= 512, the model's positions, or allow_unsafe_lengths=true)" in one[0], one
    unsafe = problems("target=onnxruntime_genai", "build.max_seq_len=600", "allow_unsafe_lengths=true")
    assert len(unsafe) == 1 and "cannot accept it" in unsafe[0] and "Fix: set build.max_seq_len <= 256, or target=" in unsafe[0], unsafe
    assert "allow_unsafe_lengths=true)" not in unsafe[0].split(" Fix: ")[1], unsafe  # already set: not offered again
    assert not problems("target=onnxruntime_genai", "build.max_seq_len=256")
    assert not problems("target=tensorrt_llm_pytorch", "build.max_seq_len=512")
    assert not problems("target=tensorrt_llm_pytorch", "build.max_seq_len=600", "allow_unsafe_lengths=true")


def test_each_fix_of_the_dynamic_rope_refusal_plans_alone(tmp_path, capsys):
    """A trial: dynamic x2 (max_position_embeddings=256) on the CPU target with build.max_seq_len=384 and the default
    build.max_input_len=256: the first fix, ``set build.max_seq_len <= 256``, applied alone was refused (max_input_len
    must be below max_seq_len). The fix now names max_input_len as the plain length refusal does; each fix offered,
    applied alone, plans with exit 0 (a GPU target with target.gpu named, as on a host without one)."""
    from pipeline.plan_cli import main as plan_main

    ckpt = _checkpoint(tmp_path, "llama", {"rope_type": "dynamic", "factor": 2.0})
    base = [f"model.path={ckpt}", "target=onnxruntime_genai", "build.max_seq_len=384"]
    assert compose(base).build.max_input_len == 256  # the default this is about
    assert plan_main(["--json", *base]) == 2
    [p] = json.loads(capsys.readouterr().out)["problems"]
    assert p["fix"] == (
        "set build.max_seq_len <= 256 and build.max_input_len below it (now 256), or target=tensorrt_llm or target=tensorrt_llm_pytorch"
    ), p
    fixes = {
        "lengths": ["build.max_seq_len=256", "build.max_input_len=255"],
        "engines": ["target=tensorrt_llm", "target.gpu=h100_sxm"],
        "pytorch": ["target=tensorrt_llm_pytorch", "target.gpu=h100_sxm"],
    }
    for name, fix in fixes.items():
        assert plan_main([*base, *fix]) == 0, (name, capsys.readouterr().err)
    assert plan_main([*base, "build.max_input_len=200", "build.max_seq_len=256"]) == 0  # below 256 already: not named
    capsys.readouterr()
    assert plan_main(["--json", *base, "build.max_input_len=200"]) == 2
    [p] = json.loads(capsys.readouterr().out)["problems"]
    assert p["fix"].startswith("set build.max_seq_len <= 256, or target="), p


def test_yarn_without_betas_in_both_spellings_builds_and_equals_transformers(tmp_path):
    """The export writes rope_scaling and rope_parameters; transformers 5 lets the legacy one override, so YaRN's
    defaults filled into rope_parameters alone were dropped and the builder divided by zero (exit 1 after export and
    quantize; fresh-user trial). They go into both."""
    import transformers as tf

    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "truncate": False}
    ckpt = _checkpoint(tmp_path, "qwen2", yarn, max_position_embeddings=16384)
    c = json.loads((ckpt / "config.json").read_text())
    c["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, **{k: v for k, v in yarn.items() if k != "type"}}
    (ckpt / "config.json").write_text(json.dumps(c))
    assert not _rope_msgs(ckpt)
    cfg = compose([f"model.path={ckpt}", "target=onnxruntime_genai", "quant=none", "build.max_input_len=160", "build.max_seq_len=200"])
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "hf").symlink_to(ckpt, target_is_directory=True)
    (tmp_path / "b").mkdir()
    get_target("onnxruntime_genai").build(cfg, tmp_path / "q", tmp_path / "b", export_dir=tmp_path / "q")
    model = tf.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    prompts = [list(range(5, 5 + n)) for n in (40, 90)]
    want = [_greedy(model, p, 10) for p in prompts]
    plain = tf.AutoModelForCausalLM.from_pretrained(str(ckpt), rope_parameters={"rope_type": "default", "rope_theta": 10000.0}).eval()
    assert want != [_greedy(plain, p, 10) for p in prompts]  # YaRN changes the tokens: the test can tell
    with get_target("onnxruntime_genai").load_runner(tmp_path / "b" / "engine") as runner:
        got = runner.generate([GenerationRequest(p, 10, [2], f"r{i}") for i, p in enumerate(prompts)])
    assert [r.output_ids for r in got] == want


def test_the_rope_types_we_accept_are_the_ones_transformers_computes():
    """A fresh-user trial: ``rope_scaling {"type": "weird"}`` passed every check and failed after the weights were read,
    as ``KeyError: 'weird'`` blamed on the config not matching the weights. facts.rope holds transformers' list."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from pipeline.facts.rope import TRANSFORMERS_ROPE_TYPES, normalise_rope

    assert set(TRANSFORMERS_ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}
    with pytest.raises(InputError, match=r"rope_parameters type 'weird' is no RoPE type transformers knows .*Fix: "):
        normalise_rope({"rope_parameters": {"rope_type": "weird", "rope_theta": 1e4}})
