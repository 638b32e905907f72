"""Start a real Triton Inference Server on a model repository and wait until it is ready.

On a CPU machine the server binary is the one shipped in the ``nvidia-pytriton`` wheel (Triton 2.51)
inside the serving virtualenv ``.venv-serve`` (``make serve-env``).  The facts this module relies on
are in ``docs/reference/triton.md`` §5 (checked on this project's CI machines):

* binary ``pytriton/tritonserver/bin/tritonserver``; Python backend in ``pytriton/tritonserver/backends/python``;
  per-Python stubs in ``pytriton/tritonserver/python_backend_stubs/3.X/`` (the matching one is linked into a
  backends folder prepared here);
* the stub links ``libpython3.X.so.1.0``: the interpreter's ``LIBDIR`` goes on ``LD_LIBRARY_PATH``;
* the stub ignores ``PYTHONPATH`` and takes ``site-packages`` from the first ``python3`` on ``PATH``:
  ``.venv-serve/bin`` goes first on ``PATH``;
* numpy must be < 2 in that environment (2.x silently corrupts tensors in the 2.51 stub).

By default every endpoint binds to 127.0.0.1 only (``host``); port 0 picks a free port.

Usage::

    with TritonServer(repo_dir, grpc_port=0) as srv:
        print(srv.grpc_url)          # "127.0.0.1:40123"
        ...                          # srv.log_path is kept after stop() when the server failed
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

from ..errors import InputError, PipelineError, PreflightError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SERVE_VENV = REPO_ROOT / ".venv-serve"
PYTRITON_REL = Path("pytriton") / "tritonserver"


class ServerError(PipelineError):
    """The server failed to start, died, or did not become ready; the message names the log file."""


_RUNNING: weakref.WeakSet[TritonServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """Stop servers still running when the interpreter exits (the server runs in its own session, so it would outlive us)."""
    for srv in list(_RUNNING):
        with contextlib.suppress(Exception):
            srv.stop(timeout_s=10)


# --------------------------------------------------------------------------- ports
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free at the time of the call (bind to port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(port: int, host: str = "127.0.0.1", field: str = "port") -> None:
    """Raise :class:`InputError` naming ``field`` when ``port`` cannot be bound on ``host``."""
    if not 0 < port < 65536:
        raise InputError(f"{field}={port}: not a TCP port. Fix: use 1..65535, or 0 to pick a free port.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise InputError(
                f"{field}={port}: cannot bind {host}:{port} ({e.strerror or e}); another server is probably "
                f"running there. Fix: stop it, or pass {field}=0 to pick a free port."
            ) from e


def resolve_ports(grpc_port: int, http_port: int, metrics_port: int, host: str) -> tuple[int, int, int]:
    """Replace 0 by distinct free ports; check explicit ports can be bound. Returns (grpc, http, metrics).

    Raises:
        InputError: every port that cannot be bound or is used twice, in one message, each named by the config field
            that sets it (``package.grpc_port`` ...), so one failed start tells every fix.
    """
    out: list[int] = []
    problems: list[str] = []
    for name, p in (("package.grpc_port", grpc_port), ("package.http_port", http_port), ("package.metrics_port", metrics_port)):
        if p == 0:
            q = free_port(host)
            while q in out:
                q = free_port(host)
            out.append(q)
            continue
        try:
            check_port_free(p, host, name)
        except InputError as e:
            problems.append(str(e))
        if p in out:
            problems.append(f"{name}={p}: the same port is used twice. Fix: give each endpoint its own port (or 0).")
        out.append(p)
    if problems:
        raise InputError("\n".join(problems))
    return out[0], out[1], out[2]


# --------------------------------------------------------------------------- environment
class ServeEnv:
    """Where the Triton binary, Python backend and stub of the serving virtualenv live.

    Raises :class:`PreflightError` with the fix (``make serve-env``) when something is missing.
    """

    def __init__(self, venv: str | os.PathLike | None = None) -> None:
        self.venv = Path(venv or os.environ.get("PIPELINE_SERVE_VENV") or DEFAULT_SERVE_VENV).absolute()
        self.python = self.venv / "bin" / "python3"
        if not self.python.exists():
            raise PreflightError(
                f"serving virtualenv not found at {self.venv} (no bin/python3). Fix: run `make serve-env` "
                f"(builds .venv-serve from pipeline/serve/requirements-serve.txt + nvidia-pytriton==0.7.0)."
            )
        info = subprocess.run(
            [
                str(self.python),
                "-c",
                "import sys,sysconfig,site;print(f'{sys.version_info[0]}.{sys.version_info[1]}');"
                "print(sysconfig.get_config_var('LIBDIR'));print(site.getsitepackages()[0])",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if info.returncode != 0:
            raise PreflightError(f"{self.python} does not run: {info.stderr.strip()[-500:]}. Fix: rebuild it with `make serve-env`.")
        pyver, libdir, site_packages = info.stdout.split("\n")[:3]
        self.py_version, self.libdir, self.site_packages = pyver.strip(), Path(libdir.strip()), Path(site_packages.strip())
        self.root = self.site_packages / PYTRITON_REL
        self.binary = self.root / "bin" / "tritonserver"
        self.python_backend = self.root / "backends" / "python"
        self.stub = self.root / "python_backend_stubs" / self.py_version / "triton_python_backend_stub"
        self.libs = self.site_packages / "nvidia_pytriton.libs"
        missing = [p for p in (self.binary, self.python_backend / "libtriton_python.so", self.stub) if not p.exists()]
        if missing:
            raise PreflightError(
                f"the Triton server from nvidia-pytriton is incomplete in {self.venv}: missing {[str(m) for m in missing]}. "
                f"Fix: `make serve-env` (installs nvidia-pytriton==0.7.0 --no-deps)."
            )
        numpy_major = subprocess.run(
            [str(self.python), "-c", "import numpy;print(numpy.__version__)"], capture_output=True, text=True, timeout=60
        )
        ver = numpy_major.stdout.strip()
        if numpy_major.returncode != 0 or not ver or int(ver.split(".")[0]) >= 2:
            raise PreflightError(
                f"numpy in {self.venv} is {ver or 'missing'}; the Triton 2.51 Python backend needs numpy < 2 "
                f"(2.x silently corrupts tensors). Fix: `{self.python} -m pip install 'numpy<2'` or `make serve-env`."
            )

    def prepare_backends(self, dest: Path) -> Path:
        """Create ``dest/python`` with links to the Python backend and the matching stub; returns ``dest``."""
        py = dest / "python"
        py.mkdir(parents=True, exist_ok=True)
        for src in (self.python_backend / "libtriton_python.so", self.python_backend / "triton_python_backend_utils.py", self.stub):
            link = py / src.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(src)  # a link keeps the stub's $ORIGIN rpath to nvidia_pytriton.libs valid
        return dest

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for ``tritonserver``: venv ``bin`` first on PATH, libpython + bundled libs on LD_LIBRARY_PATH."""
        env = dict(os.environ if base is None else base)
        env.pop("PYTHONPATH", None)  # the stub ignores it; a stray one would only confuse model.py imports
        env.pop("PYTHONHOME", None)
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        libs = [str(self.libdir), str(self.libs)]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        env.setdefault("OMP_NUM_THREADS", "1")
        # the Python backend would write __pycache__/*.pyc into the served repository (a packaged, checksummed
        # release: the parity check serves the staged repository before it is archived)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        return env


