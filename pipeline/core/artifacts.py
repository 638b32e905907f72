"""Stage outputs: the one module that knows the file names inside each artifact folder.

Every stage writes into ``artifacts/<stage>/<key>/`` (:mod:`pipeline.core.store`); downstream stages, the packager and
the benchmark read the files below through these classes instead of spelling the names. docs/artifacts.md
describes the same files (tests/contracts/test_artifacts_facts.py checks that it names every one of ``FILES``).

Each class wraps the artifact's folder (``path``); names ending in ``/`` in ``FILES`` are folders. Readers that
find a file corrupt raise :class:`~pipeline.core.errors.InputError` naming the file and the fix.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

from .errors import InputError


def _read_json(p: Path, fix: str) -> dict[str, Any]:
    """The JSON object in ``p``; ``{}`` when the file does not exist.

    Raises:
        InputError: ``p`` exists but is not a JSON object (names the file and ``fix``).
    """
    if not p.is_file():
        return {}
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: not readable JSON ({e}). Fix: {fix}.") from e
    if not isinstance(doc, dict):
        raise InputError(f"{p}: expected a JSON object, found {type(doc).__name__}. Fix: {fix}.")
    return doc


TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
"""The files a Hugging Face tokenizer is saved as (transformers ``PreTrainedTokenizerBase.save_pretrained``: the
fast tokenizer's ``tokenizer.json``, its config and special tokens, the chat template as ``chat_template.jinja`` or
the older ``chat_template.json``; a slow SentencePiece ``tokenizer.model`` or BPE ``vocab.json`` + ``merges.txt``).
Every folder a tokenizer is loaded from gets the ones present, byte for byte: export ``hf/``, quantize ``hf/``, the
engine folders of both targets and the served models' tokenizer folders."""
REQUIRED_TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json")
"""The subset :class:`pipeline.core.tokenization.TextCodec` needs (a fast tokenizer and its config)."""
TOKENIZER_DIRS: tuple[str, ...] = ("additional_chat_templates",)
"""Folders of a saved tokenizer (transformers 4.52+: named chat templates, one ``<name>.jinja`` each)."""
GENERATION_CONFIG = "generation_config.json"
"""The model's generation defaults (eos / pad / bos token ids) read next to the tokenizer."""
TOKENIZER_COPY_FILES: tuple[str, ...] = TOKENIZER_FILES + (GENERATION_CONFIG,)
"""What travels with the tokenizer into a folder a model is run from: :data:`TOKENIZER_FILES` and
``generation_config.json`` (export writes its own normalised ``generation_config.json`` instead of copying it)."""


@dataclasses.dataclass(frozen=True)
class ExportArtifact:
    """Export stage output: the normalised Hugging Face checkpoint and its facts."""

    path: Path
    HF_DIR: ClassVar[str] = "hf"
    MODEL_INFO: ClassVar[str] = "model_info.json"
    DECODING: ClassVar[str] = "decoding.json"
    FILES: ClassVar[tuple[str, ...]] = ("hf/", "model_info.json", "decoding.json")

    @property
    def hf_dir(self) -> Path:
        """``hf/``: config.json, model*.safetensors, generation_config.json, tokenizer files."""
        return self.path / self.HF_DIR

    @property
    def model_info_path(self) -> Path:
        return self.path / self.MODEL_INFO

    @property
    def decoding_path(self) -> Path:
        return self.path / self.DECODING

    def decoding(self) -> Any:
        """The decoding policy (``pipeline.core.decoding.DecodingPolicy``) export recorded in ``decoding.json``; for an
        export without it (an older release), the policy of ``hf/generation_config.json``.

        Raises:
            InputError: ``decoding.json`` is not a JSON object, or the fallback refuses ``generation_config.json``.
        """
        from .decoding import DecodingPolicy, read_policy

        d = _read_json(self.decoding_path, "re-run the export stage (force=true stages=[export])")
        return DecodingPolicy.from_json(d) if d else read_policy(self.hf_dir)

    def model_info(self) -> dict[str, Any]:
        """``model_info.json`` (fields in docs/artifacts.md); for an export without it (written by an older
        release), the token ids from ``hf/generation_config.json`` over ``hf/config.json`` (generation_config wins,
        as in transformers' ``GenerationConfig``): ``eos_token_ids`` (list), ``pad_token_id``, ``bos_token_id``,
        ``architecture``.

        Raises:
            InputError: a file exists but is not a JSON object.
        """
        fix = "re-run the export stage (force=true stages=[export])"
        mi = _read_json(self.model_info_path, fix)
        if mi:
            return mi
        cfg = _read_json(self.hf_dir / "config.json", fix)
        gen = _read_json(self.hf_dir / "generation_config.json", fix)
        eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
        return {
            "eos_token_ids": eos if isinstance(eos, list) else ([eos] if eos is not None else []),
            "pad_token_id": gen.get("pad_token_id", cfg.get("pad_token_id")),
            "bos_token_id": gen.get("bos_token_id", cfg.get("bos_token_id")),
            "architecture": (cfg.get("architectures") or [None])[0],
        }


