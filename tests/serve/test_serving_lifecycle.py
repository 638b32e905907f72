"""A Triton server started by the pipeline never outlives what started it, also on Ctrl-C while it is starting
(the package stage's parity check was interrupted in that window and left tritonserver running under PID 1)."""

from __future__ import annotations

import pytest

from pipeline.serve.server import DEFAULT_SERVE_VENV, TritonServer

pytestmark = pytest.mark.skipif(
    not (DEFAULT_SERVE_VENV / "bin" / "python3").exists(), reason="needs the serving environment (make serve-env)"
)


def test_interrupt_while_waiting_for_readiness_stops_the_server(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()  # an empty model repository: the real server starts, nothing to load
    srv = TritonServer(repo, ready_timeout_s=60)
    started = []

    def interrupted(self: TritonServer) -> None:
        assert self.process is not None and self.process.poll() is None  # the real process is up
        started.append(self.process)
        raise KeyboardInterrupt

    monkeypatch.setattr(TritonServer, "_wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        srv.start()
    assert started and started[0].poll() is not None, "tritonserver still running after Ctrl-C"
    assert not srv.is_running()
    srv.cleanup()


def test_served_python_models_write_no_bytecode(tmp_path):
    from pipeline.serve.server import ServeEnv

    assert ServeEnv(DEFAULT_SERVE_VENV).environment()["PYTHONDONTWRITEBYTECODE"] == "1"