# --------------------------------------------------------------------------- server
LEAKED_UNLOAD_GRACE_S = 3.0
"""Seconds after Triton starts unloading (no inference in flight) for which a live model with no instance stopped
is taken as held by Triton 2.51's leaked gRPC stream request (:meth:`TritonServer._wait_stopped`).  Triton stops a
model's instances as soon as its last reference goes (the same millisecond in the logs here), so 3 s is ample."""

_LIVE_LINE = re.compile(r'"Timeout -?\d+: Found (\d+) live models and (\d+) in-flight non-inference requests"')
_MODEL_STATE_LINE = re.compile(r'"(\S+) v(\d+): (\w+)"')
_INSTANCE_STOP_LINE = re.compile(r'"Stopping backend thread for (\S+)\.\.\."')
_UNLOADED_LINE = re.compile(r"successfully unloaded '([^']+)' version")


def leaked_models(shutdown_log: str) -> list[str]:
    """Models that Triton's shutdown log (verbose level 1, from the signal on) shows as held only by a leaked request.

    Read from the last ``Timeout N: Found K live models and M in-flight non-inference requests`` block: M must be 0,
    every listed model must be UNLOADING without any instance stopped (``Stopping backend thread for
    <model>_<group>_<instance>...``) and without ``successfully unloaded``.  Returns their names (empty: none, or the
    log does not show enough; then the caller waits as usual).
    """
    lines = shutdown_log.splitlines()
    last = max((i for i, ln in enumerate(lines) if _LIVE_LINE.search(ln)), default=None)
    if last is None:
        return []
    m = _LIVE_LINE.search(lines[last])
    assert m is not None
    n_live, n_requests = int(m.group(1)), int(m.group(2))
    if n_live == 0 or n_requests != 0:
        return []
    listed: list[tuple[str, str]] = []
    for ln in lines[last + 1 :]:
        s = _MODEL_STATE_LINE.search(ln)
        if s is None:
            break
        listed.append((s.group(1), s.group(3)))
    if len(listed) != n_live:
        return []  # the block is not complete in the log yet (or not verbose)
    stopped = {mm.group(1).rsplit("_", 2)[0] for mm in _INSTANCE_STOP_LINE.finditer(shutdown_log)}
    unloaded = set(_UNLOADED_LINE.findall(shutdown_log))
    if any(state != "UNLOADING" or name in stopped or name in unloaded for name, state in listed):
        return []
    return sorted(name for name, _ in listed)


