"""Runner + artifact store: content-addressed cache, manifests, summaries, interruption, multirun comparison.

Uses the real export stage on a tiny real checkpoint; the CLI tests run ``python -m pipeline`` in a subprocess.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import compose
from pipeline.core.store import ArtifactStore, digest_path
from pipeline.runner import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def run(ckpt: Path, store: Path, *extra: str, summary_dir: Path | None = None):
    cfg = compose([f"model.path={ckpt}", "stages=[export]", f"store_dir={store}", "progress=false", *extra])
    summary = run_pipeline(cfg, overrides=list(extra), summary_dir=summary_dir, console=Console(file=io.StringIO()))
    assert summary.exit_code == 0, summary.error
    (rep,) = summary.stages
    return rep


def trusted_dirs(store: Path) -> list[Path]:
    d = store / "export"
    return sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")) if d.exists() else []


@pytest.fixture()
def ckpt(tiny_llama, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_llama, tmp_path / "ckpt"))


def test_renaming_the_model_reuses_the_export_and_the_package_keys_on_the_name(ckpt, tmp_path):
    """model.name is a label: a rename is an export cache hit (fresh-user trial: it re-ran the whole chain), while the
    package stage, which writes the name into the release, keys on it."""
    from pipeline.package.stage import STAGE as PACKAGE

    store = tmp_path / "store"
    first = run(ckpt, store, "model.name=alpha")
    second = run(ckpt, store, "model.name=beta")
    assert first.status == "ran" and second.status == "cached" and second.key == first.key
    named = [compose([f"model.path={ckpt}", f"model.name={n}"]) for n in ("alpha", "beta")]
    assert [PACKAGE.key_extras(c, {})["model_name"] for c in named] == ["alpha", "beta"]


def test_miss_then_hit_manifest_and_summary(ckpt, tmp_path):
    store = tmp_path / "store"
    first = run(ckpt, store, summary_dir=tmp_path / "run1")
    assert first.status == "ran" and first.path and Path(first.path).is_dir()
    second = run(ckpt, store, summary_dir=tmp_path / "run2")
    assert second.status == "cached" and second.key == first.key and second.path == first.path

    # the run summary lists every stage with status, time and output path
    s1 = json.loads((tmp_path / "run1" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "run2" / "summary.json").read_text())
    assert s1["schema"] == "pipeline.summary/v1" and s1["ok"] is True and s1["exit_code"] == 0
    assert [(st["stage"], st["status"]) for st in s1["stages"]] == [("export", "ran")]
    assert [(st["stage"], st["status"]) for st in s2["stages"]] == [("export", "cached")]
    for st in s1["stages"] + s2["stages"]:
        assert st["path"] == first.path and st["seconds"] >= 0 and st["headline"]["architecture"] == "LlamaForCausalLM"

    mf = json.loads((Path(first.path) / "manifest.json").read_text())
    assert mf["complete"] is True and mf["key"] == first.key and mf["stage"] == "export"
    assert mf["external"]["checkpoint"]["digest"] == digest_path(ckpt) and HEX64.match(mf["external"]["checkpoint"]["digest"])
    assert mf["config"]["model"]["dtype"] == "float32" and "path" not in mf["config"]["model"]  # path is a runtime field
    assert {"python", "transformers", "safetensors", "torch"} <= set(mf["versions"]) and mf["versions"]["transformers"]
    assert mf["timings"]["run_s"] > 0 and "produce_s" in mf["timings"]
    assert mf["host"]["cpu"] or mf["host"]["gpus"]
    assert HEX64.match(mf["outputs"]["hf/model.safetensors"]["sha256"]) and HEX64.match(mf["output_digest"])
    assert mf["result"]["headline"] == {"architecture": "LlamaForCausalLM", "params": 393856, "dtype": "float32"}

    # paths never enter the key: the same bytes in another folder (or behind symlinks, as in a
    # Hugging Face hub cache snapshot: snapshots/<rev>/<file> -> ../../blobs/<sha256>) are a cache hit
    repo = tmp_path / "hub" / "models--org--ckpt"  # same derived model.name ("ckpt") as the folder above
    links = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    links.mkdir(parents=True)
    for f in ckpt.iterdir():
        blob = repo / "blobs" / digest_path(f)
        shutil.copyfile(f, blob)
        (links / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    assert run(links, store).status == "cached"


def test_runs_from_inside_the_checkpoint_folder_hit_the_cache(ckpt, tmp_path):
    """A fresh-user trial: `pipeline model.path=. stages=[export]` from inside the checkpoint folder gave a new export
    key every run: the default store (artifacts/, with its lock files and .tmp-* folders) and Hydra's run folder
    (runs/<time>-<job>/pipeline.log, still being written) were inside the folder and hashed, and so were a git clone's
    .git/ (the weights again, as LFS objects) and huggingface_hub's .cache/. The checkpoint's input files
    (pipeline.core.store.input_files) leave them out, for the cache key and for model_info.json's files; a folder that
    holds none of them keeps its digest (digest_path)."""
    from pipeline.core.store import digest_input, input_files

    clean, names = digest_path(ckpt), sorted(p.name for p in ckpt.iterdir())
    assert digest_input(ckpt, [tmp_path / "store", tmp_path / "run"]) == clean and sorted(input_files(ckpt)) == names
    (ckpt / ".git" / "lfs").mkdir(parents=True)
    (ckpt / ".git" / "lfs" / "object").write_bytes((ckpt / "model.safetensors").read_bytes())
    (ckpt / ".cache" / "huggingface").mkdir(parents=True)
    (ckpt / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("etag\n")
    cmd = [sys.executable, "-m", "pipeline", "model.path=.", "stages=[export]", "progress=false"]
    keys = []
    for _ in range(2):
        r = subprocess.run(cmd, env=_cli_env(), cwd=ckpt, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        (summary,) = sorted((ckpt / "runs").glob("*/summary.json"), key=lambda f: f.stat().st_mtime)[-1:]
        (st,) = json.loads(summary.read_text())["stages"]
        keys.append((st["key"], st["status"]))
    assert keys[1] == (keys[0][0], "cached"), keys
    art = ArtifactStore(ckpt / "artifacts").lookup("export", keys[0][0], verify=True)
    assert art is not None and sorted(json.loads((art.path / "model_info.json").read_text())["files"]) == names
    assert json.loads((art.path / "manifest.json").read_text())["external"]["checkpoint"]["digest"] == clean
    again = run(ckpt, ckpt / "artifacts", summary_dir=ckpt / "runs" / "api")  # store_dir=<model.path>/artifacts
    assert (again.status, again.key) == ("cached", keys[0][0])


def test_changed_input_byte_is_a_miss_with_a_new_key(ckpt, tmp_path):
    store = tmp_path / "store"
    k0 = run(ckpt, store).key
    with open(ckpt / "tokenizer.json", "ab") as f:  # one more byte (still valid JSON)
        f.write(b"\n")
    r1 = run(ckpt, store)
    assert r1.status == "ran" and r1.key != k0
    w = ckpt / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight (data section, header unchanged)
    w.write_bytes(bytes(data))
    r2 = run(ckpt, store)
    assert r2.status == "ran" and r2.key not in (k0, r1.key)
    assert r2.status == "ran" and run(ckpt, store).status == "cached"
    assert len(trusted_dirs(store)) == 3


def test_force_reruns_and_damaged_artifact_is_not_trusted(ckpt, tmp_path):
    store = tmp_path / "store"
    first = run(ckpt, store)
    forced = run(ckpt, store, "force=true")
    assert forced.status == "ran" and forced.key == first.key
    # a published artifact that lost a file is never trusted: the next run re-produces it
    (Path(first.path) / "hf" / "model.safetensors").unlink()
    assert ArtifactStore(store).lookup("export", first.key) is None
    again = run(ckpt, store)
    assert again.status == "ran" and (Path(again.path) / "hf" / "model.safetensors").is_file()
    assert ArtifactStore(store).lookup("export", first.key, verify=True) is not None


def _cli_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), TERM="dumb", COLUMNS="200", TOKENIZERS_PARALLELISM="false")


def test_killed_stage_leaves_no_trusted_artifact(ckpt, tmp_path):
    store = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        f"model.path={ckpt}",
        "stages=[export]",
        f"store_dir={store}",
        "progress=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.Popen(cmd, env=_cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp_dirs: list[Path] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            tmp_dirs = list((store / "export").glob(".tmp-*")) if (store / "export").exists() else []
            if tmp_dirs:
                break
            time.sleep(0.005)
        assert tmp_dirs, f"the export never started writing (exit code {proc.poll()})"
        proc.send_signal(signal.SIGKILL)  # no cleanup handlers run: the worst case
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert trusted_dirs(store) == []  # only the untrusted .tmp- folder is left
    assert list((store / "export").glob(".tmp-*"))
    rep = run(ckpt, store)
    assert rep.status == "ran" and ArtifactStore(store).lookup("export", rep.key, verify=True) is not None
    assert not list((store / "export").glob(".tmp-*"))  # the dead run's leftover was removed under the lock


def test_multirun_joblib_writes_one_comparison_and_fails_if_a_job_failed(ckpt, tmp_path):
    """A sweep over model dtypes in two joblib worker processes: float16 and float32 export; int8 is not an
    export dtype (a config error, exit 2).

    One comparison covers every job; the sweep's exit code is the failed job's although that job ran in
    another process (``MultirunComparison`` reads the jobs' summary.json files).
    """
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep}",
        f"model.path={ckpt}",
        "stages=[export]",
        f"store_dir={tmp_path / 'store'}",
        "progress=false",
        "model.dtype=float16,float32,int8",
    ]
    r = subprocess.run(cmd, env=_cli_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    doc = json.loads((sweep / "comparison.json").read_text())
    md = (sweep / "comparison.md").read_text().splitlines()
    assert len(md) == 2 + 3 and "export.dtype" in md[0]
    assert doc["schema"] == "pipeline.comparison/v1" and doc["exit_code"] == 2 and len(doc["rows"]) == 3
    by_dtype = {next(o.split("=", 1)[1] for o in row["overrides"].split() if o.startswith("model.dtype=")): row for row in doc["rows"]}
    assert set(by_dtype) == {"float16", "float32", "int8"}
    for dt in ("float16", "float32"):
        row = by_dtype[dt]
        assert row["exit_code"] == 0 and row["export.dtype"] == dt and row["export.architecture"] == "LlamaForCausalLM"
        assert row["export.params"] == 393856
    assert by_dtype["int8"]["exit_code"] == 2 and "model.dtype" in by_dtype["int8"]["error"]
    assert len(list((tmp_path / "store" / "export").glob("[!.]*"))) == 2  # one artifact per dtype


def test_comparison_on_a_narrow_terminal_prints_one_block_per_variant(tmp_path):
    """Nine columns on an 80-column terminal shrank every cell to "e…" (fresh-user trial): the console then lists
    each variant's values instead; a wide terminal keeps the table.  The files always hold every column."""
    import io

    from rich.console import Console

    from pipeline.report import write_comparison

    for i, (q, score) in enumerate((("none", 0.9069), ("int4_awq", 0.9097))):
        d = tmp_path / str(i)
        d.mkdir()
        head = {"score": score, "drop": 0.0, "agreement": 0.99, "kld": 0.0049, "top1": 0.996, "gate": "pass", "runner": "engine"}
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "overrides": [f"quant={q}", "store_dir=/x"],
                    "exit_code": 0,
                    "stages": [{"stage": "evaluate", "headline": head}, {"stage": "quantize", "headline": {"recipe": q}}],
                }
            )
        )
    narrow = io.StringIO()
    write_comparison(tmp_path, Console(file=narrow, width=80))
    out = narrow.getvalue()
    assert "quant=int4_awq" in out and "0.9097" in out and "eval.score" in out and "…" not in out, out
    wide = io.StringIO()
    write_comparison(tmp_path, Console(file=wide, width=250))
    assert "┃ variant" in wide.getvalue() and "0.9097" in wide.getvalue()
    assert "quantize.recipe" in json.loads((tmp_path / "comparison.json").read_text())["columns"]


