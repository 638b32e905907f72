"""The root of the config schema: :class:`PipelineConfig` (one field per group, plus the top-level fields), the group
schemas by name (:data:`GROUPS`) and the presets' folder (:data:`CONFIG_DIR`).  Re-exported by
:mod:`pipeline.core.config`; a module of its own so the override checks (:mod:`pipeline.core.config.overrides`),
which :func:`pipeline.core.config.compose` runs, read the schema without importing the package that calls them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from omegaconf import MISSING

from .benchmark import BenchmarkConfig
from .build import BuildConfig
from .calibration import CalibrationConfig
from .common import REPO_ROOT
from .eval import EvalConfig
from .model import ModelConfig
from .package import PackageConfig
from .parallel import ParallelConfig
from .quant import QuantConfig
from .target import TargetConfig

CONFIG_DIR = Path(os.environ.get("PIPELINE_CONFIG_DIR", REPO_ROOT / "build_configs"))

GROUPS = {
    "model": ModelConfig,
    "calibration": CalibrationConfig,
    "quant": QuantConfig,
    "parallel": ParallelConfig,
    "target": TargetConfig,
    "build": BuildConfig,
    "eval": EvalConfig,
    "package": PackageConfig,
    "benchmark": BenchmarkConfig,
}


@dataclass
class PipelineConfig:
    model: ModelConfig = MISSING
    """The checkpoint (export stage): path, dtype, trust and tokenizer settings; presets under build_configs/model/."""
    calibration: CalibrationConfig = MISSING
    """The calibration set the quantize stage feeds through the model."""
    quant: QuantConfig = MISSING
    """The quantization recipe and its settings (quantize stage)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Tensor/pipeline-parallel ranks (TensorRT-LLM ``Mapping``). The one group with a default here, so a user YAML
    whose defaults list predates it still composes."""
    target: TargetConfig = MISSING
    """Where the engine runs: onnxruntime_genai (CPU) or tensorrt_llm (NVIDIA GPU), and the target GPU."""
    build: BuildConfig = MISSING
    """Engine limits and build/runtime knobs (build stage)."""
    eval: EvalConfig = MISSING
    """Business eval set, runners and the release gate (evaluate stage)."""
    package: PackageConfig = MISSING
    """Triton model repository, release archive, parity check and ``pipeline serve`` settings (package stage)."""
    benchmark: BenchmarkConfig = MISSING
    """Load generation and measurement (benchmark stage)."""
    stages: List[str] = field(default_factory=lambda: ["export", "quantize", "build", "evaluate", "package"])
    """Stages to run, each once; they run in pipeline order whatever the order written (``[quantize,export]`` runs
    export first); missing upstream artifacts are produced (or found cached) first."""
    store_dir: str = "artifacts"
    """Content-addressed artifact store (relative paths resolve against the cwd)."""
    force: bool = False
    """Re-run the requested stages even when a cached artifact exists."""
    verify_cache: bool = False
    """Re-hash every file of a cached artifact before trusting it (slower)."""
    dry_run: bool = False
    """Validate, plan and print what each stage would do (e.g. the exact trtllm-build command); write nothing."""
    progress: bool = True
    """Show progress bars (off automatically when stdout is not a terminal)."""
    allow_unsafe_lengths: bool = False
    """Accept max_seq_len above max positions x rope factor (recorded in the manifest)."""
