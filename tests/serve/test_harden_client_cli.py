"""``pipeline client`` with no server running: one message naming host:port and how to start a server, one exit code (4:
the exit-code table's (docs/cli.md) "this machine cannot run the request" as things stand; neither bad input (2) nor a crash (1)), with or
without ``--raw``.  Before: "cannot tell which package the server serves" (exit 2), and with ``--raw`` exit 1."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.serve.server import free_port


@pytest.mark.parametrize("flags", [[], ["--raw"], ["--raw", "--stream"], ["--json"]])
def test_client_without_a_server_says_so_with_exit_4(tmp_path, flags):
    url = f"127.0.0.1:{free_port()}"
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "client", "--url", url, *flags, "Where is my order?"],
        cwd=tmp_path,  # no serving records here
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert f"no Triton server answers at {url}" in r.stderr and "pipeline serve" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "cannot tell which package" not in r.stderr, r.stderr


def test_llmclient_without_a_server_raises_the_same_error():
    from pipeline.errors import EXIT_PREFLIGHT
    from pipeline.serve.client import LLMClient, ServerUnavailable

    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnavailable, match=f"no Triton server answers at {url}") as e:
        LLMClient(url)
    assert e.value.exit_code == EXIT_PREFLIGHT


def test_ctrl_c_in_a_subcommand_exits_130_without_a_traceback(tmp_path):
    """``pipeline client`` with no prompt reads stdin; Ctrl-C there is the documented 130 and one line, not a
    KeyboardInterrupt traceback (every subcommand goes through the same handler in pipeline/cli.py)."""
    import signal
    import time

    p = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "client", "--url", f"127.0.0.1:{free_port()}"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(6)  # imports done, blocked reading prompts from stdin
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (p.returncode, err)
    assert "Traceback" not in err and "pipeline client: interrupted" in err, err
