"""Hardening: interruption, concurrency, disk-full / bad store paths, untrusted inputs, secrets.

Every test drives the real ``pipeline`` CLI in a subprocess on a tiny real checkpoint (or the real
store / config code in-process) and checks the artifact store afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import resource
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from pipeline.core.store import MANIFEST, ArtifactStore
from pipeline.errors import PipelineError

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = str(ROOT / ".venv" / "bin" / "pipeline")
SECRET = "hf_" + "Zq3" * 10  # token-shaped, never a real one
QUANT_ARGS = ["stages=[export,quantize]", "quant=int4_awq", "calibration.calib_size=16", "calibration.min_samples=8"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        HF_TOKEN=SECRET, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", COLUMNS="250", PYTHONUNBUFFERED="1"
    )
    env.update(extra)
    return env


def start(args: list[str], tmp: Path, run: str, **popen) -> subprocess.Popen:
    (tmp / run).mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [PIPELINE, *args, f"hydra.run.dir={tmp / run}"],
        cwd=tmp,
        env=popen.pop("env", _env()),
        stdout=open(tmp / run / "stdout.txt", "w"),
        stderr=subprocess.STDOUT,
        **popen,
    )


def run_cli(args: list[str], tmp: Path, run: str, timeout: float = 300, **popen) -> tuple[int, str, dict | None]:
    p = start(args, tmp, run, **popen)
    code = p.wait(timeout=timeout)
    out = (tmp / run / "stdout.txt").read_text(encoding="utf-8", errors="replace")
    sf = tmp / run / "summary.json"
    return code, out, (json.loads(sf.read_text()) if sf.is_file() else None)


def statuses(summary: dict) -> dict[str, str]:
    return {s["stage"]: s["status"] for s in summary["stages"]}


def wait_for_tmp(stage_dir: Path, proc: subprocess.Popen, limit_s: float = 240, exclude: Path | None = None) -> Path:
    """Poll until the stage's (new) temporary output folder appears (the stage is running)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {stage_dir.name} started writing")
        if stage_dir.is_dir():
            for e in os.scandir(stage_dir):
                if e.name.startswith(".tmp-") and (exclude is None or e.name != exclude.name):
                    return Path(e.path)
        time.sleep(0.02)
    pytest.fail(f"no .tmp- folder appeared under {stage_dir}")


def published(stage_dir: Path) -> list[Path]:
    return [p for p in stage_dir.iterdir() if not p.name.startswith(".")] if stage_dir.is_dir() else []


def assert_store_consistent(store_root: Path) -> None:
    """Every published artifact is complete and verifies byte for byte; nothing else is trusted."""
    st = ArtifactStore(store_root)
    for stage_dir in store_root.iterdir() if store_root.is_dir() else []:
        for art in published(stage_dir):
            mf = json.loads((art / MANIFEST).read_text())
            assert mf["complete"] is True
            assert st.lookup(stage_dir.name, mf["key"], verify=True) is not None, art


def grep_tree(root: Path, needle: str) -> list[Path]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and needle.encode() in p.read_bytes():
            hits.append(p)
    return hits


