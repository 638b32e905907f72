"""The served tiny package: the real pipeline (export -> build -> evaluate -> package) on the tiny Llama, and a real
Triton server (nvidia-pytriton's tritonserver in ``.venv-serve``) on it.

tests/serve/conftest.py builds the default package once per session and serves it from one server (per pytest-xdist
worker) for every module that only needs "a running server on the default tiny package"; a module that needs another
package (tests/serve/test_conformance.py: ``package.max_beam_width=2``) builds it here with its extra overrides and
serves it itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

#: the default served package: fp32 onnxruntime-genai engine of the tiny Llama, no quantization; 2 eval items cannot
#: show non-inferiority, so the gate is exploratory and the package is written anyway
DEFAULT_PACKAGE = [
    "model.name=tiny",
    "model.dtype=float32",
    "target=onnxruntime_genai",
    "quant=none",
    "stages=[package]",
    "eval.limit=2",
    "eval.gate.mode=exploratory",
    "package.allow_failed_gate=true",
    "build.max_batch_size=16",
    "build.max_input_len=128",
    "build.max_seq_len=192",
    "progress=false",
]


def skip_without_serve_env() -> None:
    from pipeline.serve.server import DEFAULT_SERVE_VENV

    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")


def build_package(checkpoint: Path, store: Path, *extra: str) -> dict[str, Path]:
    """The default package of ``checkpoint`` (plus ``extra`` overrides) through the real pipeline, its artifacts in
    ``store`` (a shared store reuses the export, build and evaluate artifacts of an earlier identical run).
    Returns ``{stage: artifact folder}``.

    One run at a time per store (a file lock next to it, held by the pytest-xdist workers in turn): two concurrent
    runs of one chain on one store can undo each other's work (a run that produced the export itself does not reuse
    a quantize artifact another run published meanwhile from that export: it moves it aside and quantizes again while
    the other run is building from it, which then finds no ``hf/config.json``); in turn, the later run reuses every
    stage the earlier one produced."""
    skip_without_serve_env()
    from filelock import FileLock
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.runner import run_pipeline

    cfg = compose([f"model.path={checkpoint}", f"store_dir={store}", *DEFAULT_PACKAGE, *extra])
    with FileLock(str(store.parent / f".{store.name}.build_package.lock")):
        summary = run_pipeline(cfg, console=Console(quiet=True))
    assert summary.exit_code == 0, summary.error
    return {r.stage: Path(r.path) for r in summary.stages}


@contextmanager
def serving(art: dict[str, Path], log_dir: Path, *, openai: bool = False) -> Iterator[SimpleNamespace]:
    """A Triton server (and with ``openai`` the OpenAI front end on it) on the package of ``art``
    (:func:`build_package`); both stopped on exit (``server.returncode`` then holds the server's exit code)."""
    from pipeline.serve.openai_server import OpenAIServer
    from pipeline.serve.server import TritonServer

    repo = art["package"] / "model_repository"
    srv = TritonServer(repo, ready_timeout_s=180, log_dir=log_dir).start()
    oai = None
    try:
        oai = OpenAIServer(srv.grpc_url, repo, port=0).start() if openai else None
        yield SimpleNamespace(
            server=srv,
            oai=oai,
            repo=repo,
            package=art["package"],
            engine=art["build"] / "engine",
            url=srv.grpc_url,
            http=f"http://{srv.http_url}",
            tokenizer_dir=repo / "preprocessing" / "1" / "tokenizer",
        )
    finally:
        if oai is not None:
            oai.stop()
        srv.stop()