@dataclasses.dataclass(frozen=True)
class QuantizeArtifact:
    """Quantize stage output: unified HF checkpoint, TensorRT-LLM checkpoint, ModelOpt state and the report."""

    path: Path
    HF_DIR: ClassVar[str] = "hf"
    TRTLLM_CHECKPOINT: ClassVar[str] = "trtllm_checkpoint"
    QUANT_STATE_TENSORS: ClassVar[str] = "quant_state.safetensors"
    QUANT_STATE_JSON: ClassVar[str] = "quant_state.json"
    REPORT_JSON: ClassVar[str] = "quant_report.json"
    REPORT_MD: ClassVar[str] = "quant_report.md"
    FILES: ClassVar[tuple[str, ...]] = (
        "hf/",
        "trtllm_checkpoint/",
        "quant_state.safetensors",
        "quant_state.json",
        "quant_report.json",
        "quant_report.md",
    )

    @property
    def hf_dir(self) -> Path:
        return self.path / self.HF_DIR

    @property
    def trtllm_checkpoint(self) -> Path:
        """``trtllm_checkpoint/``: config.json + rank{N}.safetensors (TensorRT-LLM checkpoint layout)."""
        return self.path / self.TRTLLM_CHECKPOINT

    @property
    def report_path(self) -> Path:
        return self.path / self.REPORT_JSON


@dataclasses.dataclass(frozen=True)
class BuildArtifact:
    """Build stage output: the engine folder, ``build_info.json`` and the builder's log."""

    path: Path
    ENGINE_DIR: ClassVar[str] = "engine"
    BUILD_INFO: ClassVar[str] = "build_info.json"
    BUILD_LOG: ClassVar[str] = "build.log"
    ENGINE_LIMITS: ClassVar[str] = "engine_limits.json"
    """Inside ``engine/`` (onnxruntime_genai): the limits its runtime config has no key for."""
    LLM_API_OPTIONS: ClassVar[str] = "llm_api_options.yaml"
    """Inside ``engine/`` (tensorrt_llm, PyTorch backend): the ``LLM()`` keyword arguments, next to ``engine/hf/``."""
    DRAFT_ENGINE_DIR: ClassVar[str] = "draft_engine"
    """Next to ``engine/`` (tensorrt_llm, draft-model speculative decoding): the draft model's engine."""
    DRAFT_BUILD_LOG: ClassVar[str] = "build_draft.log"
    """trtllm-build's log of the draft engine."""
    FILES: ClassVar[tuple[str, ...]] = (
        "engine/",
        "build_info.json",
        "build.log",
        "engine_limits.json",
        "llm_api_options.yaml",
        "draft_engine/",
        "build_draft.log",
    )
    LIMIT_KEYS: ClassVar[tuple[str, ...]] = ("max_input_len", "max_seq_len", "max_batch_size")

    @property
    def engine_dir(self) -> Path:
        return self.path / self.ENGINE_DIR

    @property
    def build_info_path(self) -> Path:
        return self.path / self.BUILD_INFO

    @property
    def build_log_path(self) -> Path:
        return self.path / self.BUILD_LOG

    def build_info(self) -> dict[str, Any]:
        """``build_info.json`` (``{}`` when absent). Raises :class:`InputError` when it is corrupt."""
        return _read_json(self.build_info_path, "rebuild with the build stage (force=true stages=[build])")

    def limits(self, result: dict[str, Any] | None = None, build_cfg: Any = None) -> dict[str, Any]:
        """Engine limits (``max_input_len``, ``max_seq_len``, ``max_batch_size``, tokens): ``build_info.json``
        ``limits``, else the manifest ``result`` ``limits``, each missing key from ``build_cfg`` (``cfg.build``)."""
        limits = dict(self.build_info().get("limits") or {})
        if not limits and result:
            limits = dict(result.get("limits") or {})
        if build_cfg is not None:
            for k in self.LIMIT_KEYS:
                limits.setdefault(k, getattr(build_cfg, k))
        return limits


@dataclasses.dataclass(frozen=True)
class EvalArtifact:
    """Evaluate stage output: the report (schema ``pipeline.eval_report/v1``) and every generated answer."""

    path: Path
    REPORT_JSON: ClassVar[str] = "eval_report.json"
    REPORT_MD: ClassVar[str] = "eval_report.md"
    REPORT_HTML: ClassVar[str] = "eval_report.html"
    OUTPUTS: ClassVar[str] = "outputs.jsonl"
    JUNIT_XML: ClassVar[str] = "eval_junit.xml"
    """The gate as JUnit XML, one testcase per check (``pipeline.evaluate.junit``)."""
    FILES: ClassVar[tuple[str, ...]] = ("eval_report.json", "eval_report.md", "eval_report.html", "outputs.jsonl", "eval_junit.xml")

    @property
    def report_path(self) -> Path:
        return self.path / self.REPORT_JSON

    @property
    def outputs_path(self) -> Path:
        return self.path / self.OUTPUTS


