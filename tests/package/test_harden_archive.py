"""Issue 16 item 1: one safe extraction, refusing hostile archives before anything is written.

The archives are built here with ``tarfile`` exactly as an attacker would (the symlink-chain / over-long-path
layout of the CPython regression test for CVE-2025-4517, ``..``, absolute names, links, duplicates), and
extracted with :func:`pipeline.release.archive.safe_extract`, the function ``pipeline serve x.tar.gz`` uses.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.release.archive import safe_extract


def _add(
    tar: tarfile.TarFile,
    name: str,
    *,
    content: bytes | None = None,
    symlink_to: str | None = None,
    hardlink_to: str | None = None,
    directory: bool = False,
) -> None:
    ti = tarfile.TarInfo(name)
    if directory:
        ti.type, ti.mode = tarfile.DIRTYPE, 0o777
        tar.addfile(ti)
    elif symlink_to is not None:
        ti.type, ti.linkname = tarfile.SYMTYPE, symlink_to
        tar.addfile(ti)
    elif hardlink_to is not None:
        ti.type, ti.linkname = tarfile.LNKTYPE, hardlink_to
        tar.addfile(ti)
    else:
        data = content or b""
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))


def realpath_limit_archive(path: Path, dest: Path) -> Path:
    """The CVE-2025-4517 layout: a chain of links whose expansion exceeds PATH_MAX, so ``os.path.realpath``
    stops resolving, then a link through it to ``dest/..`` and writes through that link."""
    steps = "abcdefghijklmnop"
    max_path = os.pathconf(dest.parent, "PC_PATH_MAX")
    component = "d" * ((max_path - (len(str(dest)) + 1)) // (len(steps) + 1))
    with tarfile.open(path, "w") as tar:
        p = ""
        for s in steps:
            _add(tar, os.path.join(p, component), directory=True)
            _add(tar, os.path.join(p, s), symlink_to=component)
            p = os.path.join(p, component)
        linkpath = os.path.join(*steps, "l" * 254)
        _add(tar, linkpath, symlink_to=os.path.join(*[".."] * len(steps)))
        _add(tar, "escape", symlink_to=os.path.join(linkpath, ".."))
        _add(tar, "flaglink", hardlink_to=os.path.join("escape", "flag"))
        _add(tar, "flaglink", content=b"overwrite")
        _add(tar, "escape/newfile", content=b"new")
    return path


def _outside_state(root: Path, dest: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>")
        for p in root.rglob("*")
        if not str(p).startswith(str(dest)) and not p.name.endswith(".tar")
    }


def test_cve_2025_4517_realpath_limit_archive_is_refused_and_nothing_is_written(tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    (outer / "flag").write_bytes(b"original")
    dest = outer / "dest"
    arch = realpath_limit_archive(tmp_path / "evil.tar", dest)
    before = _outside_state(tmp_path, dest)
    with pytest.raises(InputError, match="refusing to extract"):
        safe_extract(arch, dest)
    assert (outer / "flag").read_bytes() == b"original"  # not overwritten
    assert not (outer / "newfile").exists()  # nothing created outside
    assert _outside_state(tmp_path, dest) == before
    assert not dest.exists() or not any(dest.iterdir())  # nothing written inside either


def _tar(path: Path, *entries: dict) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        _add(tar, "pkg/good.txt", content=b"good")
        for e in entries:
            _add(tar, **e)
    return path


@pytest.mark.parametrize(
    "entries,match",
    [
        ([{"name": "pkg/" + "x" * 300, "content": b"long"}], "NAME_MAX"),
        ([{"name": "/".join(["y" * 200] * 25), "content": b"long"}], "PATH_MAX"),
        ([{"name": "../escaped.txt", "content": b"bad"}], r"'\.\.'"),
        ([{"name": "/tmp/harden_abs_escape.txt", "content": b"bad"}], "absolute path"),
        ([{"name": "up", "symlink_to": ".."}, {"name": "up/escaped.txt", "content": b"bad"}], "symbolic link"),
        ([{"name": "a", "directory": True}, {"name": "a/self", "symlink_to": "."}, {"name": "a/self/x", "content": b"x"}], "not a folder"),
        ([{"name": "chain1", "symlink_to": "chain2"}, {"name": "chain2", "symlink_to": "chain1/.."}], "symbolic link"),
        ([{"name": "abs", "symlink_to": "/etc"}], "symbolic link"),
        ([{"name": "pkg/good.txt", "content": b"overwritten"}], "appears twice"),
        ([{"name": "h", "hardlink_to": "pkg/good.txt"}], "hard link"),
    ],
)
def test_hostile_members_are_refused_before_anything_is_written(tmp_path, entries, match):
    arch = _tar(tmp_path / "evil.tar.gz", *entries)
    dest = tmp_path / "dest"
    with pytest.raises(InputError, match=match):
        safe_extract(arch, dest)
    assert not dest.exists() or not any(dest.iterdir())
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/harden_abs_escape.txt").exists()


def test_existing_files_are_never_overwritten(tmp_path):
    arch = _tar(tmp_path / "ok.tar.gz")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(InputError, match="new or empty folder"):
        safe_extract(arch, dest)
    assert (dest / "keep").read_text() == "mine" and not (dest / "pkg").exists()


def test_inside_links_and_files_extract(tmp_path):
    arch = _tar(
        tmp_path / "ok.tar.gz", {"name": "pkg/link", "symlink_to": "good.txt"}, {"name": "pkg/sub/run.sh", "content": b"#!/bin/sh\n"}
    )
    names = safe_extract(arch, tmp_path / "dest")
    assert "pkg/link" in names
    assert (tmp_path / "dest" / "pkg" / "link").read_bytes() == b"good"
    assert (tmp_path / "dest" / "pkg" / "sub" / "run.sh").read_bytes() == b"#!/bin/sh\n"
