"""``pipeline doctor [--json] [--require TARGET ...]``: what is installed here and which targets can run.

Reports Python, torch, ModelOpt, transformers, onnxruntime(-genai), TensorRT-LLM / TensorRT (if
present), the GPUs and driver (``nvidia-smi``), ``trtllm-build``, and the Triton server that
``nvidia-pytriton`` ships in ``.venv-serve`` (binary, Python-backend stub for the serving Python,
numpy < 2 there, see docs/reference/triton.md §5).  Nothing heavy is imported: versions come from
package metadata, so the command takes well under a second.

Exit codes: 0; 4 (PreflightError) when a ``--require``d target cannot run here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from .core import hostinfo
from .errors import EXIT_OK, EXIT_PREFLIGHT

PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "nvidia-modelopt",
    "onnxruntime",
    "onnxruntime-genai",
    "onnxruntime-genai-cuda",
    "onnx",
    "onnx-ir",
    "onnxscript",
    "tensorrt_llm",
    "tensorrt",
    "tritonclient",
    "hydra-core",
    "numpy",
)
TARGETS = ("onnxruntime_genai", "tensorrt_llm", "tensorrt_llm_pytorch", "triton_serving", "quantize")


def _version(dist: str) -> str | None:
    return hostinfo.installed_version(dist)


@dataclasses.dataclass(frozen=True)
class ServeEnv:
    """Facts about the serving virtualenv (``.venv-serve``) and the Triton server inside it: ``python`` and
    ``site_packages`` are probed when the virtualenv exists, the rest when its site-packages does."""

    venv: str
    exists: bool
    python: str | None = None
    site_packages: str | None = None
    nvidia_pytriton: str | None = None
    numpy: str | None = None
    tritonclient: str | None = None
    tritonserver: str | None = None
    tritonserver_executable: bool = False
    python_backend_stub: str | None = None
    python_backend_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The report's ``serve``: the facts probed (``venv`` and ``exists``; then ``python``, ``site_packages``...)."""
        d = dataclasses.asdict(self)
        return dict(list(d.items())[: 2 if not self.exists else 4 if self.site_packages is None else len(d)])


def _serve_env(root: Path) -> ServeEnv:
    """Facts about the serving virtualenv (``.venv-serve``) and the Triton server inside it."""
    venv = root / ".venv-serve"
    if not venv.is_dir():
        return ServeEnv(str(venv), False)
    pyver = None
    cfgf = venv / "pyvenv.cfg"
    if cfgf.is_file():
        m = re.search(r"^version(?:_info)?\s*=\s*(\d+)\.(\d+)", cfgf.read_text(encoding="utf-8", errors="replace"), re.M)
        if m:
            pyver = f"{m.group(1)}.{m.group(2)}"
    sites = sorted(venv.glob("lib/python*/site-packages"))
    if not sites:
        return ServeEnv(str(venv), True, pyver)
    site = sites[0]

    def dist_version(prefix: str) -> str | None:
        for d in site.glob(f"{prefix}-*.dist-info"):
            return d.name[len(prefix) + 1 : -len(".dist-info")]
        return None

    ts = site / "pytriton" / "tritonserver"
    binary = ts / "bin" / "tritonserver"
    stub = ts / "python_backend_stubs" / (pyver or "?") / "triton_python_backend_stub"
    return ServeEnv(
        str(venv),
        True,
        pyver,
        str(site),
        nvidia_pytriton=dist_version("nvidia_pytriton"),
        numpy=dist_version("numpy"),
        tritonclient=dist_version("tritonclient"),
        tritonserver=str(binary) if binary.is_file() else None,
        tritonserver_executable=bool(binary.is_file() and os.access(binary, os.X_OK)),
        python_backend_stub=str(stub) if stub.is_file() else None,
        python_backend_dir=str(ts / "backends" / "python") if (ts / "backends" / "python").is_dir() else None,
    )


