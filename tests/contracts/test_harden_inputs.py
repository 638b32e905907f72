"""Issue 16 items 5 and 9, issue 11 item 2 (export half), issue 12 item 7.

Path confinement (links and index shard names outside ``model.path``), wrong types in ``config.json`` blamed on
the field (exit 2, never a traceback), NaN/inf and lossy casts refused at export naming the tensor, and a user's
model getting its own name and dtype. Real export code on tiny real checkpoints (tests/tiny.py); the CLI cases
run the real ``pipeline`` command.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import compose
from pipeline.errors import InputError
from pipeline.export.inspect import inspect_checkpoint
from pipeline.export.write import export_checkpoint
from pipeline.runner import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = str(ROOT / ".venv" / "bin" / "pipeline")


def copy(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


def edit_config(d: Path, **kw) -> Path:
    c = json.loads((d / "config.json").read_text())
    c.update(kw)
    (d / "config.json").write_text(json.dumps(c))
    return d


def run(ckpt: Path, store: Path, *extra: str):
    cfg = compose([f"model.path={ckpt}", "stages=[export]", f"store_dir={store}", "progress=false", *extra])
    out = io.StringIO()
    summary = run_pipeline(cfg, overrides=[f"model.path={ckpt}", *extra], console=Console(file=out, width=250))
    return summary, out.getvalue()


def shard_index(d: Path, shard: str) -> None:
    from safetensors import safe_open

    with safe_open(str((d / shard) if not Path(shard).is_absolute() else shard), "np") as f:
        names = list(f.keys())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {n: shard for n in names}}))


# --------------------------------------------------------------------------- item 5: path confinement
def test_symlink_to_a_file_outside_the_checkpoint_is_refused(tiny_llama, tmp_path):
    ck = copy(tiny_llama, tmp_path / "ck")
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("TOP-SECRET-CONTENT")
    (ck / "added_tokens.json").unlink(missing_ok=True)
    (ck / "added_tokens.json").symlink_to(secret)
    with pytest.raises(InputError, match=r"added_tokens\.json: a symbolic link to .*outside model\.path.*allow_external_files"):
        inspect_checkpoint(ck)
    summary, _ = run(ck, tmp_path / "store")
    assert summary.exit_code == 2 and "allow_external_files" in summary.error
    assert "TOP-SECRET" not in "".join(p.read_text(errors="ignore") for p in (tmp_path / "store").rglob("*") if p.is_file())
    inspect_checkpoint(ck, allow_external_files=True)  # the documented opt-in


def test_index_shard_names_outside_the_checkpoint_are_refused_and_keyed_when_allowed(tiny_llama, tmp_path):
    ck = copy(tiny_llama, tmp_path / "ck")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(ck / "model.safetensors", outside / "model.safetensors")
    shard_index(ck, "../elsewhere/model.safetensors")
    with pytest.raises(InputError, match=r"weight_map\[.*\]='\.\./elsewhere/model\.safetensors' resolves to .* outside model\.path"):
        inspect_checkpoint(ck)
    summary, _ = run(ck, tmp_path / "store")
    assert summary.exit_code == 2

    # allowed explicitly: the outside shard's content is part of the cache key (no stale hit after it changes)
    first, _ = run(ck, tmp_path / "store", "model.allow_external_files=true")
    assert first.exit_code == 0, first.error
    from safetensors.torch import load_file, save_file

    sd = load_file(str(outside / "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"] * 2
    save_file(sd, str(outside / "model.safetensors"), metadata={"format": "pt"})
    second, _ = run(ck, tmp_path / "store", "model.allow_external_files=true")
    assert second.exit_code == 0, second.error
    assert second.stages[0].status == "ran" and second.stages[0].key != first.stages[0].key

    # and the rest of the run reads it too: evaluate's baseline loads the source checkpoint (transformers >= 5.25
    # refuses a `..` shard name outright; the run used to end in evaluate with exit 1)
    evs = tmp_path / "eval.jsonl"
    rows = [
        {"id": f"o{i}", "prompt": f"Where is order ORD-1{i}?", "reference": f"ORD-1{i}", "metric": "exact_match", "slice": "order"}
        for i in range(2)
    ]
    evs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chain = ["quant=none", "stages=[evaluate]", f"eval.eval_set={evs}", "eval.runners=[baseline,engine]", "eval.max_new_tokens=4"]
    chain += ["build.max_input_len=128", "build.max_seq_len=160", "eval.gate.mode=exploratory"]
    whole, out = run(ck, tmp_path / "store", "model.allow_external_files=true", *chain)
    assert whole.exit_code == 0, (whole.error, out[-2000:])
    assert [r.status for r in whole.stages] == ["cached", "ran", "ran", "ran"]


def test_absolute_and_non_string_shard_names_are_refused(tiny_llama, tmp_path):
    ck = copy(tiny_llama, tmp_path / "ck")
    shard_index(ck, str(ck / "model.safetensors"))
    with pytest.raises(InputError, match="absolute path"):
        inspect_checkpoint(ck)
    idx = json.loads((ck / "model.safetensors.index.json").read_text())
    first = next(iter(idx["weight_map"]))
    idx["weight_map"] = {k: "model.safetensors" for k in idx["weight_map"]}
    idx["weight_map"][first] = 5
    (ck / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(InputError, match=rf"weight_map\['{first}'\]=5: expected a non-empty file name"):
        inspect_checkpoint(ck)


# --------------------------------------------------------------------------- item 9: the field is named, exit 2
@pytest.mark.parametrize(
    "field,value,shown",
    [
        ("rope_theta", "10000", "rope_theta='10000'"),
        ("rope_scaling", {"rope_type": "linear", "factor": "2.0"}, "rope_scaling.factor='2.0'"),
        ("eos_token_id", "2", "eos_token_id='2'"),
        ("eos_token_id", [2, "x"], "eos_token_id=[2, 'x']"),
        ("tie_word_embeddings", "false", "tie_word_embeddings='false'"),
        ("max_position_embeddings", "256", "max_position_embeddings='256'"),
        ("max_position_embeddings", 256.5, "max_position_embeddings=256.5"),
    ],
)
def test_wrong_types_in_config_json_name_the_field_not_the_tokenizer(tiny_llama, tmp_path, field, value, shown):
    ck = edit_config(copy(tiny_llama, tmp_path / "ck"), **{field: value})
    with pytest.raises(InputError) as e:
        inspect_checkpoint(ck)
    msg = str(e.value)
    assert "config.json" in msg and shown in msg and "tokenizer" not in msg


@pytest.mark.parametrize("case", ["truncated", "garbage"])
def test_corrupt_tokenizer_json_names_the_file(tiny_llama, tmp_path, case):
    ck = copy(tiny_llama, tmp_path / "ck")
    tj = ck / "tokenizer.json"
    tj.write_bytes(tj.read_bytes()[:700] if case == "truncated" else b'{"version": "1.0", "model": 5}')
    with pytest.raises(InputError, match="tokenizer"):
        export_checkpoint(ck, tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out" / "hf").exists()


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="250")
    return subprocess.run(
        [PIPELINE, *args, f"hydra.run.dir={cwd / 'run'}", f"store_dir={cwd / 'store'}", "progress=false", "allow_unsafe_lengths=true"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: (d / "tokenizer.json").write_bytes((d / "tokenizer.json").read_bytes()[:700]), "tokenizer.json"),
        (lambda d: edit_config(d, rope_theta="10000"), "rope_theta"),
        (lambda d: edit_config(d, rope_scaling={"rope_type": "linear", "factor": "2"}), "rope_scaling.factor"),
    ],
    ids=["tokenizer_truncated", "rope_theta_str", "rope_factor_str"],
)
def test_cli_bad_inputs_exit_2_naming_the_field_without_traceback(tiny_llama, tmp_path, mutate, needle):
    """The full default chain (validation, planner, eval-length check read the checkpoint before export)."""
    ck = copy(tiny_llama, tmp_path / "ck")
    mutate(ck)
    r = _cli([f"model.path={ck}"], tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert needle in out and "Traceback" not in out


# --------------------------------------------------------------------------- issue 11 item 2: lossy casts, NaN
def _bf16_with(tiny_dir: Path, value: float) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    import tiny
    from safetensors.torch import load_file, save_file

    ck = tiny.make_checkpoint(tiny_dir, "llama", dtype="bfloat16")
    sd = load_file(str(ck / "model.safetensors"))
    sd["model.layers.0.mlp.down_proj.weight"][3, 5] = value
    save_file(sd, str(ck / "model.safetensors"), metadata={"format": "pt"})
    return ck


def test_bf16_value_that_overflows_fp16_is_refused_naming_the_tensor(tmp_path):
    ck = _bf16_with(tmp_path / "bf16", 1e5)
    summary, _ = run(ck, tmp_path / "store", "model.dtype=float16")
    assert summary.exit_code == 2
    assert "model.layers.0.mlp.down_proj.weight: 1 value(s) overflow to inf" in summary.error
    assert "model.dtype=bfloat16" in summary.error  # the fix
    assert not [p for p in (tmp_path / "store" / "export").iterdir() if not p.name.startswith(".")]


def test_nan_weight_is_refused_at_export_naming_the_tensor(tmp_path):
    ck = _bf16_with(tmp_path / "nan", float("nan"))
    with pytest.raises(InputError, match=r"model\.layers\.0\.mlp\.down_proj\.weight: 1 NaN/inf value"):
        export_checkpoint(ck, tmp_path / "out", dtype="bfloat16")
    assert not (tmp_path / "out" / "hf").exists()


# --------------------------------------------------------------------------- issue 12 item 7: own name and dtype
def test_user_checkpoint_gets_its_own_name_and_dtype_unless_set(tmp_path):
    ck = _bf16_with(tmp_path / "my-bf16-model", 1e5)  # 1e5 fits bf16: nothing is lost when the dtype follows the checkpoint
    cfg = compose([f"model.path={ck}"])
    assert (cfg.model.name, cfg.model.dtype, cfg.quant.export_dtype) == ("my-bf16-model", "bfloat16", "bfloat16")
    cfg = compose([f"model.path={ck}", "model.name=mine", "model.dtype=float32", "quant.export_dtype=float16"])
    assert (cfg.model.name, cfg.model.dtype, cfg.quant.export_dtype) == ("mine", "float32", "float16")
    assert (compose([]).model.name, compose([]).model.dtype) == ("support-llama", "float32")  # the embedded default

    summary, out = run(ck, tmp_path / "store")
    assert summary.exit_code == 0, summary.error
    assert "model my-bf16-model (checkpoint folder), dtype bfloat16 (checkpoint torch_dtype)" in out
    assert summary.to_json()["model"] == {
        "name": "my-bf16-model",
        "name_source": "checkpoint folder",
        "dtype": "bfloat16",
        "dtype_source": "checkpoint torch_dtype",
    }
    from safetensors.torch import load_file

    sd = load_file(str(Path(summary.stages[0].path) / "hf" / "model.safetensors"))
    w = sd["model.layers.0.mlp.down_proj.weight"]
    assert str(w.dtype) == "torch.bfloat16" and float(w[3, 5]) == pytest.approx(1e5, rel=1e-2)


@pytest.mark.parametrize(
    "override, field, stages",
    [
        ("calibration.path={missing}", "calibration.path", {"export": "not-run", "quantize": "failed"}),
        ("eval.eval_set={missing}", "eval.eval_set", {"export": "not-run", "quantize": "not-run", "evaluate": "failed"}),
    ],
)
def test_missing_data_file_names_the_field_and_the_stage_that_reads_it(tiny_llama, tmp_path, override, field, stages):
    """Checked before any stage runs (exit 2): the message names the config field and its value, and the summary
    blames the stage that reads the file, the others not run (it blamed the first stage, export, before)."""
    missing = tmp_path / "nope.jsonl"
    ov = [f"model.path={tiny_llama}", "quant=int8_wo", "eval.runners=[baseline,simulated]", f"stages=[{','.join(stages)}]"]
    ov += ["build.max_input_len=96", "build.max_seq_len=128"]
    ov.append(override.format(missing=missing))
    cfg = compose([f"store_dir={tmp_path / 'store'}", "progress=false", *ov])
    summary = run_pipeline(cfg, overrides=ov, console=Console(file=io.StringIO(), width=200))
    assert summary.exit_code == 2, summary.error
    assert summary.error.startswith(f"{field}={missing}: not found") and f"set {field} to an existing path" in summary.error
    assert {r.stage: r.status for r in summary.stages} == stages
    assert "PosixPath" not in summary.error


def test_a_configuration_error_blames_no_stage(tiny_llama, tmp_path):
    """A config problem is found before any stage runs: every stage is reported not run (export was marked failed)."""
    ov = [f"model.path={tiny_llama}", "quant=none", "eval.gate.min_score=90", "stages=[export,evaluate]"]
    cfg = compose([f"store_dir={tmp_path / 'store'}", "progress=false", *ov])
    summary = run_pipeline(cfg, overrides=ov, console=Console(file=io.StringIO(), width=200))
    assert summary.exit_code == 2 and "eval.gate.min_score=90.0: must be in [0, 1]" in summary.error, summary.error
    assert "(0.9 = 90 %)" in summary.error and "Fix: e.g. eval.gate.min_score=0.9" in summary.error
    assert summary.stages and {r.status for r in summary.stages} == {"not-run"}


def test_every_missing_data_file_is_reported_at_once(tiny_llama, tmp_path):
    """Both missing files in one error (only the first was named); the calibration set, which quantize and
    evaluate's held-out fidelity both read, is named once."""
    cal, ev = tmp_path / "c.jsonl", tmp_path / "e.jsonl"
    ov = [f"model.path={tiny_llama}", "quant=int8_wo", "eval.runners=[baseline,simulated]", "stages=[export,quantize,evaluate]"]
    ov += ["build.max_input_len=96", "build.max_seq_len=128", f"calibration.path={cal}", f"eval.eval_set={ev}"]
    cfg = compose([f"store_dir={tmp_path / 'store'}", "progress=false", *ov])
    summary = run_pipeline(cfg, overrides=ov, console=Console(file=io.StringIO(), width=200))
    assert summary.exit_code == 2 and summary.error.startswith("2 missing inputs:"), summary.error
    assert summary.error.count(f"calibration.path={cal}: not found") == 1 and f"eval.eval_set={ev}: not found" in summary.error
    assert {r.stage: r.status for r in summary.stages} == {"export": "not-run", "quantize": "failed", "evaluate": "not-run"}
