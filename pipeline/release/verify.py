"""``pipeline verify``: check a release before trusting it.

    pipeline verify artifacts/package/<key>/release/support-llama-int4_awq-1.tar.gz --key release.pub
    pipeline verify artifacts/package/<key>/release --key release.pub      # the release folder
    pipeline verify artifacts/package/<key>                                # a package artifact (its release/)
    pipeline verify RELEASE --certificate-chain ca.pem                     # a certificate-signed release
    pipeline verify RELEASE                                                # integrity only (says the signature was not checked)

Checks, in order (:func:`verify_release`); the first that fails ends it with exit 2 and a message naming the file:

1. ``SHA256SUMS``: every listed file exists and matches; the archive and ``release_manifest.json`` are listed; no
   other file is in the folder (``release.sig`` and ``SHA256SUMS`` itself excepted).
2. With ``--key`` / ``--certificate-chain``: ``release.sig`` must exist and verify (model-signing) over every file of
   the folder, and the DSSE envelope of the provenance must verify with the key. Without them, a signed release
   verifies for integrity only, and the output says the signature was not checked; a release whose manifest says it
   was signed but which has no ``release.sig`` is refused (the signature was removed).
3. The archive is unpacked into a temporary folder (:func:`pipeline.release.archive.safe_extract`): its
   ``release_manifest.json`` equals the one beside it and its model repository has exactly the recorded files.
4. The provenance statement (``provenance.intoto.json``): every subject's sha256 matches (archive, manifest, every
   file inside the archive) and every unpacked file is a subject (:mod:`pipeline.release.provenance`).

Exit codes: 0 verified, 2 does not verify or bad arguments.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.contracts.package import PackageArtifact, ReleaseManifest
from ..errors import EXIT_INPUT, EXIT_OK, InputError

A = PackageArtifact


def release_folder(path: str | Path) -> tuple[Path, Path]:
    """(release folder, archive) for an archive, a release folder or a package artifact folder.
    Raises InputError naming the path when none is found."""
    p = Path(path).expanduser().absolute()
    if p.is_file():
        rel = p.parent
        return rel, p
    for rel in (p, p / A.RELEASE_DIR):
        if (rel / A.SHA256SUMS).is_file():
            archives = sorted(rel.glob("*.tar.gz"))
            if len(archives) == 1:
                return rel, archives[0]
            raise InputError(f"{rel}: expected one <name>.tar.gz, found {[a.name for a in archives]}. Fix: give the archive itself.")
    raise InputError(
        f"{path}: no release there (an archive <name>.tar.gz, a release folder with SHA256SUMS, or a package artifact "
        f"with release/). Fix: give the path the package stage printed (artifacts/package/<key>/release/<name>.tar.gz)."
    )


def _check_sums(rel: Path) -> None:
    """Every file of ``SHA256SUMS`` matches; no unlisted file in ``rel`` but the signature."""
    from .archive import check_sha256, read_sha256sums

    sums = read_sha256sums(rel / A.SHA256SUMS)
    for name, want in sorted(sums.items()):
        check_sha256(rel / name, want, str(rel / A.SHA256SUMS))
    extra = sorted(p.name for p in rel.iterdir() if p.name not in sums and p.name not in (A.SHA256SUMS, A.SIGNATURE))
    if extra:
        raise InputError(f"{rel / extra[0]}: not part of the release (not in SHA256SUMS). Fix: remove it, or download the release again.")


def _check_signature(rel: Path, manifest: dict[str, Any], public_key: str | None, chain: Sequence[str], checks: list[str]) -> str:
    """Step 2 of the module doc; returns ``verified`` | ``not checked`` | ``unsigned``."""
    from .signing import dsse_verify, verify_signature

    sig = rel / A.SIGNATURE
    if public_key or chain:
        checks.append(verify_signature(rel, public_key=public_key, certificate_chain=chain))
        dsse, prov = rel / A.PROVENANCE_DSSE, rel / A.PROVENANCE
        if public_key and dsse.is_file():
            body = dsse_verify(dsse, public_key)
            if prov.is_file() and json.loads(body) != json.loads(prov.read_text(encoding="utf-8")):
                raise InputError(f"{prov}: differs from the signed statement in {dsse.name}. Fix: download the release again.")
            checks.append(f"{dsse.name}: provenance signature verified")
        return "verified"
    signing = ReleaseManifest.from_json(manifest).signing
    if signing and not sig.is_file():
        raise InputError(
            f"{sig}: missing, but release_manifest.json says the release was signed ({signing.method}): the "
            f"signature was removed; refusing it. Fix: download the release again."
        )
    return "not checked" if sig.is_file() else "unsigned"


def verify_release(
    path: str | Path, *, public_key: str | None = None, certificate_chain: Sequence[str] = (), key_field: str = "--key"
) -> dict[str, Any]:
    """Verify the release at ``path`` (module doc, steps 1-4). Returns ``{"release", "archive", "manifest",
    "checks": [str], "signature": "verified" | "not checked" | "unsigned"}``. Raises InputError (exit 2) naming the
    file that does not verify, or ``key_field`` (how the caller's user gave ``public_key``) when the key file is
    missing, a private key or not a PEM EC public key (:func:`pipeline.release.signing.check_public_key`)."""
    from ..release.archive import safe_extract
    from .archive import verify_extracted_release, verify_release_archive
    from .provenance import check_statement
    from .signing import check_public_key

    if public_key:
        check_public_key(public_key, key_field)

    rel, archive = release_folder(path)
    checks: list[str] = []
    _check_sums(rel)
    manifest = verify_release_archive(archive)
    checks.append(f"{A.SHA256SUMS}: every file matches")
    status = _check_signature(rel, manifest, public_key, certificate_chain, checks)
    prov = rel / A.PROVENANCE
    tmp = Path(tempfile.mkdtemp(prefix="pipeline-verify-"))
    try:
        safe_extract(archive, tmp)
        verify_extracted_release(tmp, manifest)
        checks.append(f"{archive.name}: unpacked; release_manifest.json and every model repository file match")
        if prov.is_file():
            check_statement(prov, rel, tmp)
            checks.append(f"{A.PROVENANCE}: every subject's sha256 matches")
        elif ReleaseManifest.from_json(manifest).provenance:
            raise InputError(f"{prov}: missing, but release_manifest.json records a provenance statement. Fix: download the release again.")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"release": str(rel), "archive": str(archive), "manifest": manifest, "checks": checks, "signature": status}


def _parse(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    path, key, chain = None, None, []
    it = iter(argv)
    for a in it:
        if a == "--key":
            key = next(it, None)
        elif a == "--certificate-chain":
            chain.append(next(it, "") or "")
        elif a.startswith("-"):
            raise InputError(f"unknown option {a!r}. Fix: pipeline verify <archive|folder> [--key PUB.pem] [--certificate-chain CA.pem].")
        elif path is None:
            path = a
        else:
            raise InputError(f"one release at a time ({path!r} and {a!r}). Fix: pipeline verify <archive|folder>.")
    return path, key, chain


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return EXIT_OK
    try:
        path, key, chain = _parse(argv)
        if not path:
            raise InputError("no release given. Fix: pipeline verify <archive|folder> [--key PUB.pem].")
        if key is None and "--key" in argv:
            raise InputError("--key needs a file. Fix: --key release.pub")
        rep = verify_release(path, public_key=key, certificate_chain=chain)
    except InputError as e:
        print(f"verify FAILED (exit {EXIT_INPUT}): {e}", file=sys.stderr)
        return EXIT_INPUT
    for c in rep["checks"]:
        print(f"ok  {c}")
    if rep["signature"] == "not checked":
        print(f"note: {A.SIGNATURE} present but not checked; pass --key <public key> (or --certificate-chain) to check who signed it")
    elif rep["signature"] == "unsigned":
        print("note: the release is not signed (package.sign_key was not set): integrity only, not who built it")
    print(f"verified: {rep['archive']}")
    return EXIT_OK


__all__ = ["main", "release_folder", "verify_release"]
