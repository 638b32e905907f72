"""``target`` config group: which engine builder/runtime to use (build stage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .common import Problem, choice, runtime

DEFAULT_SERVING_IMAGE = "nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3"
"""The default NGC serving image: TensorRT-LLM 1.2.1 (``pipeline.facts.versions.TRTLLM_IMAGES``, source there), which
the legacy engine path (1.2.0-1.2.1) and the PyTorch backend (>= 1.2.0) both accept (tests/package/test_forward26.py)."""


@dataclass
class TargetConfig:
    name: str = runtime("auto", doc="the *resolved* target enters the build key (build stage key_extras)")
    """auto | onnxruntime_genai | tensorrt_llm. ``auto`` picks tensorrt_llm (and settles ``backend`` by its version:
    pytorch without an engine builder, >= 1.3; tensorrt for 1.2.x) when it is importable and
    a GPU is visible, else onnxruntime_genai, and says which and why. Not hashed as written: the build
    stage hashes the resolved target, so ``auto`` and the target it resolves to share artifacts."""
    backend: str = "tensorrt"
    """tensorrt_llm only: tensorrt (trtllm-build engine, TensorRT-LLM <= 1.2.1) | pytorch (LLM API, no engine file)."""
    execution_provider: str = "cpu"
    """onnxruntime_genai only: cpu | cuda."""
    accuracy_level: int = 4
    """onnxruntime_genai only: MatMulNBits accuracy_level for int4/int8 weights: 4 = int8 activations (default: the
    fastest CPU kernels, judged by the release gate like any candidate), 1 = fp32 activations (bit-level agreement with
    ModelOpt's simulated-quant model; about 2.7x slower per token on an 80 M-parameter Llama, docs/build.md)."""
    gpu: Optional[str] = None
    """Target GPU name from the planner catalogue (h100_sxm, a100_80gb, l4, ...); ``None`` = the local GPU, if any."""
    trtllm_build: str = runtime("trtllm-build")
    """trtllm-build executable: a name looked up on PATH, or an absolute path."""
    serving_image: str = runtime(DEFAULT_SERVING_IMAGE)
    """NGC Triton + TensorRT-LLM container image the GPU package is served with (its TensorRT-LLM version must be the
    engine's, and one the target accepts: checked at config time against ``pipeline/facts/versions.py``)."""


def validate(cfg: TargetConfig, prefix: str = "target") -> list[Problem]:
    problems: list[Problem] = []
    # target.name is checked against the build-target registry (pipeline.core.targets.name_problems, run by
    # pipeline.validation): this layer cannot import the targets, and a registered target is a valid name
    choice(problems, f"{prefix}.backend", cfg.backend, ("tensorrt", "pytorch"))
    choice(problems, f"{prefix}.execution_provider", cfg.execution_provider, ("cpu", "cuda"))
    return problems
