"""A CycloneDX SBOM of the environment that serves the release (``release/sbom.cdx.json``).

Format: CycloneDX 1.5 JSON (cyclonedx.org/docs/1.5/json: ``bomFormat``, ``specVersion``, ``serialNumber``,
``version``, ``metadata.component``, ``components[]`` with ``type``, ``name``, ``version``, ``purl``); package URLs
per the purl spec's ``pypi`` type (``pkg:pypi/<name>@<version>``, the name lower-cased with ``_`` and ``.`` runs as
``-``, PEP 503 normalisation).

What is listed:

- ``onnxruntime_genai`` target: every Python distribution installed in the serving virtualenv (``.venv-serve`` or
  ``$PIPELINE_SERVE_VENV``: the Triton server of the nvidia-pytriton wheel, numpy, onnxruntime-genai, tokenizers,
  ...), read with ``importlib.metadata`` by that environment's own interpreter. No SBOM is written when that
  environment does not exist on the packaging host (nothing can be said about it).
- ``tensorrt_llm`` target: the serving container image (``package.serving_image``) as one ``container`` component;
  its contents are NVIDIA's (the NGC image has its own SBOM).

No timestamp and a serial number derived from the archive's sha256 (UUID v5), so the same release gives the same file.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from typing import Any

SPEC_VERSION = "1.5"
_LIST = (
    "import json, importlib.metadata as m\n"
    "print(json.dumps(sorted({(d.metadata['Name'], d.version) for d in m.distributions() if d.metadata['Name']})))"
)


def _purl(name: str, version: str) -> str:
    return f"pkg:pypi/{re.sub(r'[-_.]+', '-', name).lower()}@{version}"


def serving_components(target: str, serving_image: str | None) -> list[dict[str, Any]] | None:
    """CycloneDX components of the serving environment of ``target``; None when it cannot be inspected here."""
    if target != "onnxruntime_genai":
        return [{"type": "container", "name": serving_image}] if serving_image else None
    from ..errors import PreflightError
    from ..serve.server import ServeEnv

    try:
        env = ServeEnv()
    except PreflightError:
        return None
    p = subprocess.run([str(env.python), "-c", _LIST], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return None
    return [{"type": "library", "name": n, "version": v, "purl": _purl(n, v)} for n, v in json.loads(p.stdout)]


def build_sbom(release_name: str, archive_sha256: str, components: list[dict[str, Any]]) -> dict[str, Any]:
    """The CycloneDX document (module doc) for the release ``release_name`` whose archive has ``archive_sha256``."""
    from .. import __version__

    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'sha256:' + archive_sha256)}",
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "pipeline", "version": __version__}]},
            "component": {
                "type": "application",
                "name": release_name,
                "hashes": [{"alg": "SHA-256", "content": archive_sha256}],
                "description": "the serving environment of this release",
            },
        },
        "components": components,
    }


__all__ = ["SPEC_VERSION", "build_sbom", "serving_components"]