# --------------------------------------------------------------------------- interruption
def test_interrupted_runs_leave_nothing_trusted_and_resume(tiny_llama, tmp_path):
    store = tmp_path / "store"
    args = [f"model.path={tiny_llama}", f"store_dir={store}", *QUANT_ARGS]

    # 1. SIGKILL while export writes: nothing published, the leftover temp folder is never trusted
    p = start(args, tmp_path, "kill_export")
    tmp = wait_for_tmp(store / "export", p)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    assert published(store / "export") == []
    assert ArtifactStore(store).lookup("export", tmp.name.split("-")[1]) is None

    # 2. SIGKILL inside quantize: export was published, quantize leaves only an untrusted temp folder
    p = start(args, tmp_path, "kill_quantize")
    dead_tmp = wait_for_tmp(store / "quantize", p)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    assert len(published(store / "export")) == 1 and published(store / "quantize") == []
    assert ArtifactStore(store).lookup("quantize", dead_tmp.name.split("-")[1]) is None

    # 3. the next run resumes from the last complete stage (export cached); SIGINT it inside quantize
    p = start(args, tmp_path, "int_quantize")
    wait_for_tmp(store / "quantize", p, exclude=dead_tmp)
    assert not dead_tmp.exists()  # the new producer of the same key removed the dead run's folder under the lock
    p.send_signal(signal.SIGINT)
    code = p.wait(timeout=120)
    assert code == 130, (tmp_path / "int_quantize" / "stdout.txt").read_text()
    summary = json.loads((tmp_path / "int_quantize" / "summary.json").read_text())
    assert statuses(summary) == {"export": "cached", "quantize": "failed"} and summary["error"] == "interrupted"
    assert published(store / "quantize") == [] and not any(store.glob("quantize/.tmp-*"))  # cleaned on SIGINT
    assert_store_consistent(store)
    # no token from the environment in any artifact, manifest, log or summary of these runs
    assert grep_tree(tmp_path, SECRET) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sigterm_stops_a_run_as_ctrl_c_does(tiny_llama, tmp_path, sig):
    """A cancelled CI job gets SIGTERM, a dropped SSH session SIGHUP: the run ends exit 130 with its summary, and the
    stage's temporary folder is removed (the default handlers left it in the store for good, SIGHUP with exit 129 and
    no summary: fresh-user trials)."""
    store = tmp_path / "store"
    default = lambda: signal.signal(sig, signal.SIG_DFL)  # noqa: E731  # a suite run under nohup hands SIGHUP down ignored
    p = start([f"model.path={tiny_llama}", f"store_dir={store}", *QUANT_ARGS], tmp_path, "term", preexec_fn=default)
    wait_for_tmp(store / "quantize", p)
    p.send_signal(sig)
    assert p.wait(timeout=120) == 130, (tmp_path / "term" / "stdout.txt").read_text()
    assert json.loads((tmp_path / "term" / "summary.json").read_text())["error"] == "interrupted"
    assert not any(store.glob("*/.tmp-*"))
    assert_store_consistent(store)


_TWICE = """
import os, signal, sys, time
import pipeline.report as report, pipeline.runner as runner
from pipeline.cli import main

SECOND = int(sys.argv.pop())  # the signal number, last on the command line

def run_stages(cfg, console, state):  # the first Ctrl-C, while a stage runs
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)

def redact(doc, _redact=report.redact):  # the second signal, while the summary is written
    os.kill(os.getpid(), SECOND)
    return _redact(doc)

runner._run_stages, report.redact = run_stages, redact
main()
"""


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_second_signal_cannot_abort_the_cleanup_of_the_first(tmp_path, second):
    """Ctrl-C pressed twice (50 ms apart) during a build: the second KeyboardInterrupt hit write_summary, a traceback
    and no summary.json (fresh-user trial). After the first interrupt, SIGINT, SIGTERM and SIGHUP are ignored until
    the run has cleaned up and written its summary: exit 130, the summary says interrupted."""
    run = tmp_path / "run"
    default = lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)  # noqa: E731  # as in the SIGHUP test above
    p = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", _TWICE, f"store_dir={tmp_path / 'store'}", "stages=[export]",
         f"hydra.run.dir={run}", str(int(second))],
        cwd=tmp_path, env=_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120, preexec_fn=default,
    )  # fmt: skip
    assert p.returncode == 130 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["error"] == "interrupted"


def test_a_second_sigterm_after_the_cleanup_cannot_change_the_exit_code(tiny_llama, tmp_path):
    """A fresh-user trial: SIGTERM during quantize, another 0.3 s later; summary.json and the console said exit 130,
    the process status was 143 (the cleanup had ended 17 ms after the first signal, the second landed while the
    interpreter shut down, once Python's handlers were gone). The first signal now sets SIGINT, SIGTERM and SIGHUP to
    SIG_IGN at the OS level: SIGTERMs sent from the summary's writing to the process's end leave its status 130."""
    store = tmp_path / "store"
    default = lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)  # noqa: E731
    p = start([f"model.path={tiny_llama}", f"store_dir={store}", *QUANT_ARGS], tmp_path, "twice", preexec_fn=default)
    wait_for_tmp(store / "quantize", p)
    p.send_signal(signal.SIGTERM)
    summary, deadline = tmp_path / "twice" / "summary.json", time.monotonic() + 120
    while not summary.is_file() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    while p.poll() is None and time.monotonic() < deadline:  # the second (and later) SIGTERM: up to the very end
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
        time.sleep(0.001)
    assert p.wait(timeout=120) == 130, (tmp_path / "twice" / "stdout.txt").read_text()
    assert json.loads(summary.read_text())["error"] == "interrupted"
    assert not any(store.glob("*/.tmp-*"))


