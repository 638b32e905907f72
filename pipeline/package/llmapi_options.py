"""One LLM-API options source for every server of a PyTorch-backend package (TensorRT-LLM ``LlmArgs``).

:func:`llm_options` is the one place the ``LLM()`` keyword arguments of a package are decided: the build's limits
(``build_info.json`` ``limits``, via :class:`~pipeline.package.repository.Settings`), overlaid by the build stage's
``engine/llm_api_options.yaml`` (``pipeline.build.targets.tensorrt_llm.runtime.llm_api_options``: ``kv_cache_config``,
``cuda_graph_config``, ``scheduler_config``, chunked prefill, ``speculative_config``), overlaid by the
``package.runtime`` fields that map to LLM arguments (``pipeline.facts.trtllm.LLMAPI_MAP``). From that one dict the package
stage writes:

(a) the Triton LLM-API model ``model_repository/tensorrt_llm/1/model.yaml`` (:func:`model_yaml`: + ``triton_config``
    + the container paths of checkpoint and tokenizer);
(b) ``servers/trtllm_serve.yaml`` and the ``trtllm-serve`` command (:func:`write_servers`; the YAML goes to
    ``--extra_llm_api_options``, which overwrites trtllm-serve's own flag values);
(c) ``servers/benchmark.json``: the ``trtllm-bench throughput`` command (same YAML) and the AIPerf command against
    the trtllm-serve endpoint, sized from the ``benchmark`` config.

Each file is checked against :mod:`pipeline.package.llmapi_schema` (upstream key sets, commits cited there), and
every option is checked against :mod:`pipeline.package.option_support` (fail closed) before it is written.
Nothing here runs TensorRT-LLM: the commands are for the GPU host.
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

from ..core.contracts.build import BuildArtifact
from ..core.contracts.package import PackageArtifact
from ..errors import InputError
from . import llmapi_schema as S
from .trtllm_config import TrtllmPlan

SERVERS_DIR = "servers"
"""Package folder (next to ``model_repository/``, inside the release archive) of the non-Triton server files."""
SERVE_YAML, SERVE_SCRIPT, BENCH_JSON = PackageArtifact.SERVE_YAML, PackageArtifact.SERVE_SCRIPT, PackageArtifact.BENCH_JSON
SERVE_PORT = 8000
LLM_OPTIONS_FILE = BuildArtifact.LLM_API_OPTIONS
"""The build stage's file in ``engine/``."""
HEADER = (
    "# LLM() keyword arguments (TensorRT-LLM PyTorch backend, TorchLlmArgs) written by pipeline/package/llmapi_options.py\n"
    "# from the build's limits + engine/llm_api_options.yaml + package.runtime. triton_config is read by NVIDIA's llmapi\n"
    "# model.py (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py); every other key is passed to LLM().\n"
)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> None:
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            _merge(a[k], v)
        else:
            a[k] = copy.deepcopy(v)


def llm_options(settings: Any, engine_dir: Path) -> dict[str, Any]:
    """The package's ``LLM()`` options (no ``model``/``tokenizer``/``triton_config``): see the module docstring.

    Returns: a YAML-safe dict; keys of :data:`pipeline.package.llmapi_schema.LLM_ARGS`.
    Raises: InputError when the build's options file is not a YAML mapping.
    """
    import yaml

    s = settings
    doc: dict[str, Any] = {
        "backend": "pytorch",
        "trust_remote_code": False,
        "max_batch_size": int(s.engine_max_batch_size),
        "max_num_tokens": int(s.max_num_tokens),
        "max_seq_len": int(s.max_seq_len),
        "max_input_len": int(s.max_input_len),
        "max_beam_width": int(s.max_beam_width),
        "kv_cache_config": {
            "free_gpu_memory_fraction": float(s.kv_cache_free_gpu_mem_fraction),
            "enable_block_reuse": bool(s.enable_kv_cache_reuse),
        },
        "scheduler_config": {"capacity_scheduler_policy": str(s.batch_scheduler_policy).upper()},
    }
    if s.cuda_graph_mode:
        sizes = sorted({int(x) for x in s.cuda_graph_batch_sizes if 1 <= int(x) <= int(s.engine_max_batch_size)})
        doc["cuda_graph_config"] = {
            "enable_padding": True,
            **({"batch_sizes": sizes} if sizes else {"max_batch_size": int(s.engine_max_batch_size)}),
        }
    f = Path(engine_dir) / LLM_OPTIONS_FILE
    if f.is_file():
        build = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
        if not isinstance(build, dict):
            raise InputError(f"{f}: is not a YAML mapping of LLM() options. Fix: rebuild with the build stage.")
        doc.update(copy.deepcopy(build))  # the build stage's options win over the limits (one level: its sections whole)
    ov = {k: v for k, v in (TrtllmPlan.of(s).llmapi_overrides or {}).items() if k != "triton_config"}
    _merge(doc, ov)
    for k in ("model", "tokenizer"):
        doc.pop(k, None)
    return doc


