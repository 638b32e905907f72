"""``package`` config group: Triton model repository, release archive and serving (package stage)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..contracts.package import PackageArtifact
from .common import Problem, runtime
from .serving import RuntimeConfig, SpeculativeGateConfig
from .serving import validate as _validate_runtime
from .serving import validate_speculative as _validate_speculative


@dataclass
class PackageConfig:
    name: str = "default"
    """Label of the package preset; it enters the package key but names nothing: the served model, the archive
    (``<model.name>-<recipe>-<version>.tar.gz``) and the release are named after ``model.name``."""
    version: str = "1"
    """Model version folder in the Triton repository and the release archive's version."""
    max_batch_size: Optional[int] = None
    """Triton max_batch_size; ``None`` = the engine's. A value above the engine's is an error."""
    max_input_len: Optional[int] = None
    """Longest prompt the served engine model accepts (tokens); ``None`` = the engine's. Above the engine's is an error."""
    max_beam_width: Optional[int] = None
    """Served beam width; ``None`` = the engine's. Above the engine's is an error."""
    max_prompt_bytes: Optional[int] = None
    """Longest prompt (UTF-8 bytes) a served request may hold, refused before it is tokenized (gRPC models and the
    OpenAI endpoint, docs/package.md "Request limits"); ``None`` = ``max_input_len`` x the tokenizer's longest token x 4,
    at least 64 KiB (``pipeline.core.tokenization.prompt_byte_limit``)."""
    decoupled: bool = True
    """Decoupled (streaming) transaction policy on the models that stream."""
    exclude_input_in_output: bool = True
    """Return only the generated text, not the prompt echoed before it (Triton TensorRT-LLM backend
    ``exclude_input_in_output``)."""
    stream_coalescing: bool = True
    """onnxruntime_genai target, streaming: tokens of one request that queued up while the server was busy sending
    leave as one response (``sequence_length`` = their count) instead of one response each. Nothing waits for it: a
    server that keeps up still sends one token per response. ``false`` = always one token per response. The
    TensorRT-LLM backend sends what its executor returns (several tokens per response with speculative decoding)."""
    stream_interval: int = 1
    """onnxruntime_genai target, streaming: after the first token (sent at once), one response per this many tokens
    (and one for the last ones), each carrying the tokens since the previous one; 1 = every token. Fewer responses
    cost less per token (Python backend IPC, gRPC, the client) and make the delivery coarser (SGLang/vLLM
    ``stream_interval``). The TensorRT-LLM backend streams every token: a value other than 1 is refused there."""
    instance_count: int = 1
    """CPU instances of the pre/postprocessing and BLS Python models (Triton ``instance_group`` count)."""
    allow_failed_gate: bool = False
    """Package an artifact whose evaluation gate failed (recorded in the manifest). Off by default."""
    archive: bool = True
    """Also write ``<model>-<recipe>-<version>.tar.gz`` and ``SHA256SUMS``."""
    parity: bool = True
    """Serving parity check after packaging (pipeline/serve/parity.py): the packaged repository is served on the
    real Triton server and a seeded sample of eval items must get the evaluated answers byte for byte (exit 3
    otherwise). ``false`` disables it explicitly; the release manifest records that."""
    parity_sample: int = 64
    """Eval items replayed by the parity check (all when fewer were evaluated)."""
    parity_seed: int = 0
    """Seed of the parity sample."""
    sign: Optional[str] = runtime(None)
    """Sign the release with OpenSSF ``model-signing`` (pipeline/release/signing.py): ``key`` (an elliptic-curve
    private key, ``package.sign_key``), ``certificate`` (``sign_key`` + ``sign_certificate`` [+
    ``sign_certificate_chain``]) or ``sigstore`` (keyless, with the CI job's OIDC identity; needs network). ``None``
    (default) = ``key`` when ``sign_key`` is set, else unsigned. The signature, ``release/release.sig``, covers every
    file of ``release/`` (archive, manifest, SHA256SUMS, provenance); ``pipeline verify`` checks it. The package stage's cache key holds the method and the sha256 of the signer's
    public key (:func:`pipeline.release.signing.signer_identity`), not these paths."""
    sign_key: Optional[str] = runtime(None)
    """PEM private key (EC P-256/P-384/P-521) that signs the release."""
    sign_key_password_env: Optional[str] = runtime(None)
    """Name of the environment variable holding ``sign_key``'s password (a secret never goes into the config)."""
    sign_certificate: Optional[str] = runtime(None)
    """``sign=certificate``: the PEM signing certificate of ``sign_key``."""
    sign_certificate_chain: list[str] = runtime(default_factory=list)
    """``sign=certificate``: PEM certificates from the signing certificate's issuer up to the root."""
    verify_key: Optional[str] = runtime(None)
    """``pipeline serve``: PEM public key; when set, the release is verified (signature, SHA256SUMS, manifest,
    provenance) before serving and refused (exit 2, naming the file) when it does not verify."""
    verify_certificate_chain: list[str] = runtime(default_factory=list)
    """``pipeline serve``: verify a certificate-signed release against these PEM certificates (root last)."""
    publish: Optional[str] = runtime(None)
    """Register a passed release in a model registry after packaging: ``mlflow`` (MLflow Model Registry at
    ``mlflow_tracking_uri``; pipeline/package/publish.py). ``None`` (default) = keep it in the store only."""
    mlflow_tracking_uri: Optional[str] = runtime(None)
    """``publish=mlflow``: the tracking server, e.g. ``http://127.0.0.1:5000``."""
    mlflow_experiment: str = runtime("pipeline-releases")
    """``publish=mlflow``: the experiment whose run holds the gate metrics and the release files."""
    mlflow_model_name: Optional[str] = runtime(None)
    """``publish=mlflow``: the registered model a release becomes a version of; ``None`` = ``model.name``."""
    publish_allow_failed_gate: bool = runtime(False)
    """Register a release whose gate did not pass (tagged ``pipeline.gate_override=true``). Off: such a release is
    never registered (exit 3)."""
    serving_image: Optional[str] = None
    """Triton image the package is for (tensorrt_llm target); its TensorRT-LLM version must match the engine's."""
    grpc_port: int = runtime(8001)
    """``pipeline serve``: Triton's gRPC port (0 = pick a free one)."""
    http_port: int = runtime(8000)
    """``pipeline serve``: Triton's HTTP port (0 = pick a free one)."""
    metrics_port: int = runtime(8002)
    """``pipeline serve``: Triton's Prometheus metrics port (0 = pick a free one)."""
    openai_port: int = runtime(9000)
    """``pipeline serve --openai``: port of the OpenAI-compatible endpoint (0 = pick a free one)."""
    ready_timeout_s: float = runtime(180.0)
    """``pipeline serve``: seconds to wait for the server to report ready before giving up."""
    repository: Optional[str] = runtime(None)
    """``pipeline serve``: model repository to serve; ``None`` = the newest package artifact in the store."""
    host: str = runtime("127.0.0.1")
    """``pipeline serve``: bind address of every endpoint (127.0.0.1 = this machine only)."""
    migrated_from: Optional[str] = runtime(None)
    """The engine release (its ``release/`` folder) this PyTorch-backend package migrates (set by ``pipeline migrate``;
    recorded in the release manifest's ``migration``). Keyed by the content digest of that release's manifest, not its
    path (package stage ``key_extras``)."""
    # declared last: the field name `runtime` shadows the helper of the same name inside this class body
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """TensorRT-LLM serving knobs (``pipeline/core/config/serving.py``; backend parameter names)."""
    speculative: SpeculativeGateConfig = field(default_factory=SpeculativeGateConfig)
    """Acceptance gate for a speculative build (``pipeline/core/config/serving.py``)."""


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def host_problems(host: str, name: str = "package.host") -> list[Problem]:
    """``host`` must be an IP address literal (:mod:`ipaddress`: IPv4 parts 0-255, or IPv6) or a DNS host name
    (RFC 1123 section 2.1: dot-separated labels of letters, digits and ``-``, 63 characters each, 253 in all); a name
    made only of numeric labels is read as IPv4, so ``256.1.1.1`` is refused here instead of failing to bind later."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return []
    except ValueError:
        pass
    labels = host.split(".") if isinstance(host, str) else []
    if labels and len(host) <= 253 and all(_HOST_LABEL.match(x) for x in labels) and not all(x.isdigit() for x in labels):
        return []
    return [
        Problem(
            name,
            host,
            "is neither an IP address (IPv4 parts are 0-255) nor a host name.",
            f"use {name}=127.0.0.1 (this machine only) or {name}=0.0.0.0 (every interface)",
        )
    ]


def validate(cfg: PackageConfig, prefix: str = "package") -> list[Problem]:
    problems: list[Problem] = host_problems(cfg.host, f"{prefix}.host")
    if cfg.migrated_from is not None and not (Path(cfg.migrated_from).expanduser() / PackageArtifact.RELEASE_MANIFEST).is_file():
        problems.append(
            Problem(
                f"{prefix}.migrated_from",
                cfg.migrated_from,
                f"holds no {PackageArtifact.RELEASE_MANIFEST}.",
                "use `pipeline migrate <engine release>`",
            )
        )
    if cfg.max_batch_size is not None and cfg.max_batch_size < 1:
        problems.append(Problem(f"{prefix}.max_batch_size", cfg.max_batch_size, "must be >= 1 or null.", "remove it to use the engine's"))
    for f in ("max_input_len", "max_beam_width", "max_prompt_bytes"):
        v = getattr(cfg, f)
        if v is not None and v < 1:
            problems.append(Problem(f"{prefix}.{f}", v, "must be >= 1 or null.", "remove it to use the engine's"))
    if cfg.parity_sample < 1:
        problems.append(
            Problem(f"{prefix}.parity_sample", cfg.parity_sample, "must be >= 1.", "use 64, or package.parity=false to disable")
        )
    if cfg.stream_interval < 1:
        problems.append(Problem(f"{prefix}.stream_interval", cfg.stream_interval, "must be >= 1.", "use 1 (a response per token)"))
    if cfg.instance_count < 1:
        problems.append(Problem(f"{prefix}.instance_count", cfg.instance_count, "must be >= 1.", "use 1"))
    if not cfg.version or "/" in cfg.version or ".." in cfg.version:
        problems.append(Problem(f"{prefix}.version", cfg.version, "must be a plain non-empty name.", "use e.g. package.version=1"))
    problems += _validate_signing(cfg, prefix)
    if cfg.publish is not None and cfg.publish not in PUBLISH_TARGETS:
        problems.append(
            Problem(f"{prefix}.publish", cfg.publish, f"must be one of {list(PUBLISH_TARGETS)} or null.", "use package.publish=mlflow")
        )
    if cfg.publish == "mlflow" and not cfg.mlflow_tracking_uri:
        problems.append(
            Problem(
                f"{prefix}.mlflow_tracking_uri",
                None,
                "package.publish=mlflow needs the tracking server.",
                f"set {prefix}.mlflow_tracking_uri=http://127.0.0.1:5000",
            )
        )
    problems += _validate_runtime(cfg.runtime, f"{prefix}.runtime") + _validate_speculative(cfg.speculative, f"{prefix}.speculative")
    return problems


PUBLISH_TARGETS = ("mlflow",)
"""``package.publish`` values (model registries a passed release can be registered in)."""
SIGN_METHODS = ("key", "certificate", "sigstore")
"""``package.sign`` values (OpenSSF model-signing signers: elliptic-curve key, certificate, Sigstore keyless)."""


def _validate_signing(cfg: PackageConfig, prefix: str) -> list[Problem]:
    """Field checks of the signing options: a known method, the files it needs set and present."""
    import os

    problems: list[Problem] = []
    if cfg.sign is not None and cfg.sign not in SIGN_METHODS:
        problems.append(Problem(f"{prefix}.sign", cfg.sign, f"must be one of {list(SIGN_METHODS)} or null.", "use package.sign=key"))
        return problems
    method = cfg.sign or ("key" if cfg.sign_key else None)
    needs = {"key": ["sign_key"], "certificate": ["sign_key", "sign_certificate"]}.get(method or "", [])
    for f in needs:
        if not getattr(cfg, f):
            problems.append(Problem(f"{prefix}.{f}", None, f"package.sign={method} needs it.", f"set {prefix}.{f}=/path/to/file.pem"))
    files = [("sign_key", cfg.sign_key), ("sign_certificate", cfg.sign_certificate), ("verify_key", cfg.verify_key)]
    files += [(f"sign_certificate_chain[{i}]", c) for i, c in enumerate(cfg.sign_certificate_chain)]
    files += [(f"verify_certificate_chain[{i}]", c) for i, c in enumerate(cfg.verify_certificate_chain)]
    for f, v in files:
        if v and not os.path.isfile(os.path.expanduser(v)):
            problems.append(Problem(f"{prefix}.{f}", v, "no such file.", "give the path of a PEM file"))
    env = cfg.sign_key_password_env
    if env and env not in os.environ:
        problems.append(Problem(f"{prefix}.sign_key_password_env", env, "that environment variable is not set.", f"export {env}=..."))
    return problems
