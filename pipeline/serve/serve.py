"""``pipeline serve``: start a real Triton server on a packaged model repository.

    pipeline serve                                   # newest package artifact in the store (artifacts/package/*)
    pipeline serve artifacts/package/<key>           # a package artifact (or its model_repository/, or an unpacked release)
    pipeline serve release/tiny-none-1.tar.gz        # a release archive (unpacked safely under runs/)
    pipeline serve package.repository=/path/to/model_repository package.grpc_port=0
    pipeline serve --openai                          # + an OpenAI-compatible endpoint on 127.0.0.1:9000/v1 (package.openai_port)
    pipeline serve release/tiny-none-1.tar.gz package.verify_key=release.pub   # verify the signature first (exit 2 if not)
    make serve ARGS="package.grpc_port=9001"

onnxruntime_genai packages run here, on the Triton binary of the nvidia-pytriton wheel in ``.venv-serve``
(:class:`pipeline.serve.server.TritonServer`). For a tensorrt_llm package the exact NGC container command is
printed instead (TensorRT-LLM engines need the trtllm container and a GPU).  Every endpoint binds to
``package.host`` (127.0.0.1 by default).  Ctrl-C stops the server cleanly and exits 130 (interrupted); SIGTERM stops
it cleanly and exits 0; a server that did not stop cleanly exits 1.  When tritonserver or a model's backend process
(the engine) dies, the server is stopped and the command exits 1 within about a second (:data:`WATCH_S`), so a
supervisor restarts the deployment (Triton itself keeps such a model "ready").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..core.contracts.manifest import ArtifactManifest
from ..core.contracts.package import PackageArtifact, ParityRecord, ReleaseGate, ReleaseManifest
from ..errors import EXIT_INPUT, EXIT_INTERRUPTED, InputError, PipelineError


def _created_order(art: Any) -> tuple[str, tuple[int, int, str], str]:
    """Sort key of a package artifact: the creation time its manifest records (``created``, ISO 8601 UTC), then the
    package version (numerically when it is a number: ``10`` after ``9``), then the folder name; never a file's
    mtime, which a copy without ``-p`` or clock skew changes."""
    version = ""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        rm = ReleaseManifest.from_json(json.loads(PackageArtifact(art.path).release_manifest_path.read_text(encoding="utf-8")))
        version = str(rm.version or "")
    vkey = (0, int(version), "") if version.isdigit() else (1, 0, version)
    return str(art.doc.created or ""), vkey, art.path.name


def _complete_package_artifacts(store: Path) -> list[Path]:
    """Published, trusted package artifacts (never ``.tmp-*`` staging folders), oldest first by recorded creation
    time (:func:`_created_order`)."""
    from ..core.store import ArtifactStore

    arts = [a for a in ArtifactStore(store).published("package") if PackageArtifact(a.path).model_repository.is_dir()]
    return [a.path for a in sorted(arts, key=_created_order)]


def find_latest_repository(store_dir: str | None, *, verify: bool = False) -> Path | None:
    """``model_repository/`` of the newest complete package artifact under ``store_dir`` (default ``artifacts``), by
    recorded creation time.  ``verify`` (``verify_cache=true``) re-hashes that artifact's files and raises
    InputError when one differs from its manifest (it is refused, never silently replaced by an older one)."""
    from ..core.config import resolve_path

    store = resolve_path(store_dir or "artifacts")
    if store is None or not store.is_dir():
        return None
    arts = _complete_package_artifacts(store)
    if not arts:
        return None
    if verify:
        verify_package_artifact(arts[-1])
    return PackageArtifact(arts[-1]).model_repository


def verify_package_artifact(art_dir: Path) -> None:
    """Re-hash every file of the store artifact ``art_dir`` against its manifest (what the run does for
    ``verify_cache=true``, :meth:`pipeline.core.store.ArtifactStore.lookup`); InputError (exit 2) when the store would not
    trust it."""
    from ..core.store import MANIFEST, ArtifactStore

    key = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        key = ArtifactManifest.from_json(json.loads((art_dir / MANIFEST).read_text(encoding="utf-8"))).key
    store = ArtifactStore(art_dir.parent.parent)
    if not isinstance(key, str) or store.lookup(art_dir.parent.name, key, verify=True) is None:
        raise InputError(
            f"{art_dir}: verify_cache=true and a file of this artifact differs from the size or sha256 its "
            f"{MANIFEST} records (or the manifest is not the store's); refusing to serve it. Fix: run the package "
            f"stage again (`pipeline stages=[package] verify_cache=true` replaces a damaged artifact)."
        )


def _unpack_release(p: Path) -> Path:
    """Check the release archive ``p`` (SHA256SUMS beside it, then the unpacked content against its manifest) and
    return the folder it was unpacked into under ``runs/``; on any refusal nothing stays there."""
    from ..release.archive import safe_extract, verify_extracted_release, verify_release_archive

    manifest = verify_release_archive(p)  # SHA256SUMS (+ release manifest) before anything is unpacked
    dest = Path("runs").absolute() / f"serve-release-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    safe_extract(p, dest)  # refuses members that would land outside dest, writes nothing then
    try:
        verify_extracted_release(dest, manifest)
    except BaseException:  # nothing of a refused (or interrupted) release stays under runs/
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


def resolve_repository(arg: str | None, store_dir: str | None, *, verify: bool = False) -> Path:
    """The model repository for a path argument (artifact folder, repository, unpacked release) or the newest one.

    ``verify`` (``verify_cache=true``): a store artifact (the newest, or the folder given) is re-hashed first
    (:func:`verify_package_artifact`); a release archive is always checked against its SHA256SUMS; a bare
    repository folder, which records no digests, is refused (InputError) because nothing could be verified."""
    from ..core.store import MANIFEST

    if arg:
        p = Path(arg).expanduser().absolute()
        if not p.exists():
            raise InputError(
                f"{arg}: not found (looked for {p}). Fix: give a package artifact folder, its model_repository/ or a "
                f"release archive (<package artifact>/release/<model>-<recipe>-<version>.tar.gz; the run summary prints the "
                f"package path), or no path for the newest package in the store."
            )
        archive = p.is_file() and p.name.endswith(PackageArtifact.ARCHIVE_SUFFIXES)
        if archive:
            p = _unpack_release(p)
        elif verify:
            art = next((c for c in (p, p.parent) if (c / MANIFEST).is_file()), None)
            if art is None:
                raise InputError(
                    f"{arg}: verify_cache=true, but this folder is not a store artifact and records no digests to check. "
                    f"Fix: pass the package artifact folder (<store>/package/<key>) or its release archive, or drop verify_cache."
                )
            verify_package_artifact(art)
        for cand in (p, p / "model_repository", *sorted(p.glob("*/model_repository"))):
            if cand.is_dir() and ((cand / "ensemble" / "config.pbtxt").is_file() or (cand / "tensorrt_llm" / "config.pbtxt").is_file()):
                return cand
        raise InputError(
            f"{arg}: no Triton model repository there (expected ensemble/config.pbtxt, or a package artifact with "
            f"model_repository/). Fix: pass a package artifact folder or run `pipeline stages=[package]` first."
        )
    repo = find_latest_repository(store_dir, verify=verify)
    if repo is None:
        raise InputError(
            f"no package artifact found under {store_dir or 'artifacts'}/package. Fix: run `pipeline stages=[package]` "
            f"(or `make run`), or pass package.repository=/path/to/model_repository."
        )
    return repo


def verified_repository(
    arg: str | None, store_dir: str | None, public_key: str | None, certificate_chain: list[str], *, verify: bool = False
) -> Path:
    """:func:`resolve_repository` after the release verifies (``package.verify_key`` / ``verify_certificate_chain``;
    :func:`pipeline.release.verify.verify_release`: signature, SHA256SUMS, manifest, provenance). An archive is
    verified in its release folder; a package artifact (or its ``model_repository/``) through the ``release/`` folder
    beside it, and the served repository's files must then equal the signed manifest's ``repository_files``.

    Raises:
        InputError (exit 2): the release does not verify (naming the file), or the repository has no release to verify.
    """
    from ..release.archive import check_repository_files
    from ..release.verify import verify_release

    p = Path(arg).expanduser().absolute() if arg else None
    if p is not None and p.is_file():
        rep = verify_release(p, public_key=public_key, certificate_chain=certificate_chain, key_field="package.verify_key")
        print(f"release verified: {rep['archive']} ({rep['signature']})")
        return resolve_repository(arg, store_dir, verify=verify)
    repo = resolve_repository(arg, store_dir, verify=verify)
    rel = PackageArtifact(repo.parent).release_dir
    if not (rel / PackageArtifact.SHA256SUMS).is_file():
        raise InputError(
            f"{repo}: no release beside it ({rel} has no {PackageArtifact.SHA256SUMS}), so it cannot be verified and "
            f"package.verify_key is set; refusing to serve it. Fix: serve the release archive "
            f"(pipeline serve <release>/<name>.tar.gz) or the package artifact it came from."
        )
    rep = verify_release(rel, public_key=public_key, certificate_chain=certificate_chain, key_field="package.verify_key")
    check_repository_files(repo, rep["manifest"])
    print(f"release verified: {rep['archive']} ({rep['signature']}); {repo} matches its signed manifest")
    return repo


def refuse_unvouched_default(repo: Path, man: dict[str, Any]) -> None:
    """``pipeline serve`` without a path serves the newest package only when its evaluation gate vouches for it.

    Raises:
        InputError (exit 2): the newest package's gate did not pass (packaged with ``package.allow_failed_gate=true``),
            naming the package and the two fixes (name it to serve it anyway, which prints the gate warning, or
            package a release whose gate passes).
    """
    gate = ReleaseGate.of_manifest(man)
    if gate is not None and not gate.vouches:
        raise InputError(
            f"the newest package in the store, {repo.parent}, did not pass its evaluation gate ({gate.verdict_name}; "
            f"packaged with package.allow_failed_gate=true), and `pipeline serve` without a path serves only a package "
            f"the gate vouches for. Fix: name it to serve it anyway (`pipeline serve {repo.parent}`), or package a "
            f"release whose gate passes."
        )


def release_warnings(man: dict[str, Any]) -> list[str]:
    """What a user about to serve this release must know from its ``release_manifest.json``: an evaluation gate that
    did not pass (packaged with ``package.allow_failed_gate=true``) and a serving parity check that did not pass or was
    switched off. Empty for a release the gate vouches for (or a repository without a manifest)."""
    out: list[str] = []
    gate = ReleaseGate.of_manifest(man)
    if gate is not None and not gate.vouches:
        reason = gate.reason
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        out.append(
            f"this release's evaluation gate did not pass ({gate.verdict_name}: {reason}; whole reason in "
            "release_manifest.json -> evaluation.gate); it was packaged with package.allow_failed_gate=true, so the gate "
            "does not vouch for what this server answers."
        )
    parity = ReleaseManifest.from_json(man).parity or ParityRecord()
    status = parity.status
    if status == "disabled":
        out.append(f"served == evaluated was not checked for this release ({parity.disabled_by or 'disabled'}).")
    elif status not in (None, "passed", "not run here"):
        out.append(f"this release's serving parity check did not pass (status {status!r}).")
    return out


#: the fix of a ``hydra.*`` override given to ``pipeline serve``, which runs no Hydra app
SERVE_HYDRA_FIX = (
    "drop it; the server log goes to runs/serve-<time>/ under the current folder (the ready: line prints its path), "
    "a release archive is unpacked under runs/ too, and the ports and host are package.* overrides "
    "(pipeline serve --help)"
)


def main(argv: list[str] | None = None) -> int:
    from ..core.config import ConfigError, compose
    from ..core.config.hydra_settings import hydra_key, refuse_hydra_settings
    from ..core.config.package import host_problems
    from .server import TritonServer

    argv = list(argv or [])
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    openai = "--openai" in argv
    unknown_flags = [a for a in argv if a.startswith("-") and a != "--openai"]
    if unknown_flags:
        print(f"error: unknown option(s) {unknown_flags}; `pipeline serve --help` lists them.", file=sys.stderr)
        return EXIT_INPUT
    hydra_args = [a for a in argv if hydra_key(a) is not None]  # ~hydra.x has no "=": not a path either
    paths = [a for a in argv if "=" not in a and not a.startswith("-") and a not in hydra_args]
    overrides = [a for a in argv if "=" in a]
    try:
        refuse_hydra_settings(hydra_args, "`pipeline serve`", SERVE_HYDRA_FIX)
        cfg = compose(overrides)
        pc = cfg.package
        bad_host = host_problems(pc.host)
        if bad_host:
            raise ConfigError(bad_host)
        arg = paths[0] if paths else pc.repository
        if pc.verify_key or pc.verify_certificate_chain:
            repo = verified_repository(arg, cfg.store_dir, pc.verify_key, list(pc.verify_certificate_chain), verify=cfg.verify_cache)
        else:
            repo = resolve_repository(arg, cfg.store_dir, verify=cfg.verify_cache)
        man = PackageArtifact(repo.parent).read_release_manifest()
        if not arg:
            refuse_unvouched_default(repo, man)
        target = ReleaseManifest.from_json(man).target or ("onnxruntime_genai" if (repo / "onnxruntime_genai").is_dir() else "tensorrt_llm")
        print(f"model repository: {repo}  (target {target})")
        for w in release_warnings(man):
            print(f"warning: {w}", file=sys.stderr)
        if target == "tensorrt_llm":
            return _print_trtllm_command(repo, man, cfg, openai)
        srv = TritonServer(
            repo,
            pc.grpc_port,
            pc.http_port,
            pc.metrics_port,
            host=pc.host,
            ready_timeout_s=pc.ready_timeout_s,
            log_dir=Path("runs") / f"serve-{time.strftime('%Y%m%d-%H%M%S')}",
        )
        print("starting tritonserver ...", flush=True)
        srv.start()
    except KeyboardInterrupt:  # Ctrl-C before the server was ready: TritonServer.start already stopped it
        print("error (exit 130): interrupted while starting the server", file=sys.stderr)
        return EXIT_INTERRUPTED
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT
    oai = None
    if openai:
        from .openai_server import OpenAIServer

        try:
            oai = OpenAIServer(srv.grpc_url, repo, host=pc.host, port=pc.openai_port, triton=srv).start()
        except PipelineError as e:
            srv.stop()
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
    return _serve_until_stopped(srv, repo, oai)


def _print_trtllm_command(repo: Path, man: dict[str, Any], cfg: Any, openai: bool) -> int:
    """A TensorRT-LLM package is served by the NGC container on a GPU host: print the command (LLM API layout: NVIDIA's
    model.py notice and command); exit code (2 for --openai, which needs a server this command runs)."""
    from ..facts.trtllm import llmapi_command, llmapi_notice
    from .server import ngc_command

    pc = cfg.package
    image = ReleaseManifest.from_json(man).serving_image or pc.serving_image or cfg.target.serving_image
    grpc, http, metrics = pc.grpc_port or 8001, pc.http_port or 8000, pc.metrics_port or 8002
    if (repo / "tensorrt_llm" / "1" / "model.yaml").is_file():  # PyTorch backend (LLM API): NVIDIA's model.py needed
        print(llmapi_notice(image).split("\n\nOne command")[0] + "\n")
        print("  " + llmapi_command(str(repo), image, grpc_port=grpc, http_port=http, metrics_port=metrics))
        return 0
    print("TensorRT-LLM engines are served by the NGC Triton + TensorRT-LLM container on a GPU host:\n")
    ranks = len(list((repo / "tensorrt_llm" / "1" / "engine").glob("rank*.engine"))) or 1
    print("  " + ngc_command(str(repo), image, grpc_port=grpc, http_port=http, metrics_port=metrics, world_size=ranks))
    print("\n(the repository's absolute paths expect it mounted at /models, as the command does)")
    if openai:
        print(
            "error: --openai starts the endpoint next to a server this command runs; for a TensorRT-LLM package, run the "
            "OpenAI front end on the GPU host (docs/package.md, OpenAI-compatible endpoint).",
            file=sys.stderr,
        )
        return EXIT_INPUT
    return 0


#: seconds between two looks at the server and its backend processes (a dead engine is noticed within this)
WATCH_S = 1.0


def _serve_until_stopped(srv: Any, repo: Path, oai: Any) -> int:
    """Record the running server for ``pipeline client``, print where it listens, and wait for Ctrl-C/SIGTERM, the
    server's exit or the death of a model's backend process (the engine; :func:`pipeline.serve.server.dead_backends`);
    stop everything. Exit code: 1 when tritonserver exited on its own, a backend process died (a supervisor restarts
    the deployment) or the server did not stop cleanly; else 130 after Ctrl-C, 0 after SIGTERM."""
    stop = threading.Event()
    stopped_by: list[int] = []

    def _on_signal(signum: int, _frame: Any) -> None:
        stopped_by.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    from .registry import forget, record

    assert srv.process is not None, "start() returned: tritonserver is running"
    record(srv.grpc_url, srv.http_url, repo, srv.process.pid)  # `pipeline client` reads the served package's tokenizer from it
    print(f"ready: gRPC {srv.grpc_url}  HTTP {srv.http_url}  metrics {srv.client_host}:{srv.metrics_port}  (log {srv.log_path})")
    print(
        f'try:   pipeline client --url {srv.grpc_url} --stream "Extract the order ID from this message: Hello, I want to cancel order ORD-76526 before it ships."'
    )
    if oai is not None:
        assert oai.frontend is not None, "OpenAIServer.start() sets the front end"
        print(
            f"OpenAI-compatible endpoint: {oai.url}  (model {oai.frontend.model_id!r}; /v1/models, /v1/completions, /v1/chat/completions)"
        )
    print("Ctrl-C stops the server.", flush=True)
    srv.failure()  # Triton keeps a model "ready" after its stub died: watch the stubs themselves, from now on
    while not stop.wait(WATCH_S):
        why = srv.failure()  # the endpoint's /health and requests read the same condition (OpenAIServer(triton=srv))
        if why:
            if "backend process" in why:
                why += ". Stopping so a supervisor restarts the deployment"
            if oai is not None and oai.frontend is not None:
                oai.frontend.unhealthy = why  # /health answers 503 and requests 503 until the endpoint is down
            print(f"error (exit 1): {why}; log: {srv.log_path}\n{srv.log_tail(3000)}", file=sys.stderr, flush=True)
            if oai is not None:
                oai.stop()
            srv.stop()
            forget(srv.grpc_url)
            return 1
    if oai is not None:
        oai.stop()
    rc = srv.stop()
    forget(srv.grpc_url)
    if srv.stop_note:
        print(f"tritonserver stopped cleanly: {srv.stop_note}")
    else:
        print(f"tritonserver stopped (exit code {rc})")
    if rc != 0:
        print(f"error: tritonserver did not stop cleanly (exit code {rc}); log: {srv.log_path}", file=sys.stderr)
        return 1
    # Ctrl-C is an interruption (exit 130, the exit-code table in docs/cli.md); SIGTERM, how service managers stop a service,
    # is a requested stop (exit 0)
    return EXIT_INTERRUPTED if stopped_by and stopped_by[0] == signal.SIGINT else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
