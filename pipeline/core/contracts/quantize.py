"""The quantize stage's artifact: file names and readers of ``artifacts/quantize/<key>/``."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ..artifacts import StageArtifact


class QuantizeArtifact(StageArtifact):
    """Quantize stage output: unified HF checkpoint, TensorRT-LLM checkpoint, ModelOpt state and the report."""

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
