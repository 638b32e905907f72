"""GPU catalogue for the planner: memory, bandwidth, compute capability, supported formats.

Sources (every number below cites one of these):

* [DS-*]  NVIDIA product datasheets / product pages (memory bandwidth, compute capability family).
* [SMI]   ``nvidia-smi`` ``memory.total`` as reported on that SKU (MiB).  Datasheet capacities are
          rounded marketing numbers; the driver-reported total is what the runtime can see.  The
          values were taken from published ``nvidia-smi`` output of each card (e.g. H200 143771MiB,
          B200 183359MiB, L4 23034MiB, L40S 46068MiB, A10G 23028MiB).
* [CC]    CUDA compute capability table, https://developer.nvidia.com/cuda-gpus
* [TRTLLM-SM] TensorRT-LLM support matrix (docs/source/reference/support-matrix.md @9b062a8, summarised
          in docs/reference/tensorrt_llm.md §4): FP8 weights/activations/KV cache and W4A8 need
          SM >= 89; INT8 SmoothQuant, INT8/INT4 weight-only and INT4-AWQ (W4A16) work from SM80;
          BF16 needs SM80 (the per-recipe table: pipeline/facts/recipes.py).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# Minimum compute capability per recipe / KV format / bfloat16 [TRTLLM-SM]: the one table is pipeline/facts/recipes.py.
from .recipes import KV_MIN_SM, RECIPE_MIN_SM

MiB = 1 << 20
GB = 10**9


@dataclasses.dataclass(frozen=True)
class GPU:
    """One catalogue entry.

    Attributes:
        key: catalogue name used in ``target.gpu=`` (e.g. ``h100_sxm``).
        name: marketing name.
        memory_bytes: device memory the driver reports (bytes; [SMI] memory.total x 2**20).
        bandwidth_bytes_s: peak DRAM bandwidth in bytes/s (datasheet, decimal GB/s x 1e9).
        compute_capability: e.g. ``"9.0"`` [CC].
        match: regex matched against ``nvidia-smi`` names to recognise the local GPU.
        source: where the numbers come from.
    """

    key: str
    name: str
    memory_bytes: int
    bandwidth_bytes_s: float
    compute_capability: str
    match: str
    source: str

    @property
    def sm(self) -> int:
        major, minor = self.compute_capability.split(".")
        return int(major) * 10 + int(minor)

    @property
    def bandwidth_gb_s(self) -> float:
        """Peak bandwidth in GB/s, one decimal (as the plan shows it)."""
        return round(self.bandwidth_bytes_s / GB, 1)

    @property
    def quant_formats(self) -> list[str]:
        """Recipes (``quant.recipe``) TensorRT-LLM can run on this GPU [TRTLLM-SM]."""
        return [r for r, m in RECIPE_MIN_SM.items() if self.sm >= m]

    @property
    def kv_formats(self) -> list[str]:
        """KV-cache formats (``quant.kv_cache_dtype``) this GPU supports [TRTLLM-SM]."""
        return [k for k, m in KV_MIN_SM.items() if self.sm >= m]

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "memory_gib": round(self.memory_bytes / 2**30, 2),
            "bandwidth_gb_s": self.bandwidth_gb_s,
            "compute_capability": self.compute_capability,
            "quant_formats": self.quant_formats,
            "kv_formats": self.kv_formats,
            "source": self.source,
        }


CATALOGUE: dict[str, GPU] = {
    g.key: g
    for g in (
        # A10G (AWS g5): 24 GB GDDR6, 600 GB/s [DS: AWS EC2 G5 / NVIDIA A10 datasheet]; 23028 MiB [SMI]; SM 8.6 [CC]
        GPU("a10g", "NVIDIA A10G", 23028 * MiB, 600 * GB, "8.6", r"\bA10G?\b", "A10 datasheet 600 GB/s; nvidia-smi 23028MiB"),
        # L4: 24 GB GDDR6, 300 GB/s [DS: NVIDIA L4 datasheet]; 23034 MiB [SMI]; SM 8.9 [CC]
        GPU("l4", "NVIDIA L4", 23034 * MiB, 300 * GB, "8.9", r"\bL4\b", "L4 datasheet 300 GB/s; nvidia-smi 23034MiB"),
        # L40S: 48 GB GDDR6, 864 GB/s [DS: NVIDIA L40S datasheet]; 46068 MiB [SMI]; SM 8.9 [CC]
        GPU("l40s", "NVIDIA L40S", 46068 * MiB, 864 * GB, "8.9", r"\bL40S\b", "L40S datasheet 864 GB/s; nvidia-smi 46068MiB"),
        # A100 40GB SXM: HBM2 1,555 GB/s [DS: NVIDIA A100 datasheet]; 40960 MiB [SMI]; SM 8.0 [CC]
        GPU(
            "a100_40gb",
            "NVIDIA A100 40GB (SXM)",
            40960 * MiB,
            1555 * GB,
            "8.0",
            r"A100.*40",
            "A100 datasheet 1555 GB/s; nvidia-smi 40960MiB",
        ),
        # A100 80GB SXM: HBM2e 2,039 GB/s [DS: NVIDIA A100 datasheet; PCIe is 1,935 GB/s]; 81920 MiB [SMI]; SM 8.0 [CC]
        GPU(
            "a100_80gb",
            "NVIDIA A100 80GB (SXM)",
            81920 * MiB,
            2039 * GB,
            "8.0",
            r"A100.*80",
            "A100 datasheet 2039 GB/s (SXM); nvidia-smi 81920MiB",
        ),
        # H100 SXM: 80 GB HBM3, 3.35 TB/s [DS: NVIDIA H100 datasheet]; 81559 MiB [SMI]; SM 9.0 [CC]
        GPU(
            "h100_sxm",
            "NVIDIA H100 80GB HBM3 (SXM)",
            81559 * MiB,
            3350 * GB,
            "9.0",
            r"H100.*(HBM3|SXM)",
            "H100 datasheet 3.35 TB/s (SXM); nvidia-smi 81559MiB",
        ),
        # H100 PCIe: 80 GB HBM2e, 2.0 TB/s [DS: NVIDIA H100 datasheet]; 81559 MiB [SMI]; SM 9.0 [CC]
        GPU(
            "h100_pcie",
            "NVIDIA H100 PCIe",
            81559 * MiB,
            2000 * GB,
            "9.0",
            r"H100.*PCIe",
            "H100 datasheet 2.0 TB/s (PCIe); nvidia-smi 81559MiB",
        ),
        # H200 SXM: 141 GB HBM3e, 4.8 TB/s [DS: NVIDIA H200 product page]; 143771 MiB [SMI]; SM 9.0 [CC]
        GPU("h200", "NVIDIA H200 (SXM)", 143771 * MiB, 4800 * GB, "9.0", r"\bH200\b", "H200 product page 4.8 TB/s; nvidia-smi 143771MiB"),
        # B200 (HGX): 180 GB HBM3e, 8 TB/s per GPU [DS: NVIDIA HGX B200 / DGX B200 datasheet]; 183359 MiB [SMI]; SM 10.0 [CC]
        GPU("b200", "NVIDIA B200", 183359 * MiB, 8000 * GB, "10.0", r"\bB200\b", "HGX B200 datasheet 8 TB/s; nvidia-smi 183359MiB"),
    )
}

ALIASES = {
    "a10": "a10g",
    "h100": "h100_sxm",
    "h100_80gb": "h100_sxm",
    "a100": "a100_80gb",
    "a100_40": "a100_40gb",
    "a100_80": "a100_80gb",
    "h200_sxm": "h200",
    "l40_s": "l40s",
}


def lookup(name: str) -> GPU:
    """Catalogue entry for ``name`` (case-insensitive; ``-``/space treated as ``_``; aliases accepted).

    Raises ``KeyError`` whose message lists the known names.
    """
    k = re.sub(r"[\s\-]+", "_", str(name).strip().lower())
    k = ALIASES.get(k, k)
    if k in CATALOGUE:
        return CATALOGUE[k]
    raise KeyError(f"unknown GPU {name!r}; known: {sorted(CATALOGUE)}")


def match_local(smi_name: str, memory_mib: float | None = None) -> GPU | None:
    """The catalogue entry whose pattern matches an ``nvidia-smi`` GPU name, else ``None``.

    A100 names carry the size (``A100-SXM4-80GB``); for an H100 the PCIe/SXM split is in the name.
    """
    best = None
    for g in CATALOGUE.values():
        if re.search(g.match, smi_name, re.I):
            best = g
            break
    return best
