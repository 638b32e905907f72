"""``pipeline migrate <engine release>``: the PyTorch-backend package of an engine-based release of ours.

An engine release (``target=tensorrt_llm``, ``target.backend=tensorrt``: TensorRT-LLM 1.2.x engines, NVIDIA's
in-flight-batcher ensemble) is moved to the forward path (``target=tensorrt_llm_pytorch``, the LLM-API layout with the
``ensemble`` / ``tensorrt_llm_bls`` adapter, :mod:`.llmapi_adapter`) by re-running the chain with the release's own
recorded configuration (the resolved config in ``release/provenance.intoto.json``, ``externalParameters.config``) and
only the target changed. The content-addressed store then reuses the export and the quantize artifact (their keys do
not depend on the target: same checkpoint, same recipe, same calibration), so the PyTorch backend loads the same
ModelOpt unified HF checkpoint the engine was built from; the package stage records both releases and the digests
that show it (:func:`migration_record`, the release manifest's ``migration``).

Refused (exit 2, :class:`pipeline.errors.InputError`): a path that is no release of ours, a release that is not an
engine release, a release without its provenance statement (``package.archive=false``), and a recipe the PyTorch
backend lacks (``pipeline.facts.trtllm.PYTORCH_REFUSED_RECIPES``, INT8 KV), with the alternative.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..core.contracts.manifest import ArtifactManifest
from ..core.contracts.package import PackageArtifact, ProvenanceStatement, ReleaseManifest
from ..errors import InputError

DROPPED = ("target", "stages", "store_dir", "force", "dry_run", "verify_cache", "progress", "hydra")
"""Top-level config keys not carried over from the engine release: the target is what changes, and the rest says how
and where this run works (given on the command line if wanted), not what it produces."""
MIGRATED_FROM = "package.migrated_from"


@dataclasses.dataclass
class EngineRelease:
    """An engine release of ours: its ``release/`` folder, the release manifest, the recorded config and, when it
    is a package artifact of a store, that artifact's folder (its store ``manifest.json`` leads to the build)."""

    release_dir: Path
    manifest: dict[str, Any]
    config: dict[str, Any]
    package_dir: Path | None
    gpu: Any = None
    """The recorded config's ``target.gpu``."""


def _json(p: Path) -> dict[str, Any]:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: not readable JSON ({e}). Fix: pass a release folder written by the package stage.") from None


def read_engine_release(path: str | Path) -> EngineRelease:
    """The engine release at ``path``: a package artifact folder (``artifacts/package/<key>``), its ``release/``
    folder, or the ``.tar.gz`` in it.

    Raises:
        InputError (exit 2): not a release of ours, not an engine release, or no provenance statement.
    """
    p = Path(path).expanduser().resolve()
    if p.is_file() and p.name.endswith(".tar.gz"):
        p = p.parent
    package_dir = None
    if (p / PackageArtifact.RELEASE_DIR / PackageArtifact.RELEASE_MANIFEST).is_file():
        package_dir, p = p, p / PackageArtifact.RELEASE_DIR
    if not (p / PackageArtifact.RELEASE_MANIFEST).is_file():
        raise InputError(
            f"pipeline migrate {path}: no {PackageArtifact.RELEASE_MANIFEST} there. Fix: pass the engine release's "
            f"package artifact (artifacts/package/<key>), its release/ folder or its .tar.gz."
        )
    if package_dir is None and p.name == PackageArtifact.RELEASE_DIR and (p.parent / PackageArtifact.RELEASE_MANIFEST).is_file():
        package_dir = p.parent
    m = _json(p / PackageArtifact.RELEASE_MANIFEST)
    rm = ReleaseManifest.from_json(m)
    if rm.target != "tensorrt_llm" or (rm.backend or "tensorrt") != "tensorrt":
        raise InputError(
            f"pipeline migrate {path}: this release was built for target={rm.target} "
            f"backend={rm.backend}, not TensorRT-LLM engines (target=tensorrt_llm, backend tensorrt); there "
            f"is nothing to migrate. Fix: pass an engine release."
        )
    prov = p / PackageArtifact.PROVENANCE
    if not prov.is_file():
        raise InputError(
            f"pipeline migrate {path}: {prov.name} is missing, and it holds the release's recorded config. "
            f"Fix: pass a release packaged with package.archive=true (the default)."
        )
    st = ProvenanceStatement.from_json(_json(prov))
    if st.config is None:
        raise InputError(f"{prov}: no externalParameters.config. Fix: re-package the engine release with this version of the pipeline.")
    return EngineRelease(p, m, st.config, package_dir, st.target_gpu)


def refusal(rel: EngineRelease) -> str | None:
    """Why the PyTorch backend cannot take the release's recipe (with the alternative), or None."""
    from ..facts.trtllm import PYTORCH_ALTERNATIVE, PYTORCH_KV_CACHE_DTYPES, PYTORCH_REFUSED_RECIPES

    rm = ReleaseManifest.from_json(rel.manifest)
    recipe, kv = rm.quant_recipe, rm.kv_cache_dtype or "none"
    if recipe in PYTORCH_REFUSED_RECIPES:
        return (
            f"the release was quantized with quant={recipe}: {PYTORCH_REFUSED_RECIPES[recipe]}. "
            f"Fix: {PYTORCH_ALTERNATIVE.format(recipe=recipe)}"
        )
    if kv not in PYTORCH_KV_CACHE_DTYPES:
        return (
            f"the release uses quant.kv_cache_dtype={kv}: the TensorRT-LLM PyTorch backend has FP8 KV only "
            f"({', '.join(PYTORCH_KV_CACHE_DTYPES)}). Fix: migrate with quant.kv_cache_dtype=fp8 (a new calibration), "
            f"or keep the engine release (target=tensorrt_llm, TensorRT-LLM 1.2.x)"
        )
    return None


