"""The export stage's artifact: file names and readers of ``artifacts/export/<key>/``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from ...errors import InputError
from ..artifacts import FolderName, PathOf, StageArtifact, _read_json
from .result import StageResult

MODEL_INFO_NAME = "model_info.json"


class ExportArtifact(StageArtifact):
    """Export stage output: the normalised Hugging Face checkpoint and its facts."""

    HF_DIR: ClassVar[str] = FolderName("hf")
    MODEL_INFO: ClassVar[str] = MODEL_INFO_NAME
    DECODING: ClassVar[str] = "decoding.json"

    hf_dir = PathOf(HF_DIR, "``hf/``: config.json, model*.safetensors, generation_config.json, tokenizer files.")
    model_info_path = PathOf(MODEL_INFO)
    decoding_path = PathOf(DECODING)

    @classmethod
    def hf_dir_of(cls, export_dir: Path) -> Path:
        """The checkpoint folder of an export artifact (``export_dir/hf``) or of a bare checkpoint (``export_dir`` itself).

        Raises:
            InputError: neither holds a ``config.json``.
        """
        export_dir = Path(export_dir)
        if (export_dir / cls.HF_DIR / "config.json").is_file():
            return export_dir / cls.HF_DIR
        if (export_dir / "config.json").is_file():
            return export_dir
        raise InputError(f"{export_dir}: not an export artifact (no hf/config.json). Pass the export stage's artifact folder.")

    def decoding(self) -> Any:
        """The decoding policy (``pipeline.core.decoding.DecodingPolicy``) export recorded in ``decoding.json``; for an
        export without it (an older release), the policy of ``hf/generation_config.json``.

        Raises:
            InputError: ``decoding.json`` is not a JSON object, or the fallback refuses ``generation_config.json``.
        """
        from ..decoding import DecodingPolicy, read_policy

        d = _read_json(self.decoding_path, "re-run the export stage (force=true stages=[export])")
        return DecodingPolicy.from_json(d) if d else read_policy(self.hf_dir)

    def model_info(self) -> ModelInfo:
        """``model_info.json`` as a :class:`ModelInfo`; for an export without it (written by an older release), the
        token ids from ``hf/generation_config.json`` over ``hf/config.json`` (generation_config wins, as in
        transformers' ``GenerationConfig``) and the architecture, every other field ``None``.

        Raises:
            InputError: the folder does not exist or holds neither file, a file exists but is not a JSON object, or
                a field has the wrong type.
        """
        fix = "re-run the export stage (force=true stages=[export])"
        self.require_folder("export")
        mi = _read_json(self.model_info_path, fix)
        if mi:
            return ModelInfo.from_json(mi, source=self.model_info_path)
        if not (self.hf_dir / "config.json").is_file():
            raise InputError(
                f"{self.path}: no {self.MODEL_INFO} and no {self.HF_DIR}/config.json: not an export artifact (or one "
                f"whose files were removed). Fix: pass an export folder (<store_dir>/export/<key>), or {fix}."
            )
        cfg = _read_json(self.hf_dir / "config.json", fix)
        gen = _read_json(self.hf_dir / "generation_config.json", fix)
        eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
        return ModelInfo.from_json(
            {
                "eos_token_ids": eos if isinstance(eos, list) else ([eos] if eos is not None else []),
                "pad_token_id": gen.get("pad_token_id", cfg.get("pad_token_id")),
                "bos_token_id": gen.get("bos_token_id", cfg.get("bos_token_id")),
                "architecture": (cfg.get("architectures") or [None])[0],
            },
            source=self.hf_dir / "config.json",
        )


_INT_FIELDS = (
    "num_parameters",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tokenizer_vocab_size",
    "max_position_embeddings",
)
_TOKEN_ID_FIELDS = ("bos_token_id", "pad_token_id")


def _token_ids(fields: Any, name: str, ids: list[Any]) -> list[int]:
    """``ids`` when each is an int (``fields``: a :class:`pipeline.core.artifacts.DocumentFields`).

    Raises:
        InputError: an id is not an integer (names ``name[i]``).
    """
    for i, t in enumerate(ids):
        if t is None:
            raise fields.error(f"{name}[{i}]", t, "an integer")
        fields.get(f"{name}[{i}]", t, int)
    return ids


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """``model_info.json``: the facts export established that downstream stages rely on (docs/artifacts.md).

    Geometry fields are the transformers config's, defaults filled in (``head_dim`` = hidden / heads when the config
    has none; ``num_key_value_heads`` = heads for MHA).  ``eos_token_ids``: every end-of-sequence id (generation
    config over config.json), in order.  ``files``: sha256 of every file of the source checkpoint.  Fields a
    document lacks are ``None`` (an older or a fallback document), never guessed.
    """

    architecture: str | None = None
    model_type: str | None = None
    num_parameters: int | None = None
    num_hidden_layers: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    tokenizer_vocab_size: int | None = None
    max_position_embeddings: int | None = None
    rope_theta: float | None = None
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: str | None = None  # "tied" | "untied"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    pad_token_derived: bool = False
    dtype: str | None = None  # float16 | bfloat16 | float32: the dtype export wrote hf/ in
    chat_template: bool = False
    weight_format: str | None = None  # the source's: safetensors | pickle
    files: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any], source: Path | str = MODEL_INFO_NAME) -> ModelInfo:
        """The document ``d`` (keys not named above are ignored; an older single ``eos_token_id`` becomes the list).

        Raises:
            InputError: a field has the wrong type, or a size or count below 1 (names ``source``, the field, the value,
                what was expected and the fix).
        """
        from ..artifacts import DocumentFields

        fields = DocumentFields(source, "re-run the export stage (force=true stages=[export])")
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            v = d.get(f.name)
            if v is None:
                continue
            if f.name in _TOKEN_ID_FIELDS:
                fields.get(f.name, v, int)  # any int: some configs spell "no pad token" -1
            elif f.name in _INT_FIELDS:
                fields.get(f.name, v, int, minimum=1)  # sizes and counts
            elif f.name == "rope_theta":
                v = fields.get(f.name, v, (int, float), minimum=0)
            elif f.name in ("rope_scaling", "files"):
                fields.get(f.name, v, dict)
            elif f.name in ("pad_token_derived", "chat_template"):
                v = bool(v)
            elif f.name == "eos_token_ids":
                fields.get(f.name, v, list)
                v = tuple(_token_ids(fields, f.name, v))
            else:
                fields.get(f.name, v, str)
            kw[f.name] = v
        if "eos_token_ids" not in kw and d.get("eos_token_id") is not None:  # written before the list existed
            single = d["eos_token_id"]
            kw["eos_token_ids"] = tuple(_token_ids(fields, "eos_token_id", single if isinstance(single, list) else [single]))
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        """The ``model_info.json`` document (lists for tuples)."""
        d = dataclasses.asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @property
    def end_id(self) -> int:
        """The first eos id (TensorRT-LLM's single ``end_id``), -1 when there is none."""
        return int(self.eos_token_ids[0]) if self.eos_token_ids else -1


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExportResult(StageResult):
    """The export stage's result (``manifest.json`` ``result``).

    Attributes:
        headline: ``architecture``, ``params`` (parameter count), ``dtype``.
        warnings: what the export changed or could not keep (also logged).
        eos_token_ids: the stop tokens of ``generation_config.json``.
        pad_token_derived: the pad token was derived (the checkpoint named none).
        tie_word_embeddings: the checkpoint ties the output projection to the embeddings.
        rope_type: ``rope_scaling.rope_type`` (``default`` without rope scaling).
        decoding: the decoding policy's ``repetition_penalty`` and ``sampling`` (``decoding.json``).
    """

    warnings: list[str] = dataclasses.field(default_factory=list)
    eos_token_ids: list[int] = dataclasses.field(default_factory=list)
    pad_token_derived: bool | None = None
    tie_word_embeddings: bool | None = None
    rope_type: str | None = None
    decoding: dict[str, Any] = dataclasses.field(default_factory=dict)
