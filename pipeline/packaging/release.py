"""Release files: a reproducible ``.tar.gz`` of the repository, ``SHA256SUMS``, and :func:`safe_extract`.

Reproducible archive: entries sorted by path, every mtime fixed (``SOURCE_DATE_EPOCH`` or 0), uid/gid 0 and empty
owner names, modes normalised (0644 files, 0755 folders and executables), gzip header without file name and
with mtime 0 - the same inputs give the same sha256 on any machine.

Safe extraction refuses, before writing anything: absolute member names, ``..`` components, symbolic/hard links
that point outside the destination, device files, FIFOs; then extracts with ``tarfile``'s ``data`` filter
(Python >= 3.11.4 / 3.12) as a second line of defence.
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import tarfile
from pathlib import Path
from typing import Iterable

from ..errors import InputError
from ..store import sha256_file


def _mtime() -> int:
    try:
        return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    except ValueError:
        return 0


def make_archive(dest: Path, sources: Iterable[tuple[Path, str]]) -> str:
    """Write a reproducible ``.tar.gz`` at ``dest`` and return its sha256.

    Args:
        dest: archive path (``.tar.gz``).
        sources: ``(path, arcname)`` pairs; folders are added recursively. Symbolic links are refused
            (an artifact must be self-contained).
    Raises:
        InputError: a source contains a symbolic link or a special file.
    """
    entries: list[tuple[str, Path]] = []
    for src, arc in sources:
        src = Path(src)
        entries.append((arc, src))
        if src.is_dir():
            for p in src.rglob("*"):
                entries.append((posixpath.join(arc, p.relative_to(src).as_posix()), p))
    entries.sort(key=lambda e: e[0])
    mtime = _mtime()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arc, p in entries:
            if p.is_symlink():
                raise InputError(f"{p}: symbolic links are not allowed in a release archive; copy the file instead.")
            ti = tarfile.TarInfo(arc)
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = mtime, 0, 0, "", ""
            if p.is_dir():
                ti.type, ti.mode, ti.size = tarfile.DIRTYPE, 0o755, 0
                tar.addfile(ti)
            elif p.is_file():
                ti.size = p.stat().st_size
                ti.mode = 0o755 if os.access(p, os.X_OK) else 0o644
                with open(p, "rb") as f:
                    tar.addfile(ti, f)
            else:
                raise InputError(f"{p}: not a regular file or folder; cannot be archived.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as gz:
            gz.write(raw.getvalue())
    return sha256_file(dest)


def write_sha256sums(path: Path, files: Iterable[Path]) -> dict[str, str]:
    """``SHA256SUMS`` in ``sha256sum`` format (``<hex>  <name>``, names relative to ``path``'s folder, sorted).

    Check with ``cd <folder> && sha256sum -c SHA256SUMS``. Returns {name: hex}.
    """
    sums = {}
    for f in files:
        rel = os.path.relpath(f, path.parent)
        sums[Path(rel).as_posix()] = sha256_file(f)
    path.write_text("".join(f"{h}  {n}\n" for n, h in sorted(sums.items())), encoding="utf-8")
    return sums


def _inside(dest: Path, target: str) -> bool:
    d = os.path.realpath(dest)
    t = os.path.realpath(os.path.join(d, target))
    return t == d or t.startswith(d + os.sep)


def check_members(tar: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """The archive's members after the safety checks; raises :class:`InputError` naming the first bad member."""
    members = tar.getmembers()
    for m in members:
        name = m.name
        if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
            raise InputError(f"archive member {name!r} has an absolute path; refusing to extract.")
        parts = name.replace("\\", "/").split("/")
        if ".." in parts:
            raise InputError(f"archive member {name!r} contains '..'; refusing to extract.")
        if not _inside(dest, name):
            raise InputError(f"archive member {name!r} would be written outside {dest}; refusing to extract.")
        if m.ischr() or m.isblk() or m.isfifo() or m.isdev():
            raise InputError(f"archive member {name!r} is a device/FIFO; refusing to extract.")
        if m.issym():
            target = posixpath.join(posixpath.dirname(name), m.linkname)
            if m.linkname.startswith("/") or not _inside(dest, target):
                raise InputError(f"archive member {name!r} is a symbolic link to {m.linkname!r} outside the destination; refusing to extract.")
        if m.islnk():
            if m.linkname.startswith("/") or ".." in m.linkname.split("/") or not _inside(dest, m.linkname):
                raise InputError(f"archive member {name!r} is a hard link to {m.linkname!r} outside the destination; refusing to extract.")
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            raise InputError(f"archive member {name!r} has an unsupported type; refusing to extract.")
    return members


def safe_extract(archive: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Extract ``archive`` (tar, tar.gz, ...) into ``dest`` without ever writing outside it.

    Returns the extracted member names. Raises :class:`InputError` naming the offending member (nothing is
    written when a member is refused, since every member is checked before extraction starts).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise InputError(f"{archive}: not a readable tar archive ({e}).") from e
    with tar:
        members = check_members(tar, dest)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python without extraction filters; the checks above still apply
            tar.extractall(dest, members=members)
    return [m.name for m in members]