REAPER = Path(__file__).with_name("reaper.py")
"""The supervisor every server runs under (:mod:`pipeline.serve.reaper`, standalone, stdlib only)."""
SHM_FAMILY = "pipeline_triton_"
"""Prefix of the Python backend's ``/dev/shm`` regions of servers started here: ``<SHM_FAMILY><owner pid>_<token>_``."""


def _reaper_prefix(shm_prefix: str) -> list[str]:
    """``python -I reaper.py PID PDEATH SHM_PREFIX --``: the server runs under :mod:`pipeline.serve.reaper`.

    The server runs in its own session (``start_new_session``: a Ctrl-C in the terminal reaches this process, which
    stops the server in order), so a kill of this process's group (``kill -9``, a CI runner ending a job) does not reach
    it. The reaper asks the kernel for SIGTERM when this process dies however it dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``; it follows the parent *thread*, so it is armed only when the server is started from the
    main thread, one that lives as long as the process), stops the server, and, as a child subreaper, SIGKILLs the
    Python-backend stubs the server leaves behind and removes their ``/dev/shm`` regions."""
    pdeath = "1" if threading.current_thread() is threading.main_thread() else "0"
    return [sys.executable, "-I", str(REAPER), str(os.getpid()), pdeath, shm_prefix, "--"]


