"""Generate a Triton model repository from the ``triton_models/`` templates and a build's ``build_info.json``.

Layouts (``docs/package.md``):

* ``onnxruntime_genai``: ``ensemble`` -> ``preprocessing`` -> ``onnxruntime_genai`` (Python backend, og.Engine,
  decoupled) -> ``postprocessing``; the engine folder is copied to ``onnxruntime_genai/1/engine``.
* ``tensorrt_llm`` (TensorRT engine): ``ensemble`` -> ``preprocessing`` -> ``tensorrt_llm`` (C++ ``tensorrtllm``
  backend, ``inflight_fused_batching``) -> ``postprocessing``; engine copied to ``tensorrt_llm/1/engine``; absolute
  paths point into the container mount ``/models`` (:data:`CONTAINER_REPO`); plus ``tensorrt_llm_bls`` (our Python
  BLS model calling those three, ``trtllm_config.write_bls_model``).
* ``tensorrt_llm`` with the PyTorch backend: the LLM-API layout ``tensorrt_llm/config.pbtxt`` + ``1/model.yaml``, plus
  ``ensemble`` and ``tensorrt_llm_bls``: the adapter mapping NVIDIA's ensemble tensors onto it (:mod:`.llmapi_adapter`).

Every value comes from the build (limits, runtime knobs, versions) or the package config; templates are filled
with a ``${name}`` substitution that leaves unknown names in place so :mod:`.validate` can report them with
file and line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

from ..core.artifacts import TOKENIZER_COPY_FILES
from ..core.contracts.build import BuildInfo, EngineLimits
from ..core.contracts.export import ExportArtifact, ModelInfo
from ..core.contracts.package import PACKAGE_ID_PARAMETER
from ..errors import InputError
from .fragment import Fragment
from .model_config import MODEL_COMMON, copy_served_model, python_model_from_ensemble

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = REPO_ROOT / "triton_models"
MODELS_SRC = Path(__file__).resolve().parents[1] / "serve" / "models"
TOKENIZATION_SRC = Path(__file__).resolve().parents[1] / "core" / "tokenization.py"
"""Copied next to every served Python model's ``model.py`` as ``tokenization.py``: the served text is produced by
the same ``TextCodec`` as the evaluated text (standalone module: ``tokenizers`` + lazy ``jinja2``)."""
ORT_MODEL_PY = "onnxruntime_genai_model.py"
"""The CPU target's served model (``MODELS_SRC``): ``onnxruntime_genai``, and ``ensemble`` / ``tensorrt_llm_bls`` with
``interface=text``."""
MODEL_HELPERS = ("genai_requests.py", "genai_scheduling.py", "genai_sending.py", "request_metrics.py")
"""Copied from ``MODELS_SRC`` next to every served ``onnxruntime_genai_model.py`` (its ``model.py``), which imports them
from its own folder: request handling, scheduling (the og.Engine loop), sending (responses, the sender thread), and
the request-outcome counter's name and labels (Triton ``/metrics``, imported by ``pipeline`` too).  The one list:
the copy (:func:`copy_model_py`), the validation (``validate.sibling_problems``) and the tests read it; the release
manifest hashes every repository file and the package key digests ``MODELS_SRC``."""
SIBLING_MODULES = ("tokenization.py", MODEL_COMMON, *MODEL_HELPERS)
"""Every module a served ``model.py`` may import from its own folder (``validate.sibling_problems`` checks that each
one it imports is there)."""


def copy_model_py(model_py: str, version_dir: Path) -> None:
    """``MODELS_SRC/model_py`` as ``version_dir/model.py`` with ``MODEL_COMMON`` (:func:`.model_config.copy_served_model`),
    ``tokenization.py`` and, for the onnxruntime_genai model, its ``MODEL_HELPERS`` next to it."""
    copy_served_model(MODELS_SRC, model_py, version_dir)
    shutil.copy2(TOKENIZATION_SRC, version_dir / "tokenization.py")
    if model_py == ORT_MODEL_PY:
        for name in MODEL_HELPERS:
            shutil.copy2(MODELS_SRC / name, version_dir / name)


CONTAINER_REPO = "/models"
"""Where the GPU container command mounts the repository; TensorRT-LLM's C++ backend needs absolute engine paths."""
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# The ensemble's engine step: TensorRT-LLM's engine emits ids, which the postprocessing step detokenizes (three steps,
# as NVIDIA's inflight_batcher_llm ensemble); the onnxruntime_genai model detokenizes in-process and its text_output
# goes straight to the client (two steps: one hop per streamed token instead of two; docs/package.md "Serving path").
IDS_OUTPUT_MAP = Fragment(
    '      output_map { key: "output_ids" value: "_TOKENS_BATCH" }\n      output_map { key: "sequence_length" value: "sequence_length" }'
)
TEXT_OUTPUT_MAP = Fragment(
    '      output_map { key: "text_output" value: "text_output" }\n      output_map { key: "sequence_length" value: "sequence_length" }'
)
POSTPROCESSING_STEP = Fragment(
    ",\n"
    "    {\n"
    '      model_name: "postprocessing"\n'
    "      model_version: -1\n"
    '      input_map { key: "TOKENS_BATCH" value: "_TOKENS_BATCH" }\n'
    '      input_map { key: "SEQUENCE_LENGTH" value: "sequence_length" }\n'
    '      output_map { key: "OUTPUT" value: "text_output" }\n'
    "    }"
)


