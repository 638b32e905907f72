"""Publish a passed release to a model registry: MLflow Model Registry (``package.publish=mlflow``).

Uses the MLflow tracking client (``mlflow.tracking.MlflowClient``, PyPI ``mlflow-skinny``, the client part of
``mlflow``; the ``mlflow`` extra of this project) against ``package.mlflow_tracking_uri`` (e.g. a local
``mlflow server --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1``, which proxies artifact uploads). One
publish makes:

- a run in the experiment ``package.mlflow_experiment`` named after the release, with
  - parameters: ``recipe`` (``quant.recipe``), ``target``, ``model``, ``release``, ``eval_set``, ``candidate``;
  - metrics: ``score``, ``baseline``, ``drop``, ``drop_upper`` (the one-sided upper bound), ``allowed_drop``,
    ``kld_mean``, ``top1`` and per slice ``slice.<name>.score`` / ``.drop`` / ``.drop_upper`` (from the evaluate
    artifact's ``eval_report.json``; scores on the 0..1 scale, KLD in nats);
  - the release folder (archive, manifest, SHA256SUMS, provenance, signature) as the run's artifacts under ``release/``;
- a new version of the registered model ``package.mlflow_model_name`` (default ``model.name``), source
  ``runs:/<run id>/release``, tagged with the content keys (``pipeline.key.<stage>``), the archive's sha256, the gate
  verdict and the signature (method, signer's public key sha256, or ``unsigned``).

A release whose gate did not pass (``release_manifest.json`` ``evaluation.gate.passed`` is not true) is never
registered: :class:`~pipeline.errors.GateFailed` (exit 3), nothing is created. ``package.publish_allow_failed_gate=true``
is the explicit override; such a version is tagged ``pipeline.gate_override=true`` and its description says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..core.contracts.evaluate import EvalArtifact, EvalReport
from ..core.contracts.manifest import ArtifactManifest
from ..core.contracts.package import PackageArtifact, ReleaseGate, ReleaseManifest
from ..errors import GateFailed, InputError, PreflightError

A = PackageArtifact


def _metric_name(s: str) -> str:
    """MLflow metric / tag names allow letters, digits, ``_ - . / `` and spaces; anything else becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", s)[:250]


def _read(p: Path) -> dict[str, Any]:
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: not readable JSON ({e}). Fix: re-run the package stage (force=true stages=[package]).") from None
    return doc if isinstance(doc, dict) else {}


def release_metrics(report: EvalReport) -> dict[str, float]:
    """The gate metrics of an eval report (:meth:`pipeline.core.contracts.evaluate.EvalReport.gate_metrics`) under their
    MLflow metric names."""
    return {_metric_name(k): v for k, v in report.gate_metrics().items()}


def _facts(package_dir: Path) -> dict[str, Any]:
    """What a publish records, read from the package artifact: manifests, keys, eval report, release folder."""
    rel = A(package_dir).release_dir
    if not (rel / A.SHA256SUMS).is_file():
        raise InputError(
            f"{rel}: no release there (package.archive=false?), so there is nothing to register. Fix: package with package.archive=true."
        )
    art = _read(package_dir / "manifest.json")
    rm = _read(rel / A.RELEASE_MANIFEST)
    inputs = ArtifactManifest.from_json(art)
    keys = {"package": package_dir.name, **{s: str("" if v.key is None else v.key)[:24] for s, v in inputs.inputs.items()}}
    ev = inputs.input("evaluate")
    report = EvalArtifact(Path(str(ev.path))).report() if ev.path else EvalReport()
    return {"release": rel, "artifact": art, "manifest": rm, "keys": keys, "report": report}


