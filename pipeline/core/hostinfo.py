"""Facts about the host and the libraries that produce an artifact (recorded in manifests).

GPU facts come from ``nvidia-smi`` when it exists, else from ``torch.cuda`` only if torch is
already imported (importing torch just to look costs seconds on every cache hit).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ..facts.gpus import GPU, MiB, match_local


def installed_version(dist: str) -> str | None:
    """Installed version of distribution ``dist`` (package metadata; nothing is imported), ``None`` when not installed.

    Tries ``dist`` as written, then with ``_``/``-`` swapped (``tensorrt_llm`` is published as ``tensorrt-llm``).
    The one "installed version of X" helper: the doctor, the targets, the quantize stage and manifests use it.
    """
    for name in dict.fromkeys((dist, dist.replace("_", "-"), dist.replace("-", "_"))):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def library_versions(names: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """Installed distribution versions (``None`` when not installed), plus ``python``."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for n in names:
        out[n] = installed_version(n)
    return out


def installed_distributions() -> dict[str, str]:
    """Every Python distribution installed in this interpreter's environment, ``{name: version}`` sorted by name: the
    exact versions the release's provenance names (the ones ``constraints.txt`` pins for ``make env``)."""
    found = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _smi(fields: str) -> list[list[str]] | None:
    """Rows of ``nvidia-smi --query-gpu=<fields>`` (one per GPU, values stripped), or None when nvidia-smi is absent or
    fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[p.strip() for p in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def _per_gpu(fields: str, from_row: Callable[[list[str]], Any], from_torch: Callable[[Any, int], Any]) -> list[Any]:
    """One value per visible NVIDIA GPU: ``from_row`` of each ``nvidia-smi`` row of ``fields`` (rows with fewer
    values skipped); else, when torch is already imported and sees CUDA, ``from_torch(torch.cuda, i)`` per device;
    else empty."""
    rows = _smi(fields)
    if rows is not None:
        try:
            return [from_row(r) for r in rows if len(r) >= len(fields.split(","))]
        except ValueError:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return [from_torch(torch.cuda, i) for i in range(torch.cuda.device_count())]
        except Exception:
            pass
    return []


def _torch_gpu(cuda: Any, i: int) -> dict[str, Any]:
    p = cuda.get_device_properties(i)
    return {"name": p.name, "compute_capability": f"{p.major}.{p.minor}", "memory_mib": p.total_memory / 2**20, "driver": None}


@functools.lru_cache(maxsize=1)
def gpus() -> list[dict[str, Any]]:
    """Visible NVIDIA GPUs: name, compute capability (e.g. "9.0"), memory in MiB. Empty if none."""
    return _per_gpu(
        "name,compute_cap,memory.total,driver_version",
        lambda r: {"name": r[0], "compute_capability": r[1], "memory_mib": float(r[2]), "driver": r[3]},
        _torch_gpu,
    )


def gpu_free_bytes() -> list[int]:
    """Free memory of each visible NVIDIA GPU now, bytes, in :func:`gpus` order (``nvidia-smi``
    ``memory.free``; else ``torch.cuda.mem_get_info`` when torch is already imported). Empty if none.
    Not cached: free memory changes; not recorded in manifests."""
    return _per_gpu("memory.free", lambda r: int(float(r[0]) * 2**20), lambda cuda, i: int(cuda.mem_get_info(i)[0]))


def host() -> dict[str, Any]:
    """Host description for manifests: CPU model and count, memory, GPUs."""
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": mem,
        "gpus": gpus(),
    }


def resolve_torch_device(setting: str, field: str) -> str:
    """A device setting (``calibration.device``, ``eval.device``) -> ``cpu`` | ``cuda:N``: ``auto`` = ``cuda:0`` when
    torch sees a GPU, else ``cpu``; ``cpu``, ``cuda`` (= ``cuda:0``) and ``cuda:N`` as given. Imports torch unless the
    setting is ``cpu``.

    Raises:
        InputError: ``cuda``/``cuda:N`` on a host where torch sees no such GPU (exit 2, naming ``field`` and the fix);
            an unknown spelling.
    """
    from ..errors import InputError

    s = str(setting).strip().lower()
    if s == "cpu":
        return "cpu"
    if s not in ("auto", "cuda") and not (s.startswith("cuda:") and s[5:].isdigit()):
        raise InputError(f"{field}={setting!r}: unknown. Fix: use auto, cpu, cuda or cuda:N.")
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if s == "auto":
        return "cuda:0" if n else "cpu"
    idx = int(s[5:]) if ":" in s else 0
    if idx >= n:
        raise InputError(
            f"{field}={setting!r}: torch sees {n} CUDA device(s) on this host. "
            f"Fix: {field}=auto (CUDA when visible, else the CPU) or {field}=cpu."
        )
    return f"cuda:{idx}"


def local_gpus() -> list[tuple[dict[str, Any], GPU]]:
    """Visible NVIDIA GPUs as (nvidia-smi facts, GPU).

    A GPU not in the catalogue gets an entry with the reported memory and compute capability and an
    unknown bandwidth (``0``; the planner then reports no speed bound).
    """
    out = []
    for i, d in enumerate(gpus()):
        g = match_local(d.get("name", ""), d.get("memory_mib"))
        mem = int(float(d.get("memory_mib") or 0) * MiB)
        if g is not None:
            if mem:
                g = dataclasses.replace(g, memory_bytes=mem, source=g.source + f"; memory as reported locally ({d.get('memory_mib')} MiB)")
        else:
            g = GPU(
                f"local{i}",
                d.get("name", "unknown GPU"),
                mem,
                0.0,
                str(d.get("compute_capability") or "0.0"),
                "",
                "local nvidia-smi (not in the catalogue: bandwidth unknown)",
            )
        out.append((d, g))
    return out
