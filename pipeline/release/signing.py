"""Release signing with OpenSSF ``model-signing`` (PyPI ``model-signing`` 1.1, github.com/sigstore/model-transparency),
and DSSE envelopes for the provenance statement.

What is signed: the release folder ``release/`` (``<name>.tar.gz``, ``release_manifest.json``, ``SHA256SUMS``,
``provenance.intoto.json``, ``provenance.intoto.dsse.json``), hashed file by file with model-signing's default
``files`` serialization (sha256 per file) and every file but the signature itself. The signature,
``release/release.sig``, is a Sigstore bundle (``application/vnd.dev.sigstore.bundle.v0.3+json``) whose DSSE payload
is an in-toto Statement listing each file's sha256 (model-signing's format, the one NVIDIA NGC adopted).

Signers (``package.sign``; model-signing ``signing.Config``):

- ``key``: ``use_elliptic_key_signer`` with ``package.sign_key`` (PEM EC private key; password from the environment
  variable ``package.sign_key_password_env``). Verified with the matching public key
  (``use_elliptic_key_verifier``). Works offline.
- ``certificate``: ``use_certificate_signer`` (``sign_key`` + ``sign_certificate`` + ``sign_certificate_chain``);
  verified against the chain (``use_certificate_verifier``). Works offline.
- ``sigstore``: keyless ``use_sigstore_signer(use_ambient_credentials=True)``: the CI job's OIDC identity (GitHub
  Actions ``id-token: write``, GitLab ``id_tokens``) gets a short-lived certificate from Fulcio and the signature is
  logged in Rekor; verified with ``model_signing verify sigstore --identity ... --identity_provider ...``. Needs
  network: documented, not tested here.

The provenance statement gets its own DSSE envelope (DSSE v1, github.com/secure-systems-lab/dsse ``protocol.md``:
the signature is over ``PAE(payloadType, payload) = "DSSEv1" SP len(type) SP type SP len(body) SP body``), signed
with the same key (ECDSA with SHA-256 on P-256, SHA-384 / SHA-512 on P-384 / P-521), so a consumer of the
provenance alone (an in-toto / SLSA verifier) can check it. ``sigstore`` signs only ``release.sig``; the envelope is
written for ``key`` and ``certificate``.

Errors are :class:`~pipeline.errors.InputError` (exit 2) naming the file and the fix.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.contracts.manifest import DsseEnvelope
from ..core.contracts.package import PackageArtifact
from ..errors import InputError

DSSE_PAYLOAD_TYPE = "application/vnd.in-toto+json"
"""The DSSE payload type of an in-toto Statement (in-toto attestation spec v1, ``envelope.md``)."""


def method(pc: Any) -> str | None:
    """The signing method of ``pc`` (``PackageConfig``): ``package.sign``, else ``key`` when ``sign_key`` is set, else None."""
    return pc.sign or ("key" if pc.sign_key else None)


def _password(pc: Any) -> bytes | None:
    env = pc.sign_key_password_env
    return os.environ[env].encode() if env and env in os.environ else None


def _load_private_key(pc: Any) -> Any:
    """The ``cryptography`` EC private key of ``package.sign_key``. Raises InputError naming the field."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p = Path(os.path.expanduser(pc.sign_key))
    try:
        key = serialization.load_pem_private_key(p.read_bytes(), password=_password(pc))
    except (OSError, ValueError, TypeError) as e:
        raise InputError(
            f"package.sign_key={pc.sign_key}: not a readable PEM private key ({e}). Fix: give an EC private key "
            f"(openssl ecparam -name prime256v1 -genkey -noout -out release.key), and its password in the variable "
            f"package.sign_key_password_env names when it is encrypted."
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InputError(
            f"package.sign_key={pc.sign_key}: a {type(key).__name__}, but model-signing signs with elliptic-curve keys. "
            f"Fix: openssl ecparam -name prime256v1 -genkey -noout -out release.key"
        )
    return key


def public_key_sha256(public_key: Any) -> str:
    """sha256 (hex) of a public key's DER SubjectPublicKeyInfo: the signer's id in the manifest and the cache key."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def signer_identity(pc: Any) -> dict[str, Any] | None:
    """``{"method", "public_key_sha256", "signature"}`` of the configured signer (``sigstore``: no key), or None when
    the release is not signed. Recorded in the release manifest (``signing``) and the package stage's key.
    Raises InputError when the key cannot be read."""
    m = method(pc)
    if m is None:
        return None
    ident: dict[str, Any] = {"method": m, "signature": PackageArtifact.SIGNATURE}
    if m in ("key", "certificate"):
        ident["public_key_sha256"] = public_key_sha256(_load_private_key(pc).public_key())
    return ident


def _config(pc: Any) -> Any:
    """model-signing's ``signing.Config`` for ``pc``, hashing every file of the folder but the signature."""
    import model_signing

    hashing = model_signing.hashing.Config().set_ignored_paths(paths=[PackageArtifact.SIGNATURE])
    cfg = model_signing.signing.Config().set_hashing_config(hashing)
    m = method(pc)
    pw = _password(pc)
    if m == "key":
        # model-signing 1.1.1 hands the password to cryptography's load_pem_private_key, which wants bytes (its
        # annotation says str)
        password: Any = pw
        return cfg.use_elliptic_key_signer(private_key=os.path.expanduser(pc.sign_key), password=password)
    if m == "certificate":
        return cfg.use_certificate_signer(
            private_key=os.path.expanduser(pc.sign_key),
            signing_certificate=os.path.expanduser(pc.sign_certificate),
            certificate_chain=[os.path.expanduser(c) for c in pc.sign_certificate_chain],
        )
    return cfg.use_sigstore_signer(use_ambient_credentials=True)


def sign_release(release_dir: Path, pc: Any) -> dict[str, Any]:
    """Sign ``release_dir`` (every file; see module doc) into ``release_dir/release.sig``; returns
    :func:`signer_identity`. Raises InputError when the key cannot be read."""
    ident = signer_identity(pc)
    assert ident is not None, "sign_release is called only when signing is configured"
    _config(pc).sign(release_dir, release_dir / PackageArtifact.SIGNATURE)
    return ident


def check_public_key(public_key: str, field: str) -> Any:
    """The ``cryptography`` elliptic-curve public key in the PEM file ``public_key``, given as ``field`` (``--key`` of
    ``pipeline verify``, ``package.verify_key`` of ``pipeline serve``), read before model-signing sees it (its errors
    for a missing file or a private key were tracebacks).

    Raises:
        InputError: the file is missing or unreadable, holds a private key (the fix says how to derive the public
            one), is not a PEM public key, or is not an elliptic-curve key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p = Path(os.path.expanduser(public_key))
    sep = " " if field.startswith("-") else "="  # a flag (--key K) or a config field (package.verify_key=K)
    given = f"{field}{sep}{public_key}"
    fix_pub = f"pass the signer's PEM public key, e.g. {field}{sep}release.pub"
    try:
        data = p.read_bytes()
    except OSError as e:
        what = "no such file" if not p.exists() else f"not readable ({e.strerror or e})"
        raise InputError(f"{given}: {what}. Fix: {fix_pub}.") from None
    if b"PRIVATE KEY-----" in data:
        raise InputError(
            f"{given}: a private key, not a public one (never hand the signing key to a verifier). Fix: "
            f"derive the public key (openssl ec -in {p.name} -pubout -out release.pub) and {fix_pub}."
        )
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise InputError(f"{given}: not a PEM public key ({str(e).splitlines()[0][:200]}). Fix: {fix_pub}.") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise InputError(f"{given}: a {type(key).__name__}, but releases are signed with elliptic-curve keys. Fix: {fix_pub}.")
    return key


def verify_signature(release_dir: Path, *, public_key: str | None = None, certificate_chain: Sequence[str] = ()) -> str:
    """Check ``release_dir/release.sig`` against the files of ``release_dir`` with model-signing: signed by
    ``public_key`` (PEM public key path) or by a certificate chaining to ``certificate_chain``. Returns a one-line
    description of what was verified.

    Raises:
        InputError: no signature, a signature by another key, or a file that differs from the signed one (the
            message names the file: model-signing's ``Hash mismatch for '<file>'``, ``Extra files`` or ``Missing files``).
    """
    import model_signing

    sig = release_dir / PackageArtifact.SIGNATURE
    if not sig.is_file():
        raise InputError(
            f"{sig}: missing: the release is not signed (or its signature was removed), so who built it cannot be "
            f"checked; refusing it. Fix: use the release folder as published (with {PackageArtifact.SIGNATURE}), or "
            f"package with package.sign_key=<private key>."
        )
    cfg = model_signing.verifying.Config()
    if public_key:
        cfg = cfg.use_elliptic_key_verifier(public_key=os.path.expanduser(public_key))
        what = f"public key {public_key}"
    else:
        cfg = cfg.use_certificate_verifier(certificate_chain=[os.path.expanduser(c) for c in certificate_chain])
        what = f"certificate chain {list(certificate_chain)}"
    try:
        cfg.verify(release_dir, sig)
    except Exception as e:  # model-signing raises ValueError (mismatch, wrong key) and library errors (bad bundle)
        msg = _readable(str(e), release_dir, sig)
        fix = (
            "a file changed after signing: download the release again"
            if "Signature mismatch" in str(e)
            else "the release was signed (or re-signed) by someone else, or this is not its signer's public key / CA: "
            "get the release and the key or chain from the publisher again"
        )
        raise InputError(f"{sig}: does not verify with {what}: {msg}; refusing it. Fix: {fix}.") from None
    return f"signature {sig.name} verified with {what}"


def _readable(msg: str, release_dir: Path, sig: Path) -> str:
    """model-signing's error, with a file mismatch ("Signature mismatch": the signature itself verified, so its
    payload is authentic) told as the files that differ, are missing or were not signed, instead of raw digests."""
    if "Signature mismatch" not in msg:
        return msg[:600]
    from ..core.store import sha256_file

    try:
        bundle = json.loads(sig.read_text(encoding="utf-8"))
        payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        signed = {str(r["name"]): str(r["digest"]) for r in payload["predicate"]["resources"]}
    except (OSError, ValueError, KeyError, TypeError):
        return msg[:600]
    actual = {p.name: sha256_file(p) for p in release_dir.iterdir() if p.is_file() and p.name != PackageArtifact.SIGNATURE}
    changed = sorted(n for n in signed if n in actual and actual[n] != signed[n])
    parts = [f"files that differ from the signed ones: {', '.join(changed)}"] if changed else []
    if missing := sorted(set(signed) - set(actual)):
        parts.append(f"signed files that are missing: {', '.join(missing)}")
    if extra := sorted(set(actual) - set(signed)):
        parts.append(f"files that were not signed: {', '.join(extra)}")
    return "; ".join(parts) or msg[:600]


def _pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding (``protocol.md``)."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def _hash_for(curve_bits: int) -> Any:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256() if curve_bits <= 256 else hashes.SHA384() if curve_bits <= 384 else hashes.SHA512()


def dsse_sign(payload: bytes, pc: Any, payload_type: str = DSSE_PAYLOAD_TYPE) -> dict[str, Any]:
    """A DSSE envelope ``{payloadType, payload (base64), signatures: [{keyid, sig (base64)}]}`` of ``payload`` signed
    with ``package.sign_key`` (ECDSA; keyid = :func:`public_key_sha256`)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = _load_private_key(pc)
    sig = key.sign(_pae(payload_type, payload), ec.ECDSA(_hash_for(key.curve.key_size)))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [{"keyid": public_key_sha256(key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}],
    }


def dsse_verify(envelope_path: Path, public_key: str) -> bytes:
    """The payload of the DSSE envelope at ``envelope_path`` after checking a signature by ``public_key`` (PEM path).
    Raises InputError naming the file when it is unreadable or no signature verifies."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        env = DsseEnvelope.from_json(json.loads(envelope_path.read_text(encoding="utf-8")))
        body = base64.b64decode(env.payload, validate=True)
        pub = serialization.load_pem_public_key(Path(os.path.expanduser(public_key)).read_bytes())
        sigs = [base64.b64decode(s) for s in env.signatures]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{envelope_path}: not a readable DSSE envelope ({e}). Fix: download the release again.") from None
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise InputError(f"{public_key}: not an elliptic-curve public key. Fix: give the signer's PEM public key.")
    for sig in sigs:
        try:
            pub.verify(sig, _pae(str(env.payload_type), body), ec.ECDSA(_hash_for(pub.curve.key_size)))
            return body
        except InvalidSignature:
            continue
    raise InputError(
        f"{envelope_path}: no signature verifies with {public_key}: the provenance was changed or signed by another "
        f"key; refusing it. Fix: get the release and the public key from the publisher again."
    )


__all__ = [
    "DSSE_PAYLOAD_TYPE",
    "dsse_sign",
    "dsse_verify",
    "method",
    "check_public_key",
    "public_key_sha256",
    "sign_release",
    "signer_identity",
    "verify_signature",
]
