"""Issue 28, low items: inputs that exited 1, printed tracebacks or blamed the wrong thing now exit 2 naming the
field (or file:line), the value and the fix; ``pipeline serve`` picks the newest package by recorded creation time
and honours ``verify_cache``.  Real config composition, real checkpoint inspection / export on a tiny real
checkpoint, the real eval-set and calibration readers, the real CLI in a subprocess, real tar archives."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from test_hardening import PIPELINE, _env

from pipeline.errors import MAX_LINE_BYTES, InputError


def _cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PIPELINE, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- model.name
@pytest.mark.parametrize("name", ["", "   ", "-1", ".hidden", "x" * 129])
def test_empty_dash_or_over_long_model_name_is_a_config_problem(name, tiny_llama):
    from pipeline.core.config import compose
    from pipeline.core.config import validate as validate_fields

    cfg = compose([f"model.path={tiny_llama}"])
    cfg.model.name = name
    problems = [p for p in validate_fields(cfg, raise_on_error=False) if p.field == "model.name"]
    assert problems and "at most 128 characters" in str(problems[0]) and "Fix:" in str(problems[0]), problems


def test_ordinary_model_names_pass(tiny_llama):
    from pipeline.core.config import compose
    from pipeline.core.config import validate as validate_fields

    for name in ("support-llama", "Llama-3.1-8B-Instruct", "x" * 128):
        cfg = compose([f"model.path={tiny_llama}", f"model.name={name}"])
        assert not [p for p in validate_fields(cfg, raise_on_error=False) if p.field == "model.name"], name


# --------------------------------------------------------------------------- config.json values
def _edited_checkpoint(src: Path, dst: Path, **fields) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_unknown_torch_dtype_names_the_field_not_the_tokenizer(tiny_llama, tmp_path):
    from pipeline.export.inspect import inspect_checkpoint

    ck = _edited_checkpoint(tiny_llama, tmp_path / "ck", torch_dtype="float7")
    with pytest.raises(InputError, match=r"torch_dtype='float7' is not a dtype .*Fix: correct \"torch_dtype\" in config\.json"):
        inspect_checkpoint(ck)


def test_unknown_hidden_act_names_the_field_instead_of_a_bare_keyerror(tiny_llama, tmp_path):
    ck = _edited_checkpoint(tiny_llama, tmp_path / "ck", hidden_act="nope")
    p = _cli([f"model.path={ck}", f"store_dir={tmp_path / 'store'}", "stages=[export]", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out[-2000:]
    assert "hidden_act='nope' is not an activation transformers knows" in out and "silu" in out, out[-2000:]
    assert "KeyError" not in out


def test_index_without_metadata_is_an_input_error_with_allow_external_files(tiny_llama, tmp_path):
    from safetensors import safe_open

    from pipeline.export.inspect import inspect_checkpoint

    ck = tmp_path / "ck"
    shutil.copytree(tiny_llama, ck)
    (ck / "model.safetensors").rename(ck / "model-00001-of-00001.safetensors")
    with safe_open(str(ck / "model-00001-of-00001.safetensors"), "pt") as f:
        names = list(f.keys())
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}))
    for allow in (False, True):
        with pytest.raises(InputError, match=r"model\.safetensors\.index\.json: metadata=None must be a JSON object.*Fix:"):
            inspect_checkpoint(ck, allow_external_files=allow)


# --------------------------------------------------------------------------- eval / calibration sets
def test_eval_set_that_is_a_directory_says_so(tmp_path):
    from pipeline.data.evalset import load_eval_set

    with pytest.raises(InputError, match=r"eval\.eval_set='.*' is a directory\. Fix: set eval\.eval_set to a \.jsonl file"):
        load_eval_set(tmp_path)


def _item(i: int, prompt: str) -> str:
    return json.dumps({"id": f"q{i}", "prompt": prompt, "reference": "a", "metric": "exact_match", "slice": "s"})


def test_eval_line_over_the_byte_limit_is_refused_naming_the_line(tmp_path):
    from pipeline.data.evalset import load_eval_set

    f = tmp_path / "eval.jsonl"
    f.write_text(_item(1, "ok") + "\n" + _item(2, "é" * (MAX_LINE_BYTES // 2 + 8)) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=rf"eval\.jsonl:2: the line holds [\d,]+ bytes, over the limit of {MAX_LINE_BYTES:,} bytes"):
        load_eval_set(f)
    f.write_text(_item(1, "ok") + "\n" + _item(2, "x" * (MAX_LINE_BYTES - 200)) + "\n", encoding="utf-8")
    assert len(load_eval_set(f)) == 2  # just under the limit is read


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_calibration_line_over_the_byte_limit_is_refused_naming_the_line(tmp_path, fmt):
    from pipeline.core.config.calibration import CalibrationConfig
    from pipeline.data.calibration import read_raw

    f = tmp_path / f"calib.{'jsonl' if fmt == 'jsonl' else 'txt'}"
    big = "y" * (MAX_LINE_BYTES + 1)
    f.write_text("\n".join([json.dumps({"text": "ok"}), json.dumps({"text": big})]) if fmt == "jsonl" else f"ok\n{big}\n")
    with pytest.raises(InputError, match=r"calib\.\w+:2: the line holds [\d,]+ bytes, over the limit"):
        read_raw(CalibrationConfig(format=fmt), f)


# --------------------------------------------------------------------------- CLI-level inputs
def test_serve_with_an_invalid_host_names_the_field(tmp_path):
    p = _cli(["serve", "package.host=256.1.1.1", str(tmp_path)], tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "package.host='256.1.1.1': is neither an IP address" in p.stderr and "Fix:" in p.stderr
    assert "another server" not in p.stdout + p.stderr


def test_config_accepts_ordinary_hosts():
    from pipeline.core.config.package import host_problems

    for h in ("127.0.0.1", "0.0.0.0", "::1", "localhost", "serving-1.example.com"):
        assert host_problems(h) == [], h
    for h in ("256.1.1.1", "1.2.3", "bad_host!", "-x.example.com", ""):
        assert host_problems(h), h


def test_unusable_hydra_run_dir_is_exit_2_without_a_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for run_dir in ("/proc/x", str(blocker / "sub")):
        p = _cli(["stages=[export]", f"hydra.run.dir={run_dir}"], tmp_path)
        out = p.stdout + p.stderr
        assert p.returncode == 2, out
        assert f"hydra.run.dir={run_dir!r}: the run folder cannot be created or written" in out and "Fix:" in out, out
        assert "Traceback" not in out
    # the same folder set in a user YAML's hydra block (a recheck: Hydra's FileNotFoundError traceback, exit 2)
    (tmp_path / "hyd.yaml").write_text("quant: none\nhydra:\n  run:\n    dir: /proc/x\n")
    p = _cli(["--config-dir", str(tmp_path), "--config-name", "hyd", "stages=[export]"], tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and "hyd.yaml: hydra.run.dir='/proc/x': the run folder cannot be created or written" in out, out
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out


def test_yaml_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    lines, prev = ["a: &a [x, x, x, x, x, x, x, x, x, x]"], "a"
    for name in "bcdef":  # 10^6 leaves from a ~300-byte file
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 10)}]")
        prev = name
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    (tmp_path / "loop.yaml").write_text("a: &a [1, *a]\n")
    for name, why in (("bomb", "aliases expand to over 100,000 values"), ("loop", "an alias refers to itself")):
        p = _cli(["--config-dir", str(tmp_path), "--config-name", name, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=60)
        assert p.returncode == 2 and why in p.stderr, p.stdout + p.stderr


# --------------------------------------------------------------------------- release archives / store
def test_release_archive_holding_a_symlink_is_an_input_error_and_nothing_is_left(tmp_path, monkeypatch):
    from test_harden_serve_release import _release

    from pipeline.release.archive import write_sha256sums
    from pipeline.serve.serve import resolve_repository

    monkeypatch.chdir(tmp_path)
    archive = _release(tmp_path / "r")
    with tarfile.open(archive, "r:gz") as src:
        members = [(m, src.extractfile(m).read() if m.isfile() else None) for m in src.getmembers()]
    with tarfile.open(archive, "w:gz") as dst:
        for m, data in members:
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
        link = tarfile.TarInfo("m-1/model_repository/preprocessing/1/alias.py")
        link.type, link.linkname = tarfile.SYMTYPE, "model.py"
        dst.addfile(link)
    write_sha256sums(archive.parent / "SHA256SUMS", [archive, archive.parent / "release_manifest.json"])
    with pytest.raises(InputError, match=r"alias\.py: the release holds a symbolic link \(to 'model\.py'\).*Fix:"):
        resolve_repository(str(archive), None)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _package(store: Path, key: str, created: str, version: str) -> Path:
    from pipeline.core.store import ArtifactStore

    with ArtifactStore(store).produce("package", key, {}) as (tmp, manifest):
        (tmp / "model_repository" / "ensemble").mkdir(parents=True)
        (tmp / "model_repository" / "ensemble" / "config.pbtxt").write_text(f'name: "ensemble"\n# {key}\n')
        (tmp / "release_manifest.json").write_text(json.dumps({"version": version}))
    d = ArtifactStore(store).path_for("package", key)
    m = json.loads((d / "manifest.json").read_text())
    m["created"] = created
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def test_newest_package_is_the_latest_recorded_creation_not_the_latest_mtime(tmp_path):
    from pipeline.serve.serve import find_latest_repository

    store = tmp_path / "store"
    new = _package(store, "a" * 64, "2026-12-01T10:00:00+00:00", "2")
    old = _package(store, "b" * 64, "2026-11-01T10:00:00+00:00", "1")
    now = time.time()
    os.utime(old / "manifest.json", (now + 60, now + 60))  # copied later (cp without -p) or a skewed clock
    os.utime(new / "manifest.json", (now - 3600, now - 3600))
    assert find_latest_repository(str(store)) == new / "model_repository"
    tie_9 = _package(store, "c" * 64, "2026-12-02T10:00:00+00:00", "9")
    tie_10 = _package(store, "d" * 64, "2026-12-02T10:00:00+00:00", "10")
    os.utime(tie_9 / "manifest.json", (now + 120, now + 120))
    assert find_latest_repository(str(store)) == tie_10 / "model_repository"  # same second: version 10 after 9


def test_serve_verify_cache_refuses_a_package_with_a_flipped_byte(tmp_path):
    from pipeline.serve.serve import resolve_repository

    store = tmp_path / "store"
    art = _package(store, "e" * 64, "2026-12-01T10:00:00+00:00", "1")
    f = art / "model_repository" / "ensemble" / "config.pbtxt"
    data = bytearray(f.read_bytes())
    data[0] ^= 0x01  # same size: only a re-hash notices
    f.write_bytes(bytes(data))
    assert resolve_repository(None, str(store)) == art / "model_repository"  # the size check alone trusts it
    with pytest.raises(InputError, match=r"verify_cache=true and a file of this artifact differs"):
        resolve_repository(None, str(store), verify=True)
    with pytest.raises(InputError, match=r"verify_cache=true and a file of this artifact differs"):
        resolve_repository(str(art), str(store), verify=True)
    bare = tmp_path / "bare"
    shutil.copytree(art / "model_repository", bare)
    with pytest.raises(InputError, match=r"verify_cache=true, but this folder is not a store artifact"):
        resolve_repository(str(bare), None, verify=True)
    p = _cli(["serve", f"store_dir={store}", "verify_cache=true"], tmp_path)  # the CLI passes the flag through
    assert p.returncode == 2 and "verify_cache=true and a file of this artifact differs" in p.stderr, p.stdout + p.stderr


# --------------------------------------------------------------------------- odd weights (export)
def test_integer_weights_in_a_float_checkpoint_are_refused(tmp_path):
    import tiny
    import torch
    from safetensors.torch import load_file, save_file

    from pipeline.errors import InputError
    from pipeline.export.inspect import inspect_checkpoint

    ck = tiny.make_checkpoint(tmp_path / "ck", "llama")
    sd = load_file(str(ck / "model.safetensors"))
    sd["model.layers.0.mlp.up_proj.weight"] = torch.randint(-8, 8, sd["model.layers.0.mlp.up_proj.weight"].shape, dtype=torch.int8)
    save_file(sd, str(ck / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"stored as integers, e\.g\. model\.layers\.0\.mlp\.up_proj\.weight \(I8\).*Fix:"):
        inspect_checkpoint(ck)


def test_an_embedding_far_larger_than_the_tokenizer_is_refused(tmp_path):
    import tiny

    from pipeline.errors import InputError
    from pipeline.export.write import export_checkpoint

    ck = tiny.make_checkpoint(tmp_path / "ck", "llama", vocab_size=20000)  # the tokenizer has 320 tokens
    with pytest.raises(InputError, match=r"20000 rows but the tokenizer only 320 tokens.*Fix: copy the model's own tokenizer"):
        export_checkpoint(ck, tmp_path / "out")


def test_a_directory_as_the_eval_set_is_refused_before_any_stage_runs(tmp_path, tiny_llama):
    import subprocess
    import sys

    (tmp_path / "evals").mkdir()
    store = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "pipeline.cli",
        f"model.path={tiny_llama}",
        f"eval.eval_set={tmp_path / 'evals'}",
        f"store_dir={store}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "progress=false",
        "build.max_seq_len=256",
        "build.max_input_len=200",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-2000:]
    assert "is a directory" in out and "Fix: set eval.eval_set to the data file" in out, out[-2000:]
    assert not (store / "export").exists()  # refused before export ran
