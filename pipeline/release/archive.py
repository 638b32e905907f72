"""Release files: a reproducible ``.tar.gz`` of the repository, ``SHA256SUMS``, and :func:`safe_extract`.

Reproducible archive: entries sorted by path, every mtime fixed (``SOURCE_DATE_EPOCH`` or 0), uid/gid 0 and empty
owner names, modes normalised (0644 files, 0755 folders and executables), gzip header without file name and
with mtime 0 - the same inputs give the same sha256 on any machine.

Safe extraction (:func:`safe_extract`, the only place an archive is unpacked) checks every member lexically before
writing anything and then writes through folder descriptors that never follow a link; it does not rely on
``tarfile``'s ``data`` filter, which unpatched Python 3.11/3.12 releases let escape (CVE-2025-4517).
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import shutil
import tarfile
from collections.abc import Iterable
from pathlib import Path

from ..core.contracts.package import PackageArtifact, ReleaseManifest
from ..core.store import sha256_file
from ..errors import InputError


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


#: longest member name / single component accepted (bytes, UTF-8); Linux PATH_MAX and NAME_MAX.
PATH_MAX, NAME_MAX = 4096, 255


def _member_parts(name: str) -> list[str]:
    """The components of a member name after the name checks; raises InputError naming the member."""
    if not name or "\0" in name:
        raise InputError(f"archive member {name!r} has an empty or NUL-containing name; refusing to extract.")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise InputError(f"archive member {name!r} has an absolute path; refusing to extract.")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InputError(f"archive member {name!r} contains '..'; refusing to extract.")
    if not parts:
        raise InputError(f"archive member {name!r} names the destination itself; refusing to extract.")
    long = [p for p in parts if len(p.encode()) > NAME_MAX]
    if long:
        raise InputError(
            f"archive member {name[:80]!r}...: a path component is {len(long[0].encode())} bytes long (limit "
            f"NAME_MAX={NAME_MAX}); refusing to extract."
        )
    return parts


def check_members(tar: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """The archive's members after the safety checks; raises :class:`InputError` naming the first bad member.

    The checks are lexical and do not consult the file system, so they cannot be fooled by what is (or will be)
    on disk: every name is relative, has no ``..``, components of at most ``NAME_MAX`` bytes and, joined to
    ``dest``, stays under ``PATH_MAX`` bytes (the length class of CVE-2025-4517, where ``os.path.realpath`` gives up
    on an over-long path and ``tarfile``'s ``data`` filter on unpatched Python 3.11/3.12 accepts an escaping
    link); no name appears twice (nothing is overwritten); only regular files, folders and relative symbolic
    links whose target has no ``..`` and no absolute part (so a link can only point into its own folder's
    subtree, and a chain of such links never leaves ``dest``). Hard links, devices and FIFOs are refused.
    :func:`safe_extract` then writes through directory file descriptors without following links.
    """
    members = tar.getmembers()
    base = len(os.fsencode(os.path.abspath(dest))) + 1
    seen: dict[str, tarfile.TarInfo] = {}
    for m in members:
        name = m.name
        parts = _member_parts(name)
        norm = "/".join(parts)
        if base + len(norm.encode()) >= PATH_MAX:
            raise InputError(
                f"archive member {name[:80]!r}... is {len(norm.encode())} bytes long; under {dest} it would exceed "
                f"PATH_MAX={PATH_MAX} (a path the OS cannot resolve reliably); refusing to extract."
            )
        if m.ischr() or m.isblk() or m.isfifo() or m.isdev():
            raise InputError(f"archive member {name!r} is a device/FIFO; refusing to extract.")
        if m.islnk():
            raise InputError(
                f"archive member {name!r} is a hard link to {m.linkname!r}; hard links are not allowed in a "
                f"release archive (they can alias files outside the destination); refusing to extract."
            )
        if m.issym():
            link = m.linkname
            lparts = link.replace("\\", "/").split("/")
            if (
                not link
                or link.startswith(("/", "\\"))
                or (len(link) > 1 and link[1] == ":")
                or ".." in lparts
                or len(link.encode()) >= PATH_MAX
            ):
                raise InputError(
                    f"archive member {name!r} is a symbolic link to {link[:120]!r}, which may point outside the "
                    f"destination (only relative targets without '..' are allowed); refusing to extract."
                )
        elif not (m.isfile() or m.isdir()):
            raise InputError(f"archive member {name!r} has an unsupported type; refusing to extract.")
        prev = seen.get(norm)
        if prev is not None and not (prev.isdir() and m.isdir()):
            raise InputError(
                f"archive member {name!r} appears twice in the archive (the second copy would overwrite the first); refusing to extract."
            )
        seen[norm] = m
    # a member may not live below a name that is a file or a link (writing through a link is how archives escape)
    for norm, m in seen.items():
        parts = norm.split("/")
        for i in range(1, len(parts)):
            parent = seen.get("/".join(parts[:i]))
            if parent is not None and not parent.isdir():
                raise InputError(
                    f"archive member {m.name!r} lies below {parent.name!r}, which is not a folder "
                    f"({'a symbolic link' if parent.issym() else 'a file'}); refusing to extract."
                )
    return members


def _open_dir(root_fd: int, parts: list[str]) -> int:
    """fd of the folder ``parts`` below ``root_fd``, creating folders; never follows a symbolic link."""
    fd = os.dup(root_fd)
    try:
        for p in parts:
            try:
                os.mkdir(p, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def safe_extract(archive: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Extract ``archive`` (tar, tar.gz, ...) into the new or empty folder ``dest`` without ever writing outside it.

    This is the one extraction function of the project; every archive is unpacked through it.  All members are
    checked first (:func:`check_members`); nothing is written when one is refused.  Writing then never passes a
    path to the OS that could resolve elsewhere: folders are opened one component at a time relative to a folder
    descriptor with ``O_NOFOLLOW``, files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (an existing file or
    link is never overwritten or followed), and symbolic links are created last.  Modes are normalised (0644 /
    0755 for executables and folders), owners are not restored.

    Returns the member names. Raises :class:`InputError` naming the offending member, or when ``dest`` is a
    non-empty folder; on any failure after writing started, ``dest`` is removed again (when this call created it).
    """
    dest = Path(dest)
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise InputError(f"{dest}: extraction needs a new or empty folder (nothing is ever overwritten).")
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise InputError(f"{archive}: not a readable tar archive ({e}).") from e
    created = not dest.exists()
    with tar:
        try:
            members = check_members(tar, dest)
        except tarfile.TarError as e:
            raise InputError(f"{archive}: corrupt tar archive ({e}).") from e
        dest.mkdir(parents=True, exist_ok=True)
        root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            links = []
            for m in members:
                parts = _member_parts(m.name)
                if m.issym():
                    links.append((parts, m.linkname))
                    continue
                if m.isdir():
                    os.close(_open_dir(root_fd, parts))
                    continue
                dfd = _open_dir(root_fd, parts[:-1])
                try:
                    mode = 0o755 if m.mode & 0o111 else 0o644
                    fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dfd)
                    src = tar.extractfile(m)
                    with os.fdopen(fd, "wb") as out:
                        if src is not None:
                            while True:
                                b = src.read(1 << 20)
                                if not b:
                                    break
                                out.write(b)
                finally:
                    os.close(dfd)
            for parts, target in links:
                dfd = _open_dir(root_fd, parts[:-1])
                try:
                    os.symlink(target, parts[-1], dir_fd=dfd)
                finally:
                    os.close(dfd)
        except BaseException as e:
            os.close(root_fd)
            root_fd = -1
            if created:
                shutil.rmtree(dest, ignore_errors=True)
            else:
                for p in list(dest.iterdir()):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
            if isinstance(e, (tarfile.TarError, FileExistsError)):
                raise InputError(f"{archive}: extraction failed ({e}); nothing was kept.") from e
            raise
        finally:
            if root_fd >= 0:
                os.close(root_fd)
    return [m.name for m in members]