def _client(uri: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as e:
        raise PreflightError(
            f"package.publish=mlflow needs the MLflow client ({e}). Fix: pip install 'pipeline[mlflow]' (mlflow-skinny)."
        ) from None
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _experiment(client: Any, name: str) -> str:
    try:
        exp = client.get_experiment_by_name(name)
        return str(exp.experiment_id) if exp is not None else str(client.create_experiment(name))
    except Exception as e:  # MlflowException, requests ConnectionError after the client's retries
        raise PreflightError(
            f"package.mlflow_tracking_uri: the MLflow server does not answer ({type(e).__name__}: {str(e)[:300]}). "
            f"Fix: start it (mlflow server --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000) or "
            f"correct the URI."
        ) from None


def publish_mlflow(package_dir: Path, cfg: Any) -> dict[str, Any]:
    """Register the release of the package artifact ``package_dir`` as a new model version (module doc).

    Returns ``{"registry": "mlflow", "tracking_uri", "model", "version", "run_id", "gate_override"}``.

    Raises:
        GateFailed: the release's gate did not pass and ``package.publish_allow_failed_gate`` is not set.
        InputError: no release folder, or an unreadable manifest.
        PreflightError: the MLflow client is not installed or the server does not answer.
    """
    pc = cfg.package
    f = _facts(Path(package_dir))
    gate = ReleaseGate.of_manifest(f["manifest"]) or ReleaseGate(None, override=False)
    override = not gate.passed
    if override and not pc.publish_allow_failed_gate:
        raise GateFailed(
            f"package.publish=mlflow: refusing to register {f['release']}: its evaluation gate did not pass "
            f"({gate.verdict_name}: {gate.reason[:200]}). Fix: improve the candidate; "
            f"or override explicitly with package.publish_allow_failed_gate=true (recorded on the model version)."
        )
    uri = pc.mlflow_tracking_uri
    client = _client(str(uri))
    exp_id = _experiment(client, pc.mlflow_experiment)
    model = pc.mlflow_model_name or cfg.model.name
    tags = _version_tags(f, gate, override)
    run = client.create_run(exp_id, run_name=str(ReleaseManifest.from_json(f["manifest"]).name), tags=tags)
    rid = run.info.run_id
    try:
        for k, p in _params(f, cfg).items():
            client.log_param(rid, k, p)
        for k, m in release_metrics(f["report"]).items():
            client.log_metric(rid, k, m)
        client.log_artifacts(rid, str(f["release"]), artifact_path="release")
        if not client.search_registered_models(filter_string=f"name = '{model}'"):
            client.create_registered_model(model)
        desc = (
            "GATE OVERRIDE (package.publish_allow_failed_gate=true): the evaluation gate did not pass. "
            if override
            else "Evaluation gate passed. "
        ) + f"Release {ReleaseManifest.from_json(f['manifest']).name}, recipe {cfg.quant.recipe}."
        mv = client.create_model_version(model, f"runs:/{rid}/release", run_id=rid, tags=tags, description=desc)
    except Exception:
        client.set_terminated(rid, status="FAILED")
        raise
    client.set_terminated(rid)
    return {"registry": "mlflow", "tracking_uri": uri, "model": model, "version": str(mv.version), "run_id": rid, "gate_override": override}


def _params(f: dict[str, Any], cfg: Any) -> dict[str, str]:
    rm, rep = ReleaseManifest.from_json(f["manifest"]), f["report"]
    return {
        "recipe": str(cfg.quant.recipe),
        "target": str(rm.target),
        "model": str(cfg.model.name),
        "release": str(rm.name),
        "eval_set": str(rep.eval_set.name),
        "candidate": str(rep.candidate),
    }


def _version_tags(f: dict[str, Any], gate: ReleaseGate, override: bool) -> dict[str, str]:
    """Content keys, archive digest, gate verdict and signature as MLflow tags (strings)."""
    from ..core.store import sha256_file

    rel: Path = f["release"]
    sign = ReleaseManifest.from_json(f["manifest"]).signing
    archives = sorted(rel.glob("*.tar.gz"))
    tags = {f"pipeline.key.{s}": str(k) for s, k in f["keys"].items()}
    tags.update(
        {
            "pipeline.archive_sha256": sha256_file(archives[0]) if archives else "",
            "pipeline.gate": gate.verdict_name,
            "pipeline.gate_override": "true" if override else "false",
            "pipeline.signature": (f"{sign.method}:{sign.public_key_sha256}" if sign and (rel / A.SIGNATURE).is_file() else "unsigned"),
        }
    )
    return tags


__all__ = ["publish_mlflow", "release_metrics"]