@dataclasses.dataclass(frozen=True)
class PackageArtifact:
    """Package stage output: the Triton model repository, the release manifest and the release folder."""

    path: Path
    MODEL_REPOSITORY: ClassVar[str] = "model_repository"
    RELEASE_MANIFEST: ClassVar[str] = "release_manifest.json"
    #: PyTorch-backend packages: the non-Triton server files, in ``servers/`` (pipeline/package/llmapi_options.py)
    SERVE_YAML: ClassVar[str] = "trtllm_serve.yaml"
    SERVE_SCRIPT: ClassVar[str] = "trtllm_serve.sh"
    BENCH_JSON: ClassVar[str] = "benchmark.json"
    RELEASE_DIR: ClassVar[str] = "release"
    SHA256SUMS: ClassVar[str] = "SHA256SUMS"
    SIGNATURE: ClassVar[str] = "release.sig"
    """Inside ``release/``: the model-signing signature of every other file there (``package.sign``)."""
    PROVENANCE: ClassVar[str] = "provenance.intoto.json"
    """Inside ``release/``: the in-toto Statement with the SLSA v1 provenance predicate (pipeline/package/provenance.py)."""
    PROVENANCE_DSSE: ClassVar[str] = "provenance.intoto.dsse.json"
    """Inside ``release/``, when signed with a key: the provenance statement in a signed DSSE envelope."""
    SBOM: ClassVar[str] = "sbom.cdx.json"
    """Inside ``release/``: CycloneDX SBOM of the serving environment (pipeline/package/sbom.py)."""
    FILES: ClassVar[tuple[str, ...]] = (
        "model_repository/",
        "release_manifest.json",
        "release/",
        "SHA256SUMS",
        "release.sig",
        "provenance.intoto.json",
        "provenance.intoto.dsse.json",
        "sbom.cdx.json",
        "trtllm_serve.yaml",
        "trtllm_serve.sh",
        "benchmark.json",
    )
    """Top-level names and the names inside ``release/`` (``SHA256SUMS``, the signature, the provenance) and, for a
    PyTorch-backend package, inside ``servers/`` (the trtllm-serve options and command, the benchmark commands)."""

    @property
    def model_repository(self) -> Path:
        return self.path / self.MODEL_REPOSITORY

    @property
    def release_manifest_path(self) -> Path:
        return self.path / self.RELEASE_MANIFEST

    def read_release_manifest(self) -> dict[str, Any]:
        """The release manifest of this package (the artifact's copy, else the one in ``release/``); ``{}`` when there
        is none (a bare model repository)."""
        for p in (self.release_manifest_path, self.release_dir / self.RELEASE_MANIFEST):
            if p.is_file():
                return json.loads(p.read_text(encoding="utf-8"))
        return {}

    @property
    def release_dir(self) -> Path:
        return self.path / self.RELEASE_DIR


@dataclasses.dataclass(frozen=True)
class BenchmarkArtifact:
    """Benchmark stage output (schema ``pipeline.benchmark/v1``)."""

    path: Path
    RESULT_JSON: ClassVar[str] = "benchmark.json"
    RESULT_MD: ClassVar[str] = "benchmark.md"
    FILES: ClassVar[tuple[str, ...]] = ("benchmark.json", "benchmark.md")

    @property
    def result_path(self) -> Path:
        return self.path / self.RESULT_JSON


ARTIFACTS: dict[str, type] = {
    "export": ExportArtifact,
    "quantize": QuantizeArtifact,
    "build": BuildArtifact,
    "evaluate": EvalArtifact,
    "package": PackageArtifact,
    "benchmark": BenchmarkArtifact,
}
"""stage name -> its artifact class."""


def target_of(build_art: Any, default: str) -> str:
    """The target a build artifact (a :class:`pipeline.core.store.Artifact` or ``None``) was built for:
    ``build_info.json`` ``target``, else its manifest headline's, else ``default`` (the configured name)."""
    if build_art is None:
        return default
    bi = BuildArtifact(build_art.path).build_info()
    head = build_art.result.get("headline") or {}
    return str(bi.get("target") or head.get("target") or default)


__all__ = [
    "ARTIFACTS",
    "GENERATION_CONFIG",
    "REQUIRED_TOKENIZER_FILES",
    "TOKENIZER_COPY_FILES",
    "TOKENIZER_DIRS",
    "TOKENIZER_FILES",
    "BenchmarkArtifact",
    "BuildArtifact",
    "EvalArtifact",
    "ExportArtifact",
    "PackageArtifact",
    "QuantizeArtifact",
    "target_of",
]
