"""Cross-field validation: every problem reported together, each check, eval-set lengths, speed budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.config import ConfigError, compose, resolve_path
from pipeline.evaluate.checks import eval_prompt_stats
from pipeline.planner import plan
from pipeline.validation import stage_problems, validate

ROOT = Path(__file__).resolve().parents[2]


def fields(problems) -> list[str]:
    return [p.field for p in problems]


def test_all_problems_are_reported_together():
    cfg = compose(
        [
            "model=llama31_8b",
            "target.gpu=a100_80gb",
            "quant=fp8",
            "quant.kv_cache_dtype=fp8",
            "parallel.tp_size=3",
            "build.max_input_len=4096",
            "build.max_seq_len=4096",
            "build.max_num_tokens=1024",
            "build.tokens_per_block=48",
        ]
    )
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    got = fields(e.value.problems)
    for f in (
        "build.max_input_len",
        "build.max_num_tokens",
        "build.tokens_per_block",
        "parallel.tp_size",
        "quant.recipe",
        "quant.kv_cache_dtype",
    ):
        assert f in got, (f, got)
    text = str(e.value)
    assert "use one of [1, 2, 4, 8, 16]" in text and "compute capability >= 8.9" in text


def test_max_seq_len_against_positions_and_rope_factor():
    # Llama 3.1: rope_type llama3 -> max_position_embeddings (131072) already is the extended length
    p = stage_problems(compose(["model=llama31_8b", "build.max_seq_len=140000", "build.max_input_len=1024", "build.max_num_tokens=8192"]))
    assert "build.max_seq_len" in fields(p) and "131072" in str(p[fields(p).index("build.max_seq_len")])
    # linear rope scaling multiplies the positions
    ok = stage_problems(
        compose(
            [
                "model=llama2_7b",
                "+model.hf_config.rope_scaling={type:linear,factor:2.0}",
                "build.max_seq_len=8192",
                "build.max_input_len=1024",
                "build.max_num_tokens=8192",
            ]
        )
    )
    assert "build.max_seq_len" not in fields(ok)
    bad = stage_problems(compose(["model=llama2_7b", "build.max_seq_len=8192", "build.max_input_len=1024", "build.max_num_tokens=8192"]))
    assert "build.max_seq_len" in fields(bad)
    # speculative draft tokens count against the positions
    spec = stage_problems(
        compose(
            [
                "model=llama2_7b",
                "build.max_seq_len=4096",
                "build.max_input_len=1024",
                "build.max_num_tokens=8192",
                "build.speculative.max_draft_len=8",
            ]
        )
    )
    assert "build.max_seq_len" in fields(spec)


def test_allow_unsafe_lengths_accepts_and_records():
    ov = ["model=llama2_7b", "build.max_seq_len=8192", "build.max_input_len=1024", "build.max_num_tokens=8192", "target.gpu=h100_sxm"]
    cfg = compose(ov + ["allow_unsafe_lengths=true"])
    assert "build.max_seq_len" not in fields(stage_problems(cfg))
    p = plan(cfg)
    assert p.config.allow_unsafe_lengths is True and any("allow_unsafe_lengths=true" in w for w in p.warnings)


def test_chunked_context_allows_short_max_num_tokens_but_needs_paged_fmha():
    base = ["model=llama31_8b", "build=long_context"]
    assert "build.max_num_tokens" not in fields(stage_problems(compose(base)))
    p = stage_problems(compose(base + ["build.use_paged_context_fmha=false"]))
    assert "build.enable_chunked_context" in fields(p)


def test_tensor_parallel_heads_kv_heads_and_vocab():
    # qwen2.5-7b: 28 heads, 4 KV heads, vocab 152064
    assert fields(stage_problems(compose(["model=qwen25_7b", "parallel.tp_size=4"]))) == []
    p = stage_problems(compose(["model=qwen25_7b", "parallel.tp_size=8"]))  # 28 % 8 != 0
    assert "parallel.tp_size" in fields(p)
    # 32 heads, 8 KV heads: TP 16 replicates KV heads (allowed)
    assert "parallel.tp_size" not in fields(stage_problems(compose(["model=mistral_7b", "parallel.tp_size=16"])))
    # a KV-head count neither divided nor replicated evenly
    p = stage_problems(
        compose(
            ["model=mistral_7b", "model.hf_config.num_key_value_heads=6", "parallel.tp_size=4", "model.hf_config.num_attention_heads=48"]
        )
    )
    assert "parallel.tp_size" in fields(p)
    # vocab 32002 with TP 3 heads 48: padded by default, rejected on request
    ov = [
        "model=llama2_7b",
        "model.hf_config.num_attention_heads=48",
        "model.hf_config.num_key_value_heads=48",
        "parallel.tp_size=3",
        "model.hf_config.vocab_size=32002",
    ]
    assert "quant.vocab_padding" not in fields(stage_problems(compose(ov)))
    p = stage_problems(compose(ov + ["quant.vocab_padding=reject"]))
    assert "quant.vocab_padding" in fields(p) and "32002" in str(p[fields(p).index("quant.vocab_padding")])


def test_calibration_length_against_positions():
    p = stage_problems(compose(["model=llama2_7b", "quant=int4_awq", "calibration.calib_max_seq_length=8192"]))
    assert "calibration.calib_max_seq_length" in fields(p)
    # no calibration for the unquantized recipe
    assert "calibration.calib_max_seq_length" not in fields(
        stage_problems(compose(["model=llama2_7b", "quant=none", "calibration.calib_max_seq_length=8192"]))
    )


def test_unknown_target_gpu_is_a_problem():
    p = stage_problems(compose(["model=llama2_7b", "target.gpu=rtx9090"]))
    assert fields(p) == ["target.gpu"] and "h100_sxm" in p[0].fix


def test_build_limits_only_checked_when_an_engine_is_involved(tiny_llama):
    # tiny checkpoint: 256 positions; cpu_default asks for 384 -> a problem for a build, none for export/quantize only
    assert "build.max_seq_len" in fields(stage_problems(compose([f"model.path={tiny_llama}"])))
    assert stage_problems(compose([f"model.path={tiny_llama}", "stages=[export,quantize]", "quant=int4_awq"])) == []


def test_eval_set_prompt_lengths_checked_with_max_and_p99(tiny_llama):
    cfg = compose([f"model.path={tiny_llama}", "build.max_input_len=16", "build.max_seq_len=256"])
    p = stage_problems(cfg)
    assert "build.max_input_len" in fields(p)
    msg = str(p[fields(p).index("build.max_input_len")])
    st = eval_prompt_stats(cfg)
    shipped = resolve_path(cfg.eval.eval_set)
    assert shipped is not None
    assert f"up to {st['max']} tokens" in msg and f"P99 {st['p99']}" in msg
    assert st["count"] == len(shipped.read_text(encoding="utf-8").splitlines())
    assert st["p99"] <= st["max"]
    ok = stage_problems(
        compose([f"model.path={tiny_llama}", f"build.max_input_len={st['max']}", "build.max_seq_len=256", "build.max_num_tokens=2048"])
    )
    assert "build.max_input_len" not in fields(ok)
    # eval.limit: the same items the evaluate stage takes (round-robin across slices), not the first N lines
    from pipeline.data.evalset import load_eval_set

    lim = eval_prompt_stats(compose([f"model.path={tiny_llama}", "eval.limit=12"]))
    assert lim["count"] == 12 and lim["max_id"] in {it.id for it in load_eval_set(ROOT / "evaluation/data/support_eval_v2.jsonl", limit=12)}


def test_eval_lengths_equal_the_transformers_tokenizer(tiny_llama):
    """The light tokenizer (TextCodec: tokenizers + jinja2, no transformers) renders and encodes exactly like
    transformers' own fast tokenizer and chat template for ordinary prompts (no control-token strings in them)."""
    from transformers import AutoTokenizer

    from pipeline.core import tokenization

    ref = AutoTokenizer.from_pretrained(str(tiny_llama))
    codec = tokenization.TextCodec.from_dir(tiny_llama)
    rows = [json.loads(line) for line in (ROOT / "evaluation/data/support_eval_v2.jsonl").read_text(encoding="utf-8").splitlines()[::37]]
    rows.append({"prompt": "我的订单 ORD-55555 什么时候到？"})
    msgs_list = [[{"role": "user", "content": r["prompt"]}] for r in rows]
    msgs_list.append([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    for msgs in msgs_list:
        text = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert codec.render(messages=msgs) == text
        assert codec.encode_prompt(messages=msgs) == ref(text, add_special_tokens=False)["input_ids"]


def test_validation_does_not_import_torch_or_transformers(tiny_llama):
    code = (
        "import sys\n"
        "from pipeline.core.config import compose\n"
        "from pipeline.validation import validate\n"
        f"cfg = compose(['model.path={tiny_llama}', 'build.max_seq_len=256', 'build.max_input_len=200'])\n"
        "problems = validate(cfg, raise_on_error=False)\n"
        "from pipeline.planner import plan\n"
        "plan(cfg)\n"
        "print([str(p) for p in problems])\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_shape_only_presets_skip_eval_lengths_without_a_tokenizer():
    assert eval_prompt_stats(compose(["model=llama31_8b"])) is None


@pytest.mark.parametrize("stages", ["[package]", "[benchmark]", "[build]"])
def test_the_checks_of_every_stage_that_will_run_are_run(stages):
    """``stages=[package]`` runs export, quantize, build and evaluate first: their fields are checked too (issue
    "one package per stage": it used to run 50 s and die in evaluate with a scipy NaN traceback, exit 1)."""
    bad = ["eval.gate.confidence=1.5", "calibration.batch_size=0", "quant=int4_awq"]
    fields = {p.field for p in validate(compose([f"stages={stages}", *bad]), raise_on_error=False)}
    assert "calibration.batch_size" in fields  # quantize runs before each of them
    assert ("eval.gate.confidence" in fields) == (stages != "[build]")  # build does not need evaluate


def test_a_bad_field_of_an_upstream_stage_exits_2_before_any_work(tmp_path):
    store = tmp_path / "store"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "stages=[package]",
            "eval.gate.confidence=1.5",
            f"store_dir={store}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "eval.gate.confidence=1.5: must be in [0.5, 1)" in r.stdout + r.stderr
    assert not any(store.glob("*/*")) if store.exists() else True  # no stage ran


def test_a_length_fix_never_points_at_the_next_refusal(tmp_path):
    """Each fix, followed, must not be refused by the next check (trial 4): a max_seq_len over the positions with a
    max_input_len at the limit names both; an item that alone needs more than the positions asks for fewer tokens,
    not for a max_seq_len the position check would refuse."""
    limit = 512  # models/support-llama: max_position_embeddings
    p = stage_problems(compose([f"build.max_seq_len={limit + 100}", f"build.max_input_len={limit}"]))
    msg = str(p[fields(p).index("build.max_seq_len")])
    assert f"Fix: set build.max_seq_len <= {limit} and build.max_input_len below it (now {limit})" in msg
    alone = stage_problems(compose([f"build.max_seq_len={limit + 100}", "build.max_input_len=256"]))
    assert "build.max_input_len below it" not in str(alone[fields(alone).index("build.max_seq_len")])
    ev = tmp_path / "eval.jsonl"
    row = {"prompt": "Where is ORD-1?", "reference": "ORD-1", "metric": "exact_match", "slice": "s"}
    ev.write_text(json.dumps({"id": "a", **row, "max_new_tokens": 100000}) + "\n" + json.dumps({"id": "b", **row}) + "\n")
    p = stage_problems(compose([f"eval.eval_set={ev}"]))
    msg = str(p[fields(p).index("build.max_seq_len")])
    assert f"Fix: lower max_new_tokens (eval.max_new_tokens, or the item's own max_new_tokens): the model has {limit}" in msg
    assert "set build.max_seq_len >=" not in msg


def test_a_value_the_field_check_refuses_is_not_built_on_by_the_stage_checks():
    """A recheck: ``build.max_seq_len=-5`` gave "must be >= 1" and then two cross-field problems built on -5, one
    with the fix ``build.max_input_len < -5``. Only the field's own problem is reported."""
    problems = validate(compose(["build.max_seq_len=-5"]), raise_on_error=False)
    assert [str(p) for p in problems] == ["build.max_seq_len=-5: must be >= 1. Fix: set build.max_seq_len to a positive integer"]
    assert len(validate(compose(["build.max_seq_len=100", "build.max_input_len=200"]), raise_on_error=False)) >= 1  # still checked


def test_a_run_with_configuration_problems_also_names_an_unusable_store(tmp_path):
    """A recheck: a run refused for one problem (a checkpoint's) said nothing of a ``store_dir`` that is a file, while
    ``pipeline plan`` listed both; the run now lists the store's problem with the others (one ConfigError)."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    over = ["build.max_seq_len=-5", f"store_dir={afile}"]
    said = [str(p) for p in validate(compose(over), raise_on_error=False, list_inputs=True)]
    assert any(s.startswith("build.max_seq_len=-5") for s in said) and any(s.startswith(f"store_dir='{afile}'") for s in said), said
    assert all(p.field != "store_dir" for p in validate(compose(over), raise_on_error=False))  # the public check: fields