def check_sha256(f: Path, want: str, listed_in: str) -> None:
    """``f`` is there and its sha256 is ``want``, as ``listed_in`` (the record that names it: ``SHA256SUMS``, a
    provenance subject) says.

    Raises:
        InputError: ``f`` is missing, or its bytes changed (names the file, both digests and ``listed_in``).
    """
    if not f.is_file():
        raise InputError(f"{f}: listed in {listed_in} but missing. Fix: download the release again.")
    got = sha256_file(f)
    if got != want:
        raise InputError(
            f"{f}: sha256 {got} does not match {want} in {listed_in}: the file was changed after the release was built. "
            f"Fix: download the release again."
        )


def read_sha256sums(path: Path) -> dict[str, str]:
    """``SHA256SUMS`` (``sha256sum`` format) -> {name: hex}; raises InputError naming the file and line."""
    sums: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(
            f"{path}: cannot read the checksum file ({e}). Fix: copy SHA256SUMS from the release next to the archive."
        ) from None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        h, sep, name = line.partition("  ")
        if not sep or len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            raise InputError(f"{path}:{i}: not a sha256sum line ({line[:100]!r}). Fix: restore SHA256SUMS from the release.")
        sums[name.lstrip("*")] = h
    return sums


def verify_release_archive(archive: str | os.PathLike) -> dict:
    """Check a release archive against the ``SHA256SUMS`` (and ``release_manifest.json``) beside it, before unpacking.

    Returns the release manifest beside the archive (``{}`` when there is none). Raises :class:`InputError`
    naming the file: no ``SHA256SUMS`` beside the archive, the archive or the manifest not listed, or a
    sha256 that differs.
    """
    archive = Path(archive)
    sums_path = archive.parent / PackageArtifact.SHA256SUMS
    if not sums_path.is_file():
        raise InputError(
            f"{archive}: no SHA256SUMS beside it, so its integrity cannot be checked; refusing to serve it. "
            f"Fix: keep the release folder together (<name>.tar.gz, SHA256SUMS, release_manifest.json)."
        )
    sums = read_sha256sums(sums_path)
    manifest: dict = {}
    for f in (archive, archive.parent / PackageArtifact.RELEASE_MANIFEST):
        if f != archive and not f.is_file():
            continue
        want = sums.get(f.name)
        if want is None:
            raise InputError(
                f"{sums_path}: does not list {f.name}; refusing to serve an unchecked file. "
                f"Fix: use the SHA256SUMS written with this release."
            )
        got = sha256_file(f)
        if got != want:
            raise InputError(
                f"{f}: sha256 {got} does not match {want} in {sums_path}: the file was modified or corrupted "
                f"after the release was made; refusing to serve it. Fix: download the release again."
            )
        if f != archive:
            import json

            manifest = json.loads(f.read_text(encoding="utf-8"))
    return manifest