class TritonServer:
    """A running ``tritonserver`` process (context manager).

    Args:
        repo_dir: the model repository (folders with ``config.pbtxt`` + numeric version folders).
        grpc_port, http_port, metrics_port: ports; 0 = pick a free one (default for all three).
        host: bind address of every endpoint; default ``127.0.0.1`` (nothing is exposed to the network).
        serve_venv: serving virtualenv (default ``.venv-serve`` of the repo, or ``$PIPELINE_SERVE_VENV``).
        ready_timeout_s: seconds to wait for server and model readiness (raises :class:`ServerError` after).
        log_dir: where ``tritonserver.log`` is written (default: a new temporary folder, kept if start fails).
        models: names whose readiness is awaited (default: every model folder of the repository).
        log_verbose: Triton's ``--log-verbose`` level.
        extra_args: further ``tritonserver`` flags.

    Attributes after :meth:`start`: ``grpc_port``, ``http_port``, ``metrics_port``, ``grpc_url`` ("127.0.0.1:P"),
    ``http_url``, ``log_path``, ``process``, ``returncode`` (after :meth:`stop`).

    Raises:
        PreflightError: the serving environment is missing (fix: ``make serve-env``).
        InputError: a port is taken or the repository is not a folder.
        ServerError: the server exited or was not ready within ``ready_timeout_s`` (message holds the log tail).
    """

    def __init__(
        self,
        repo_dir: str | os.PathLike,
        grpc_port: int = 0,
        http_port: int = 0,
        metrics_port: int = 0,
        *,
        host: str = "127.0.0.1",
        serve_venv: str | os.PathLike | None = None,
        ready_timeout_s: float = 180.0,
        log_dir: str | os.PathLike | None = None,
        models: Sequence[str] | None = None,
        log_verbose: int = 0,
        extra_args: Iterable[str] = (),
    ) -> None:
        self.repo_dir = Path(repo_dir).absolute()
        if not self.repo_dir.is_dir():
            raise InputError(f"model repository {self.repo_dir} is not a folder. Fix: pass the `model_repository/` of a package artifact.")
        self.requested_ports = (int(grpc_port), int(http_port), int(metrics_port))
        self.host = host
        self.serve_venv = serve_venv
        self.ready_timeout_s = float(ready_timeout_s)
        self.log_dir = Path(log_dir).absolute() if log_dir else None
        self.models = (
            list(models) if models is not None else sorted(p.name for p in self.repo_dir.iterdir() if (p / "config.pbtxt").is_file())
        )
        self.log_verbose = log_verbose
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen | None = None
        self._watched: dict[int, str] | None = None  # failure(): the stubs watched
        self.returncode: int | None = None
        self.log_path: Path | None = None
        self._log_file: IO[bytes] | None = None
        self.grpc_port = self.http_port = self.metrics_port = 0
        self.command: list[str] = []
        self.stop_note = ""

    # -- properties
    @property
    def client_host(self) -> str:
        """Address clients use: always the loopback address unless an explicit non-wildcard host was bound."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "127.0.0.1", "localhost", "") else self.host

    @property
    def grpc_url(self) -> str:
        return f"{self.client_host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.client_host}:{self.http_port}"

    # -- lifecycle
    def start(self) -> TritonServer:
        """Start the process and wait until the server and every model are ready."""
        env = ServeEnv(self.serve_venv)
        workdir = Path(tempfile.mkdtemp(prefix="triton-")) if self.log_dir is None else self.log_dir
        workdir.mkdir(parents=True, exist_ok=True)
        self._workdir = workdir
        backends = env.prepare_backends(workdir / "backends")
        self.log_path = workdir / "tritonserver.log"
        last_err: Exception | None = None
        from .reaper import sweep_stale_shm

        sweep_stale_shm(SHM_FAMILY)  # regions of servers whose owner was killed before its reaper could clean up
        shm_prefix = f"{SHM_FAMILY}{os.getpid()}_{secrets.token_hex(4)}_"
        for _attempt in range(3):  # a port picked as free can be taken by someone else before Triton binds it
            self.grpc_port, self.http_port, self.metrics_port = resolve_ports(*self.requested_ports, host=self.host)
            self.command = [
                str(env.binary),
                f"--model-repository={self.repo_dir}",
                f"--backend-directory={backends}",
                f"--grpc-address={self.host}",
                f"--grpc-port={self.grpc_port}",
                f"--http-address={self.host}",
                f"--http-port={self.http_port}",
                f"--metrics-address={self.host}",
                f"--metrics-port={self.metrics_port}",
                "--allow-gpu-metrics=false",
                "--disable-auto-complete-config",
                "--exit-timeout-secs=15",
                f"--log-verbose={self.log_verbose}",
                f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
                *self.extra_args,
            ]
            self._log_file = open(self.log_path, "ab")
            self._log_file.write(("$ " + " ".join(self.command) + "\n").encode())
            self._log_file.flush()
            self.process = subprocess.Popen(
                [*_reaper_prefix(shm_prefix), *self.command],
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env.environment(),
                cwd=str(workdir),
                start_new_session=True,
            )
            _RUNNING.add(self)
            try:
                self._wait_ready()
                return self
            except ServerError as e:
                last_err = e
                port_clash = "address already in use" in self.log_tail(4000).lower() and 0 in self.requested_ports
                self._terminate()
                if not port_clash:
                    raise
            except BaseException:  # Ctrl-C (KeyboardInterrupt) or any other error while waiting: never leave it running
                self._terminate()
                raise
        assert last_err is not None
        raise last_err

    def _wait_ready(self) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        deadline = time.monotonic() + self.ready_timeout_s
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            while True:
                assert self.process is not None
                rc = self.process.poll()
                if rc is not None:
                    raise ServerError(
                        f"tritonserver exited with code {rc} before it was ready. Log: {self.log_path}\n--- log tail ---\n{self.log_tail()}"
                    )
                try:
                    if client.is_server_live() and client.is_server_ready() and all(client.is_model_ready(m) for m in self.models):
                        return
                except InferenceServerException:
                    pass
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"tritonserver was not ready after {self.ready_timeout_s:.0f} s (models {self.models}). "
                        f"Log: {self.log_path}\n--- log tail ---\n{self.log_tail()}"
                    )
                time.sleep(0.25)
        finally:
            with contextlib.suppress(Exception):
                client.close()

    def log_tail(self, n_chars: int = 6000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()[-n_chars:]
        return data.decode("utf-8", "replace")

    def _terminate(self, timeout_s: float = 30.0) -> int | None:
        p = self.process
        if p is None:
            return self.returncode
        self.stop_note = ""
        rc: int | None = None
        if p.poll() is None:
            offset = self.log_path.stat().st_size if self.log_path is not None and self.log_path.exists() else 0
            self._verbose_shutdown_log()
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)  # Triton shuts down gracefully on SIGTERM (waits --exit-timeout-secs)
            rc = self._wait_stopped(p, offset, timeout_s)
        # stubs are in the same session; make sure none outlives the server
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        self.returncode = p.returncode if rc is None else rc
        self.process = None
        _RUNNING.discard(self)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.returncode

    def _verbose_shutdown_log(self) -> None:
        """Raise Triton's log verbosity to 1 for the shutdown (gRPC ``LogSettings``; best effort): the per-model unload
        lines :meth:`_wait_stopped` reads are verbose-level in Triton 2.51."""
        try:
            import tritonclient.grpc as grpcclient

            c = grpcclient.InferenceServerClient(self.grpc_url)
            try:
                c.update_log_settings({"log_verbose_level": 1}, client_timeout=5)
            finally:
                c.close()
        except Exception:
            pass

    def _wait_stopped(self, p: subprocess.Popen, offset: int, timeout_s: float) -> int | None:
        """Wait for the server to exit after SIGTERM, at most ``timeout_s`` (then kill).  Returns the exit code to report,
        or None for the process's own.

        One known Triton 2.51 defect is cut short instead of waited out: the gRPC stream handler
        (``src/grpc/stream_infer_handler.cc``) keeps the state of a stream's *first* request for the stream's
        cancellation notification; when the server rejected that request before running it (a missing input, a wrong
        data type) the state never enters the in-flight set, so when the client then cancels the stream
        (``stop_stream(cancel_requests=True)``) ``IssueRequestCancellation`` never hands it back to the completion queue
        and it is never released.  It holds the rejected ``TRITONSERVER_InferenceRequest``, which holds its model: that
        model stays UNLOADING, Triton waits ``--exit-timeout-secs`` and exits 1 ("Exit timeout expired"), and the
        model's ``finalize`` never runs.  Recognised from the shutdown log (verbose level 1): Triton reported no
        in-flight inference and started unloading, every other model unloaded, and the models still live never had an
        instance stopped (``Stopping backend thread for <model>_...``: their model object is still referenced, though no
        request runs) for :data:`LEAKED_UNLOAD_GRACE_S`.  Those models are idle, so the process is ended there; the
        stop counts as clean (0) and :attr:`stop_note` says what happened, also appended to the log.
        """
        deadline = time.monotonic() + timeout_s
        unloading_since: float | None = None
        while True:
            try:
                return p.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
                return None
            text = self._log_since(offset)
            if unloading_since is None:
                if "All models are stopped, unloading models" in text:
                    unloading_since = now
                continue
            if now - unloading_since < LEAKED_UNLOAD_GRACE_S:
                continue
            stuck = leaked_models(text)
            if stuck:
                self.stop_note = (
                    f"no inference was in flight and every other model unloaded; model(s) {', '.join(stuck)} stayed "
                    f"referenced by a request Triton 2.51's gRPC stream handler never releases (a stream whose first "
                    f"request the server refused was then cancelled by its client), so they could never unload; the "
                    f'server was ended instead of waiting out its exit timeout (docs/package.md "Stopping the server")'
                )
                if self._log_file is not None:
                    with contextlib.suppress(Exception):
                        self._log_file.write(f"pipeline: {self.stop_note}\n".encode())
                        self._log_file.flush()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
                return 0

    def _log_since(self, offset: int) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s`` for a clean exit, then kill. Returns the exit code (0 = clean; see
        :meth:`_wait_stopped` for the one Triton defect that is ended early and still counts as clean, with
        :attr:`stop_note` set)."""
        return self._terminate(timeout_s)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def backend_processes(self) -> dict[int, str]:
        """The Python-backend stub processes of this server: ``{pid: model name}``.

        Each instance of a Python-backend model runs in its own ``triton_python_backend_stub`` child of tritonserver
        (itself the child of the supervisor this object started)
        (argv[1] = ``<repository>/<model>/<version>/model.py``; Triton python_backend ``src/stub_launcher.cc``).  Triton
        2.51 keeps reporting a model ready after its stub died (server and model readiness stay 200 while every request
        fails with "Stub process ... is not healthy"), so :func:`dead_backends` watches these pids instead.  Linux
        ``/proc`` only; ``{}`` elsewhere or before :meth:`start`.
        """
        if self.process is None:
            return {}
        procs: list[tuple[int, int, list[bytes]]] = []
        for d in Path("/proc").glob("[0-9]*"):
            try:
                stat = (d / "stat").read_text()
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            procs.append((int(d.name), int(stat.rsplit(")", 1)[1].split()[1]), argv))
        # the server process is the supervisor (pipeline/serve/reaper.py): tritonserver is its child
        parents = {self.process.pid} | {pid for pid, ppid, _ in procs if ppid == self.process.pid}
        return {
            pid: Path(argv[1].decode("utf-8", "replace")).parent.parent.name
            for pid, ppid, argv in procs
            if ppid in parents and argv and argv[0].endswith(b"triton_python_backend_stub") and len(argv) > 1
        }

    def failure(self) -> str | None:
        """Why this server can no longer answer, or None: a Python-backend stub of the ones running at the first call
        died (:meth:`backend_processes`, :func:`dead_backends`: Triton still reports the model ready while every
        request to it fails), or tritonserver exited.  The one readiness condition of ``pipeline serve``'s watcher and
        of the OpenAI endpoint's ``/health`` and requests (``Frontend.down``); reads ``/proc`` for the watched pids only."""
        if self._watched is None:
            self._watched = self.backend_processes()
        dead = dead_backends(self._watched)
        if dead:
            return (
                f"the backend process of model(s) {sorted(set(dead.values()))} died (pid {sorted(dead)}); every request "
                f"to it would fail while Triton still reports it ready"
            )
        return None if self.is_running() else "tritonserver exited unexpectedly"

    def cleanup(self) -> None:
        """Remove the temporary work folder (log included). Only for a folder this object created."""
        if self.log_dir is None and getattr(self, "_workdir", None) is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()


