"""Issue 16 item 8: shutdown after a malformed streamed request and a client cancel, and ``pipeline serve``'s exit codes.

Cause (read from Triton 2.51's ``src/grpc/stream_infer_handler.cc`` / ``infer_handler.h`` and reproduced here): the gRPC
stream handler keeps the state of a stream's *first* request for the stream's cancellation notification; when the server
rejects that request before it runs (a required input missing, a wrong data type) the state never enters the in-flight
set, so a client cancel of the stream (``stop_stream(cancel_requests=True)``) never releases it.  It holds the rejected
request, which holds the model: the model never unloads and tritonserver waits out ``--exit-timeout-secs`` and exits 1.
The sequence needs no model code at all (a rejected first request + a cancel, nothing executed, leaks the same way); a
valid first request on the stream leaves no leak.  Our side: ``LLMClient`` no longer cancels a stream whose request the
server already answered with an error, and ``TritonServer.stop`` ends a server whose only remaining models are held by
that leaked request instead of waiting out the timeout (``pipeline/serve/server.py`` ``_wait_stopped``).

Real pipeline (export -> package) on a tiny Llama, the real ``pipeline serve`` command, the real tritonclient.
"""

from __future__ import annotations

import queue
import re
import signal
from pathlib import Path

import numpy as np
import pytest
from cli_serve import start_cli_server

from pipeline.serve.server import DEFAULT_SERVE_VENV


@pytest.fixture(scope="module")
def package(tmp_path_factory, tiny_llama) -> Path:
    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.runner import run_pipeline

    store = tmp_path_factory.mktemp("store")
    cfg = compose(
        [
            f"model.path={tiny_llama}",
            "model.name=tiny",
            "target=onnxruntime_genai",
            "quant=none",
            "stages=[package]",
            f"store_dir={store}",
            "eval.limit=2",
            "build.max_batch_size=4",
            "build.max_input_len=128",
            "build.max_seq_len=192",
            "progress=false",
            "package.allow_failed_gate=true",
        ]
    )
    summary = run_pipeline(cfg, console=Console(quiet=True))
    # 2 eval items cannot show non-inferiority (exit 3); the package is written anyway (allow_failed_gate)
    pkg = next(r for r in summary.stages if r.stage == "package")
    assert summary.exit_code in (0, 3) and pkg.status == "ran", summary.error
    return Path(pkg.path)


def _inputs(grpcclient, **arrays):
    out = []
    for name, arr in arrays.items():
        dt = "BYTES" if arr.dtype == np.object_ else {"int32": "INT32", "float32": "FP32"}[str(arr.dtype)]
        i = grpcclient.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


def test_ctrl_c_after_malformed_and_cancelled_streams_is_clean(package, tmp_path):
    import tritonclient.grpc as grpcclient

    proc, head = start_cli_server(package, tmp_path)
    try:
        m = re.search(r"gRPC (127\.0\.0\.1:\d+)", head)
        assert m, head
        text = np.array([[b"Extract the order ID from this message: where is ORD-12345?"]], dtype=np.object_)

        c = grpcclient.InferenceServerClient(m.group(1))
        q: queue.Queue = queue.Queue()
        c.start_stream(callback=lambda result, error: q.put((result, error)))
        # 1. malformed: a required input missing, then a wrong data type
        c.async_stream_infer("ensemble", _inputs(grpcclient, text_input=text), enable_empty_final_response=True)
        _, err = q.get(timeout=60)
        assert err is not None
        c.async_stream_infer(
            "ensemble",
            _inputs(grpcclient, text_input=text, max_tokens=np.array([[4.0]], dtype=np.float32)),
            enable_empty_final_response=True,
        )
        _, err = q.get(timeout=60)
        assert err is not None
        # 2. a long streamed request, cancelled by the client after its first chunk
        ins = _inputs(grpcclient, text_input=text, max_tokens=np.array([[150]], dtype=np.int32))
        s = grpcclient.InferInput("stream", [1, 1], "BOOL")
        s.set_data_from_numpy(np.array([[True]], dtype=bool))
        c.async_stream_infer("ensemble", ins + [s], enable_empty_final_response=True)
        q.get(timeout=60)
        c.stop_stream(cancel_requests=True)
        c.close()

        # 3. Ctrl-C
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        out = head + out
        assert proc.returncode == 130, out[-3000:]  # Ctrl-C = interrupted (docs/cli.md exit codes), after a clean stop
        assert "tritonserver stopped cleanly" in out and "model(s) ensemble stayed referenced" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    logs = sorted(tmp_path.glob("runs/serve-*/tritonserver.log"))
    assert logs, "no server log"
    tail = logs[-1].read_text(errors="replace").split("Signal (15) received.")[-1]
    assert "Exit timeout expired" not in tail, tail[-3000:]
    assert "Found 0 model versions that have in-flight inferences" in tail  # nothing was running
    for model in ("onnxruntime_genai", "preprocessing", "postprocessing", "tensorrt_llm_bls"):  # ours unloaded (finalize ran)
        assert f"successfully unloaded '{model}'" in tail, tail[-3000:]


