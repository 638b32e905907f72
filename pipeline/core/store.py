"""Content-addressed artifact store.

Every stage output lives in ``<root>/<stage>/<key>/`` where ``key`` is the sha256 of a
canonical JSON document holding (a) the stage's config fields that affect the bytes,
(b) the content digests of its input artifacts and external input files, (c) the versions
of the libraries that produce it, and (d) the stage's own format version.  Paths never
enter the key; contents do.

Writes are staged in ``<root>/<stage>/.tmp-<key>-<pid>-<rand>/`` and renamed into place
only after ``manifest.json`` (with ``"complete": true``) has been written and fsynced, all
under a per-key file lock (:mod:`filelock`).  A run killed at any point therefore leaves
at most a temporary folder, which is never trusted and is removed by the next producer of
the same key.  Two concurrent runs of the same key serialise on the lock; the second one
finds the first one's artifact and reports a cache hit.

An artifact's content digest (``output_digest``) covers only what determines its bytes: ``manifest.json`` (where
stages record timings, peak memory and other measurements of the run) and logs (``*.log``: progress bars, temporary
paths) are listed and size-checked like every output but left out of the digest, so a forced rebuild from the same
inputs has the same digest (tests/core/test_reproducible_release.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import PipelineError
from .contracts.manifest import ArtifactManifest
from .contracts.result import R, StageResult, result_class

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = "pipeline.manifest/v1"
_CHUNK = 1 << 20


class StoreError(PipelineError):
    """An artifact could not be written or read; the message names the path."""


# --------------------------------------------------------------------------- hashing
def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (streamed in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def tree_files(root: Path, *, follow_symlinks: bool = False, skip: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """Map of relative POSIX path -> {sha256, bytes} for every regular file under ``root``.

    Symbolic links are refused (an artifact must be self-contained) unless ``follow_symlinks``
    (external inputs: a Hugging Face cache snapshot is a folder of links to blobs; the linked
    content is hashed).  The manifest itself is skipped, and so is everything under a top-level name in ``skip``
    (:func:`input_files`).  Raises :class:`StoreError` naming the offending path.
    """
    out: dict[str, dict[str, Any]] = {}
    root = Path(root)
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if skip and rel.split("/", 1)[0] in skip:
            continue
        if p.is_symlink() and not follow_symlinks:
            raise StoreError(f"{p}: symbolic links are not allowed in an artifact; copy the file instead")
        if p.is_symlink() and not p.exists():
            raise StoreError(f"{p}: broken symbolic link (its target {os.readlink(p)!r} does not exist)")
        if p.is_dir() or rel == MANIFEST:
            continue
        out[rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    return out


#: outputs that record how a run went rather than what it made: verified like every output, not in ``output_digest``
RECORD_SUFFIXES = (".log",)


def is_record(rel: str) -> bool:
    """Whether the output ``rel`` (a relative POSIX path) is a run record left out of the content digest."""
    return rel.endswith(RECORD_SUFFIXES)


def digest_files(files: Mapping[str, Mapping[str, Any]]) -> str:
    """One digest for a file map from :func:`tree_files` (order-independent; run records, :func:`is_record`, are
    left out)."""
    h = hashlib.sha256()
    for rel in sorted(r for r in files if not is_record(r)):
        h.update(rel.encode())
        h.update(b"\0")
        h.update(files[rel]["sha256"].encode())
        h.update(b"\n")
    return h.hexdigest()


#: top-level folders of an input folder (a checkpoint) that are never its input: git's own store (a git clone of a
#: Hugging Face repository holds every weight a second time, as an LFS object under ``.git/lfs``) and
#: huggingface_hub's download metadata (``.cache/huggingface`` of a ``local_dir`` download).
NOT_INPUTS = (".git", ".cache")


def not_inputs(root: str | os.PathLike, outputs: Iterable[str | os.PathLike] = ()) -> set[str]:
    """The top-level names under the input folder ``root`` that :func:`input_files` leaves out: :data:`NOT_INPUTS`
    and, for each of the pipeline's own output folders in ``outputs`` (the store, the run's output folder) that lies
    inside ``root``, the top-level folder that holds it: the store with its lock files and ``.tmp-*`` folders, and
    Hydra's ``runs/`` (every run makes a new ``runs/<time>-<job>`` folder whose ``pipeline.log`` is still being
    written).  An output folder that is ``root`` itself, or holds it, leaves nothing out."""
    names = set(NOT_INPUTS)
    base = Path(root).resolve()
    for o in outputs:
        try:
            rel = Path(o).resolve().relative_to(base)
        except ValueError:
            continue
        if rel.parts:
            names.add(rel.parts[0])
    return names


def input_files(root: str | os.PathLike, outputs: Iterable[str | os.PathLike] = ()) -> dict[str, dict[str, Any]]:
    """The files of an input folder (a checkpoint) as :func:`tree_files` maps them, links followed, less what is not
    its input (:func:`not_inputs`): the one list that both its cache-key digest (:func:`digest_input`) and the
    export's ``model_info.json`` ``files`` use.  A folder that holds none of those has the file map, and so the
    digest, of :func:`tree_files`/:func:`digest_path`."""
    return tree_files(Path(root), follow_symlinks=True, skip=not_inputs(root, outputs))


def digest_input(path: str | os.PathLike, outputs: Iterable[str | os.PathLike] = ()) -> str:
    """Content digest of an external input: a file's sha256, or a folder's digest over :func:`input_files`."""
    p = Path(path)
    if p.is_dir():
        return digest_files(input_files(p, outputs))
    return digest_path(p)


def digest_path(path: str | os.PathLike) -> str:
    """Content digest of a file or a folder (folder: over relative names and file digests)."""
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    if p.is_dir():
        return digest_files(tree_files(p, follow_symlinks=True))
    raise StoreError(f"{p}: no such file or folder")


def canonical(obj: Any) -> Any:
    """Convert ``obj`` to plain JSON types, refusing anything that cannot be canonicalised.

    Dataclasses become dicts of their fields, tuples become lists, Paths are refused
    (paths must not enter a cache key: digest the content instead), floats must be finite.
    Raises ``TypeError`` naming the offending value: under-hashing would make the cache lie.
    """
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise TypeError(f"cannot hash non-finite float {obj!r}")
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if hasattr(obj, "value") and hasattr(obj, "name"):  # Enum
        return canonical(obj.value)
    raise TypeError(f"cannot canonicalise {type(obj).__name__} value {obj!r} for a cache key")


def canonical_json(obj: Any) -> str:
    return json.dumps(canonical(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def cache_key(document: Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of ``document``."""
    return hashlib.sha256(canonical_json(document).encode()).hexdigest()