def fill(text: str, values: dict[str, Any]) -> str:
    """Replace every ``${name}`` whose name is in ``values``; unknown names stay for validation to report.

    Strings are escaped for a protobuf text-format string literal (backslash and double quote).
    """

    def rep(m: re.Match) -> str:
        k = m.group(1)
        if k not in values:
            return m.group(0)
        v = values[k]
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str) and not isinstance(v, Fragment):
            return v.replace("\\", "\\\\").replace('"', '\\"')
        return str(v)

    return PLACEHOLDER.sub(rep, text)


@dataclasses.dataclass
class Settings:
    """Everything the templates need (one object so generation is a pure function of it).

    Limits are the engine's (``build_info.json`` ``limits``); ``triton_max_batch_size`` is the served batch
    (the package config's value, else the engine's; validation refuses a value above the engine's).
    """

    target: str  # onnxruntime_genai | tensorrt_llm
    backend: str = "tensorrt"  # tensorrt_llm only: tensorrt | pytorch
    model_name: str = "model"
    engine_max_batch_size: int = 8
    max_input_len: int = 256
    max_seq_len: int = 384
    max_num_tokens: int = 2048
    max_beam_width: int = 1
    triton_max_batch_size: int = 8
    served_max_input_len: int | None = None
    max_prompt_bytes: int | None = None  # package.max_prompt_bytes (None: the served model derives it)
    served_max_beam_width: int | None = None
    decoupled: bool = True
    exclude_input_in_output: bool = True
    stream_coalescing: bool = True
    stream_interval: int = 1
    instance_count: int = 1
    bos_id: int | None = None
    end_id: int = -1
    pad_id: int = -1
    execution_provider: str = "cpu"
    kv_cache_free_gpu_mem_fraction: float = 0.9
    enable_kv_cache_reuse: bool = False
    batch_scheduler_policy: str = "guaranteed_no_evict"
    enable_chunked_context: bool = False
    cuda_graph_mode: bool = False
    cuda_graph_cache_size: int = 0
    cuda_graph_batch_sizes: list[int] = dataclasses.field(default_factory=list)
    trtllm: dict[str, Any] = dataclasses.field(default_factory=dict)
    """tensorrt_llm target: parameters, speculative wiring (``pipeline.package.trtllm_config.plan``)."""
    decoding: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The export's decoding policy (``pipeline.core.decoding.DecodingPolicy.to_json``); onnxruntime_genai: written to
    ``onnxruntime_genai/1/decoding.json``, whose ``repetition_penalty`` the served model applies when a request sends none."""

    @property
    def engine_model(self) -> str:
        return "onnxruntime_genai" if self.target == "onnxruntime_genai" else "tensorrt_llm"


def settings_from_build(
    build_info: BuildInfo, model_info: ModelInfo, package_cfg: Any, build_cfg: Any = None, target_cfg: Any = None
) -> Settings:
    """Join ``build_info.json`` (limits, runtime knobs), ``model_info.json`` (token ids) and the package config.

    Runtime knobs missing from ``build_info`` fall back to the build config (same names, ``pipeline/core/config/build.py``).
    Raises :class:`InputError` when the build has no target or limits.
    """
    target = _build_target(build_info)
    limits, lim = build_info.limits, EngineLimits.from_json(build_info.limits)

    def knob(name: str, default: Any) -> Any:
        v = build_info.knob(name)
        if v is not None:
            return v
        if build_cfg is not None and hasattr(build_cfg, name):
            return getattr(build_cfg, name)
        return default

    def limit(name: str) -> int:
        v = limits.get(name, knob(name, None))
        if v is None:
            raise InputError(f"build_info.json has no limits.{name}. Fix: rebuild with the build stage (it records the engine limits).")
        return int(v)

    served_bw = getattr(package_cfg, "max_beam_width", None)
    # onnxruntime_genai: beam search runs on og.Generator (num_beams is a per-request search option; genai_config.json
    # needs no change), so package.max_beam_width only bounds the beam_width a request may ask for.
    eng_bs = limit("max_batch_size")
    end_id = model_info.end_id
    pad = model_info.pad_token_id
    backend = build_info.backend or (getattr(target_cfg, "backend", "tensorrt") if target_cfg is not None else "tensorrt")
    ep = build_info.execution_provider or (getattr(target_cfg, "execution_provider", "cpu") if target_cfg is not None else "cpu")
    s = Settings(
        target=target,
        backend=str(backend),
        model_name=str(getattr(package_cfg, "name", None) or "model"),
        engine_max_batch_size=eng_bs,
        max_input_len=limit("max_input_len"),
        max_seq_len=limit("max_seq_len"),
        max_num_tokens=int(lim.max_num_tokens or knob("max_num_tokens", 2048)),  # a recorded limit is >= 1
        max_beam_width=max(
            int(lim.max_beam_width or knob("max_beam_width", 1)), int(served_bw or 1) if target == "onnxruntime_genai" else 1
        ),  # og: no beam limit in the engine
        triton_max_batch_size=int(package_cfg.max_batch_size or eng_bs),
        served_max_input_len=getattr(package_cfg, "max_input_len", None),
        max_prompt_bytes=getattr(package_cfg, "max_prompt_bytes", None),
        served_max_beam_width=getattr(package_cfg, "max_beam_width", None),
        decoupled=bool(package_cfg.decoupled),
        exclude_input_in_output=bool(package_cfg.exclude_input_in_output),
        stream_coalescing=bool(getattr(package_cfg, "stream_coalescing", True)),
        stream_interval=int(getattr(package_cfg, "stream_interval", 1)),
        instance_count=int(package_cfg.instance_count),
        bos_id=model_info.bos_token_id,
        end_id=end_id,
        pad_id=int(pad) if pad is not None else end_id,
        execution_provider=str(ep),
        kv_cache_free_gpu_mem_fraction=float(knob("kv_cache_free_gpu_mem_fraction", 0.9)),
        enable_kv_cache_reuse=bool(knob("enable_kv_cache_reuse", False)),
        batch_scheduler_policy=str(knob("batch_scheduler_policy", "guaranteed_no_evict")),
        enable_chunked_context=bool(knob("enable_chunked_context", False)),
        cuda_graph_mode=bool(knob("cuda_graph_mode", False)),
        cuda_graph_cache_size=int(knob("cuda_graph_cache_size", 0)),
        cuda_graph_batch_sizes=list(knob("cuda_graph_batch_sizes", []) or []),
    )
    if target == "tensorrt_llm":
        from .trtllm_config import plan

        s.trtllm = plan(s, build_info, package_cfg, build_cfg, target_cfg)
    return s


def _build_target(build_info: BuildInfo) -> str:
    """The build's target name; InputError unless a known target."""
    target = build_info.target
    if target not in ("onnxruntime_genai", "tensorrt_llm"):
        raise InputError(
            f"build_info.json target={target!r}: expected 'onnxruntime_genai' or 'tensorrt_llm'. "
            f"Fix: package a build artifact written by the build stage."
        )
    return str(target)