def test_an_interrupt_stops_a_sweep_and_not_only_its_current_job(tiny_llama, tmp_path):
    """A recheck: one SIGTERM (a cancelled CI job) or Ctrl-C during job 0 of a ``-m`` sweep stopped job 0 only; Hydra
    then ran job 1 to the end. The jobs after the interrupted one are now not run: each says so in its summary, and
    the sweep exits 130."""
    store, sweep = tmp_path / "store", tmp_path / "sweep"
    default = lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)  # noqa: E731
    args = ["-m", f"model.path={tiny_llama}", f"store_dir={store}", *QUANT_ARGS, "calibration.seed=1,2", f"hydra.sweep.dir={sweep}"]
    p = start(args, tmp_path, "sweep", preexec_fn=default)
    wait_for_tmp(store / "quantize", p)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) == 130, (tmp_path / "sweep" / "stdout.txt").read_text()
    first, second = (json.loads((d / "summary.json").read_text()) for d in sorted(sweep.glob("[01]-*")))
    assert first["error"] == "interrupted" and first["exit_code"] == 130
    assert second["exit_code"] == 130 and "not run" in second["error"] and second["stages"] == []
    assert not any(store.glob("*/.tmp-*"))


def test_a_run_under_nohup_ignores_sighup(tiny_llama, tmp_path):
    """``nohup pipeline ...`` starts the run with SIGHUP ignored: it stays ignored, and the run finishes."""
    store = tmp_path / "store"
    ignore_hup = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731  # what nohup does
    p = start([f"model.path={tiny_llama}", f"store_dir={store}", "stages=[export]"], tmp_path, "nohup", preexec_fn=ignore_hup)
    wait_for_tmp(store / "export", p)
    p.send_signal(signal.SIGHUP)
    assert p.wait(timeout=300) == 0, (tmp_path / "nohup" / "stdout.txt").read_text()
    assert statuses(json.loads((tmp_path / "nohup" / "summary.json").read_text())) == {"export": "ran"}


# --------------------------------------------------------------------------- concurrency (+ secrets)
def test_two_concurrent_runs_produce_one_artifact_and_no_secret(tiny_llama, tmp_path):
    """Two runs on one store at once: one produces, the other waits on the lock and reuses it; the
    artifact verifies byte for byte.  Both runs carry ``HF_TOKEN`` in the environment and pull it into
    the config with ``${oc.env:HF_TOKEN}`` (OmegaConf's built-in resolver does resolve it): the value
    never reaches a manifest, log or summary (the store redacts secret-named environment values)."""
    store = tmp_path / "store"
    args = [f"model.path={tiny_llama}", f"store_dir={store}", "stages=[export]", "model.name=${oc.env:HF_TOKEN}"]
    a, b = start(args, tmp_path, "a"), start(args, tmp_path, "b")
    ca, cb = a.wait(timeout=300), b.wait(timeout=300)
    assert ca == 0 and cb == 0, (tmp_path / "a" / "stdout.txt").read_text() + (tmp_path / "b" / "stdout.txt").read_text()
    sa = json.loads((tmp_path / "a" / "summary.json").read_text())["stages"][0]
    sb = json.loads((tmp_path / "b" / "summary.json").read_text())["stages"][0]
    assert sa["key"] == sb["key"] and sa["path"] == sb["path"]
    assert sorted([sa["status"], sb["status"]]) in (["cached", "ran"], ["cached", "cached"])  # one producer, never two
    assert len(published(store / "export")) == 1 and not any(store.glob("export/.tmp-*"))
    assert_store_consistent(store)
    assert grep_tree(tmp_path, SECRET) == []
    # model.name is a label the export stage does not key on (its manifest does not hold it); each run's summary does
    assert all("***redacted***" in (tmp_path / r / "summary.json").read_text() for r in ("a", "b"))