# --------------------------------------------------------------------------- secrets
_SECRET_WORDS = {"token", "secret", "secrets", "password", "passwd", "apikey", "credential", "credentials", "auth", "authorization"}
_SPECIAL_TOKEN_WORDS = {"bos", "eos", "pad", "unk", "sep", "cls", "mask", "end", "start", "stop", "special", "additional"}


def is_secret_key(key: str) -> bool:
    """Whether a key or variable name names a secret: one of its words (split at ``_ - . /`` and spaces, any case)
    is ``token``, ``secret``, ``password``, ``auth``, ... or the pair ``api key`` (``HF_TOKEN``, ``access_token``,
    ``X-Api-Key``, ``db.password``).  Not: words that only contain one (``tokenizer.json``, ``tokenization.py``,
    ``tokenizers``, ``max_tokens``), token ids (``bos_token_id``, ``*_ids``) and special-token names (``pad_token``)."""
    words = [w for w in re.split(r"[^a-z0-9]+", key.lower()) if w]
    if not words or words[-1] in ("id", "ids"):
        return False
    for i, w in enumerate(words):
        if w in _SECRET_WORDS and not (w == "token" and i > 0 and words[i - 1] in _SPECIAL_TOKEN_WORDS):
            return True
        if w == "api" and i + 1 < len(words) and words[i + 1] == "key":
            return True
    return False


