"""Which package a running server serves: a small record per endpoint, written by ``pipeline serve``.

``pipeline client`` and the OpenAI-compatible front end render prompts with the *served* package's tokenizer and
chat template.  Triton's protocol does not expose the files of a model repository, so ``pipeline serve`` records
``runs/serving/<host>_<grpc port>.json`` = ``{grpc_url, http_url, repository, pid, started}`` while the server runs
(removed on a clean stop).  :func:`served_repository` finds the record for a URL, checks that its server process is
still alive and that the configs the server reports are the recorded repository's (a port reused by another
server is caught), and returns the repository.  It never guesses ("the newest package" is not the served one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from ..core.contracts.package import ServingRecord

REGISTRY_DIR = Path("runs") / "serving"
"""Relative to the working directory, like ``pipeline serve``'s log folders (``runs/serve-*``)."""


def _key(url: str) -> str:
    host, _, port = url.rpartition(":")
    host = "127.0.0.1" if host in ("", "localhost", "0.0.0.0") else host
    return f"{host}_{port}"


def record_path(grpc_url: str, root: Path | None = None) -> Path:
    return (root or REGISTRY_DIR) / f"{_key(grpc_url)}.json"


def record(grpc_url: str, http_url: str, repository: Path, pid: int, root: Path | None = None) -> Path:
    """Write the record for a server that is now ready; returns its path."""
    p = record_path(grpc_url, root)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tmp.write_text(
        json.dumps(dataclasses.asdict(ServingRecord(grpc_url, http_url, str(Path(repository).absolute()), int(pid), started)), indent=1)
    )
    os.replace(tmp, p)
    return p


def forget(grpc_url: str, root: Path | None = None) -> None:
    p = record_path(grpc_url, root)
    if p.is_file():
        p.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _file_parameters(repo: Path, model: str) -> dict[str, str] | None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    p = repo / model / "config.pbtxt"
    if not p.is_file():
        return None
    cfg = text_format.Parse(p.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
    return {k: v.string_value for k, v in cfg.parameters.items()}


def served_repository(grpc_url: str, client: Any = None, root: Path | None = None) -> tuple[Path | None, str]:
    """The model repository served at ``grpc_url``, or ``(None, why)``.

    Args:
        grpc_url: ``host:port`` of Triton's gRPC endpoint.
        client: a ``tritonclient.grpc.InferenceServerClient`` connected to it; when given, the ``preprocessing``
            parameters the server reports must equal the recorded repository's (else the record is stale).
        root: registry folder (default ``runs/serving`` under the working directory).
    """
    p = record_path(grpc_url, root)
    if not p.is_file():
        return None, f"no record {p} (the server was not started by `pipeline serve` from this folder)"
    try:
        rec = ServingRecord.from_json(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, ValueError) as e:
        return None, f"unreadable record {p}: {e}"
    repo = Path(rec.repository)
    if not _alive(int(rec.pid)):
        return None, f"the server recorded in {p} (pid {rec.pid}) is no longer running"
    if not (repo / "preprocessing" / "1" / "tokenizer").is_dir():
        return None, f"{repo} (recorded in {p}) has no preprocessing/1/tokenizer"
    if client is not None:
        try:
            served = client.get_model_config("preprocessing", as_json=True, client_timeout=10)["config"]
            got = {k: v.get("string_value", "") for k, v in served.get("parameters", {}).items()}
        except Exception as e:
            return None, f"cannot read the served preprocessing config: {e}"
        if got != _file_parameters(repo, "preprocessing"):
            return None, f"the server at {grpc_url} does not serve {repo} (its preprocessing parameters differ from the record's)"
    return repo, f"recorded by `pipeline serve` in {p}"


__all__ = ["REGISTRY_DIR", "forget", "record", "record_path", "served_repository"]