def verify_extracted_release(root: Path, manifest: dict) -> None:
    """Check an unpacked release (``root/<name>/model_repository`` + ``release_manifest.json``) against ``manifest``.

    ``manifest`` is the checked manifest beside the archive: the copy inside the archive must equal it, and the
    unpacked model repository must have exactly the recorded files and digests. Raises InputError naming the file.
    """
    import json

    inner = sorted(Path(root).glob(f"*/{PackageArtifact.RELEASE_MANIFEST}"))
    if not inner:
        raise InputError(f"{root}: the archive has no <name>/release_manifest.json; refusing to serve it.")
    inner_doc = json.loads(inner[0].read_text(encoding="utf-8"))
    if manifest and inner_doc != manifest:
        raise InputError(f"{inner[0]}: differs from the release_manifest.json beside the archive; refusing to serve it.")
    links = sorted(p for p in Path(root).rglob("*") if p.is_symlink())
    if links:
        raise InputError(
            f"{links[0]}: the release holds a symbolic link (to {os.readlink(links[0])!r}); a release is self-contained "
            f"and the package stage never writes one; refusing to serve it. Fix: use the archive the package stage "
            f"wrote, or rebuild it with `pipeline stages=[package]`."
        )
    check_repository_files(PackageArtifact(inner[0].parent).model_repository, inner_doc)


def check_repository_files(repo: Path, manifest: dict) -> None:
    """Check that the model repository ``repo`` has exactly the files and digests ``manifest`` (a release manifest)
    records (``repository_files``, ``sources.model_repository``). Raises InputError naming the first file that differs."""
    from ..core.store import digest_files, tree_files

    inner_doc = ReleaseManifest.from_json(manifest)
    files = tree_files(repo) if repo.is_dir() else {}
    recorded = inner_doc.repository_files
    if isinstance(recorded, dict):
        for rel in sorted(set(recorded) | set(files)):
            if rel not in files or rel not in recorded or files[rel]["sha256"] != recorded[rel]:
                raise InputError(
                    f"{repo / rel}: does not match release_manifest.json (repository_files): the archive's content "
                    f"was modified; refusing to serve it. Fix: download the release again."
                )
    want = inner_doc.repository_digest
    if want and digest_files(files) != want:
        raise InputError(
            f"{repo}: content digest differs from release_manifest.json sources.model_repository: the archive's "
            f"content was modified; refusing to serve it. Fix: download the release again."
        )