# A token-shaped secret is a whole word (no letter, digit, ``_`` or ``-`` right before or after it) with a known
# prefix and a random tail of 20+ characters in mixed case: Hugging Face ``hf_`` (huggingface_hub docs, "User access
# tokens"), OpenAI ``sk-`` / ``sk-proj-``, NVIDIA ``nvapi-``, GitHub ``ghp_`` (GitHub docs, "About authentication",
# token prefixes).  A word that merely contains a prefix (``task-finetunedsupportllama2024``) is not one.
_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9_-])(?:hf_|ghp_|sk-|nvapi-)([A-Za-z0-9_-]{20,})(?![A-Za-z0-9_-])")
# The userinfo of a URL (RFC 3986 section 3.2.1: ``scheme://user:password@host``).
_URL_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#@\s'\"]+)@")


def _mask_token(m: re.Match[str]) -> str:
    tail = m.group(1)
    return REDACTED if any(c.isupper() for c in tail) and any(c.islower() for c in tail) else m.group(0)


REDACTED = "***redacted***"


def _env_secrets() -> set[str]:
    return {v for k, v in os.environ.items() if is_secret_key(k) and len(v) >= 8}


def redact_text(text: str) -> str:
    """``text`` with secrets masked by ``***redacted***``: token-shaped words (see ``_TOKEN_RE``), the userinfo of
    URLs (``https://user:pass@registry`` -> ``https://***redacted***@registry``) and the values of secret-named
    environment variables (``HF_TOKEN``, ``*_API_KEY`` ...).  For recorded copies only (manifests, summaries, logs,
    ``.hydra/*.yaml``, labels): a path or value the run uses is never passed through it."""
    s = _TOKEN_RE.sub(_mask_token, text)
    s = _URL_USERINFO_RE.sub(lambda m: m.group(1) + REDACTED + "@", s)
    for sec in _env_secrets():
        if sec in s:
            s = s.replace(sec, REDACTED)
    return s


def redact(obj: Any) -> Any:
    """Copy of ``obj`` with values under secret-named keys (:func:`is_secret_key`) replaced and every other string
    passed through :func:`redact_text`.

    This is the project's one redaction: every place that writes the config (or anything derived from it:
    manifests, the run summary, the release manifest, archive names, Hydra's ``.hydra/*.yaml``, log
    records) goes through it or :func:`redact_text`.  Keys are redacted like values (file-name keys can carry a
    secret too).  ``obj`` itself is never changed: the run keeps using the real values.
    """

    def _r(o: Any, key: str = "") -> Any:
        if isinstance(o, Mapping):
            return {(redact_text(k) if isinstance(k, str) else k): _r(v, str(k)) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [_r(v, key) for v in o]
        if isinstance(o, str):
            if key and o and is_secret_key(key):
                return REDACTED
            return redact_text(o)
        return o

    return _r(obj)


def secret_fields(cfg: Any) -> list[str]:
    """Dotted names of the string values in a config dataclass tree that a recorded copy masks (a secret-named
    field, or a value :func:`redact_text` changes).  Nothing is changed: the run uses the values as given, and only
    what is written about it (manifests, summary, logs) goes through :func:`redact`.  Secrets belong in the
    environment (``HF_TOKEN``), never in a config value."""
    found: list[str] = []

    def _walk(o: Any, prefix: str, key: str) -> None:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            for f in dataclasses.fields(o):
                _walk(getattr(o, f.name), f"{prefix}.{f.name}" if prefix else f.name, f.name)
        elif isinstance(o, str):
            if o and (is_secret_key(key) or redact_text(o) != o):
                found.append(prefix)
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                _walk(v, f"{prefix}[{i}]", key)
        elif isinstance(o, dict):
            for k, v in o.items():
                _walk(v, f"{prefix}.{k}", str(k))

    _walk(cfg, "", "")
    return found


class RedactingFilter:
    """``logging`` filter: the formatted message of every record passes :func:`redact_text` (installed on every
    handler of the root logger by :func:`install_log_redaction`)."""

    def filter(self, record: Any) -> bool:
        try:
            msg = record.getMessage()
        except Exception:
            return True
        red = redact_text(msg)
        if red != msg or record.args:
            record.msg, record.args = red, ()
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def install_log_redaction() -> None:
    """Add :class:`RedactingFilter` to every handler of the root logger (idempotent)."""
    import logging

    for h in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())