def migration_config(rel: EngineRelease) -> dict[str, Any]:
    """The release's recorded config without :data:`DROPPED` keys and without unset (null) values, as a user YAML
    (``pipeline --config-dir/--config-name``) of the migration run."""

    def prune(d: Any) -> Any:
        if isinstance(d, dict):
            return {k: prune(v) for k, v in d.items() if v is not None and not (isinstance(v, dict) and not prune(v))}
        return d

    return prune({k: v for k, v in rel.config.items() if k not in DROPPED})


USAGE = (
    "usage: pipeline migrate <artifacts/package/<key> | release folder> [overrides ...]\n\n"
    "Rebuild a TensorRT-LLM engine release as a PyTorch-backend package (target=tensorrt_llm_pytorch): the same\n"
    "checkpoint, recipe and target.gpu, read from the release; overrides given after it win (docs/package.md)."
)


def pipeline_argv(argv: list[str], tmp: Path) -> list[str]:
    """``pipeline migrate RELEASE [overrides ...]`` -> the ``pipeline`` arguments of the migration run.

    Writes ``tmp/migrate.yaml`` (:func:`migration_config`); the run is ``target=tensorrt_llm_pytorch`` with the
    release's ``target.gpu``, ``package.migrated_from=<release folder>`` and the given overrides last (they win).

    Raises:
        InputError (exit 2): no release named, or see :func:`read_engine_release` / :func:`refusal`.
    """
    import yaml

    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        raise InputError(
            "pipeline migrate needs the engine release first: pipeline migrate <artifacts/package/<key> | release folder> [overrides ...]."
        )
    rel = read_engine_release(argv[0])
    why = refusal(rel)
    if why:
        raise InputError(f"pipeline migrate {argv[0]}: {why}.")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "migrate.yaml").write_text(yaml.safe_dump(migration_config(rel), sort_keys=True), encoding="utf-8")
    head = ["--config-dir", str(tmp), "--config-name", "migrate", "target=tensorrt_llm_pytorch"]
    head += [f"target.gpu={rel.gpu}"] if rel.gpu else []
    return [*head, f"{MIGRATED_FROM}={rel.release_dir}", *argv[1:]]


def _quantize_digest(build_dir: Path | None) -> str | None:
    """The quantize artifact digest a build artifact was made from (its store ``manifest.json`` ``inputs``)."""
    if build_dir is None or not (build_dir / "manifest.json").is_file():
        return None
    return ArtifactManifest.from_json(_json(build_dir / "manifest.json")).input("quantize").digest


def _engine_build_dir(rel: EngineRelease) -> Path | None:
    if rel.package_dir is None or not (rel.package_dir / "manifest.json").is_file():
        return None
    b = ArtifactManifest.from_json(_json(rel.package_dir / "manifest.json")).input("build")
    return Path(b.path) if b.path else None


def migration_record(release_dir: str | Path, *, export_digest: str | None, build_dir: Path, quant: dict[str, Any]) -> dict[str, Any]:
    """The release manifest's ``migration``: both releases, whether checkpoint and recipe are the same, and the
    served-parity commands for the GPU host.

    Args:
        release_dir: ``package.migrated_from`` (the engine release's ``release/`` folder).
        export_digest: this run's export artifact digest; ``build_dir``: this run's build artifact (its store manifest
            names the quantize artifact); ``quant``: this run's ``key_fields(cfg.quant)``.
    Raises:
        InputError (exit 2): ``release_dir`` is not an engine release (:func:`read_engine_release`).
    """
    from ..serve.parity import command_for

    rel = read_engine_release(release_dir)
    m = ReleaseManifest.from_json(rel.manifest)
    q_engine, q_here = _quantize_digest(_engine_build_dir(rel)), _quantize_digest(build_dir)
    archive = next(iter(sorted(rel.release_dir.glob("*.tar.gz"))), None)
    return {
        "from": {
            "release": m.name,
            "archive": archive.name if archive else None,
            "archive_sha256": _sha256(archive) if archive else None,
            "layout": m.layout,
            "backend": "tensorrt",
            "engine_versions": m.engine_versions,
            "serving_image": m.serving_image,
            "export": m.export_digest,
            "quantize": q_engine,
        },
        "to": {"layout": "llmapi", "backend": "pytorch", "export": export_digest, "quantize": q_here},
        "same_recipe": m.quant == quant,
        "same_export": bool(export_digest) and m.export_digest == export_digest,
        "same_quantize": None if q_engine is None else q_engine == q_here,
        "parity_commands": {
            "pytorch_package": command_for(url="<host>:8001"),
            "against_engine_answers": command_for("<engine release: artifact or unpacked folder>", "<host>:8001"),
        },
        "note": (
            "serve this package on the GPU host (both releases answer NVIDIA's ensemble interface); the first command "
            "compares its answers with the answers its own evaluation recorded, the second with the answers the engine "
            "release's evaluation recorded (greedy outputs of two backends can differ at near-tied logits: a "
            "difference is shown item by item, exit 3)"
        ),
    }


def _sha256(p: Path) -> str:
    from ..core.store import sha256_file

    return sha256_file(p)