def python_text_model_config(
    ensemble_config: str,
    name: str,
    *,
    decoupled: bool,
    instance_count: int,
    params: dict[str, Any],
    extra_inputs: tuple[tuple[str, str, list[int]], ...] = (),
) -> str:
    """``config.pbtxt`` of a Python model with the ensemble's tensor interface (CPU target's ``ensemble``/``tensorrt_llm_bls``).

    The inputs and outputs are taken from the filled ensemble template (one definition of the interface), the
    ensemble scheduling is dropped, and ``model.py`` (``onnxruntime_genai_model.py`` with ``interface=text``) does
    tokenization, generation and incremental detokenization in one process.

    Args:
        ensemble_config: the filled ``triton_models/ensemble/config.pbtxt`` text.
        name: model name (``ensemble`` or ``tensorrt_llm_bls``).
        decoupled: ``model_transaction_policy.decoupled``.
        instance_count: CPU instances.
        params: ``parameters`` (string values).
        extra_inputs: further optional inputs ``(name, TYPE_*, dims)`` (the BLS model's speculative-decoding inputs).
    Returns:
        Protobuf text; raises ``text_format.ParseError`` when the ensemble text does not parse.
    """
    from google.protobuf import text_format

    cfg = python_model_from_ensemble(ensemble_config, name, decoupled, instance_count, params, extra_inputs)
    head = (
        f"# {name}: text in, text out, with the tensor interface of TensorRT-LLM's {name} (tensorrtllm_backend\n"
        f"# all_models/inflight_batcher_llm), served on the CPU target by one Python model that tokenizes, runs the\n"
        f'# onnxruntime-genai engine and detokenizes incrementally in-process (docs/package.md "Serving path").\n'
        f"# Generated by pipeline/package/repository.py from triton_models/ensemble/config.pbtxt.\n"
    )
    return head + text_format.MessageToString(cfg)