def test_sigterm_stops_serve_cleanly_with_exit_0(package, tmp_path):
    """SIGTERM (how a service manager stops a service) is a requested stop: exit 0; Ctrl-C is exit 130 (above)."""
    proc, head = start_cli_server(package, tmp_path)
    try:
        assert "ready:" in head, head
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, (head + out)[-3000:]
        assert "tritonserver stopped (exit code 0)" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def test_kill_9_of_serve_takes_the_triton_server_down_with_it(package, tmp_path):
    """A CI runner ending a job, or ``kill -9``, ends ``pipeline serve`` without its clean stop: the Triton server it
    started (in a session of its own) gets SIGTERM from the kernel (parent-death signal) and exits, freeing its ports."""
    import contextlib
    import os
    import shutil
    import time

    if shutil.which("setpriv") is None:
        pytest.skip("util-linux setpriv missing: the parent-death signal is not set")
    proc, head = start_cli_server(package, tmp_path)
    try:
        assert "ready:" in head, head
        servers = [c for c in _children(proc.pid) if b"tritonserver" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(servers) == 1, servers
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and Path(f"/proc/{servers[0]}").exists():
            time.sleep(0.2)
            try:  # reap it if it became ours (it is re-parented to init or a subreaper, not to this test)
                os.waitpid(servers[0], os.WNOHANG)
            except ChildProcessError:
                pass
        state = (
            Path(f"/proc/{servers[0]}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{servers[0]}").exists() else "gone"
        )
        assert state in ("gone", "Z"), f"tritonserver {servers[0]} still running ({state}) after its parent was killed"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in servers if "servers" in locals() else []:  # a failed run leaves no server behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_client_does_not_cancel_a_stream_the_server_already_answered(package, tmp_path):
    """``LLMClient`` closes the stream of a request the server refused without cancelling it, so Triton 2.51 leaks
    nothing and stops on its own (no ``stop_note``: nothing had to be ended for it).  The old client cancelled such a
    stream, which is the leaking sequence of item 8."""
    from pipeline.serve.client import LLMClient, RequestError
    from pipeline.serve.server import TritonServer

    srv = TritonServer(package / "model_repository", log_dir=tmp_path / "srv").start()
    try:
        with LLMClient(srv.grpc_url) as c:
            assert c.decoupled
            # a client whose view of the interface is stale (the server was redeployed with another config since it
            # read the metadata): the server refuses the request before it runs
            c.inputs["max_tokens"] = {**c.inputs["max_tokens"], "datatype": "FP32"}
            with pytest.raises(RequestError, match="max_tokens"):
                c.generate("where is ORD-12345?", 4, stream=True, chat=False)
    finally:
        rc = srv.stop()
    assert rc == 0 and srv.stop_note == "", srv.stop_note
    assert "Exit timeout expired" not in srv.log_path.read_text(errors="replace")


def test_leaked_models_reads_the_shutdown_log():
    from pipeline.serve.server import leaked_models

    def block(timeout, live, lines, requests=0):
        head = f'I1 server.cc:345] "Timeout {timeout}: Found {live} live models and {requests} in-flight non-inference requests"'
        return "\n".join([head, *(f'I1 server.cc:351] "{ln}"' for ln in lines)])

    start = [
        'I1 server.cc:321] "Timeout 15: Found 0 model versions that have in-flight inferences"',
        'I1 server.cc:336] "All models are stopped, unloading models"',
        block(15, 3, ["ensemble v1: UNLOADING", "onnxruntime_genai v1: UNLOADING", "pre_0 v1: UNLOADING"]),
        'I1 backend_model_instance.cc:806] "Stopping backend thread for onnxruntime_genai_0_0..."',
        'I1 backend_model_instance.cc:806] "Stopping backend thread for pre_0_0_0..."',
    ]
    # the Triton 2.51 leak (measured log): every other model unloaded, 'ensemble' never had an instance stopped
    leaked = [
        *start,
        "I1 model_lifecycle.cc:624] \"successfully unloaded 'onnxruntime_genai' version 1\"",
        "I1 model_lifecycle.cc:624] \"successfully unloaded 'pre_0' version 1\"",
        block(13, 1, ["ensemble v1: UNLOADING"]),
    ]
    assert leaked_models("\n".join(leaked)) == ["ensemble"]
    # a model still finalizing (its instances were stopped) is waited for, not ended
    assert (
        leaked_models(
            "\n".join([*start, block(14, 3, ["ensemble v1: UNLOADING", "onnxruntime_genai v1: UNLOADING", "pre_0 v1: UNLOADING"])])
        )
        == []
    )
    # a non-inference request still in flight, or a block not complete in the log yet: wait
    assert leaked_models("\n".join([*leaked[:-1], block(13, 1, ["ensemble v1: UNLOADING"], requests=1)])) == []
    assert leaked_models("\n".join([*leaked[:-1], block(13, 2, ["ensemble v1: UNLOADING"])])) == []
    # not verbose (no per-model lines): nothing can be told, Triton's own timeout applies
    assert leaked_models("\n".join([start[0], start[1], block(13, 1, [])])) == []
