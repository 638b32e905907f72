"""The quantize stage's artifact: file names and readers of ``artifacts/quantize/<key>/``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ..artifacts import FolderName, PathOf, StageArtifact
from .result import Record, StageResult, json_object


class QuantizeArtifact(StageArtifact):
    """Quantize stage output: unified HF checkpoint, TensorRT-LLM checkpoint, ModelOpt state and the report."""

    HF_DIR: ClassVar[str] = FolderName("hf")
    TRTLLM_CHECKPOINT: ClassVar[str] = FolderName("trtllm_checkpoint")
    QUANT_STATE_TENSORS: ClassVar[str] = "quant_state.safetensors"
    QUANT_STATE_JSON: ClassVar[str] = "quant_state.json"
    REPORT_JSON: ClassVar[str] = "quant_report.json"
    REPORT_MD: ClassVar[str] = "quant_report.md"

    hf_dir = PathOf(HF_DIR)
    trtllm_checkpoint = PathOf(
        TRTLLM_CHECKPOINT, "``trtllm_checkpoint/``: config.json + rank{N}.safetensors (TensorRT-LLM checkpoint layout)."
    )
    report_path = PathOf(REPORT_JSON)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizeResult(StageResult):
    """The quantize stage's result (``manifest.json`` ``result``; ``pipeline.quantize.run.quantize`` returns it as a
    dict, with the run's ``measurements``, which go to the manifest's ``measurements`` instead).

    Attributes:
        headline: ``recipe``, ``kv_cache``, ``compression``, ``calib_samples``.
        quant_algo / kv_cache_quant_algo: the TensorRT-LLM checkpoint's ``quantization`` algorithms.
        tp_size / pp_size: the checkpoint's tensor / pipeline parallel sizes.
        calibration_s: calibration wall time (s).
        placement: where calibration ran (``quant_report.json`` ``placement``).
        cuda_extension: load time of ModelOpt's CUDA extension (None when not loaded).
        warnings: the report's warnings.
    """

    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    tp_size: int | None = None
    pp_size: int | None = None
    calibration_s: float | None = None
    placement: dict[str, Any] = dataclasses.field(default_factory=dict)
    cuda_extension: dict[str, Any] | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class QuantStateRecord(Record):
    """``quant_state.json`` (pipeline/quantize/state.py) as restoring the state reads it: the ``schema``, ``quant.recipe``,
    the dtype and kind of device (``cpu`` / ``cuda``) calibration ran in, the digest of the export artifact it was made
    from (None: not recorded) and ModelOpt's ``modelopt_state`` encoded as JSON (None for ``none``)."""

    schema: Any = None
    recipe: Any = None
    calib_dtype: Any = "float32"
    calib_device: Any = "cpu"
    export_digest: Any = None
    modelopt_state: Any = None


@dataclasses.dataclass(frozen=True)
class QuantReportNotes:
    """The sections of ``quant_report.json`` (pipeline/quantize/report.py) its Markdown rendering lists below the table:
    the ``calibration`` statistics (None for ``none``), the ``preflight`` facts, the ``config.json`` fields ``patched``
    after the export (``export_checks``; ``{}`` when none or not exported), the ``warnings`` and the ``auto`` search."""

    calibration: dict[str, Any] | None = None
    preflight: dict[str, Any] = dataclasses.field(default_factory=dict)
    patched: dict[str, Any] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    auto: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, d: Any) -> QuantReportNotes:
        doc = json_object(d)
        patched = json_object(json_object(doc.get("export_checks")).get("patched"))
        return cls(doc.get("calibration"), json_object(doc.get("preflight")), patched, doc.get("warnings") or [], doc.get("auto"))