def template_values(s: Settings) -> dict[str, Any]:
    """The ``${name}`` values of every template for these settings."""
    ort = s.target == "onnxruntime_genai"
    trt_root = f"{CONTAINER_REPO}/tensorrt_llm/1/engine"
    return {
        "triton_max_batch_size": s.triton_max_batch_size,
        "decoupled_mode": s.decoupled,
        "max_queue_delay_microseconds": 0,
        "max_queue_size": 0,
        "logits_datatype": "TYPE_FP32",
        "engine_model": s.engine_model,
        "engine_text_output_map": TEXT_OUTPUT_MAP if ort else IDS_OUTPUT_MAP,
        "postprocessing_step": Fragment("") if ort else POSTPROCESSING_STEP,
        "engine_dir": "engine" if ort else trt_root,
        "max_input_len": s.served_max_input_len or s.max_input_len,
        "max_seq_len": s.max_seq_len,
        "engine_max_batch_size": s.engine_max_batch_size,
        "max_num_tokens": s.max_num_tokens,
        "max_beam_width": s.served_max_beam_width or s.max_beam_width,
        "exclude_input_in_output": s.exclude_input_in_output,
        "stream_coalescing": s.stream_coalescing,
        "stream_interval": s.stream_interval,
        "execution_provider": s.execution_provider,
        "preprocessing_instance_count": s.instance_count,
        "postprocessing_instance_count": s.instance_count,
        "tokenizer_dir": "tokenizer",
        "trtllm_tokenizer_dir": f"{CONTAINER_REPO}/preprocessing/1/tokenizer",
        "bos_id": "" if s.bos_id is None else int(s.bos_id),
        "end_id": s.end_id,
        "pad_id": s.pad_id,
        "batching_strategy": "inflight_fused_batching",
        "kv_cache_free_gpu_mem_fraction": s.kv_cache_free_gpu_mem_fraction,
        "enable_kv_cache_reuse": s.enable_kv_cache_reuse,
        "batch_scheduler_policy": s.batch_scheduler_policy,
        "enable_chunked_context": s.enable_chunked_context,
        "cuda_graph_mode": s.cuda_graph_mode,
        "cuda_graph_cache_size": s.cuda_graph_cache_size,
        # LLM-API (PyTorch backend) model.yaml
        "checkpoint_dir": f"{CONTAINER_REPO}/tensorrt_llm/1/checkpoint",
        "llmapi_tokenizer_dir": f"{CONTAINER_REPO}/tensorrt_llm/1/tokenizer",
        **_trtllm_values(s),
    }


def _trtllm_values(s: Settings) -> dict[str, Any]:
    from .trtllm_config import template_values

    return template_values(s)


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=False, dirs_exist_ok=True)


