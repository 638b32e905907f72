"""TensorRT-LLM serving configuration: the ``tensorrt_llm`` model's ``parameters``, the draft model and BLS wiring of a
draft-model build, and the acceptance-first decision for speculative decoding.

Every parameter written here is an upstream parameter of TensorRT-LLM 1.2.1's ``tensorrt_llm/config.pbtxt``; which ones
we always set, which we set only for a feature, and which stay at the backend default is
:data:`pipeline.package.trtllm_backend_table.TABLE` (rendered as ``docs/reference/tensorrt_llm_backend_parameters.md``).
A parameter left out of the file means the backend default (the C++ backend falls back to its default for a missing
key; an empty or unparsable value would only log a warning and do the same, so we never write one).

Values come from, in order: ``package.runtime`` (the user's serving knobs, TensorRT-LLM names), the build's
``build_info.json`` ``runtime`` (what the build decided: sliding window, speculative mode, CUDA graphs, KV knobs), and
the build config.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from ..core.contracts.build import BuildArtifact, BuildInfo
from ..core.contracts.evaluate import SpeculativeMeasurement
from ..core.contracts.result import from_fields
from ..errors import GateFailed, InputError
from ..facts.trtllm import SPECULATIVE_RUNTIME_FIELDS, llmapi_notice, llmapi_overrides, llmapi_unsupported

DRAFT_MODEL = "tensorrt_llm_draft"
"""Model name of the draft engine in a draft-model package (the BLS ``tensorrt_llm_draft_model_name``)."""
DRAFT_ENGINE_DIR = BuildArtifact.DRAFT_ENGINE_DIR
"""Folder of the draft engine inside a build artifact (next to ``engine/``; the name lives in pipeline/core/contracts/build.py)."""
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
SPEC_DECODING_MODE = {"medusa": "medusa", "eagle": "eagle", "lookahead_decoding": "lookahead"}
"""build.speculative.mode -> backend ``decoding_mode`` (draft_tokens_external: the engine's own mode, not written)."""

# package.runtime fields written verbatim when set (condition "runtime" in the table)
RUNTIME_PASSTHROUGH = (
    "encoder_model_path",
    "max_tokens_in_paged_kv_cache",
    "sink_token_length",
    "cross_kv_cache_fraction",
    "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks",
    "enable_trt_overlap",
    "cancellation_check_period_ms",
    "stats_check_period_ms",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "gpu_device_ids",
    "participant_ids",
    "num_nodes",
    "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes",
    "lora_prefetch_dir",
    "gpu_weights_percent",
    "enable_context_fmha_fp32_acc",
    "multi_block_mode",
    "speculative_decoding_fast_logits",
    "guided_decoding_backend",
    "xgrammar_tokenizer_info_path",
)


def _s(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _runtime(package_cfg: Any) -> Any:
    rt = getattr(package_cfg, "runtime", None)
    if rt is None:
        from ..core.config.serving import RuntimeConfig

        rt = RuntimeConfig()
    return rt


def speculative_of(build_info: BuildInfo, build_cfg: Any = None) -> dict[str, Any]:
    """``{"mode", "max_draft_len", "draft_model_path", "draft_engine"}`` of the build (``build_info.json`` ``runtime``)."""
    sp = build_info.speculative
    if not sp and build_cfg is not None and getattr(build_cfg, "speculative", None) is not None:
        b = build_cfg.speculative
        sp = {"mode": b.mode, "max_draft_len": b.max_draft_len, "draft_model_path": b.draft_model_path}
    sp.setdefault("mode", "none")
    return sp


def parameters(s: Any, build_info: BuildInfo, package_cfg: Any, build_cfg: Any = None) -> dict[str, str]:
    """The ``tensorrt_llm`` model parameters (key -> string value) for repository settings ``s``.

    Args:
        s: :class:`pipeline.package.repository.Settings` (limits, build knobs already joined).
        build_info: the build's ``build_info.json`` (``runtime.max_attention_window_size``, ``runtime.speculative``).
        package_cfg: the ``package`` config group (``runtime`` knobs, ``exclude_input_in_output``).
    Raises:
        InputError: a knob contradicts the engine (window above max_seq_len, Medusa without choices ...), naming the
            field, the value and the fix (exit 2).
    """
    rt = _runtime(package_cfg)
    p: dict[str, str] = {
        "gpt_model_path": "/models/tensorrt_llm/1/engine",
        "gpt_model_type": "inflight_fused_batching",
        "max_beam_width": _s(s.served_max_beam_width or s.max_beam_width),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "executor_worker_path": EXECUTOR_WORKER,
        "batch_scheduler_policy": s.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": _s(
            rt.kv_cache_free_gpu_mem_fraction if rt.kv_cache_free_gpu_mem_fraction is not None else s.kv_cache_free_gpu_mem_fraction
        ),
        "enable_kv_cache_reuse": _s(s.enable_kv_cache_reuse),
        "enable_chunked_context": _s(s.enable_chunked_context),
        "exclude_input_in_output": _s(s.exclude_input_in_output),
        "normalize_log_probs": _s(rt.normalize_log_probs),
        "cuda_graph_mode": _s(s.cuda_graph_mode),
        "cuda_graph_cache_size": _s(s.cuda_graph_cache_size),
        "tokenizer_dir": "/models/preprocessing/1/tokenizer",
    }
    for f in RUNTIME_PASSTHROUGH:
        v = getattr(rt, f)
        if v is not None:
            p[f] = _s(v)
    window = rt.max_attention_window_size if rt.max_attention_window_size is not None else build_info.max_attention_window_size
    if window is not None:
        if int(window) > s.max_seq_len:
            raise InputError(
                f"package.runtime.max_attention_window_size={window}: larger than the engine's max_seq_len={s.max_seq_len}. "
                f"Fix: set it <= {s.max_seq_len}, or null for full attention."
            )
        p["max_attention_window_size"] = _s(int(window))
    p.update(_speculative_parameters(rt, speculative_of(build_info, build_cfg)["mode"]))
    return p


def _speculative_parameters(rt: Any, mode: str) -> dict[str, str]:
    """:func:`parameters`' decoding-mode entries for an engine built with ``build.speculative.mode=mode``.

    Raises:
        InputError: ``package.runtime.decoding_mode`` contradicts the engine, a Medusa/lookahead engine lacks its
            choices/sizes, or a knob of another speculative mode is set.
    """
    p: dict[str, str] = {}
    if mode in SPEC_DECODING_MODE:
        p["decoding_mode"] = SPEC_DECODING_MODE[mode]
    if rt.decoding_mode is not None:
        want = SPEC_DECODING_MODE.get(mode)
        if want is not None and rt.decoding_mode != want:
            raise InputError(
                f"package.runtime.decoding_mode={rt.decoding_mode!r}: the engine was built for {mode} "
                f"(build.speculative.mode). Fix: set it to {want!r} or null."
            )
        p["decoding_mode"] = rt.decoding_mode
    if mode == "medusa":
        if not rt.medusa_choices:
            raise InputError(
                "package.runtime.medusa_choices is not set, but the engine is a Medusa engine (build.speculative.mode=medusa). "
                "Fix: set package.runtime.medusa_choices to the tree the Medusa heads were trained for, e.g. '{0}, {0, 0}, {1}'."
            )
        p["medusa_choices"] = rt.medusa_choices
    if mode == "eagle" and rt.eagle_choices:
        p["eagle_choices"] = rt.eagle_choices
    if mode == "lookahead_decoding":
        for f in ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"):
            if getattr(rt, f) is None:
                raise InputError(
                    f"package.runtime.{f} is not set, but the engine is a lookahead engine (build.speculative.mode=lookahead_decoding). "
                    f"Fix: set package.runtime.lookahead_window_size, lookahead_ngram_size and lookahead_verification_set_size."
                )
            p[f] = _s(getattr(rt, f))
    for f, m in SPECULATIVE_RUNTIME_FIELDS.items():
        if getattr(rt, f) is not None and mode != m:
            raise InputError(
                f"package.runtime.{f}={getattr(rt, f)!r}: only used by a {m} engine, and this build is "
                f"build.speculative.mode={mode}. Fix: remove package.runtime.{f} or build with build.speculative.mode={m}."
            )
    return p


def render_parameters(params: dict[str, str]) -> str:
    """``parameters { key: ... }`` lines (protobuf text format; quotes and backslashes escaped)."""

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"')

    # the leading spaces mark a pre-rendered fragment for repository.fill (inserted verbatim, not re-escaped)
    head = "      # parameters generated by pipeline/package/trtllm_config.py (docs/reference/tensorrt_llm_backend_parameters.md)"
    return "\n".join([head] + [f'parameters {{ key: "{k}" value: {{ string_value: "{esc(v)}" }} }}' for k, v in params.items()])


def _fragment(text: str) -> str:
    """Mark ``text`` as a pre-rendered fragment for ``repository.fill`` (:class:`pipeline.package.fragment.Fragment`)."""
    from .fragment import Fragment

    return Fragment(text)


def template_values(s: Any) -> dict[str, Any]:
    """Extra ``${name}`` values for the TensorRT-LLM templates (the engine model, the ensemble's step-2 keys, the BLS)."""
    trt = s.target == "tensorrt_llm"
    tr = TrtllmPlan.of(s)
    return {
        # the 1.x engine model names these request inputs min_tokens / seed; the ensemble keeps its client-facing names
        "engine_input_min_tokens": "min_tokens" if trt else "min_length",
        "engine_input_seed": "seed" if trt else "random_seed",
        "trtllm_parameters": _fragment(render_parameters(tr.parameters or {})),
        "encoder_input_features_data_type": tr.encoder_input_features_data_type,
        "prompt_embedding_table_data_type": "TYPE_FP16",
        "tensorrt_llm_model_name": "tensorrt_llm",
        "tensorrt_llm_draft_model_name": DRAFT_MODEL if tr.draft else "",
    }


@dataclasses.dataclass(frozen=True)
class TrtllmPlan:
    """``Settings.trtllm`` (:func:`plan`) as its readers see it. Engine layout: the ``tensorrt_llm`` model's
    ``parameters``, whether a ``draft`` model is packaged and the encoder features' data type; LLM-API layout (PyTorch
    backend): the README ``llmapi_notice`` and the ``model.yaml`` keys of the set ``package.runtime`` fields."""

    parameters: dict[str, str] | None = None
    draft: bool = False
    encoder_input_features_data_type: Any = "TYPE_FP16"
    llmapi_notice: str = ""
    llmapi_overrides: dict[str, Any] | None = None

    @classmethod
    def of(cls, s: Any) -> TrtllmPlan:
        """The plan of the repository settings ``s`` (every field its default when ``s`` has none)."""
        return from_fields(cls, getattr(s, "trtllm", None) or {})


def plan(s: Any, build_info: BuildInfo, package_cfg: Any, build_cfg: Any = None, target_cfg: Any = None) -> dict[str, Any]:
    """What :func:`pipeline.package.repository.settings_from_build` stores in ``Settings.trtllm``."""
    if s.stream_interval != 1:
        raise InputError(
            f"package.stream_interval={s.stream_interval}: the TensorRT-LLM target streams every token (the Triton "
            f"TensorRT-LLM backend has no stream interval; the setting is the CPU target's). Fix: remove it (1)."
        )
    if s.backend == "pytorch":
        image = (
            getattr(package_cfg, "serving_image", None)
            or getattr(target_cfg, "serving_image", None)
            or "nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3"
        )
        rt = _runtime(package_cfg)
        bad = llmapi_unsupported(rt)
        if bad:
            raise InputError(
                f"package.runtime.{bad[0]}={getattr(rt, bad[0])!r}: has no equivalent in the PyTorch-backend (LLM API) "
                f"layout (unsupported here: {bad}). Fix: remove it, or build an engine with target.backend=tensorrt."
            )
        return {"llmapi_notice": llmapi_notice(image), "serving_image": image, "llmapi_overrides": llmapi_overrides(rt)}
    sp = speculative_of(build_info, build_cfg)
    return {
        "parameters": parameters(s, build_info, package_cfg, build_cfg),
        "speculative": sp,
        "draft": sp["mode"] == "draft_tokens_external",
        "encoder_input_features_data_type": _runtime(package_cfg).encoder_input_features_data_type,
    }


def write_draft_model(repo: Path, s: Any, engine_dir: Path) -> str | None:
    """Draft-model builds: package the draft engine as the model :data:`DRAFT_MODEL` (a copy of the ``tensorrt_llm``
    model config with its own name and engine path). Returns the model name, or None for other builds.

    Raises:
        InputError: the build artifact has no ``draft_engine/`` folder.
    """
    if not TrtllmPlan.of(s).draft:
        return None
    src = engine_dir.parent / DRAFT_ENGINE_DIR
    if not (src / "config.json").is_file():
        raise InputError(
            f"{src}: the draft-model build (build.speculative.mode=draft_tokens_external) has no draft engine "
            "(config.json + rank*.engine). Fix: rebuild with build.speculative.draft_model_path set."
        )
    d = repo / DRAFT_MODEL
    (d / "1").mkdir(parents=True, exist_ok=True)
    text = (repo / "tensorrt_llm" / "config.pbtxt").read_text(encoding="utf-8")
    text = text.replace('name: "tensorrt_llm"', f'name: "{DRAFT_MODEL}"', 1)
    text = text.replace('"/models/tensorrt_llm/1/engine"', f'"/models/{DRAFT_MODEL}/1/engine"')
    # the draft runs plain greedy decoding: no speculative decoding_mode on it
    text = "\n".join(line for line in text.splitlines() if '"decoding_mode"' not in line) + "\n"
    (d / "config.pbtxt").write_text(text, encoding="utf-8")
    shutil.copytree(src, d / "1" / "engine", dirs_exist_ok=True)
    return DRAFT_MODEL


# --------------------------------------------------------------------------- acceptance first
@dataclasses.dataclass
class SpeculativeDecision:
    mode: str
    enabled: bool
    override: bool
    reason: str
    acceptance_rate: float | None = None
    expected_tokens_per_step: float | None = None
    measured_tokens_per_step: float | None = None
    slices: dict[str, float] | None = None
    k: int | None = None
    max_draft_len: int | None = None
    threshold: float | None = None
    slice_threshold: float | None = None
    draft_model: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens per target step with k draft tokens and per-token acceptance ``alpha``:
    (1 - alpha^(k+1)) / (1 - alpha), = k + 1 at alpha = 1 (Leviathan et al. 2023, "Fast Inference from Transformers
    via Speculative Decoding", eq. 1; i.i.d. acceptance assumed)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def decide_speculative(
    mode: str, measured: dict[str, Any] | None, gate_cfg: Any, *, draft_model_path: str | None = None, max_draft_len: int | None = None
) -> SpeculativeDecision:
    """Acceptance-first decision for a speculative build.

    Args:
        mode: ``build.speculative.mode``.
        measured: the evaluate report's ``speculative`` section (``acceptance_rate``, ``k``, ``mean_tokens_per_step``,
            ``slices.<name>.acceptance_rate``, ``draft_model``), or None when nothing was measured.
        gate_cfg: ``package.speculative`` (``min_acceptance_rate``, ``min_slice_acceptance_rate``, ``allow_low_acceptance``).
        draft_model_path: the draft the build packages (``build.speculative.draft_model_path``); the measurement must
            be of the same draft.
        max_draft_len: the engine's draft length; the measurement must use the same k.
    Returns:
        The decision; ``enabled`` is False only when mode is none. A refusal raises.
    Raises:
        GateFailed (exit 3): acceptance below the threshold overall or on a slice, not measured, or measured with another
            draft, and ``package.speculative.allow_low_acceptance`` is false. The message names the numbers and the fix.
    """
    if mode == "none":
        return SpeculativeDecision(mode, enabled=False, override=False, reason="no speculative decoding in this build")
    thr = float(gate_cfg.min_acceptance_rate)
    sthr = float(gate_cfg.min_slice_acceptance_rate if gate_cfg.min_slice_acceptance_rate is not None else thr)
    problems: list[str] = []
    dec = SpeculativeDecision(
        mode, enabled=True, override=False, reason="", threshold=thr, slice_threshold=sthr, max_draft_len=max_draft_len
    )
    if not measured:
        how = (
            "eval.draft_model_path=<the draft checkpoint>"
            if mode == "draft_tokens_external"
            else "an acceptance measurement for this mode (the evaluate stage measures draft-model acceptance only)"
        )
        problems.append(f"the acceptance rate of build.speculative.mode={mode} was not measured on the eval set (needs {how})")
    else:
        m = SpeculativeMeasurement.from_json(measured)
        dec.draft_model = m.draft_model
        dec.k = int(m.k or 0) or None
        dec.acceptance_rate = float(m.acceptance_rate or 0.0)
        dec.measured_tokens_per_step = m.mean_tokens_per_step
        dec.expected_tokens_per_step = expected_tokens_per_step(dec.acceptance_rate, dec.k or 1)
        dec.slices = dict(m.slice_acceptance)
        if draft_model_path and dec.draft_model and Path(str(draft_model_path)).resolve() != Path(str(dec.draft_model)).resolve():
            problems.append(
                f"the acceptance was measured with draft {dec.draft_model}, but the build packages "
                f"build.speculative.draft_model_path={draft_model_path}"
            )
        if max_draft_len and dec.k and int(max_draft_len) != dec.k:
            problems.append(
                f"the acceptance was measured with k={dec.k} draft tokens (eval.draft_tokens), but the engine drafts "
                f"build.speculative.max_draft_len={max_draft_len}"
            )
        if dec.acceptance_rate < thr:
            problems.append(
                f"overall acceptance rate {dec.acceptance_rate:.3f} < package.speculative.min_acceptance_rate={thr:g} "
                f"(expected {dec.expected_tokens_per_step:.2f} tokens per target step with k={dec.k})"
            )
        low = {k: v for k, v in dec.slices.items() if v < sthr}
        if low:
            problems.append("slice acceptance below " + f"{sthr:g}: " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(low.items())))
    if not problems:
        dec.reason = f"acceptance {dec.acceptance_rate:.3f} >= {thr:g} overall and >= {sthr:g} on every slice"
        return dec
    msg = "; ".join(problems)
    if not gate_cfg.allow_low_acceptance:
        raise GateFailed(
            f"package: refusing to enable speculative decoding ({mode}): {msg}. Fix: use a draft that agrees with the "
            "target more often (same family, distilled), build without speculative decoding "
            "(build.speculative.mode=none), or override explicitly with package.speculative.allow_low_acceptance=true "
            "(recorded in release_manifest.json)."
        )
    dec.override, dec.reason = True, f"package.speculative.allow_low_acceptance=true: enabled although {msg}"
    return dec


