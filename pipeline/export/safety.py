"""Export: the one rule for every path read from a user's checkpoint (docs/export.md "Path confinement").

A file or link named by the checkpoint (``*.index.json`` shard names, tokenizer files, symlinks in the folder) must
resolve inside the checkpoint folder (or its Hugging Face cache snapshot's blob store), unless
``model.allow_external_files=true``; otherwise :class:`pipeline.errors.InputError` names the path and the fix.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..errors import InputError

#: architecture (``config.json`` ``architectures[0]``) -> ``model_type``.

log = logging.getLogger("pipeline.export.safety")


def confinement_roots(src: Path) -> list[Path]:
    """Folders a checkpoint's files may resolve into: the checkpoint folder itself and, for a Hugging Face hub
    cache snapshot (``.../models--<org>--<name>/snapshots/<rev>``, whose files are links to ``../../blobs/<sha>``),
    that repository's ``blobs`` folder."""
    src = Path(src).resolve()
    roots = [src]
    if src.parent.name == "snapshots" and src.parent.parent.name.startswith(("models--", "datasets--")):
        roots.append(src.parent.parent / "blobs")
    return roots


def _is_inside(p: Path, roots: list[Path]) -> bool:
    return any(p == r or r in p.parents for r in roots)


def confine(src: Path, rel: Any, what: str, *, allow_external: bool = False) -> Path:
    """The path of ``rel`` (a file name taken from a checkpoint file, e.g. a shard in the safetensors index)
    under the checkpoint folder ``src``, refused unless it resolves inside it.

    This is the one confinement rule for names read from user-supplied files: ``rel`` must be a non-empty string,
    relative, and its *resolved* path (links followed) must lie inside :func:`confinement_roots`; with
    ``allow_external`` (``model.allow_external_files``) a resolved path outside is accepted and reported by
    :func:`external_files` so that the cache key covers it. Raises InputError naming ``what``, the value and the fix.
    """
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise InputError(f"{what}={rel!r}: expected a non-empty file name (a string). Fix: restore the file from the original checkpoint.")
    p = Path(rel)
    if p.is_absolute() and not allow_external:
        raise InputError(
            f"{what}={rel!r}: an absolute path; checkpoint files must be named relative to model.path={str(src)!r}. "
            f"Fix: copy the file into the checkpoint folder and name it relatively."
        )
    full = Path(src) / p
    resolved = full.resolve()
    if not allow_external and not _is_inside(resolved, confinement_roots(src)):
        raise InputError(
            f"{what}={rel!r} resolves to {resolved}, outside model.path={str(src)!r}; files from outside the "
            f"checkpoint folder are refused (they could be any file on this machine, and would not be covered by "
            f"the cache key). Fix: copy the file into the checkpoint folder, or, if this is intended, set "
            f"model.allow_external_files=true."
        )
    return full


def check_folder_links(src: Path, *, allow_external: bool = False) -> list[Path]:
    """Refuse symbolic links in the checkpoint folder that resolve outside it (see :func:`confine`).

    Returns the resolved outside targets (empty unless ``allow_external``). Broken links are refused too.
    """
    roots = confinement_roots(src)
    outside: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            if not p.is_symlink():
                continue
            if not p.exists():
                raise InputError(f"{p}: broken symbolic link (to {os.readlink(p)!r}). Fix: restore the file it points to.")
            target = p.resolve()
            if not _is_inside(target, roots):
                if not allow_external:
                    raise InputError(
                        f"{p}: a symbolic link to {target}, outside model.path={str(src)!r}; files from outside "
                        f"the checkpoint folder are refused (a link can point at any file on this machine, e.g. "
                        f"a secret, which would then be exported and shipped). Fix: replace the link by a copy of "
                        f"the file, or, if this is intended, set model.allow_external_files=true."
                    )
                outside.append(target)
    return outside
