"""Signed releases with provenance (issue 27, items 2 and 3).

One real chain on a tiny Llama (export -> quantize -> build (onnxruntime-genai) -> evaluate -> package, with
``package.sign_key``; the serving parity check is off here, it has its own tests) writes a signed release; the
tests verify it with ``pipeline verify`` and ``pipeline serve``'s check, and attack copies of it: a flipped byte,
a rewritten file with regenerated SHA256SUMS, a release re-signed with another key, a removed signature. Keys are
real EC P-256 keys made by ``cryptography``; signatures are made and checked by OpenSSF ``model-signing``.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import compose
from pipeline.core.store import sha256_file
from pipeline.errors import EXIT_INPUT, EXIT_OK, InputError
from pipeline.release.archive import write_sha256sums
from pipeline.release.verify import main as verify_main
from pipeline.release.verify import verify_release
from pipeline.runner import run_pipeline


def _keypair(d: Path, name: str) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    k = ec.generate_private_key(ec.SECP256R1())
    priv, pub = d / f"{name}.key", d / f"{name}.pub"
    priv.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {"good": _keypair(d, "good"), "other": _keypair(d, "other")}


@pytest.fixture(scope="module")
def signed_package(tmp_path_factory, keys):
    """The package artifact folder of a real signed release."""
    import tiny

    root = tmp_path_factory.mktemp("signed_release")
    ckpt = tiny.make_checkpoint(root / "llama", "llama")
    rows = [
        {"id": f"o{i}", "prompt": f"Where is my order ORD-1234{i}?", "reference": f"ORD-1234{i}", "metric": "exact_match", "slice": "order"}
        for i in range(4)
    ]
    es = root / "eval.jsonl"
    es.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    overrides = [
        "stages=[package]",
        f"store_dir={root / 'store'}",
        "progress=false",
        f"model.path={ckpt}",
        "model.dtype=float32",
        "quant=none",
        f"eval.eval_set={es}",
        "eval.max_new_tokens=6",
        "eval.gate.max_drop=1.0",
        "eval.gate.slice_max_drop=1.0",
        "build.max_input_len=128",
        "build.max_seq_len=160",
        "package.parity=false",
        f"package.sign_key={keys['good'][0]}",
    ]
    buf = io.StringIO()
    summary = run_pipeline(compose(overrides), console=Console(file=buf, width=160))
    assert summary.exit_code == EXIT_OK, (summary.error, buf.getvalue())
    pkg = next(s for s in summary.stages if s.stage == "package")
    return Path(pkg.path)


def _copy(pkg: Path, dest: Path) -> Path:
    """A copy of the release folder (what a consumer downloads)."""
    shutil.copytree(pkg / "release", dest)
    return dest


def _archive(rel: Path) -> Path:
    (a,) = rel.glob("*.tar.gz")
    return a


def _verify(capsys, *argv: str) -> tuple[int, str]:
    code = verify_main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_signed_release_verifies(signed_package, keys, capsys):
    rel = signed_package / "release"
    assert {p.name for p in rel.iterdir()} == {
        _archive(rel).name,
        "release_manifest.json",
        "SHA256SUMS",
        "provenance.intoto.json",
        "provenance.intoto.dsse.json",
        "release.sig",
        "sbom.cdx.json",
    }
    man = json.loads((rel / "release_manifest.json").read_text())
    assert man["signing"]["method"] == "key" and len(man["signing"]["public_key_sha256"]) == 64
    for target in (_archive(rel), rel, signed_package):  # an archive, its folder, the package artifact
        code, out = _verify(capsys, str(target), "--key", str(keys["good"][1]))
        assert code == EXIT_OK, out
        assert "signature release.sig verified" in out and "provenance.intoto.dsse.json: provenance signature verified" in out
    code, out = _verify(capsys, str(rel))
    assert code == EXIT_OK and "present but not checked" in out


def test_flipped_byte_is_refused_naming_the_file(signed_package, keys, tmp_path, capsys):
    rel = _copy(signed_package, tmp_path / "release")
    a = _archive(rel)
    data = bytearray(a.read_bytes())
    data[len(data) // 2] ^= 0xFF
    a.write_bytes(bytes(data))
    code, out = _verify(capsys, str(a), "--key", str(keys["good"][1]))
    assert code == EXIT_INPUT and f"{a}: sha256" in out and "does not match" in out


def test_rewritten_file_with_regenerated_sums_fails_only_the_signature(signed_package, keys, tmp_path, capsys):
    """Whoever can write the folder can rewrite SHA256SUMS too: integrity checks pass, the signature does not."""
    rel = _copy(signed_package, tmp_path / "release")
    prov = rel / "provenance.intoto.json"
    st = json.loads(prov.read_text())
    st["predicate"]["runDetails"]["byproducts"][0]["annotations"]["verdict"] = "pass (edited)"
    prov.write_text(json.dumps(st))
    write_sha256sums(
        rel / "SHA256SUMS", [_archive(rel), rel / "release_manifest.json", prov, rel / "provenance.intoto.dsse.json", rel / "sbom.cdx.json"]
    )
    assert verify_release(rel)["signature"] == "not checked"  # no key: integrity only, and it says so
    code, out = _verify(capsys, str(rel), "--key", str(keys["good"][1]))
    assert code == EXIT_INPUT and "files that differ from the signed ones: SHA256SUMS, provenance.intoto.json" in out, out


def test_release_re_signed_with_another_key_is_refused(signed_package, keys, tmp_path, capsys):
    from pipeline.release.signing import sign_release

    rel = _copy(signed_package, tmp_path / "release")
    (rel / "release_manifest.json").write_text((rel / "release_manifest.json").read_text().replace('"passed": true', '"passed": false', 1))
    write_sha256sums(
        rel / "SHA256SUMS",
        [
            _archive(rel),
            rel / "release_manifest.json",
            rel / "provenance.intoto.json",
            rel / "provenance.intoto.dsse.json",
            rel / "sbom.cdx.json",
        ],
    )
    sign_release(rel, compose([f"package.sign_key={keys['other'][0]}"]).package)
    with pytest.raises(InputError, match="release.sig: does not verify with public key .*Key mismatch"):
        verify_release(rel, public_key=str(keys["good"][1]))
    # the manifest edit is also caught without any key: the archive's own copy differs from it
    with pytest.raises(InputError, match="differs from the release_manifest.json beside the archive"):
        verify_release(rel)


def test_missing_signature_is_refused(signed_package, keys, tmp_path, capsys):
    rel = _copy(signed_package, tmp_path / "release")
    (rel / "release.sig").unlink()
    code, out = _verify(capsys, str(rel), "--key", str(keys["good"][1]))
    assert code == EXIT_INPUT and "release.sig: missing: the release is not signed" in out
    code, out = _verify(capsys, str(rel))  # no key: the manifest says signed, so a removed signature is refused
    assert code == EXIT_INPUT and "the signature was removed" in out


def test_serve_verifies_before_serving(signed_package, keys, tmp_path, monkeypatch, capsys):
    """``pipeline serve`` with ``package.verify_key``: an intact archive resolves to its repository; a tampered one and
    a package artifact whose served repository was edited are refused with exit 2 naming the file, before any server."""
    from pipeline.serve import serve

    monkeypatch.chdir(tmp_path)
    good = str(keys["good"][1])
    repo = serve.verified_repository(str(_archive(signed_package / "release")), None, good, [])
    assert (repo / "ensemble" / "config.pbtxt").is_file()
    repo = serve.verified_repository(str(signed_package), None, good, [])
    assert repo == signed_package / "model_repository"

    rel = _copy(signed_package, tmp_path / "r2")
    (rel / "release.sig").unlink()
    assert serve.main([str(_archive(rel)), f"package.verify_key={good}"]) == EXIT_INPUT
    assert "release.sig: missing" in capsys.readouterr().err

    pkg = tmp_path / "pkg"
    shutil.copytree(signed_package, pkg)
    cfgfile = pkg / "model_repository" / "ensemble" / "config.pbtxt"
    cfgfile.write_text(cfgfile.read_text() + "\n# edited\n")
    assert serve.main([str(pkg), f"package.verify_key={good}"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "ensemble/config.pbtxt: does not match release_manifest.json" in err


def test_provenance_subjects_match_the_files(signed_package, keys):
    """Item 3: the in-toto Statement's subjects are the archive, the manifest and every file in the archive, with
    their sha256; the inputs are the checkpoint, calibration-free (quant=none) and eval set digests; it records the
    builder, the gate verdict and the resolved config; its DSSE envelope is signed with the release key."""
    import tarfile

    from pipeline.release.signing import dsse_verify

    rel = signed_package / "release"
    st = json.loads((rel / "provenance.intoto.json").read_text())
    assert st["_type"] == "https://in-toto.io/Statement/v1" and st["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in st["subject"]}
    a = _archive(rel)
    assert subjects[a.name] == sha256_file(a) and subjects["release_manifest.json"] == sha256_file(rel / "release_manifest.json")
    with tarfile.open(a) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    import hashlib

    assert {n: hashlib.sha256(b).hexdigest() for n, b in members.items()} == {n: h for n, h in subjects.items() if "/" in n}
    pred = st["predicate"]
    deps = {d["name"]: d["digest"]["sha256"] for d in pred["buildDefinition"]["resolvedDependencies"]}
    mf = lambda stage: json.loads(next((signed_package.parent.parent / stage).glob("*/manifest.json")).read_text())  # noqa: E731
    assert deps["evaluate:eval_set"] == mf("evaluate")["external"]["eval_set"]["digest"]
    assert {k for k in deps if k.startswith("export:")} and all(len(v) == 64 for v in deps.values())
    assert deps["export:" + next(iter(mf("export")["external"]))] == next(iter(mf("export")["external"].values()))["digest"]
    assert pred["buildDefinition"]["externalParameters"]["config"]["quant"]["recipe"] == "none"
    assert pred["runDetails"]["builder"]["version"]["pipeline"]
    gate = next(b for b in pred["runDetails"]["byproducts"] if b["name"] == "evaluation gate")["annotations"]
    assert gate["passed"] is True
    assert "memory_bytes" in pred["buildDefinition"]["internalParameters"]["host"]
    assert json.loads(dsse_verify(rel / "provenance.intoto.dsse.json", str(keys["good"][1]))) == st
    with pytest.raises(InputError, match="no signature verifies"):
        dsse_verify(rel / "provenance.intoto.dsse.json", str(keys["other"][1]))


def _ca_and_leaf(d: Path, tag: str) -> tuple[Path, Path, Path]:
    """A real two-level PKI made with ``cryptography``: (CA certificate, signing certificate, its private key)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def usage(sign: bool, ca: bool) -> x509.KeyUsage:
        return x509.KeyUsage(sign, False, False, False, False, ca, ca, False, False)

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder(name(f"{tag} ca"), name(f"{tag} ca"), ca_key.public_key(), 1, now - day, now + day)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage(False, True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder(ca.subject, name(f"{tag} signer"), key.public_key(), 2, now - day, now + day)  # issuer, subject
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage(True, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = (d / f"{tag}-ca.pem", d / f"{tag}-leaf.pem", d / f"{tag}-leaf.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


def test_certificate_signed_release(signed_package, tmp_path):
    """``package.sign=certificate``: signed with a key and its certificate, verified against the CA; another CA and an
    edited file are refused."""
    from pipeline.release.signing import sign_release

    ca, leaf, key = _ca_and_leaf(tmp_path, "good")
    other_ca, _, _ = _ca_and_leaf(tmp_path, "other")
    rel = _copy(signed_package, tmp_path / "release")
    pc = compose(
        [
            "package.sign=certificate",
            f"package.sign_key={key}",
            f"package.sign_certificate={leaf}",
            f"package.sign_certificate_chain=[{ca}]",
        ]
    ).package
    assert sign_release(rel, pc)["method"] == "certificate"
    assert verify_release(rel, certificate_chain=[str(ca)])["signature"] == "verified"
    with pytest.raises(InputError, match="release.sig: does not verify with certificate chain"):
        verify_release(rel, certificate_chain=[str(other_ca)])
    (rel / "provenance.intoto.dsse.json").write_text("{}")
    write_sha256sums(
        rel / "SHA256SUMS",
        [
            _archive(rel),
            rel / "release_manifest.json",
            rel / "provenance.intoto.json",
            rel / "provenance.intoto.dsse.json",
            rel / "sbom.cdx.json",
        ],
    )
    with pytest.raises(InputError, match="files that differ from the signed ones: SHA256SUMS, provenance.intoto.dsse.json"):
        verify_release(rel, certificate_chain=[str(ca)])


def test_encrypted_key_takes_its_password_from_the_environment(signed_package, tmp_path, monkeypatch):
    """``package.sign_key_password_env`` names the variable with the key's password; the config never holds it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from pipeline.release.signing import dsse_sign, sign_release
    from pipeline.validation import validate

    k = ec.generate_private_key(ec.SECP384R1())
    key, pub = tmp_path / "enc.key", tmp_path / "enc.pub"
    key.write_bytes(
        k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"s3cret-pw"))
    )
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    cfg = compose([f"package.sign_key={key}", "package.sign_key_password_env=RELEASE_KEY_PW"])
    monkeypatch.delenv("RELEASE_KEY_PW", raising=False)
    problems = validate(cfg, raise_on_error=False)
    assert any(p.field == "package.sign_key_password_env" and "not set" in p.message for p in problems)
    monkeypatch.setenv("RELEASE_KEY_PW", "s3cret-pw")
    rel = _copy(signed_package, tmp_path / "release")
    dsse = rel / "provenance.intoto.dsse.json"  # the publisher's own re-signing: provenance envelope, sums, signature
    dsse.write_text(json.dumps(dsse_sign((rel / "provenance.intoto.json").read_bytes(), cfg.package)))
    write_sha256sums(
        rel / "SHA256SUMS", [_archive(rel), rel / "release_manifest.json", rel / "provenance.intoto.json", dsse, rel / "sbom.cdx.json"]
    )
    sign_release(rel, cfg.package)
    assert verify_release(rel, public_key=str(pub))["signature"] == "verified"
    monkeypatch.setenv("RELEASE_KEY_PW", "wrong")
    with pytest.raises(InputError, match="package.sign_key=.*not a readable PEM private key"):
        sign_release(rel, cfg.package)


def test_sbom_lists_the_serving_environment(signed_package):
    """The CycloneDX SBOM names every distribution of the serving virtualenv with the version installed there."""
    import subprocess

    from pipeline.serve.server import ServeEnv

    bom = json.loads((signed_package / "release" / "sbom.cdx.json").read_text())
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.5" and bom["serialNumber"].startswith("urn:uuid:")
    got = {c["name"].lower(): c["version"] for c in bom["components"]}
    py = str(ServeEnv().python)
    for dist in ("numpy", "onnxruntime-genai", "nvidia-pytriton"):
        want = subprocess.run(
            [py, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"], capture_output=True, text=True
        ).stdout.strip()
        assert got[dist] == want and want, (dist, want)
    assert got["numpy"].startswith("1.")  # the serving environment's numpy, not the pipeline's
    assert any(c["purl"] == f"pkg:pypi/onnxruntime-genai@{got['onnxruntime-genai']}" for c in bom["components"])


def test_a_bad_key_file_is_exit_2_naming_the_flag_or_field(signed_package, keys, tmp_path, capsys):
    """Trial 3: ``pipeline verify --key`` with a missing file, a non-PEM file or the PRIVATE key was a traceback
    (exit 1); ``pipeline serve ... package.verify_key=`` with them printed only the library's text."""
    from pipeline.serve import serve

    archive = str(_archive(signed_package / "release"))
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("garbage\n")
    priv = keys["good"][0]
    cases = [
        (tmp_path / "nonexist.pub", "no such file"),
        (garbage, "not a PEM public key"),
        (priv, "a private key, not a public one"),
    ]
    for key, said in cases:
        code, out = _verify(capsys, archive, "--key", str(key))
        assert code == EXIT_INPUT, out
        assert f"--key {key}: {said}" in out and "Fix: " in out and "Traceback" not in out, out
        assert serve.main([archive, f"package.verify_key={key}"]) == EXIT_INPUT
        err = capsys.readouterr().err
        assert f"package.verify_key={key}: {said}" in err and "Fix: " in err, err
    code, out = _verify(capsys, archive, "--key", str(priv))
    assert f"openssl ec -in {priv.name} -pubout -out release.pub" in out, out