def test_target_auto_and_the_target_it_resolves_to_share_the_downstream_keys():
    """``make run`` uses ``target=auto``; a later ``target=onnxruntime_genai`` run on the same CPU host must reuse its
    evaluate (and so its package) instead of redoing them: the key holds the resolved target, as the build key does.
    A target that resolves differently still gets its own key."""
    from pipeline.core.stage import get_stage
    from pipeline.core.targets import resolve_target

    auto, explicit, trt = (compose([f"target={t}"]) for t in ("auto", "onnxruntime_genai", "tensorrt_llm"))
    assert resolve_target(auto).name == "onnxruntime_genai"  # this host has no GPU / TensorRT-LLM
    for stage in ("build", "evaluate"):
        extras = get_stage(stage).key_extras
        assert extras(auto, {}) == extras(explicit, {}), stage
        assert extras(trt, {}) != extras(explicit, {}), stage


@pytest.mark.parametrize(
    "raised, code",
    [
        ("wrapped", 130),  # transformers re-raises an import the Ctrl-C hit as ModuleNotFoundError (fresh-user trial)
        ("plain", 1),
    ],
)
def test_a_ctrl_c_a_library_re_raised_as_its_own_error_exits_130(tmp_path, monkeypatch, raised, code):
    """A KeyboardInterrupt anywhere in an exception's chain is an interrupt (exit 130, summary says interrupted);
    an ordinary error stays a stage failure (exit 1)."""
    import pipeline.runner as runner
    from pipeline.core.config import compose

    def run_stages(cfg, console, state):
        if raised == "plain":
            raise RuntimeError("a real bug")
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ki:
            try:
                raise RuntimeError("class body") from ki
            except RuntimeError as e:
                raise ModuleNotFoundError("Could not import module 'LlamaConfig'") from e

    monkeypatch.setattr(runner, "_run_stages", run_stages)
    summary = runner.run_pipeline(compose([f"store_dir={tmp_path}", "stages=[export]", "progress=false"]), console=None)
    assert summary.exit_code == code and (summary.error == "interrupted") == (code == 130), summary.error


