"""Reference engines for the benchmark: what onnxruntime-genai's own model builder makes of the same checkpoint.

``builder_int4`` (benchmark mode ``builder_int4``): ``python -m onnxruntime_genai.models.builder -i <export hf/>
-o <tmp> -p int4 -e cpu`` with the builder's defaults (its own round-to-nearest int4 weights, MatMulNBits with int8
activations on CPU), then the same runtime limits as the pipeline's engine (``set_runtime_limits``), so the
comparison differs only in the graph and its weights. It answers "how fast could int4 on this runtime be?"; its
quality is not measured (its weights are not the quantize stage's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BUILDER = "onnxruntime_genai.models.builder"


def builder_int4_command(hf_dir: Path, out: Path, cache: Path) -> list[str]:
    """The builder command line for the reference int4 CPU engine."""
    return [
        sys.executable,
        "-m",
        BUILDER,
        "-i",
        str(hf_dir),
        "-o",
        str(out),
        "-p",
        "int4",
        "-e",
        "cpu",
        "-c",
        str(cache),
        "--extra_options",
        "hf_token=false",
        "hf_remote=false",
    ]


def build_builder_int4(hf_dir: Path, work: Path, *, max_batch_size: int | None, max_seq_len: int | None) -> Path:
    """Build the reference engine into ``work/engine`` (log in ``work/build.log``); return the engine folder.

    Raises:
        PipelineError: the builder failed (with the log tail).
    """
    from ..core.genai import run_logged, set_runtime_limits

    work = Path(work)
    engine = work / "engine"
    cmd = builder_int4_command(Path(hf_dir), engine, work / "cache")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    run_logged(cmd, work / "build.log", "onnxruntime-genai model builder (benchmark reference builder_int4)", env=env)
    import json

    gc = json.loads((engine / "genai_config.json").read_text(encoding="utf-8"))
    set_runtime_limits(
        engine, max_batch_size=int(max_batch_size or 16), max_seq_len=int(max_seq_len or gc.get("search", {}).get("max_length") or 512)
    )
    return engine
