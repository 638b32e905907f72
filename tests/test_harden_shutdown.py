"""Issue 16 item 8: after a malformed streamed request and a client-cancelled stream, Ctrl-C on ``pipeline serve``
stops the real Triton server cleanly (exit code 0, no request left in flight for Triton's exit timeout).

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

from pipeline.serving.server import DEFAULT_SERVE_VENV


@pytest.fixture(scope="module")
def package(tmp_path_factory, tiny_llama) -> Path:
    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")
    from rich.console import Console

    from pipeline.config import compose
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


@pytest.mark.xfail(
    strict=True,
    reason=(
        "Triton 2.51 (nvidia-pytriton wheel): a request the server core rejects (missing input, wrong dtype) followed by a "
        "client cancel on the same gRPC stream leaves the model referenced, so it never unloads and tritonserver exits 1 "
        "after --exit-timeout-secs. Measured: cancel alone 2.4 s rc 0; malformed alone 2.6 s rc 0; both 15.6 s rc 1 (also "
        "with the serving branch's Python 'ensemble'). Strict: remove this marker when the server exits cleanly."
    ),
)
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
        assert proc.returncode == 0, out[-3000:]
        assert "tritonserver stopped (exit code 0)" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    logs = sorted(tmp_path.glob("runs/serve-*/tritonserver.log"))
    assert logs, "no server log"
    tail = logs[-1].read_text(errors="replace").split("Signal (2) received.")[-1]
    assert "Timeout" not in tail and "in-flight inferences" not in tail.replace("Found 0 model versions that have in-flight inferences", "")