def test_an_error_after_the_commands_handler_received_an_interrupt_is_the_interrupt(tmp_path, monkeypatch):
    """A recheck: a SIGTERM during quantize's model load came out of safetensors' get_tensor as a ValueError with no
    context (exit 1, a traceback). Once the command's handler has received an interrupt (errors.INTERRUPT), the error
    it caused is the interrupt: exit 130."""
    import pipeline.runner as runner
    from pipeline import errors
    from pipeline.core.config import compose

    def run_stages(cfg, console, state):
        errors.INTERRUPT["received"] = True  # what pipeline.cli._interrupt_once records before it raises
        raise ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'")

    monkeypatch.setattr(runner, "_run_stages", run_stages)
    monkeypatch.setitem(errors.INTERRUPT, "received", False)
    summary = runner.run_pipeline(compose([f"store_dir={tmp_path}", "stages=[export]", "progress=false"]), console=None)
    assert summary.exit_code == 130 and summary.error == "interrupted", summary.error


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_interrupted_stage_says_so_with_the_time_it_ran(tmp_path, monkeypatch, wrapped):
    """An interrupted stage's row read "failed 0.00 s" (trial): it says interrupted, with the time the stage had run.
    summary.json records it as every interrupt is recorded (status failed, error interrupted), with those seconds."""
    import pipeline.runner as runner
    from pipeline.core.config import compose

    def run_stages(cfg, console, state):
        state.started["export"] = time.time() - 2.5  # export began 2.5 s ago
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ki:
            if wrapped:  # a Ctrl-C a library re-raised as its own error (the test above)
                raise ModuleNotFoundError("Could not import module 'LlamaConfig'") from ki
            raise

    monkeypatch.setattr(runner, "_run_stages", run_stages)
    buf = io.StringIO()
    cfg = compose([f"store_dir={tmp_path}", "stages=[export,quantize]", "progress=false"])
    summary = runner.run_pipeline(cfg, summary_dir=tmp_path / "run", console=Console(file=buf, width=200))
    assert summary.exit_code == 130
    (row,) = [line for line in buf.getvalue().splitlines() if "export" in line]
    assert "interrupted" in row and "failed" not in row and re.search(r"2\.[5-9]\d s", row), row
    stages = json.loads((tmp_path / "run" / "summary.json").read_text())["stages"]
    assert [(s["stage"], s["status"], s["error"]) for s in stages] == [("export", "failed", "interrupted"), ("quantize", "not-run", None)]
    assert 2.5 <= stages[0]["seconds"] < 60 and stages[1]["seconds"] == 0


def test_the_run_log_ends_with_the_result(tiny_llama, tmp_path):
    """runs/<...>/pipeline.log ended at the build stage's "building:" line (fresh-user trial): whoever reads only the
    log could not tell how the run ended. Its last line is the console's result line, ok or error."""
    for name, extra, code, result in (
        ("ok", [f"model.path={tiny_llama}", "dry_run=true"], 0, r"INFO pipeline: ok in \d+\.\d s$"),
        ("bad", [f"model.path={tmp_path / 'missing'}"], 2, r"INFO pipeline: error \(exit 2\): .*missing"),
    ):
        run_dir = tmp_path / name
        cmd = [sys.executable, "-m", "pipeline", "stages=[export]", f"store_dir={tmp_path / 'store'}", f"hydra.run.dir={run_dir}", *extra]
        r = subprocess.run(cmd, env=_cli_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == code, r.stderr[-2000:]
        last = (run_dir / "pipeline.log").read_text(encoding="utf-8").splitlines()[-1]
        assert re.search(result, last), last
