"""Fuzzing (hypothesis): config composition + validation + planning, and the JSONL loaders.

Any input must give a result or a clear error of a known kind (our InputError/ConfigError/
PipelineError, Hydra's composition/override errors, OmegaConf's config errors), never a traceback
from deep inside a library.  Examples are kept small so the file stays fast.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline.core.config import ConfigError, compose
from pipeline.errors import PipelineError
from pipeline.validation import validate

try:
    from hydra.errors import HydraException
except ImportError:  # pragma: no cover
    HydraException = ()  # type: ignore[assignment]
from omegaconf.errors import OmegaConfBaseException

CLEAR = (ConfigError, PipelineError, HydraException, OmegaConfBaseException)
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

KEYS = [
    "build.max_seq_len",
    "build.max_input_len",
    "build.max_num_tokens",
    "build.tokens_per_block",
    "build.max_batch_size",
    "build.kv_cache_free_gpu_mem_fraction",
    "build.enable_chunked_context",
    "build.speculative.max_draft_len",
    "quant.recipe",
    "quant.kv_cache_dtype",
    "parallel.tp_size",
    "parallel.pp_size",
    "quant.group_size",
    "quant.export_dtype",
    "quant.exclude_modules",
    "quant.sensitive_preset",
    "quant.vocab_padding",
    "target.gpu",
    "target.name",
    "model.dtype",
    "model.path",
    "model.hf_config.num_key_value_heads",
    "model.hf_config.hidden_size",
    "model.hf_config.rope_scaling",
    "model.hf_config.max_position_embeddings",
    "calibration.calib_max_seq_length",
    "eval.limit",
    "stages",
    "allow_unsafe_lengths",
    "nonexistent.key",
    "build",
    "quant",
    "model",
]
_TEXT = st.text(alphabet=string.ascii_letters + string.digits + "_-.,:/${}[]'\" =+~*\\", max_size=12)
VALUES = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        [
            "true",
            "false",
            "null",
            "[]",
            "{}",
            "[export,build]",
            "fp8",
            "int4_awq",
            "h100_sxm",
            "llama31_8b",
            "throughput",
            "1e9",
            "-1",
            "0",
            "bfloat16",
            "${oc.env:HOME}",
            "${nope:x}",
            "{a:1}",
            "[1,2",
        ]
    ),
    _TEXT,
)
OVERRIDE = st.tuples(st.sampled_from(KEYS), st.sampled_from(["", "+", "~", "++"]), VALUES).map(
    lambda t: f"{t[1]}{t[0]}={t[2]}" if t[1] != "~" else f"~{t[0]}"
)
BASE = ["model=llama31_8b", "target.gpu=h100_sxm"]


@FUZZ
@given(st.lists(OVERRIDE, max_size=4))
@example(["+build.max_seq_len=0", "~build"])  # found by this test (2026-12-01): OmegaConf's bare AttributeError
@example(["quant.group_size=0"])  # found by this test (2026-12-07, CI): ZeroDivisionError in the group-size preflight
def test_compose_validate_plan_never_crash(overrides):
    from pipeline.planner import plan

    try:
        cfg = compose(BASE + overrides)
    except CLEAR:
        return
    try:
        problems = validate(cfg, raise_on_error=False)
    except CLEAR:
        return
    assert isinstance(problems, list)
    for p in problems:
        assert p.field and p.message  # every problem names its field
    try:
        p = plan(cfg)
    except CLEAR:
        return
    assert p.status in ("ok", "warn", "refused", "unplanned")
    json.dumps(p.to_json())


JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)
EVAL_ROW = st.fixed_dictionaries(
    {},
    optional={
        "id": JSON_VALUE | st.text(max_size=6),
        "prompt": JSON_VALUE | st.text(max_size=20),
        "reference": JSON_VALUE,
        "metric": st.sampled_from(["exact_match", "rouge_l", "nope"]) | JSON_VALUE,
        "slice": st.text(max_size=5) | JSON_VALUE,
        "max_new_tokens": st.integers(-5, 10**6) | JSON_VALUE,
        "messages": JSON_VALUE,
        "text": JSON_VALUE | st.text(max_size=20),
        "stop": JSON_VALUE,
        "metric_args": JSON_VALUE,
    },
)
LINE = st.one_of(
    EVAL_ROW.map(json.dumps), JSON_VALUE.map(json.dumps), st.text(max_size=30), st.binary(max_size=30).map(lambda b: b.decode("latin-1"))
)


def _write(tmp: Path, name: str, lines: list[str], raw: bytes | None) -> Path:
    p = tmp / name
    p.write_bytes(raw if raw is not None else "\n".join(lines).encode("utf-8", errors="surrogatepass"))
    return p


@FUZZ
@given(lines=st.lists(LINE, max_size=6), raw=st.none() | st.binary(max_size=60))
def test_eval_set_loader_fuzz(tmp_path, lines, raw):
    dataset = pytest.importorskip("pipeline.data.evalset")
    p = _write(tmp_path, "eval.jsonl", lines, raw)
    try:
        items = dataset.load_eval_set(p)
    except PipelineError as e:
        assert str(p) in str(e)  # the message names the file
        return
    assert all(isinstance(i.id, str) for i in items)


@FUZZ
@given(lines=st.lists(LINE, max_size=6), raw=st.none() | st.binary(max_size=60))
def test_calibration_loader_fuzz(tmp_path, lines, raw):
    calibration = pytest.importorskip("pipeline.data.calibration")
    from pipeline.core.config import CalibrationConfig

    p = _write(tmp_path, "calib.jsonl", lines, raw)
    try:
        rows, dropped, fmt = calibration.read_raw(CalibrationConfig(path=str(p), format="jsonl"), p)
    except PipelineError:
        return
    assert fmt == "jsonl" and dropped >= 0 and isinstance(rows, list)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, max_size=6))
def test_eval_length_check_fuzz(tiny_llama, tmp_path, lines):
    """The cross-field eval-set length check skips what it cannot read instead of crashing."""
    from pipeline.validation import stage_problems

    p = _write(tmp_path, "e.jsonl", lines, None)
    cfg = compose([f"model.path={tiny_llama}", f"eval.eval_set={p}", "build.max_seq_len=256", "build.max_input_len=128"])
    assert isinstance(stage_problems(cfg), list)


# --------------------------------------------------------------------------- config.json field types (issue 16 item 9)
def _valid(kind: str, v) -> bool:
    import math

    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "num":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str)
    if kind == "dtype":  # a string naming a dtype a loader reads (export/inspect.py CHECKPOINT_DTYPES)
        from pipeline.export.inspect import CHECKPOINT_DTYPES

        return isinstance(v, str) and v.removeprefix("torch.") in CHECKPOINT_DTYPES
    if kind == "id":  # token id, a list of them, or null
        items = v if isinstance(v, list) else [v]
        return v is None or (bool(items) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items))
    raise AssertionError(kind)


#: (config.json field, expected kind, may be null); nested rope_scaling fields are written as "rope_scaling.<k>".
TYPED_FIELDS = [
    ("vocab_size", "int", False),
    ("hidden_size", "int", False),
    ("num_hidden_layers", "int", False),
    ("num_attention_heads", "int", False),
    ("num_key_value_heads", "int", True),
    ("max_position_embeddings", "int", False),
    ("rope_theta", "num", True),
    ("rms_norm_eps", "num", False),
    ("tie_word_embeddings", "bool", False),
    ("attention_bias", "bool", False),
    ("hidden_act", "str", False),
    ("torch_dtype", "dtype", True),
    ("eos_token_id", "id", True),
    ("bos_token_id", "id", True),
    ("pad_token_id", "id", True),
    ("rope_scaling.factor", "num", True),
    ("rope_scaling.original_max_position_embeddings", "int", True),
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=4,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(TYPED_FIELDS), value=JSON_VALUES)
def test_config_json_wrong_types_exit_2_naming_the_field(tiny_llama, tmp_path_factory, field, value):
    """A wrong JSON type in any known config.json field: InputError (exit 2) naming config.json and the field,
    never a traceback and never the tokenizer; a right type passes the type check."""
    import shutil

    from hypothesis import assume

    from pipeline.errors import EXIT_INPUT
    from pipeline.export.inspect import check_config_types

    name, kind, nullable = field
    assume(not (value is None and nullable))
    cfg = json.loads((tiny_llama / "config.json").read_text())
    if name.startswith("rope_scaling."):
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            name.split(".", 1)[1]: value,
        }
    else:
        cfg[name] = value
    if _valid(kind, value):
        check_config_types(cfg, "config.json")  # accepted types are never refused
        return
    ck = tmp_path_factory.mktemp("fuzzck")
    for f in tiny_llama.iterdir():
        if f.name != "config.json":
            (ck / f.name).symlink_to(f)
    (ck / "config.json").write_text(json.dumps(cfg))
    from pipeline.export.inspect import inspect_checkpoint

    with pytest.raises(PipelineError) as e:
        inspect_checkpoint(ck, allow_external_files=True)  # the other files are links to the fixture's
    shutil.rmtree(ck, ignore_errors=True)
    msg = str(e.value)
    assert e.value.exit_code == EXIT_INPUT
    assert "config.json" in msg and name in msg and "tokenizer" not in msg, msg