def redact_files(paths: Any) -> None:
    """Rewrite text files (e.g. Hydra's ``.hydra/*.yaml``, ``multirun.yaml``) with :func:`redact_text` applied."""
    for p in paths:
        p = Path(p)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        red = redact_text(text)
        if red != text:
            tmp = p.with_name(f".{p.name}.{secrets.token_hex(4)}.tmp")
            tmp.write_text(red, encoding="utf-8")
            os.replace(tmp, p)


# --------------------------------------------------------------------------- store
_STORAGE_ERRNOS = {28, 27, 13, 30, 122, 1}  # ENOSPC, EFBIG, EACCES, EROFS, EDQUOT, EPERM
_STORAGE_MSG_RE = re.compile(r"os error (28|27|13|30|122)\b|No space left|File too large|Read-only file system|Disk quota", re.I)


def _is_storage_error(e: BaseException) -> bool:
    """A write failed for lack of space/quota/permission (also when a library wraps the OSError)."""
    if not isinstance(e, Exception) or isinstance(e, StoreError) or type(e).__module__.startswith("pipeline."):
        return False  # PipelineError (input problems, gates) and our own errors keep their meaning and exit code
    if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
        return True
    return bool(_STORAGE_MSG_RE.search(str(e)))


@dataclasses.dataclass(frozen=True)
class Artifact:
    """A complete, trusted artifact folder and its manifest."""

    stage: str
    key: str
    path: Path
    manifest: dict[str, Any]

    @property
    def digest(self) -> str:
        return self.manifest["output_digest"]

    @property
    def doc(self) -> ArtifactManifest:
        """The manifest's fields read outside the store, typed (:class:`ArtifactManifest`)."""
        return ArtifactManifest.from_json(self.manifest)

    @property
    def result(self) -> StageResult:
        """The stage's typed result (``manifest.json`` ``result`` parsed by the stage's class,
        :data:`pipeline.core.contracts.result.STAGE_RESULTS`: ``ExportResult`` ... ``BenchmarkResult``)."""
        return result_class(self.stage).from_json(self.doc.result)

    def result_as(self, cls: type[R]) -> R:
        """:attr:`result` as ``cls`` (the stage's result class, e.g. ``EvalResult``); TypeError for another stage's."""
        res = self.result
        if not isinstance(res, cls):
            raise TypeError(f"{self.stage} artifact {self.path}: its result is a {type(res).__name__}, not a {cls.__name__}")
        return res


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` via a temporary file + fsync + rename (never half-written)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, ensure_ascii=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StoreError(f"cannot write {path}: {e.strerror or e}") from e


class ArtifactStore:
    """Folder of content-addressed stage artifacts (see module docstring)."""

    def __init__(self, root: str | os.PathLike, *, lock_timeout_s: float = 3600.0, verify: bool = False) -> None:
        """``verify``: every :meth:`lookup` of this store re-hashes the artifact's files (``verify_cache=true``);
        one setting, so no lookup path (first look, the look under the lock, after publishing) can skip it."""
        self.root = Path(root).absolute()
        self.lock_timeout_s = lock_timeout_s
        self.verify = verify

    def path_for(self, stage: str, key: str) -> Path:
        return self.root / stage / key[:24]

    def resume_dir(self, stage: str, key: str) -> Path:
        """``<root>/<stage>/.resume-<key>/``: where a stage keeps the work of a run of ``key`` that was killed, so the
        next run of the same key resumes it (layer-by-layer calibration's per-layer checkpoints). Not created here;
        kept when a run fails, removed when the artifact of ``key`` is published (:meth:`produce`)."""
        return self.root / stage / f".resume-{key[:24]}"

    def _lock(self, stage: str, key: str) -> FileLock:
        d = self.root / stage
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create artifact folder {d}: {e.strerror or e}") from e
        return FileLock(str(d / f".{key[:24]}.lock"), timeout=self.lock_timeout_s)

    def lookup(self, stage: str, key: str, *, verify: bool | None = None) -> Artifact | None:
        """Return the complete artifact for ``key`` or ``None``.

        A folder is trusted only if its manifest parses, says ``complete``, carries the same
        key, and every listed output file exists with the recorded size (``verify=True``, or
        the store's ``verify`` when None, also re-hashes every file).  Anything else is treated
        as absent: the caller produces the key again, and :meth:`produce` moves the rejected
        folder aside before publishing, so a rejected artifact is never reused.
        :meth:`inspect` says why a folder was rejected.
        """
        return self.inspect(stage, key, verify=verify)[0]

    def inspect(self, stage: str, key: str, *, verify: bool | None = None) -> tuple[Artifact | None, str | None]:
        """:meth:`lookup` with its reason: ``(artifact, None)`` for a trusted artifact, ``(None, None)`` when nothing
        is stored for ``key``, ``(None, why)`` when a folder is there but not trusted (``why`` names the first file
        that differs, e.g. ``the stored artifact does not match its manifest (build_info.json: size 812 != 815
        recorded)``)."""
        verify = self.verify if verify is None else verify
        path = self.path_for(stage, key)
        if not path.exists():
            return None, None
        mf = path / MANIFEST
        try:
            manifest = json.loads(mf.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return None, f"the stored artifact has no readable {MANIFEST} ({type(e).__name__})"
        doc = ArtifactManifest.from_json(manifest)
        if doc.schema != MANIFEST_SCHEMA or not doc.complete:
            return None, f"the stored artifact's {MANIFEST} is not a complete {MANIFEST_SCHEMA} manifest"
        if doc.key != key:
            return None, f"the stored artifact's {MANIFEST} records another key ({str(doc.key)[:24]})"
        if doc.outputs is None:  # a list of files that is not an object: nothing can be checked
            return None, f"the stored artifact's {MANIFEST} is not a complete {MANIFEST_SCHEMA} manifest"
        mismatch = "the stored artifact does not match its manifest"
        for rel, meta in doc.outputs.items():
            f = path / rel
            try:
                size = f.stat().st_size
            except OSError:
                return None, f"{mismatch} ({rel}: missing, {meta.bytes} bytes recorded)"
            if size != meta.bytes:
                return None, f"{mismatch} ({rel}: size {size} != {meta.bytes} recorded)"
            if verify:
                digest = sha256_file(f)
                if digest != meta.sha256:
                    return None, f"{mismatch} ({rel}: sha256 {digest[:12]} != {str(meta.sha256)[:12]} recorded)"
        return Artifact(stage, key, path, manifest), None

    def set_aside(self, stage: str, key: str) -> Path | None:
        """Move the folder of ``key`` (one that must not be reused) to ``.stale-<key>-<rand>`` next to it and return
        that path (None when there is none).  The caller must hold :meth:`locked`; the next holder of the lock
        removes the stale folder."""
        final = self.path_for(stage, key)
        if not final.exists():
            return None
        aside = final.parent / f".stale-{key[:24]}-{secrets.token_hex(3)}"
        try:
            shutil.move(str(final), str(aside))
        except OSError as e:
            raise StoreError(f"cannot move {final} aside to {aside}: {e.strerror or e}") from e
        return aside

    def published(
        self, stage: str, *, verify: bool | None = None, where: Callable[[ArtifactManifest], bool] | None = None
    ) -> list[Artifact]:
        """Every trusted artifact of ``stage`` (whose manifest satisfies ``where``, when given), oldest first (by
        manifest time).

        Only published folders count: staging (``.tmp-*``) and moved-aside (``.stale-*``) folders, folders whose
        name is not their manifest's key, and anything :meth:`lookup` would not trust are skipped; ``where`` is
        asked before :meth:`lookup`, so only the artifacts it keeps are verified.
        """
        out = []
        stage_dir = self.root / stage
        if not stage_dir.is_dir():
            return []
        for d in stage_dir.iterdir():
            if d.name.startswith(".") or not d.is_dir():
                continue
            try:
                doc = ArtifactManifest.from_json(json.loads((d / MANIFEST).read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
            key = doc.key
            if not isinstance(key, str) or self.path_for(stage, key) != d or (where is not None and not where(doc)):
                continue
            art = self.lookup(stage, key, verify=verify)
            if art is not None:
                out.append(art)
        return sorted(out, key=lambda a: ((a.path / MANIFEST).stat().st_mtime, a.path.name))

    def with_generation_key(self, stage: str, generation_key: str) -> list[Artifact]:
        """Every trusted artifact of ``stage`` whose manifest records ``generation_key`` (``Stage.generation_key``),
        newest first; each one's files are re-hashed (an artifact that does not match its manifest is left out)."""
        return self.published(stage, verify=True, where=lambda m: m.generation_key == generation_key)[::-1]

    @contextlib.contextmanager
    def produce(self, stage: str, key: str, manifest: dict[str, Any]) -> Iterator[tuple[Path, dict[str, Any]]]:
        """Context manager that yields ``(tmp_dir, manifest)`` to write a new artifact.

        The caller writes files into ``tmp_dir`` and may add keys to ``manifest``
        (``result``, ``timings`` ...).  On normal exit the output files are hashed, the
        manifest is completed and written, and the folder is renamed into place.  On any
        exception the temporary folder is deleted and nothing is published.  The caller
        must hold :meth:`locked` for the same key.
        """
        stage_dir = self.root / stage
        final = self.path_for(stage, key)
        tmp = stage_dir / f".tmp-{key[:24]}-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            tmp.mkdir(parents=True)
        except OSError as e:
            raise StoreError(f"cannot create {tmp}: {e.strerror or e}") from e
        t0 = time.time()
        try:
            yield tmp, manifest
            files = tree_files(tmp)
            manifest.update(
                schema=MANIFEST_SCHEMA,
                stage=stage,
                key=key,
                complete=True,
                created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                production=secrets.token_hex(8),
                outputs=files,
                output_digest=digest_files(files),
            )
            manifest.setdefault("timings", {})["produce_s"] = round(time.time() - t0, 3)
            for rel in files:  # flush file data before the rename publishes it
                with contextlib.suppress(OSError):
                    fd = os.open(tmp / rel, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            write_json_atomic(tmp / MANIFEST, redact(manifest))
            _fsync_dir(tmp)
            if final.exists():  # an untrusted leftover (e.g. edited by hand): move it aside
                shutil.move(str(final), str(stage_dir / f".stale-{key[:24]}-{secrets.token_hex(3)}"))
            os.rename(tmp, final)
            _fsync_dir(stage_dir)
            shutil.rmtree(self.resume_dir(stage, key), ignore_errors=True)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if _is_storage_error(e):  # name the folder: a bare "File too large (os error 27)" says nothing
                raise StoreError(
                    f"{stage}: writing the artifact into {stage_dir} failed ({e}); nothing was published. "
                    f"Fix: free disk space / check the quota and permissions of {self.root}, or set store_dir."
                ) from e
            raise

    @contextlib.contextmanager
    def locked(self, stage: str, key: str) -> Iterator[None]:
        """Hold the per-key lock; on entry remove temporary/stale folders of this key.

        Under the lock no other process can be writing this key, so every ``.tmp-<key>-*``
        folder left there belongs to a run that died and is deleted.
        """
        lock = self._lock(stage, key)
        with lock:
            stage_dir = self.root / stage
            for leftover in list(stage_dir.glob(f".tmp-{key[:24]}-*")) + list(stage_dir.glob(f".stale-{key[:24]}-*")):
                shutil.rmtree(leftover, ignore_errors=True)
            yield