def read_measurement(evaluate_dir: Path | None) -> dict[str, Any] | None:
    """The ``speculative`` section of the evaluate artifact's ``eval_report.json`` (None when absent)."""
    if evaluate_dir is None:
        return None
    from ..core.contracts.evaluate import EvalArtifact

    art = EvalArtifact(Path(evaluate_dir))
    if not art.report_path.is_file():
        return None
    return art.report().speculative


# --------------------------------------------------------------------------- tensorrt_llm_bls
BLS_MODEL = "tensorrt_llm_bls"
BLS_EXTRA_INPUTS = (
    ("min_tokens", "TYPE_INT32", [1]),
    ("seed", "TYPE_UINT64", [1]),
    ("num_draft_tokens", "TYPE_INT32", [1]),
    ("use_draft_logits", "TYPE_BOOL", [1]),
    ("return_num_input_tokens", "TYPE_BOOL", [1]),
    ("return_num_output_tokens", "TYPE_BOOL", [1]),
)
"""Upstream ``tensorrt_llm_bls`` inputs (TensorRT-LLM 1.2.1, name / type / dims) that the ensemble does not declare; the
ensemble's inputs (``min_length``/``random_seed`` included, as aliases) come first."""
BLS_EXTRA_OUTPUTS = (("num_input_tokens", "TYPE_INT32", [1]), ("num_output_tokens", "TYPE_INT32", [1]))
"""Upstream ``tensorrt_llm_bls`` outputs the ensemble does not declare (the engine's, passed through)."""