# --------------------------------------------------------------------------- disk full / bad paths
def _limit_file_size(limit: int):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def test_disk_full_names_the_path_and_publishes_nothing(tiny_llama, tmp_path):
    store = tmp_path / "store"
    size = (tiny_llama / "model.safetensors").stat().st_size
    code, out, summary = run_cli(
        [f"model.path={tiny_llama}", f"store_dir={store}", "stages=[export]"], tmp_path, "full", preexec_fn=_limit_file_size(size // 2)
    )
    assert code not in (0, 130), out
    assert summary is not None and summary["exit_code"] == code
    err = summary["error"] or ""
    assert str(store) in err or str(store) in out, err  # the failing path is named
    assert "Traceback" not in out.split("pipeline run")[-1]
    assert published(store / "export") == [] and not any(store.glob("export/.tmp-*"))


def _plan_cli(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PIPELINE, "plan", *args], cwd=tmp, env=_env(), capture_output=True, text=True, timeout=300)


def _store_refused_alike(tiny_llama: Path, tmp_path: Path, store_dir: Path) -> str:
    """Run and plan (the CLI and ``pipeline.plan``) with ``store_dir``: both exit 2 with one message, returned."""
    import pipeline
    from pipeline.core.config import ConfigError

    args = [f"model.path={tiny_llama}", f"store_dir={store_dir}", "stages=[export]"]  # a plan with no other problem
    code, out, summary = run_cli(args, tmp_path, "run")
    assert code == 2 and summary is not None and summary["error"].startswith(f"store_dir={str(store_dir)!r}: "), out
    expected = summary["error"]
    assert f"error (exit 2): {expected}" in out
    planned = _plan_cli(args, tmp_path)
    assert planned.returncode == 2 and expected in planned.stderr, planned.stderr[-3000:]
    with pytest.raises(ConfigError, match=re.escape(expected)):
        pipeline.plan(pipeline.compose(args))
    return expected


