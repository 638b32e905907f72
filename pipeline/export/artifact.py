"""The export stage's artifact: file names and readers of ``artifacts/export/<key>/``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from ..core.artifacts import _read_json


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
        from ..core.decoding import DecodingPolicy, read_policy

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