def bls_model_config(ensemble_config: str, s: Any) -> str:
    """``tensorrt_llm_bls/config.pbtxt`` of the TensorRT-LLM package (Python backend, model.py
    ``pipeline/serve/models/tensorrt_llm_bls_model.py``).

    Args:
        ensemble_config: the filled ``triton_models/ensemble/config.pbtxt`` of this package (its tensors are the BLS's
            client interface: one definition).
        s: repository ``Settings`` (``decoupled``, ``instance_count``, :class:`TrtllmPlan` ``draft``).
    Returns:
        Protobuf text (parses with tritonclient's ``model_config_pb2.ModelConfig``); ``decoupled`` equals the
        ``tensorrt_llm`` model's (both are ``package.decoupled``).
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from .model_config import python_model_from_ensemble

    params = {"accumulate_tokens": "false", "tensorrt_llm_model_name": "tensorrt_llm"}
    if TrtllmPlan.of(s).draft:
        params["tensorrt_llm_draft_model_name"] = DRAFT_MODEL
    cfg = python_model_from_ensemble(ensemble_config, BLS_MODEL, s.decoupled, s.instance_count, params, BLS_EXTRA_INPUTS)
    for name, dtype, dims in BLS_EXTRA_OUTPUTS:
        o = cfg.output.add()
        o.name, o.data_type = name, mc.DataType.Value(dtype)
        o.dims.extend(dims)
    head = (
        "# tensorrt_llm_bls: text in, text out, with the interface of TensorRT-LLM's tensorrt_llm_bls (TensorRT-LLM 1.2.1\n"
        "# triton_backend/all_models/inflight_batcher_llm): a Python model that calls preprocessing -> tensorrt_llm ->\n"
        '# postprocessing by BLS requests, mapping tensors as the ensemble does (docs/package.md "Serving path").\n'
        "# Generated by pipeline/package/trtllm_config.py from this package's ensemble/config.pbtxt.\n"
    )
    return head + text_format.MessageToString(cfg)


def write_bls_model(repo: Path, s: Any, models_src: Path) -> str:
    """Write ``tensorrt_llm_bls/`` (config + ``1/model.py``) into the TensorRT-LLM repository ``repo`` (its
    ``ensemble/config.pbtxt`` must already be written). Returns the model name."""
    from .model_config import copy_served_model

    d = repo / BLS_MODEL
    (d / "1").mkdir(parents=True, exist_ok=True)
    ens = (repo / "ensemble" / "config.pbtxt").read_text(encoding="utf-8")
    (d / "config.pbtxt").write_text(bls_model_config(ens, s), encoding="utf-8")
    copy_served_model(models_src, "tensorrt_llm_bls_model.py", d / "1")
    return BLS_MODEL