def copy_tokenizer(src_dirs: list[Path], dst: Path) -> list[str]:
    """Copy the tokenizer files found in the first of ``src_dirs`` that has ``tokenizer.json``; returns names copied."""
    for src in src_dirs:
        if src is not None and (src / "tokenizer.json").is_file():
            dst.mkdir(parents=True, exist_ok=True)
            copied = []
            for name in TOKENIZER_COPY_FILES:
                if (src / name).is_file():
                    shutil.copy2(src / name, dst / name)
                    copied.append(name)
            return copied
    raise InputError(
        f"no tokenizer.json found in {[str(s) for s in src_dirs if s is not None]}. The served pre/postprocessing "
        f"needs a fast (tokenizer.json) tokenizer. Fix: export a checkpoint whose tokenizer has tokenizer.json."
    )


def stamp_package_id(repo: Path, package_id: str) -> Path:
    """Add ``parameters { key: "pipeline_package_id" ... }`` (:data:`PACKAGE_ID_PARAMETER`) to
    ``repo/ensemble/config.pbtxt`` (every layout has an ``ensemble``); returns that file.  The value is data for
    clients only: no backend reads it.  Raises InputError when the repository has no ensemble."""
    p = repo / "ensemble" / "config.pbtxt"
    if not p.is_file():
        raise InputError(f"{repo}: no ensemble/config.pbtxt to record the package id in. Fix: re-package.")
    text = p.read_text(encoding="utf-8").rstrip("\n")
    entry = f'parameters {{\n  key: "{PACKAGE_ID_PARAMETER}"\n  value: {{ string_value: "{package_id}" }}\n}}\n'
    p.write_text(f"{text}\n{entry}", encoding="utf-8")
    return p


def generate_repository(
    out: Path,
    settings: Settings,
    *,
    engine_dir: Path,
    tokenizer_dirs: list[Path],
    templates: Path = TEMPLATES,
    trtllm_version: str | None = None,
    package_id: str | None = None,
) -> dict[str, Any]:
    """Write the model repository for ``settings`` into ``out`` (created; must not exist or be empty).

    Args:
        out: the repository folder (``<artifact>/model_repository``).
        settings: see :func:`settings_from_build`.
        engine_dir: the build's ``engine/`` folder (copied into the engine model's version folder).
        tokenizer_dirs: folders searched in order for ``tokenizer.json`` (export ``hf/`` first, then the engine).
        trtllm_version: the serving image's TensorRT-LLM (LLM-API layout: the adapter refuses the client options that
            version is not known to honour, :func:`pipeline.package.llmapi_adapter.tensor_map`).
        package_id: stamped into the ensemble's config (:func:`stamp_package_id`) when given.
    Returns:
        {"models": [names], "files": n, "layout": "..."}.
    """
    out.mkdir(parents=True, exist_ok=True)
    vals = template_values(settings)
    models: list[str] = []

    def write(model: str, tpl: str, *, model_py: str | None = None) -> Path:
        d = out / model
        (d / "1").mkdir(parents=True, exist_ok=True)
        text = fill((templates / tpl / "config.pbtxt").read_text(encoding="utf-8"), vals)
        (d / "config.pbtxt").write_text(text, encoding="utf-8")
        if model_py:
            copy_model_py(model_py, d / "1")
        models.append(model)
        return d

    if settings.target == "tensorrt_llm" and settings.backend == "pytorch":
        _write_llmapi_model(write("tensorrt_llm", "llmapi"), settings, vals, templates, engine_dir, tokenizer_dirs)
        from .llmapi_adapter import write_adapter_models  # NVIDIA's ensemble tensors in front of it (docs/package.md)

        ens = fill((templates / "ensemble" / "config.pbtxt").read_text(encoding="utf-8"), vals)
        models += write_adapter_models(out, settings, ens, MODELS_SRC, trtllm_version=trtllm_version)
        layout = "llmapi"
    else:
        write("ensemble", "ensemble")
        pre = write("preprocessing", "preprocessing", model_py="preprocessing_model.py")
        copy_tokenizer(tokenizer_dirs, pre / "1" / "tokenizer")
        post = write("postprocessing", "postprocessing", model_py="postprocessing_model.py")
        copy_tokenizer(tokenizer_dirs, post / "1" / "tokenizer")
        if settings.target == "onnxruntime_genai":
            eng = write("onnxruntime_genai", "onnxruntime_genai", model_py=ORT_MODEL_PY)
            copy_tokenizer(tokenizer_dirs, eng / "1" / "tokenizer")  # in-process detokenization (text_output)
            if settings.decoding:
                (eng / "1" / ExportArtifact.DECODING).write_text(
                    json.dumps(settings.decoding, indent=2, sort_keys=True) + "\n", encoding="utf-8"
                )
            for name in _write_ort_text_models(out, settings, vals):
                if name not in models:
                    models.append(name)
        else:
            eng = write("tensorrt_llm", "tensorrt_llm")
        _copy_tree(engine_dir, eng / "1" / "engine")
        if settings.target == "tensorrt_llm":
            from .trtllm_config import write_bls_model, write_draft_model

            if write_draft_model(out, settings, engine_dir):
                models.append("tensorrt_llm_draft")
            models.append(write_bls_model(out, settings, MODELS_SRC))
        layout = "inflight_batcher_llm"
    if package_id:
        stamp_package_id(out, package_id)
    n = sum(1 for p in out.rglob("*") if p.is_file())
    return {"models": sorted(models), "files": n, "layout": layout}