def collect(root: Path | None = None) -> dict[str, Any]:
    """The doctor report as a dict (the ``--json`` output)."""
    root = root or Path(__file__).resolve().parents[1]
    pkgs = {p: _version(p) for p in PACKAGES}
    gpus = hostinfo.gpus()
    trtllm_build = shutil.which("trtllm-build")
    serve = _serve_env(root)
    py = platform.python_version()
    targets: dict[str, dict[str, Any]] = {}

    why = [f"{p} not installed" for p in ("onnxruntime-genai", "onnx", "onnx-ir", "onnxscript") if not pkgs.get(p)]
    targets["onnxruntime_genai"] = {
        "ok": not why,
        "why": why or ["CPU execution provider available"],
        "cuda": bool(gpus and pkgs.get("onnxruntime-genai-cuda")),
    }
    why = []
    if not pkgs.get("tensorrt_llm"):
        why.append(
            "tensorrt_llm not installed (pip install --extra-index-url https://pypi.nvidia.com 'tensorrt-llm<=1.2.1'; "
            "Python 3.10/3.12 on Linux with a CUDA driver)"
        )
    if not trtllm_build:
        why.append("trtllm-build not on PATH")
    if not gpus:
        why.append("no NVIDIA GPU visible (nvidia-smi)")
    if py.rsplit(".", 1)[0] not in ("3.10", "3.12"):
        why.append(f"Python {py}: TensorRT-LLM wheels exist for 3.10 and 3.12 only")
    targets["tensorrt_llm"] = {"ok": not why, "why": ["legacy engine path (TensorRT-LLM 1.2.x)"] + (why or ["engine builds possible"])}
    targets["tensorrt_llm_pytorch"] = _pytorch_backend(pkgs, gpus)
    why = []
    if not serve.exists:
        why.append(f"{serve.venv} missing (make serve-env)")
    else:
        if not serve.tritonserver:
            why.append("tritonserver binary not found (pip install --no-deps nvidia-pytriton==0.7.0 into .venv-serve)")
        if not serve.python_backend_stub:
            why.append(f"no Python-backend stub for Python {serve.python}")
        npv = serve.numpy
        if npv and int(npv.split(".")[0]) >= 2:
            why.append(f"numpy {npv} in .venv-serve: Triton 2.51's Python backend corrupts tensors with numpy 2; install numpy<2 there")
    targets["triton_serving"] = {"ok": not why, "why": why or ["Triton server (Python backend) can start on this host"]}
    why = [f"{p} not installed" for p in ("torch", "nvidia-modelopt", "transformers") if not pkgs.get(p)]
    targets["quantize"] = {"ok": not why, "why": why or ["ModelOpt quantization " + ("on GPU" if gpus else "on CPU (slow for big models)")]}
    return {
        "schema": "pipeline.doctor/v1",
        "python": {"version": py, "executable": sys.executable, "implementation": platform.python_implementation()},
        "platform": platform.platform(),
        "cpu": hostinfo.cpu_model(),
        "cpu_count": os.cpu_count(),
        "packages": pkgs,
        "gpus": gpus,
        "driver": gpus[0].get("driver") if gpus else None,
        "trtllm_build": trtllm_build,
        "serve": serve.to_json(),
        "targets": targets,
    }


def _pytorch_backend(pkgs: dict[str, Any], gpus: list[Any]) -> dict[str, Any]:
    """``target=tensorrt_llm_pytorch`` (the forward path): packaging needs the quantize stack only (no TensorRT-LLM, no
    GPU: the GPU is named with ``target.gpu``); running the package needs TensorRT-LLM >= 1.2 on a GPU host."""
    missing = [f"{p} not installed" for p in ("torch", "nvidia-modelopt", "transformers") if not pkgs.get(p)]
    runs = "runs here too" if pkgs.get("tensorrt_llm") and gpus else "serve it on a GPU host with TensorRT-LLM >= 1.2"
    return {"ok": not missing, "why": missing or [f"forward path: packages here (name the GPU with target.gpu=...); {runs}"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pipeline doctor", description="Report the environment and which targets can run here.")
    ap.add_argument("--json", action="store_true", help="machine-readable output (schema pipeline.doctor/v1)")
    ap.add_argument("--require", action="append", default=[], choices=TARGETS, help="exit 4 unless this target can run here")
    args = ap.parse_args(argv)
    rep = collect()
    missing = [t for t in args.require if not rep["targets"][t]["ok"]]
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        from rich.console import Console
        from rich.table import Table

        con = Console()
        t = Table(title="pipeline doctor", show_header=False, title_justify="left")
        t.add_column("what", style="bold")
        t.add_column("value")
        t.add_row("python", f"{rep['python']['version']} ({rep['python']['executable']})")
        t.add_row("platform", f"{rep['platform']}; {rep['cpu']} x{rep['cpu_count']}")
        for p, v in rep["packages"].items():
            t.add_row(p, v or "[dim]not installed[/]")
        t.add_row(
            "GPUs",
            ", ".join(f"{g['name']} (SM {g['compute_capability']}, {g['memory_mib']:.0f} MiB)" for g in rep["gpus"]) or "none visible",
        )
        t.add_row("driver", str(rep["driver"] or "-"))
        t.add_row("trtllm-build", rep["trtllm_build"] or "[dim]not on PATH[/]")
        s = ServeEnv(**rep["serve"])
        t.add_row(
            "tritonserver",
            f"{s.tritonserver or 'not found'} (nvidia-pytriton {s.nvidia_pytriton}, serve Python {s.python}, numpy {s.numpy})",
        )
        con.print(t)
        tt = Table(title="targets on this host")
        tt.add_column("target")
        tt.add_column("runs here")
        tt.add_column("why")
        for name, v in rep["targets"].items():
            tt.add_row(name, "[green]yes[/]" if v["ok"] else "[red]no[/]", "; ".join(v["why"]))
        con.print(tt)
        if missing:
            con.print(f"[bold red]required target(s) cannot run here:[/] {', '.join(missing)}")
    return EXIT_PREFLIGHT if missing else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