def triton_config(settings: Any) -> dict[str, Any]:
    """``model.yaml`` ``triton_config``: batch size 0 (:data:`~pipeline.package.llmapi_schema.TRITON_MAX_BATCH_SIZE`),
    ``decoupled`` = ``package.decoupled``, plus ``package.runtime.cancellation_check_period_ms`` when set."""
    tc: dict[str, Any] = {"max_batch_size": S.TRITON_MAX_BATCH_SIZE, "decoupled": bool(settings.decoupled)}
    tc.update((TrtllmPlan.of(settings).llmapi_overrides or {}).get("triton_config") or {})
    return tc


def model_yaml(settings: Any, engine_dir: Path, *, model: str, tokenizer: str) -> dict[str, Any]:
    """(a) the Triton LLM-API ``model.yaml`` document: ``triton_config``, ``model``, ``tokenizer`` + :func:`llm_options`."""
    return {"triton_config": triton_config(settings), "model": model, "tokenizer": tokenizer, **llm_options(settings, engine_dir)}


def write_model_yaml(path: Path, settings: Any, engine_dir: Path, *, model: str, tokenizer: str) -> dict[str, Any]:
    """Write (a) after checking it against the upstream key sets; returns the document.

    Raises: InputError naming each unknown key / wrong type and the upstream file.
    """
    import yaml

    doc = model_yaml(settings, engine_dir, model=model, tokenizer=tokenizer)
    _raise(S.check_model_yaml(doc, where=str(path)))
    path.write_text(HEADER + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return doc


def _raise(problems: list[str]) -> None:
    if problems:
        raise InputError("the PyTorch-backend package does not match upstream:\n" + "\n".join(f"  - {p}" for p in problems))


def serve_command(*, checkpoint: str, tokenizer: str, options_file: str, host: str = "127.0.0.1", port: int = SERVE_PORT) -> list[str]:
    """(b) ``trtllm-serve`` argv (paths relative to the package root). Limits are not repeated as flags: the options
    YAML overwrites them (serve.py help of ``--extra_llm_api_options``)."""
    return [
        "trtllm-serve",
        checkpoint,
        "--tokenizer",
        tokenizer,
        "--host",
        host,
        "--port",
        str(port),
        "--backend",
        "pytorch",
        "--extra_llm_api_options",
        options_file,
    ]


def bench_commands(
    bench_cfg: Any, *, model_name: str, checkpoint: str, tokenizer: str, options_file: str, port: int = SERVE_PORT
) -> dict[str, list[str]]:
    """(c) ``trtllm-bench throughput`` (offline, same options YAML; ``--dataset`` is a trtllm-bench dataset file the GPU
    host prepares, e.g. with ``trtllm-bench prepare-dataset``) and ``aiperf profile`` against the trtllm-serve
    endpoint; concurrency = the largest of ``benchmark.concurrency``, lengths = ``benchmark.input_len/output_len``
    means, ``benchmark.num_requests``, ``benchmark.seed``."""
    conc = max([int(c) for c in getattr(bench_cfg, "concurrency", [1]) or [1]])
    n = int(getattr(bench_cfg, "num_requests", 32))
    isl = int(round(float(bench_cfg.input_len.mean))) if bench_cfg is not None else 32
    osl = int(round(float(bench_cfg.output_len.mean))) if bench_cfg is not None else 32
    seed = int(getattr(bench_cfg, "seed", 0))
    return {
        "trtllm_bench": [
            "trtllm-bench",
            "--model",
            model_name,
            "--model_path",
            checkpoint,
            "throughput",
            "--backend",
            "pytorch",
            "--dataset",
            "dataset.jsonl",
            "--extra_llm_api_options",
            options_file,
            "--concurrency",
            str(conc),
            "--num_requests",
            str(n),
            "--streaming",
        ],
        "aiperf": [
            "aiperf",
            "profile",
            "-m",
            checkpoint,
            "--tokenizer",
            tokenizer,
            "--endpoint-type",
            "chat",
            "--random-seed",
            str(seed),
            "--synthetic-input-tokens-mean",
            str(isl),
            "--synthetic-input-tokens-stddev",
            "0",
            "--output-tokens-mean",
            str(osl),
            "--output-tokens-stddev",
            "0",
            "--request-count",
            str(n),
            "--concurrency",
            str(conc),
            "--url",
            f"127.0.0.1:{port}",
            "--streaming",
        ],
    }


def check_servers(pkg_dir: Path) -> list[str]:
    """Structural problems of ``servers/`` in the package at ``pkg_dir`` (empty = valid): the options YAML against
    ``TorchLlmArgs``, the trtllm-serve / trtllm-bench / AIPerf commands against their flag tables."""
    import yaml

    d = Path(pkg_dir) / SERVERS_DIR
    out: list[str] = []
    y = d / SERVE_YAML
    if not y.is_file():
        return [f"{y}: missing (the trtllm-serve options of a PyTorch-backend package)."]
    out += S.check_llm_args(yaml.safe_load(y.read_text(encoding="utf-8")), where=str(y), require_model=False)
    b = d / BENCH_JSON
    if not b.is_file():
        return out + [f"{b}: missing (the trtllm-bench / AIPerf settings of a PyTorch-backend package)."]
    doc = json.loads(b.read_text(encoding="utf-8"))
    out += S.check_command(
        doc["trtllm_serve"][1:], S.TRTLLM_SERVE_FLAGS, where=f"{b} trtllm_serve", source=S.SOURCES["serve.py"], positionals=1
    )
    out += S.check_command(doc["trtllm_bench"][1:], S.TRTLLM_BENCH_FLAGS, where=f"{b} trtllm_bench", source=S.SOURCES["bench"])
    out += S.check_command(doc["aiperf"][1:], S.AIPERF_FLAGS, where=f"{b} aiperf", source=S.SOURCES["aiperf"])
    return out


def write_servers(
    pkg_dir: Path, repo: Path, settings: Any, engine_dir: Path, *, bench_cfg: Any, trtllm_version: str | None
) -> dict[str, Any]:
    """(b) + (c): write ``servers/`` next to ``repo`` from :func:`llm_options`, after the fail-closed option preflight
    (:func:`pipeline.package.option_support.package_option_problems` for ``trtllm_version``) and the structural
    checks. Returns the release manifest's ``serving.servers`` entry (files and commands).

    Raises:
        InputError (exit 2): an option the pinned TensorRT-LLM is not known to honour (field, value, fix), or a file
        that does not match upstream (key, upstream file).
    """
    import yaml

    from .option_support import package_option_problems

    opts = llm_options(settings, engine_dir)
    refused = package_option_problems(opts, trtllm_version)
    if refused:
        raise InputError("option preflight (fail closed):\n" + "\n".join(f"  - {p}" for p in refused))
    d = Path(pkg_dir) / SERVERS_DIR
    d.mkdir(parents=True, exist_ok=True)
    rel_repo = Path(repo).relative_to(pkg_dir).as_posix()
    ckpt, tok, opt_file = f"{rel_repo}/tensorrt_llm/1/checkpoint", f"{rel_repo}/tensorrt_llm/1/tokenizer", f"{SERVERS_DIR}/{SERVE_YAML}"
    (d / SERVE_YAML).write_text(
        HEADER.replace("triton_config is read", "(no triton_config here:") + yaml.safe_dump(opts, sort_keys=False), encoding="utf-8"
    )
    serve = serve_command(checkpoint=ckpt, tokenizer=tok, options_file=opt_file)
    (d / SERVE_SCRIPT).write_text(
        "#!/bin/sh\n# Run from the package root on a GPU host with TensorRT-LLM (PyTorch backend); not run by this project.\n"
        f"exec {shlex.join(serve)}\n",
        encoding="utf-8",
    )
    bench = bench_commands(bench_cfg, model_name=settings.model_name, checkpoint=ckpt, tokenizer=tok, options_file=opt_file)
    doc = {
        "schema": "pipeline.servers/v1",
        "note": "commands for the GPU host, run from the package root; none has been run by this project",
        "options_file": opt_file,
        "trtllm_serve": serve,
        "trtllm_bench": bench["trtllm_bench"],
        "trtllm_bench_dataset": "dataset.jsonl: a trtllm-bench dataset the GPU host prepares (trtllm-bench prepare-dataset)",
        "aiperf": bench["aiperf"],
        "sources": {k: S.SOURCES[k] for k in ("serve.py", "bench", "aiperf")},
    }
    (d / BENCH_JSON).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    _raise(check_servers(pkg_dir))
    return {
        "dir": SERVERS_DIR,
        "files": [f"{SERVERS_DIR}/{n}" for n in (SERVE_YAML, SERVE_SCRIPT, BENCH_JSON)],
        "trtllm_serve": shlex.join(serve),
        "trtllm_bench": shlex.join(bench["trtllm_bench"]),
        "aiperf": shlex.join(bench["aiperf"]),
    }