def _write_llmapi_model(
    d: Path, settings: Settings, vals: dict[str, Any], templates: Path, engine_dir: Path, tokenizer_dirs: list[Path]
) -> None:
    """The TensorRT-LLM PyTorch-backend (LLM API) model in ``d``: ``model.yaml`` (``pipeline.package.llmapi_options``:
    the one LLM-API options source, checked against the upstream key sets), tokenizer, README notice and the checkpoint."""
    from .llmapi_options import write_model_yaml
    from .trtllm_config import TrtllmPlan

    write_model_yaml(d / "1" / "model.yaml", settings, engine_dir, model=vals["checkpoint_dir"], tokenizer=vals["llmapi_tokenizer_dir"])
    copy_tokenizer(tokenizer_dirs, d / "1" / "tokenizer")
    (d / "README.md").write_text(TrtllmPlan.of(settings).llmapi_notice, encoding="utf-8")  # container + files it needs
    src = engine_dir / "hf" if (engine_dir / "hf").is_dir() else engine_dir  # the build copies the checkpoint to engine/hf
    if src.is_dir():
        _copy_tree(src, d / "1" / "checkpoint")


def _write_ort_text_models(out: Path, settings: Settings, vals: dict[str, Any]) -> list[str]:
    """onnxruntime_genai: the python ``ensemble`` (eager) and ``tensorrt_llm_bls`` (lazy) text models that run the
    engine in-process, replacing the ensemble config written from the template; returns their names."""
    from .trtllm_backend_table import EXTENSION_INPUTS  # server-side chat rendering (docs/package.md)

    ens_text = (out / "ensemble" / "config.pbtxt").read_text(encoding="utf-8")
    common = {
        "interface": "text",
        "engine_dir": "../../onnxruntime_genai/1/engine",
        "tokenizer_dir": "../../onnxruntime_genai/1/tokenizer",
        "max_input_len": vals["max_input_len"],
        "max_prompt_bytes": settings.max_prompt_bytes or 0,  # 0: derived by the model (pipeline.core.tokenization)
        "max_seq_len": vals["max_seq_len"],
        "max_beam_width": vals["max_beam_width"],
        "exclude_input_in_output": vals["exclude_input_in_output"],
        "stream_coalescing": vals["stream_coalescing"],
        "stream_interval": vals["stream_interval"],
        "skip_special_tokens": "true",
    }

    def ext(model: str) -> tuple[tuple[str, str, list[int]], ...]:
        return tuple((n, e["type"], list(e["dims"])) for n, e in EXTENSION_INPUTS.items() if model in e["models"])

    names = []
    for name, load, extra in (
        ("ensemble", "eager", ext("ensemble")),
        (
            "tensorrt_llm_bls",
            "lazy",
            ext("tensorrt_llm_bls") + (("num_draft_tokens", "TYPE_INT32", [1]), ("use_draft_logits", "TYPE_BOOL", [1])),
        ),
    ):
        d = out / name
        (d / "1").mkdir(parents=True, exist_ok=True)
        (d / "config.pbtxt").write_text(
            python_text_model_config(
                ens_text, name, decoupled=settings.decoupled, instance_count=1, params={**common, "load": load}, extra_inputs=extra
            ),
            encoding="utf-8",
        )
        copy_model_py(ORT_MODEL_PY, d / "1")
        names.append(name)
    return names
