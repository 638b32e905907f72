"""``parallel`` config group: how many GPUs one engine is split over (TensorRT-LLM's ``Mapping``).

The names are TensorRT-LLM's (``tensorrt_llm.Mapping(tp_size=, pp_size=)``, the checkpoint's ``mapping`` block,
``quantize.py --tp_size/--pp_size``).  The quantize stage writes one ``rank{N}.safetensors`` per rank
(``world_size = tp_size * pp_size``); the build turns each into one ``rank{N}.engine``.  ``quant.tp_size`` /
``quant.pp_size`` are the old spellings, kept one release as deprecated aliases.
"""

from __future__ import annotations

from dataclasses import dataclass

from .common import Problem


@dataclass
class ParallelConfig:
    tp_size: int = 1
    """Tensor-parallel ranks (GPUs each layer's weights are split over; TensorRT-LLM ``Mapping.tp_size``). Must
    divide the attention heads; KV heads are split or replicated evenly (checked before calibration)."""
    pp_size: int = 1
    """Pipeline-parallel ranks (GPUs the decoder layers are split over, in consecutive blocks; TensorRT-LLM
    ``Mapping.pp_size``). At most the number of decoder layers."""


def validate(cfg: ParallelConfig, prefix: str = "parallel") -> list[Problem]:
    """Field checks: both sizes are positive integers (the model-dependent rules run in the quantize preflight
    and the planner)."""
    problems: list[Problem] = []
    for f in ("tp_size", "pp_size"):
        if getattr(cfg, f) < 1:
            problems.append(Problem(f"{prefix}.{f}", getattr(cfg, f), "must be >= 1.", f"set {prefix}.{f}=1"))
    return problems