def dead_backends(processes: dict[int, str]) -> dict[int, str]:
    """The entries of ``processes`` (:meth:`TritonServer.backend_processes`) whose process is gone or a zombie."""
    dead = {}
    for pid, model in processes.items():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        if state in ("gone", "Z", "X"):
            dead[pid] = model
    return dead


def ngc_command(
    repo_dir: str,
    image: str,
    *,
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
    world_size: int = 1,
    container_repo: str = "/models",
) -> str:
    """The ``docker run`` command that serves ``repo_dir`` in the NGC Triton + TensorRT-LLM image on a GPU host.

    Flags follow the TensorRT-LLM backend README (docs/reference/triton.md §3): ``--gpus all --shm-size=2g --ulimit memlock=-1
    --ulimit stack=67108864``.  The repository is mounted at ``container_repo`` (``/models``), where the package
    stage's absolute paths (``gpt_model_path``, tokenizer) point.  ``world_size`` > 1 (tensor x pipeline parallel
    ranks of the engine) goes through the container's ``launch_triton_server.py`` (MPI; tensorrtllm_backend scripts/launch_triton_server.py).
    """
    ports = f"-p {grpc_port}:{grpc_port} -p {http_port}:{http_port} -p {metrics_port}:{metrics_port}"
    if world_size > 1:
        server = (
            f"python3 /app/scripts/launch_triton_server.py --world_size={world_size} --model_repo={container_repo} "
            f"--grpc_port={grpc_port} --http_port={http_port} --metrics_port={metrics_port}"
        )
    else:
        server = (
            f"tritonserver --model-repository={container_repo} --grpc-port={grpc_port} --http-port={http_port} "
            f"--metrics-port={metrics_port} --disable-auto-complete-config"
        )
    return (
        f"docker run --rm -it --gpus all --shm-size=2g --ulimit memlock=-1 --ulimit stack=67108864 {ports} "
        f"-v {repo_dir}:{container_repo} {image} {server}"
    )


__all__ = ["ServeEnv", "ServerError", "TritonServer", "check_port_free", "free_port", "leaked_models", "ngc_command", "resolve_ports"]