def test_store_path_that_is_a_file_is_a_clear_error(tiny_llama, tmp_path):
    """A store_dir that is a file: the run said "(File exists)", and ``pipeline plan`` planned it (exit 0). Both now
    say it is a file, not a folder, with the fix (exit 2), and the file is left as it was."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    msg = _store_refused_alike(tiny_llama, tmp_path, blocker)
    assert "is a file, not a folder" in msg and "File exists" not in msg and str(blocker) in msg
    assert blocker.read_text() == "x"


def test_a_store_dir_that_is_a_dangling_symlink_names_the_missing_target(tiny_llama, tmp_path):
    """A store_dir that is a symbolic link to a missing path was called "a file" by the run and by ``pipeline plan``;
    both now say it is a link to a missing path, name the target and give the fix (exit 2)."""
    link = tmp_path / "store"
    target = tmp_path / "gone" / "x"
    link.symlink_to(target)
    msg = _store_refused_alike(tiny_llama, tmp_path, link)
    assert f"is a symbolic link to a missing path, {target}" in msg and "is a file" not in msg, msg
    assert f"Fix: create the folder it points to (mkdir -p {target})" in msg and f"remove the link {link}" in msg, msg
    assert link.is_symlink() and not target.exists()


def test_a_store_dir_no_folder_can_be_made_in_is_refused_by_the_plan_as_by_the_run(tiny_llama, tmp_path):
    """A store_dir where no folder can be made (here under /proc; chmod 0o555 does not stop root, a read-only mount
    is refused alike): ``pipeline plan`` planned it (exit 0) where the run refused it (exit 2); both now refuse it."""
    store_dir = Path("/proc/pipeline-test-store")
    if not Path("/proc/self").is_dir() or store_dir.exists():
        pytest.skip("no Linux /proc here: the check cannot be made")
    msg = _store_refused_alike(tiny_llama, tmp_path, store_dir)
    assert f"cannot create {store_dir}" in msg and "Fix: point store_dir at a writable folder" in msg


def test_a_plan_leaves_no_store_behind(tiny_llama, tmp_path):
    """The plan checks a store_dir that does not exist yet without creating it, or anything in the folder above."""
    store_dir = tmp_path / "new" / "store"
    planned = _plan_cli([f"model.path={tiny_llama}", f"store_dir={store_dir}", "stages=[export]"], tmp_path)
    assert planned.returncode != 2 and "store_dir" not in planned.stderr, planned.stderr[-3000:]
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".write-test-*"))


# --------------------------------------------------------------------------- untrusted inputs
class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _copy_without_weights(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, dst / f.name)
    return dst


def test_pickled_weights_are_refused_and_never_unpickled(tiny_llama, tmp_path):
    ck = _copy_without_weights(tiny_llama, tmp_path / "ck")
    marker = tmp_path / "PWNED"
    (ck / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    code, out, summary = run_cli([f"model.path={ck}", f"store_dir={tmp_path / 'store'}", "stages=[export]"], tmp_path, "pickle")
    assert code == 2, out
    assert "allow_pickle" in summary["error"]
    assert not marker.exists()


def test_remote_code_is_not_run_by_default(tiny_llama, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(tiny_llama, ck)
    marker = tmp_path / "PWNED"
    (ck / "evil_modeling.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "evil_modeling.EvilForCausalLM", "AutoConfig": "evil_modeling.EvilConfig"}
    (ck / "config.json").write_text(json.dumps(cfg))
    from pipeline.core.config import compose

    assert compose([]).model.trust_remote_code is False
    code, out, summary = run_cli([f"model.path={ck}", f"store_dir={tmp_path / 'store'}", "stages=[export]"], tmp_path, "remote")
    assert code == 2, out
    assert "trust_remote_code" in summary["error"]
    assert not marker.exists()


def test_config_values_are_never_turned_into_code(tmp_path):
    """A ``_target_`` key is data (nothing calls hydra.utils.instantiate on user config); unknown
    resolvers (``${eval:...}``) are refused at compose time; no code runs either way."""
    from pipeline.core.config import compose, key_fields
    from pipeline.core.store import canonical_json
    from pipeline.planner import plan
    from pipeline.validation import validate

    marker = tmp_path / "PWNED"
    cfg = compose(["model=llama31_8b", f"+model.hf_config.evil={{_target_:os.system,command:'touch {marker}'}}", "target.gpu=h100_sxm"])
    validate(cfg, raise_on_error=False)
    plan(cfg)
    canonical_json(key_fields(cfg.model))
    assert cfg.model.hf_config["evil"]["_target_"] == "os.system" and not marker.exists()
    with pytest.raises(Exception) as e:
        compose([f"model.name=${{eval:__import__('os').system('touch {marker}')}}"])
    assert "eval" in str(e.value) and not marker.exists()
    # our code never instantiates config nodes
    offenders = [p for p in (ROOT / "pipeline").rglob("*.py") if "instantiate(" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_archive_extraction_cannot_escape(tmp_path):
    import io

    from pipeline.release.archive import safe_extract

    def tar_with(name: str, *, link: str | None = None) -> Path:
        p = tmp_path / f"{abs(hash(name))}.tar.gz"
        with tarfile.open(p, "w:gz") as t:
            ti = tarfile.TarInfo(name)
            if link is not None:
                ti.type, ti.linkname = tarfile.SYMTYPE, link
                t.addfile(ti)
            else:
                ti.size = 3
                t.addfile(ti, io.BytesIO(b"bad"))
        return p

    for evil in (tar_with("../escaped.txt"), tar_with(str(tmp_path / "abs_escape.txt")), tar_with("link", link="/etc/passwd")):
        dest = tmp_path / "out"
        dest.mkdir(exist_ok=True)
        with pytest.raises(PipelineError):  # the one safe extraction refuses with an InputError (a PipelineError)
            safe_extract(evil, dest)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "abs_escape.txt").exists()
