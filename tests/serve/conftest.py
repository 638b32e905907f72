"""One served tiny package for the tests/serve modules that only need a running server on the default package.

``served`` builds the default package (tests/serve_tiny.py) once per session and serves it from one Triton server with
the OpenAI front end on it, per pytest-xdist worker (``make test`` runs whole files per worker, so the tests of a worker
run one at a time on its server).  Tests on it send requests and read answers, logs and metrics as deltas; a test that
stops, kills or reconfigures a server starts its own (on ``served.package`` or a package of its own).  A module that
needs another package defines its own ``served`` (tests/serve/test_conformance.py).
"""

from __future__ import annotations

import pytest
import serve_tiny


@pytest.fixture(scope="session")
def served(tmp_path_factory, tiny_llama, shared_store):
    """The default package (``package``, ``repo``, ``engine``, ``tokenizer_dir``) served by ``server`` (gRPC ``url``,
    ``http``) and ``oai`` (the OpenAI front end).  Shared: never stop, kill or reload it.  On teardown, after every
    request of the session (cancelled and refused ones included), the server must exit cleanly with no request left in
    flight (Triton would wait out its exit timeout and exit 1)."""
    art = serve_tiny.build_package(tiny_llama, shared_store)
    with serve_tiny.serving(art, tmp_path_factory.mktemp("serve-log"), openai=True) as s:
        yield s
    last = s.server.log_tail(20000).split("Signal (15) received.")[-1]
    in_flight = "in-flight inferences" in last.replace("Found 0 model versions that have in-flight inferences", "")
    if s.server.returncode != 0 or in_flight:
        pytest.fail(f"the shared server did not stop cleanly (exit code {s.server.returncode}):\n{last[-3000:]}")


@pytest.fixture(scope="session")
def sdk(served):
    """The official OpenAI SDK on the shared server's front end."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=served.oai.url, api_key="unused", max_retries=0, timeout=120)
