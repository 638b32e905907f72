"""Quantization with NVIDIA ModelOpt: recipes, checks, calibration, export and the quant report.

Our code orchestrates and validates; the quantization algorithms (AWQ, SmoothQuant, FP8/INT8
max calibration) and the checkpoint writers are ModelOpt's (``modelopt.torch.quantization`` and
``modelopt.torch.export``).

Public API used by other stages:

* :func:`load_simulated_model` - rebuild ModelOpt's simulated-quantization (fake-quant) model from a
  quantize artifact plus the export artifact, without pickle (evaluate's ``simulated`` runner, the
  build stage's ORT converter).
* :data:`RECIPES` - recipe -> ModelOpt config + TensorRT-LLM ``quant_algo``.
* :func:`quantize` - the plain function the stage calls.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError

# ModelOpt warnings that are expected in this pipeline and read like failures on a CPU host:
# its TensorRT-LLM config writer falls back to its own manual path when tensorrt_llm is not installed
# (the path we use and check after export), and it flags untested transformers releases.
warnings.filterwarnings("ignore", message=r"Cannot export tensorrt_llm checkpoint config")
warnings.filterwarnings("ignore", message=r"transformers .* is not tested with current version of modelopt")

if TYPE_CHECKING:  # torch is imported lazily: `pipeline plan` and cache hits never pay for it
    import torch

log = logging.getLogger("pipeline.quantize")

QUANT_STATE_SCHEMA = "pipeline.quant_state/v1"
QUANT_STATE_JSON = "quant_state.json"
QUANT_STATE_TENSORS = "quant_state.safetensors"
_STATE_TENSOR_PREFIX = "__modelopt_state__."
PROBE_IDS, PROBE_LOGITS = "__probe__.input_ids", "__probe__.logits"


# --------------------------------------------------------------------------- quant state (no pickle)
def _encode_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """ModelOpt's ``modelopt_state`` -> plain JSON; tensors go to ``tensors`` (saved as safetensors).

    Tagged forms: ``{"__dtype__": "float32"}``, ``{"__size__": [..]}``, ``{"__tuple__": [..]}``,
    ``{"__tensor__": "<key>"}``, ``{"__items__": [[k, v], ..]}`` (dicts with non-string keys).  Raises ``TypeError`` for any other non-JSON type.
    """
    import torch

    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.Size):
        return {"__size__": list(obj)}
    if isinstance(obj, torch.Tensor):
        key = f"{_STATE_TENSOR_PREFIX}{len([k for k in tensors if k.startswith(_STATE_TENSOR_PREFIX)])}"
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode_state(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode_state(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):  # e.g. block_sizes {-1: 128, "type": "static"}
            return {"__items__": [[_encode_state(k, tensors), _encode_state(v, tensors)] for k, v in obj.items()]}
        return {k: _encode_state(v, tensors) for k, v in obj.items()}
    raise TypeError(f"cannot store {type(obj).__name__} value {obj!r} of the modelopt state as JSON")


def _decode_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    import torch

    if isinstance(obj, list):
        return [_decode_state(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1:
            ((k, v),) = obj.items()
            if k == "__dtype__":
                return getattr(torch, v)
            if k == "__size__":
                return torch.Size(v)
            if k == "__tuple__":
                return tuple(_decode_state(x, tensors) for x in v)
            if k == "__tensor__":
                return tensors[v]
            if k == "__items__":
                return {_decode_state(a, tensors): _decode_state(b, tensors) for a, b in v}
        return {k: _decode_state(v, tensors) for k, v in obj.items()}
    return obj


def save_quant_state(
    model: torch.nn.Module, base_state: dict[str, torch.Tensor], out_dir: Path, meta: dict[str, Any], probe_ids: torch.Tensor | None = None
) -> dict[str, Any]:
    """Write ``quant_state.safetensors`` + ``quant_state.json`` for a ModelOpt-quantized model.

    Stored tensors: every quantizer buffer (``*_quantizer._amax``, ``_pre_quant_scale`` ...), every
    model tensor whose value differs from ``base_state`` (AWQ and SmoothQuant fold their scales into
    the weights), and the tensors inside ModelOpt's ``modelopt_state`` (quantizer types/configs,
    restored with ``modelopt.torch.opt.restore_from_modelopt_state``).  No pickle is involved.

    Args:
        model: the quantized model (float32 on CPU, as calibrated).
        base_state: the state_dict of the unquantized model loaded from the export checkpoint in the
            same dtype (the restore starts from it).
        out_dir: folder to write into.
        meta: recipe facts stored in the JSON (recipe, kv_cache, modelopt config, calib dtype ...).
        probe_ids: optional ``(1, T)`` int64 token ids; the quantized model's float32 logits on them are
            stored (``__probe__.input_ids`` / ``__probe__.logits``) so :func:`load_simulated_model` can
            prove the restored model is the calibrated one.
    Returns:
        The JSON document written.
    """
    import modelopt
    import modelopt.torch.opt as mto
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    state = _encode_state(mto.modelopt_state(model), tensors)
    buffers, changed = [], []
    for name, t in model.state_dict().items():
        if "_quantizer." in name or name.endswith("_quantizer"):
            buffers.append(name)
        elif name in base_state and (base_state[name].shape == t.shape) and torch.equal(base_state[name], t):
            continue
        else:
            changed.append(name)
        tensors[name] = t.detach().cpu().contiguous().clone()
    if probe_ids is not None:
        with torch.no_grad():
            logits = model(input_ids=probe_ids, attention_mask=torch.ones_like(probe_ids)).logits
        tensors[PROBE_IDS] = probe_ids.detach().cpu().contiguous().clone()
        tensors[PROBE_LOGITS] = logits.detach().float().cpu().contiguous()
    doc = {
        "schema": QUANT_STATE_SCHEMA,
        "modelopt_version": modelopt.__version__,
        **meta,
        "modelopt_state": state,
        "quantizer_buffers": sorted(buffers),
        "changed_weights": sorted(changed),
    }
    save_file(tensors, str(out_dir / QUANT_STATE_TENSORS), metadata={"schema": QUANT_STATE_SCHEMA})
    (out_dir / QUANT_STATE_JSON).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return doc


def _hf_dir(export_dir: Path) -> Path:
    export_dir = Path(export_dir)
    if (export_dir / "hf" / "config.json").is_file():
        return export_dir / "hf"
    if (export_dir / "config.json").is_file():
        return export_dir
    raise InputError(f"{export_dir}: not an export artifact (no hf/config.json). Pass the export stage's artifact folder.")


def load_simulated_model(
    quant_dir: Path, export_dir: Path, device: str = "cpu", dtype: torch.dtype | None = None, verify: bool = True
) -> torch.nn.Module:
    """ModelOpt's simulated-quantization (fake-quant) model of a quantize artifact, without pickle.

    Loads the export checkpoint (``export_dir/hf``) with ``transformers`` in float32 (the dtype the
    calibration ran in, recorded in ``quant_state.json``), restores ModelOpt's quantizers with
    ``modelopt.torch.opt.restore_from_modelopt_state`` from the JSON-encoded state, then loads the
    quantizer buffers (amax, pre_quant_scale) and the scale-folded weights from
    ``quant_state.safetensors``.  Its logits equal those of the model that was calibrated
    (``tests/test_quantize.py::test_load_simulated_model_reproduces_logits``).

    Args:
        quant_dir: the quantize artifact folder (holds ``quant_state.json``/``.safetensors``).
        export_dir: the export artifact folder (holds ``hf/``) or the ``hf/`` folder itself.
        device: torch device for the returned model ("cpu", "cuda", ...).
        dtype: override the float dtype (default: the calibration dtype, float32).
        verify: when the state carries a probe (the quantize stage always stores one), run it on CPU in
            float32 and require the logits to match the calibrated model's (``allclose``, 1e-4).
    Returns:
        ``transformers`` causal-LM ``torch.nn.Module`` in eval mode; for recipe ``none`` the plain
        unquantized model.
    Raises:
        InputError: missing/corrupt files, or a state that does not fit the model (names the file).
    """
    import torch
    import transformers as tf
    from safetensors.torch import load_file

    quant_dir = Path(quant_dir)
    sj = quant_dir / QUANT_STATE_JSON
    try:
        doc = json.loads(sj.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{sj}: cannot read the quant state ({e}). Pass the quantize stage's artifact folder.") from e
    if doc.get("schema") != QUANT_STATE_SCHEMA:
        raise InputError(f"{sj}: schema {doc.get('schema')!r} is not {QUANT_STATE_SCHEMA!r}; re-run the quantize stage.")
    want = dtype or getattr(torch, doc.get("calib_dtype", "float32"))
    model = tf.AutoModelForCausalLM.from_pretrained(str(_hf_dir(export_dir)), dtype=want, trust_remote_code=False)
    model.eval()
    if doc.get("recipe") == "none" or doc.get("modelopt_state") is None:
        return model.to(device)
    import modelopt.torch.opt as mto

    tensors = load_file(str(quant_dir / QUANT_STATE_TENSORS))
    state = _decode_state(doc["modelopt_state"], tensors)
    mto.restore_from_modelopt_state(model, state)
    own = {k: v for k, v in tensors.items() if not k.startswith((_STATE_TENSOR_PREFIX, "__probe__."))}
    res = model.load_state_dict(own, strict=False)
    missing_q = [k for k in res.missing_keys if "_quantizer" in k]
    if res.unexpected_keys or missing_q:
        raise InputError(
            f"{quant_dir / QUANT_STATE_TENSORS}: does not fit the model from {export_dir} "
            f"(unexpected {res.unexpected_keys[:5]}, missing quantizer buffers {missing_q[:5]}). "
            "Quantize and export artifacts must come from the same run."
        )
    model.eval()
    if verify and PROBE_IDS in tensors and dtype is None:
        ids = tensors[PROBE_IDS]
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
        want = tensors[PROBE_LOGITS]
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            diff = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
            raise InputError(
                f"{quant_dir}: the restored model's logits on the stored probe differ from the calibrated model's "
                f"(max |diff| {diff}). The export artifact {export_dir} is not the one this quant state was made from."
            )
    if dtype is not None:
        model.to(dtype)
    return model.to(device)


# --------------------------------------------------------------------------- recipes
@dataclasses.dataclass(frozen=True)
class Recipe:
    """One ``quant.recipe``: the ModelOpt config it starts from and the TensorRT-LLM names it exports to.

    Attributes:
        name: ``quant.recipe`` value.
        modelopt_cfg: name of the ``modelopt.torch.quantization`` config constant (None: no quantization).
        quant_algo: TensorRT-LLM ``quantization.quant_algo`` ModelOpt 0.47's exporter writes
            (TensorRT-LLM quantization/mode.py QuantAlgo, docs/reference/tensorrt_llm.md §3; checked after export).
        grouped: weights quantized in groups of ``quant.group_size`` along the input dimension.
        weight_bits: stored weight bits (for the report's size estimate).
        activations: activation format at inference ("fp16" = not quantized).
        description: one line for docs and reports.
    """

    name: str
    modelopt_cfg: str | None
    quant_algo: str | None
    grouped: bool
    weight_bits: int
    activations: str
    description: str


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("none", None, None, False, 16, "fp16", "no quantization: the export checkpoint in quant.export_dtype"),
        Recipe("fp8", "FP8_DEFAULT_CFG", "FP8", False, 8, "fp8", "FP8 E4M3 weights and activations, per-tensor scales (max calibration)"),
        Recipe(
            "int8_sq",
            "INT8_SMOOTHQUANT_CFG",
            "W8A8_SQ_PER_CHANNEL",
            False,
            8,
            "int8",
            "SmoothQuant (Xiao et al. 2023): INT8 per-channel weights, INT8 activations with a calibrated per-tensor scale; "
            "smoothing strength quant.smoothquant_alpha",
        ),
        Recipe("int8_wo", "INT8_WEIGHT_ONLY_CFG", "W8A16", False, 8, "fp16", "INT8 per-channel weight-only"),
        Recipe(
            "int4_rtn",
            "INT4_BLOCKWISE_WEIGHT_ONLY_CFG",
            "W4A16_AWQ",
            True,
            4,
            "fp16",
            "INT4 group-wise weight-only, plain round-to-nearest with max calibration (no AWQ scale search; ModelOpt "
            "exports it to TensorRT-LLM's group-wise W4A16_AWQ kernel path with unit pre-quant scales)",
        ),
        Recipe(
            "int4_wo",
            "INT4_BLOCKWISE_WEIGHT_ONLY_CFG",
            "W4A16_AWQ",
            True,
            4,
            "fp16",
            "deprecated alias of int4_rtn (same ModelOpt config, same bytes); use quant=int4_rtn",
        ),
        Recipe(
            "int4_awq",
            "INT4_AWQ_CFG",
            "W4A16_AWQ",
            True,
            4,
            "fp16",
            "INT4 group-wise weights with AWQ activation-aware scales (Lin et al. 2023; ModelOpt awq_lite)",
        ),
        Recipe("w4a8_awq", "W4A8_AWQ_BETA_CFG", "W4A8_AWQ", True, 4, "fp8", "INT4 AWQ weights with FP8 activations"),
        Recipe(
            "auto",
            None,
            "MIXED_PRECISION",
            False,
            16,
            "fp16",
            "per-layer format search under an effective-bits budget (ModelOpt auto_quantize; formats quant.auto.formats "
            "or not quantized); TensorRT-LLM MIXED_PRECISION with per-layer quant_cfg.json, or the one format chosen",
        ),
    )
}

#: quant.kv_cache_dtype -> (TensorRT-LLM kv_cache_quant_algo, ModelOpt quantizer entries for the K/V bmm quantizers).
KV_CACHE: dict[str, tuple[str | None, list[dict[str, Any]]]] = {
    "none": (None, []),
    "fp8": ("FP8", [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}, "enable": True}]),
    "int8": ("INT8", [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}, "enable": True}]),
}

#: HF ``model_type`` -> ModelOpt ``decoder_type`` for export_tensorrt_llm_checkpoint.
#: phi3 is absent on purpose: ModelOpt 0.47's export_tensorrt_llm_checkpoint raises NotImplementedError for it.
DECODER_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen"}
#: model_type -> why ModelOpt writes no TensorRT-LLM checkpoint for it; quantize still calibrates and writes the
#: simulated-quant state and the unified HF checkpoint (onnxruntime_genai and tensorrt_llm_pytorch deploy those).
#: Source: modelopt/torch/export/tensorrt_llm_utils.py (0.47) raises NotImplementedError for Phi3ForCausalLM.
NO_TRTLLM_CHECKPOINT = {
    "phi3": "ModelOpt 0.47 cannot export Phi3ForCausalLM to a TensorRT-LLM checkpoint (its converter "
    "raises NotImplementedError and points to the unified HF checkpoint + the PyTorch backend)"
}

#: Module-name patterns of attention output projections (``sensitive_preset`` attn_out).
ATTN_OUT_PATTERNS = ("*.self_attn.o_proj", "*.self_attention.dense", "*.attention.dense", "*.attn.out_proj")

#: Minimal compute-capability table used only when ``pipeline.planner.gpus`` is unavailable.
#: Source: https://developer.nvidia.com/cuda-gpus (compute capability per GPU).
_LOCAL_SM = {
    "h100": 90,
    "h100_sxm": 90,
    "h100_pcie": 90,
    "h200": 90,
    "a100": 80,
    "a100_40gb": 80,
    "a100_80gb": 80,
    "a10g": 86,
    "a10": 86,
    "l4": 89,
    "l40s": 89,
    "t4": 75,
    "v100": 70,
    "b200": 100,
}
#: ModelOpt pads vocab_embedding/lm_head rows to a multiple of this when it exports AWQ-format (W4A16_AWQ, W4A8_AWQ)
#: TensorRT-LLM checkpoints (modelopt/torch/export/model_config_export.py, postprocess.pad_embedding_lm_head).
AWQ_VOCAB_MULTIPLE = 64

#: Minimum SM per recipe / KV format, TensorRT-LLM support matrix (docs/source/reference/support-matrix.md; docs/reference/tensorrt_llm.md §4).
_LOCAL_RECIPE_MIN_SM = {
    "none": 80,
    "int8_wo": 80,
    "int4_rtn": 80,
    "int4_wo": 80,
    "auto": 80,
    "int4_awq": 80,
    "int8_sq": 80,
    "fp8": 89,
    "w4a8_awq": 89,
}
_LOCAL_KV_MIN_SM = {"none": 80, "int8": 80, "fp8": 89}


def _gpu_facts(name: str) -> tuple[int, dict[str, int], dict[str, int], str]:
    """(SM, recipe min-SM table, KV min-SM table, source) for a target GPU name; InputError if unknown."""
    try:
        from .planner import gpus as catalogue
    except ImportError:
        catalogue = None
    if catalogue is not None:
        try:
            g = catalogue.lookup(name)
        except KeyError as e:
            raise InputError(f"target.gpu={name!r}: {e.args[0]}") from e
        return g.sm, dict(catalogue.RECIPE_MIN_SM), dict(catalogue.KV_MIN_SM), "pipeline.planner.gpus"
    key = str(name).strip().lower().replace("-", "_")
    if key not in _LOCAL_SM:
        raise InputError(f"target.gpu={name!r}: unknown GPU; known: {sorted(_LOCAL_SM)}")
    return _LOCAL_SM[key], _LOCAL_RECIPE_MIN_SM, _LOCAL_KV_MIN_SM, "pipeline.quantize local table"


# --------------------------------------------------------------------------- model facts
def source_facts(hf_dir: Path) -> dict[str, Any]:
    """Architecture-critical facts of the export checkpoint (``hf/config.json``).

    Returns a dict with model_type, architecture, num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, head_dim, vocab_size, max_position_embeddings, rope_theta (float; 10000.0 when
    the config gives none, the transformers LLaMA default), rope_scaling (dict or None, ``rope_type``
    spelling), norm_epsilon (``rms_norm_eps``), dtype.
    """
    from .export import normalise_rope

    where = str(hf_dir / "config.json")
    try:
        c = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{where}: cannot read ({e}). Re-run the export stage.") from e
    theta, scaling = normalise_rope(c, where)
    heads = int(c["num_attention_heads"])
    return {
        "model_type": c.get("model_type"),
        "architecture": (c.get("architectures") or [None])[0],
        "num_hidden_layers": int(c["num_hidden_layers"]),
        "hidden_size": int(c["hidden_size"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(c.get("num_key_value_heads") or heads),
        "head_dim": int(c.get("head_dim") or c["hidden_size"] // heads),
        "vocab_size": int(c["vocab_size"]),
        "max_position_embeddings": int(c["max_position_embeddings"]),
        "rope_theta": float(theta) if theta is not None else 10000.0,
        "rope_scaling": scaling,
        "norm_epsilon": float(c.get("rms_norm_eps", c.get("layer_norm_eps", 1e-5))),
        "dtype": c.get("dtype") or c.get("torch_dtype") or "float16",
    }


def _linear_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    import torch

    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def excluded_modules(qcfg: Any, linear_names: list[str], num_layers: int) -> dict[str, str]:
    """Linear modules kept in high precision and why: ``{module name: reason}``.

    ``quant.exclude_modules`` entries are fnmatch patterns of module names (``lm_head``,
    ``model.layers.0.*``; a bare name also matches as ``*.<name>``); ``quant.sensitive_preset`` adds
    the first and last decoder layers (``first_last``) and/or every attention output projection
    (``attn_out``).
    """
    import fnmatch
    import re

    out: dict[str, str] = {}
    for name in linear_names:
        for pat in qcfg.exclude_modules:
            if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(name, f"*.{pat}") or fnmatch.fnmatchcase(name, f"{pat}.*"):
                out[name] = f"quant.exclude_modules: {pat}"
                break
    preset = qcfg.sensitive_preset
    if preset in ("first_last", "first_last_attn_out"):
        edge = {0, num_layers - 1}
        for name in linear_names:
            m = re.search(r"\.layers\.(\d+)\.", f".{name}.")
            if m and int(m.group(1)) in edge and name not in out:
                out[name] = f"sensitive_preset: first/last decoder layer {m.group(1)}"
    if preset in ("attn_out", "first_last_attn_out"):
        for name in linear_names:
            if name not in out and any(fnmatch.fnmatchcase(name, p) for p in ATTN_OUT_PATTERNS):
                out[name] = "sensitive_preset: attention output projection"
    return out


def modelopt_config(qcfg: Any, excluded: dict[str, str], recipe_name: str | None = None) -> dict[str, Any]:
    """The ModelOpt ``mtq.quantize`` config for ``quant`` (a deep copy of the recipe's ModelOpt constant).

    Changes applied: ``block_sizes[-1] = quant.group_size`` for grouped recipes; SmoothQuant
    ``alpha = quant.smoothquant_alpha``; the KV-cache quantizer entries of ``quant.kv_cache_dtype``; one
    ``enable: False`` entry per excluded module (``<module>.*``), last so that it wins.
    ``recipe_name`` overrides ``quant.recipe`` (the candidate formats of ``quant=auto``).
    """
    import modelopt.torch.quantization as mtq

    name = recipe_name or qcfg.recipe
    recipe = RECIPES[name]
    cfg = copy.deepcopy(getattr(mtq, recipe.modelopt_cfg))
    entries = cfg["quant_cfg"]
    if recipe.grouped:
        for e in entries:
            qc = e.get("cfg")
            for c in qc if isinstance(qc, list) else [qc]:
                if isinstance(c, dict) and isinstance(c.get("block_sizes"), dict) and -1 in c["block_sizes"]:
                    c["block_sizes"][-1] = int(qcfg.group_size)
    if name == "int8_sq":
        algo = cfg.get("algorithm")
        cfg["algorithm"] = {**(algo if isinstance(algo, dict) else {"method": "smoothquant"}), "alpha": float(qcfg.smoothquant_alpha)}
    entries.extend(copy.deepcopy(KV_CACHE[qcfg.kv_cache_dtype][1]))
    for name in sorted(excluded):
        entries.append({"quantizer_name": f"{name}.*", "enable": False})
    return cfg


# --------------------------------------------------------------------------- checks before calibration
def preflight(
    qcfg: Any, facts: dict[str, Any], linears: dict[str, tuple[int, int]], excluded: dict[str, str], target_gpu: str | None
) -> dict[str, Any]:
    """Checks that must pass before any calibration; returns the facts they establish.

    Collects every problem and raises one :class:`InputError` listing them all (field, value, fix).

    * grouped recipes: for every quantized Linear, ``in_features / tp_size`` is an integer multiple of
      ``quant.group_size`` (the INT4 kernels quantize whole groups per TP shard); lists offending
      modules/dims, the group sizes and the TP sizes that would work;
    * ``num_attention_heads % tp_size == 0``; KV heads divisible by tp_size, or tp_size a multiple of
      them (then each KV head is replicated ``tp_size / kv_heads`` times, recorded); lists valid TP sizes;
    * ``vocab_size % tp_size``: padded to the next multiple (``quant.vocab_padding=pad``, original and
      padded sizes recorded; TensorRT-LLM pads the same way) or rejected (``reject``);
    * ``pp_size <= num_hidden_layers``;
    * ``target.gpu`` set: the recipe and KV format must run on its compute capability (TensorRT-LLM support
      matrix, docs/reference/tensorrt_llm.md §4: FP8 and W4A8 need SM 8.9+).

    Args:
        linears: ``{module name: (in_features, out_features)}`` of the model's Linear layers.
    """
    from .config.common import Problem

    problems: list[Problem] = []
    tp, pp = int(qcfg.tp_size), int(qcfg.pp_size)
    recipe = RECIPES[qcfg.recipe]
    out: dict[str, Any] = {"tp_size": tp, "pp_size": pp}
    heads, kv, vocab = facts["num_attention_heads"], facts["num_key_value_heads"], facts["vocab_size"]
    quantized = {n: d for n, d in linears.items() if n not in excluded and qcfg.recipe != "none"}
    if qcfg.recipe == "none" and qcfg.kv_cache_dtype != "none":
        problems.append(
            Problem(
                "quant.kv_cache_dtype",
                qcfg.kv_cache_dtype,
                "a quantized KV cache needs calibrated K/V scales, and recipe 'none' calibrates nothing.",
                f"use quant.kv_cache_dtype=none, or a quantized recipe, e.g. quant=int8_sq quant.kv_cache_dtype={qcfg.kv_cache_dtype}",
            )
        )
    if qcfg.recipe != "none" and not [n for n in quantized if not n.endswith("lm_head")]:
        problems.append(
            Problem(
                "quant.exclude_modules",
                list(qcfg.exclude_modules),
                f"with sensitive_preset={qcfg.sensitive_preset!r} every linear layer of the model is kept in high precision "
                f"({len(excluded)} excluded), so recipe {qcfg.recipe!r} would quantize nothing.",
                "exclude fewer modules, use quant.sensitive_preset=none, or quant=none",
            )
        )
    grouped = recipe.grouped or (qcfg.recipe == "auto" and any(RECIPES[f].grouped for f in qcfg.auto.formats))
    if grouped and quantized:
        g = int(qcfg.group_size)

        def fits(dims: list[int], t: int, gs: int) -> bool:
            return all(d % t == 0 and (d // t) % gs == 0 for d in dims)

        dims = sorted({d[0] for d in quantized.values()})
        bad = [d for d in dims if not fits([d], tp, g)]
        if bad:
            mods = [n for n, d in quantized.items() if d[0] in bad]
            ok_g = [x for x in (128, 64, 32) if fits(dims, tp, x)]
            ok_tp = [t for t in range(1, 17) if fits(dims, t, g)]
            problems.append(
                Problem(
                    "quant.group_size",
                    g,
                    f"with tp_size={tp}, the input dimension(s) {bad} of {len(mods)} quantized linear layer(s) (e.g. {mods[:3]}) "
                    f"give per-rank sizes {[d // tp if d % tp == 0 else d / tp for d in bad]} that are not multiples of the group size.",
                    (f"use quant.group_size in {ok_g}" if ok_g else "no group size of 128/64/32 fits")
                    + (f" or quant.tp_size in {ok_tp}" if ok_tp else f" and no tp_size fits group_size={g}")
                    + ", or keep those layers in high precision with quant.exclude_modules",
                )
            )
    valid_tp = [t for t in range(1, heads + 1) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]
    if heads % tp:
        problems.append(Problem("quant.tp_size", tp, f"does not divide num_attention_heads={heads}.", f"use quant.tp_size in {valid_tp}"))
    elif kv % tp and tp % kv:
        problems.append(
            Problem(
                "quant.tp_size",
                tp,
                f"neither divides num_key_value_heads={kv} nor is a multiple of it (KV heads cannot be split or replicated evenly).",
                f"use quant.tp_size in {valid_tp}",
            )
        )
    elif tp > kv:
        out["kv_heads_replicated"] = tp // kv
    if vocab % tp:
        padded = -(-vocab // tp) * tp
        if qcfg.vocab_padding == "reject":
            ok = [t for t in range(1, 17) if vocab % t == 0 and t in valid_tp]
            problems.append(
                Problem(
                    "quant.vocab_padding",
                    "reject",
                    f"vocab_size={vocab} is not divisible by tp_size={tp}.",
                    f"set quant.vocab_padding=pad (pads to {padded}) or quant.tp_size in {ok}",
                )
            )
        else:
            out["vocab_padding"] = {"original": vocab, "padded": padded}
    if pp > facts["num_hidden_layers"]:
        problems.append(
            Problem(
                "quant.pp_size",
                pp,
                f"exceeds num_hidden_layers={facts['num_hidden_layers']}.",
                f"use quant.pp_size <= {facts['num_hidden_layers']}",
            )
        )
    gpu = None
    if target_gpu:
        try:
            gpu = _gpu_facts(target_gpu)
        except InputError as e:
            problems.append(Problem("target.gpu", target_gpu, str(e).split(": ", 1)[-1], "use a GPU name from the planner catalogue"))
    if gpu is not None:
        sm, rmin, kmin, src = gpu
        out["target_gpu"] = {"name": target_gpu, "sm": sm, "source": src}
        if sm < rmin.get(qcfg.recipe, 0):
            ok = [r for r in RECIPES if sm >= rmin.get(r, 0)]
            problems.append(
                Problem(
                    "quant.recipe",
                    qcfg.recipe,
                    f"needs compute capability >= {rmin[qcfg.recipe] / 10:.1f}; target.gpu={target_gpu} is SM {sm / 10:.1f}.",
                    f"use one of {ok} (e.g. int4_awq or int8_sq), or a newer GPU (Ada/Hopper)",
                )
            )
        if sm < kmin.get(qcfg.kv_cache_dtype, 0):
            ok = [k for k in KV_CACHE if sm >= kmin.get(k, 0)]
            problems.append(
                Problem(
                    "quant.kv_cache_dtype",
                    qcfg.kv_cache_dtype,
                    f"needs compute capability >= {kmin[qcfg.kv_cache_dtype] / 10:.1f}; target.gpu={target_gpu} is SM {sm / 10:.1f}.",
                    f"use quant.kv_cache_dtype in {ok}",
                )
            )
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise InputError(f"quantize: {len(problems)} problem(s) found before calibration:\n{lines}")
    return out


# --------------------------------------------------------------------------- quant=auto (per-layer format search)
def auto_min_bits(qcfg: Any, linears: dict[str, tuple[int, int]], excluded: dict[str, str]) -> float:
    """The smallest ``effective_bits`` ``quant=auto`` can reach: every searched Linear in the lowest-bit candidate
    format, every excluded one at 16 bits (ModelOpt's ``auto_quantize`` weight cost model counts all Linear weights)."""
    low = min(RECIPES[f].weight_bits for f in qcfg.auto.formats)
    total = sum(i * o for i, o in linears.values())
    cost = sum(i * o * (16 if n in excluded else low) for n, (i, o) in linears.items())
    return cost / total if total else 16.0


def auto_search(model: torch.nn.Module, qcfg: Any, excluded: dict[str, str], batches: list[list[list[int]]], seed: int) -> dict[str, Any]:
    """Run ModelOpt's per-layer format search (``mtq.auto_quantize``) on ``model`` in place.

    Candidates: the ModelOpt configs of ``quant.auto.formats`` (with ``quant.group_size``), plus "not quantized",
    which ModelOpt always adds. ModelOpt calibrates every candidate on all ``batches``, scores each layer group
    (q/k/v share one format, as do gate/up: TensorRT-LLM fuses them) on the first ``quant.auto.num_score_steps``
    batches, and picks the formats that minimise the summed score under ``constraints.effective_bits``
    (``method=kl_div``: KL divergence of the model's output with only that group quantized, threshold search;
    ``gradient``: Taylor estimate of the causal-LM loss change, linear programming).

    Args:
        batches: token-id batches (each a list of equal-length rows, as :meth:`CalibrationSet.batches`).
    Returns:
        The report section: ``effective_bits`` (budget, achieved, satisfied), ``method``, ``formats``,
        ``layers`` (per group: ``layer``, ``modules``, ``format``, ``scores`` {format: score}, ``bits``
        {format: bits}, ``sensitivity`` = the score of the lowest-bit candidate) and ``per_module``
        {module: format}.
    Raises:
        InputError: the budget is below what the candidate formats can reach.
    """
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.quantization.algorithms import QuantRecipe

    a = qcfg.auto
    cfgs, labels = [], {"NONE": "none"}
    for i, f in enumerate(a.formats):
        c = modelopt_config(qcfg, {}, f)
        cfgs.append(c)
        labels[QuantRecipe.get_auto_name_for_config(c) or f"CUSTOM_{i}"] = f
    data = [torch.tensor(ids, dtype=torch.long) for ids in batches]

    def forward_step(m: Any, ids: torch.Tensor) -> Any:
        return m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits

    def loss_func(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # causal-LM loss (gradient method)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    def label(r: Any) -> str:
        return labels.get(str(r).split("(")[0], str(r))

    torch.manual_seed(seed)
    kw: dict[str, Any] = {"loss_func": loss_func} if a.method == "gradient" else {}
    with _quiet("mtq.auto_quantize"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Received custom quantization formats")
        _, state = mtq.auto_quantize(
            model,
            constraints={"effective_bits": float(a.effective_bits)},
            quantization_formats=cfgs,
            data_loader=data,
            forward_step=forward_step,
            disabled_layers=sorted(excluded) or None,
            num_calib_steps=len(data),
            num_score_steps=min(len(data), int(a.num_score_steps)),
            method=a.method,
            verbose=False,
            **kw,
        )
    best = state["best"]
    layers, per_module = [], {}
    for key, st in state["candidate_stats"].items():
        fmts = [label(f) for f in st["formats"]]
        chosen = label(best["recipe"].get(key, "NONE"))
        bits = {
            f: float(str(r).split("effective-bits:")[1].rstrip(")").strip()) if "effective-bits:" in str(r) else None
            for f, r in zip(fmts, st["formats"])
        }
        scores = {f: float(x) for f, x in zip(fmts, st["scores"])}
        low = min((f for f in fmts if f != "none"), key=lambda f: bits.get(f) or 16.0, default="none")
        mods = list(st["module_names"])
        layers.append(
            {
                "layer": key.removesuffix(".quant_recipe"),
                "modules": mods,
                "format": chosen,
                "scores": scores,
                "bits": bits,
                "sensitivity": scores.get(low),
            }
        )
        for n in mods:
            per_module[n] = chosen
    return {
        "method": a.method,
        "formats": list(a.formats),
        "num_score_steps": min(len(data), int(a.num_score_steps)),
        "effective_bits": {
            "budget": float(a.effective_bits),
            "achieved": float(best["constraints"].get("effective_bits", float("nan"))),
            "satisfied": bool(best.get("is_satisfied")),
        },
        "layers": layers,
        "per_module": per_module,
    }


def auto_quant_algo(per_module: dict[str, str]) -> str | None:
    """TensorRT-LLM ``quant_algo`` ModelOpt writes for a searched model: the one format's, or MIXED_PRECISION
    (``modelopt/torch/export/quant_utils.py``: more than one layer format) with per-layer ``quant_cfg.json``."""
    algos = {RECIPES[f].quant_algo for f in per_module.values() if f != "none"}
    if not algos:
        return None
    return algos.pop() if len(algos) == 1 else "MIXED_PRECISION"


# --------------------------------------------------------------------------- checks after export
def check_trtllm_checkpoint(
    ckpt: Path, facts: dict[str, Any], qcfg: Any, pre: dict[str, Any], quant_algo: str | None = None
) -> dict[str, Any]:
    """Repair known exporter omissions, then verify the TensorRT-LLM checkpoint against the source model.

    Repair (recorded in the result's ``patched``): ModelOpt 0.47 reads ``rope_theta``/``rope_scaling`` as
    model-config attributes, which transformers 5 moved into ``rope_parameters``; it then writes no
    ``rotary_base``/``rotary_scaling`` and TensorRT-LLM would silently use base 10000 without scaling.
    Missing fields are written from the source config; a *different* value is never overwritten.

    Checks (InputError listing all mismatches): ``rotary_base``, ``rotary_scaling``,
    ``max_position_embeddings``, ``vocab_size``, ``num_attention_heads``, ``num_key_value_heads``,
    ``head_size``, ``num_hidden_layers``, ``norm_epsilon`` equal the source's; ``quant_algo`` and
    ``kv_cache_quant_algo`` are the recipe's (``quant_algo`` overrides it: quant=auto's result); ``mapping`` has the configured tp/pp; one
    ``rank{N}.safetensors`` per rank; with a quantized KV cache every attention layer has a finite,
    positive ``kv_cache_scaling_factor``; embedding/lm_head shards have ``padded_vocab / tp`` rows.
    """
    import math

    from safetensors import safe_open

    from .store import write_json_atomic

    cpath = ckpt / "config.json"
    c = json.loads(cpath.read_text(encoding="utf-8"))
    patched: dict[str, Any] = {}
    if "rotary_base" not in c:
        c["rotary_base"] = facts["rope_theta"]
        patched["rotary_base"] = facts["rope_theta"]
    if facts["rope_scaling"] and not c.get("rotary_scaling"):
        sc = dict(facts["rope_scaling"])
        sc.setdefault("type", sc.get("rope_type"))
        c["rotary_scaling"] = sc
        patched["rotary_scaling"] = sc
    if patched:
        write_json_atomic(cpath, c)
    errs: list[str] = []

    def eq(field: str, got: Any, want: Any) -> None:
        same = (
            math.isclose(float(got), float(want), rel_tol=1e-9)
            if isinstance(want, float) and isinstance(got, (int, float))
            else got == want
        )
        if not same:
            errs.append(f"{field}: exported {got!r} != source {want!r}")

    eq("rotary_base", c.get("rotary_base"), facts["rope_theta"])
    want_sc = facts["rope_scaling"]
    got_sc = c.get("rotary_scaling")
    if want_sc:
        if (
            not isinstance(got_sc, dict)
            or any(got_sc.get(k) != v for k, v in want_sc.items() if k not in ("type", "rope_type"))
            or (got_sc.get("rope_type") or got_sc.get("type")) != want_sc.get("rope_type")
        ):
            errs.append(f"rotary_scaling: exported {got_sc!r} != source {want_sc!r}")
    elif got_sc:
        errs.append(f"rotary_scaling: exported {got_sc!r} but the source has none")
    algo = quant_algo if quant_algo is not None else RECIPES[qcfg.recipe].quant_algo
    awq_padded = None
    if (
        facts["vocab_size"] % AWQ_VOCAB_MULTIPLE
        and c.get("vocab_size") == -(-facts["vocab_size"] // AWQ_VOCAB_MULTIPLE) * AWQ_VOCAB_MULTIPLE
        and algo in ("W4A16_AWQ", "W4A8_AWQ", "MIXED_PRECISION")
    ):
        # ModelOpt pads embedding and lm_head rows to a multiple of 64 when it exports AWQ-format weights
        # (modelopt/torch/export/postprocess.py pad_embedding_lm_head); the padded rows are zeros.
        awq_padded = int(c["vocab_size"])
    eq("vocab_size", c.get("vocab_size"), awq_padded or facts["vocab_size"])
    for f, k in (
        ("max_position_embeddings", "max_position_embeddings"),
        ("num_attention_heads", "num_attention_heads"),
        ("num_key_value_heads", "num_key_value_heads"),
        ("head_size", "head_dim"),
        ("num_hidden_layers", "num_hidden_layers"),
    ):
        eq(f, c.get(f), facts[k])
    eq("norm_epsilon", c.get("norm_epsilon"), facts["norm_epsilon"])
    q = c.get("quantization") or {}
    eq("quantization.quant_algo", q.get("quant_algo"), quant_algo if quant_algo is not None else RECIPES[qcfg.recipe].quant_algo)
    eq("quantization.kv_cache_quant_algo", q.get("kv_cache_quant_algo"), KV_CACHE[qcfg.kv_cache_dtype][0])
    m = c.get("mapping") or {}
    eq("mapping.tp_size", m.get("tp_size"), int(qcfg.tp_size))
    eq("mapping.pp_size", m.get("pp_size", 1), int(qcfg.pp_size))
    world = int(qcfg.tp_size) * int(qcfg.pp_size)
    ranks = sorted(ckpt.glob("rank*.safetensors"))
    if [p.name for p in ranks] != [f"rank{i}.safetensors" for i in range(world)]:
        errs.append(f"rank files: {[p.name for p in ranks]} (expected rank0..rank{world - 1}.safetensors)")
    padded = (pre.get("vocab_padding") or {}).get("padded", facts["vocab_size"])
    if awq_padded:
        padded = -(-awq_padded // int(qcfg.tp_size)) * int(qcfg.tp_size)
    # layer indices are local to a pipeline rank (rank = pp_rank * tp_size + tp_rank); map them to global ones
    kv_local: dict[tuple[int, int], float] = {}
    layers_per_pp: dict[int, int] = {}
    shard_rows: set[int] = set()
    for r, p in enumerate(ranks):
        pp_rank = r // int(qcfg.tp_size)
        with safe_open(str(p), "pt") as f:
            for k in f.keys():
                if k in ("lm_head.weight", "transformer.vocab_embedding.weight"):
                    shard_rows.add(f.get_slice(k).get_shape()[0])
                if k.startswith("transformer.layers."):
                    local = int(k.split(".")[2])
                    layers_per_pp[pp_rank] = max(layers_per_pp.get(pp_rank, 0), local + 1)
                if k.endswith("attention.kv_cache_scaling_factor"):
                    local = int(k.split(".layers.")[1].split(".")[0])
                    t = f.get_tensor(k).float()
                    v = float(t.min()) if bool(t.isfinite().all()) else float("nan")
                    kv_local[(pp_rank, local)] = min(kv_local.get((pp_rank, local), math.inf), v)
    offsets, acc = {}, 0
    for pr in sorted(layers_per_pp):
        offsets[pr], acc = acc, acc + layers_per_pp[pr]
    kv_layers = {offsets.get(pr, 0) + local: v for (pr, local), v in kv_local.items()}
    if shard_rows and shard_rows != {padded // int(qcfg.tp_size)}:
        errs.append(f"embedding/lm_head shard rows {sorted(shard_rows)} != padded vocab {padded} / tp_size {qcfg.tp_size}")
    if qcfg.kv_cache_dtype != "none":
        n = facts["num_hidden_layers"]
        missing = [i for i in range(n) if i not in kv_layers]
        bad = {i: v for i, v in kv_layers.items() if not (math.isfinite(v) and v > 0)}
        if missing:
            errs.append(f"kv_cache_scaling_factor missing on attention layer(s) {missing}")
        if bad:
            errs.append(f"kv_cache_scaling_factor not finite and positive on layer(s) {bad}")
    if errs:
        raise InputError(
            f"{cpath}: the exported TensorRT-LLM checkpoint does not match the source model:\n"
            + "\n".join(f"  - {e}" for e in errs)
            + "\nFix: this is an exporter problem for this architecture/recipe; report it with the quant_report.json."
        )
    return {
        "patched": patched,
        "ranks": [p.name for p in ranks],
        "vocab_padded": (
            {"original": facts["vocab_size"], "padded": awq_padded, "by": "ModelOpt AWQ export (multiple of 64, zero rows)"}
            if awq_padded
            else None
        ),
        "kv_cache_scales": {str(k): v for k, v in sorted(kv_layers.items())},
        "config": {
            k: c.get(k) for k in ("architecture", "dtype", "vocab_size", "rotary_base", "rotary_scaling", "quantization", "mapping")
        },
    }


# --------------------------------------------------------------------------- per-module precision
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def _describe_quantizer(q: Any) -> str | None:
    """'int4/g128', 'int8/channel', 'fp8/tensor' ... for an enabled ModelOpt quantizer, else None."""
    subs = list(q) if hasattr(q, "__iter__") and not hasattr(q, "num_bits") else [q]
    parts = []
    for s in subs:
        if not getattr(s, "is_enabled", False):
            continue
        nb = s.num_bits
        fmt = f"fp{1 + nb[0] + nb[1]}" if isinstance(nb, (tuple, list)) else f"int{nb}"
        bs = getattr(s, "block_sizes", None)
        if bs and bs.get(-1):
            gran = f"g{bs[-1]}"
        elif getattr(s, "axis", None) is not None:
            gran = "channel"
        else:
            gran = "tensor"
        parts.append(f"{fmt}/{gran}")
    return "+".join(parts) or None


def module_precisions(
    model: torch.nn.Module,
    excluded: dict[str, str],
    recipe: Recipe,
    group_size: int,
    source_dtype: str,
    export_dtype: str,
    per_module: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Per Linear module: the weight and activation format it got, parameter count and estimated bytes.

    ``bytes_before`` = params x bytes(source dtype); ``bytes_after`` = params x weight bits / 8 plus the
    scales (group-wise: one fp16 scale per group; per-channel: one fp32 scale per output row; per-tensor:
    one fp32), following the TensorRT-LLM checkpoint layout (``weights_scaling_factor`` tensors); a module
    left in high precision costs params x bytes(quant.export_dtype). ``per_module`` (quant=auto): module name ->
    the recipe the search chose for it (its bits and grouping are used instead of ``recipe``'s).
    """
    out = []
    chosen = recipe
    for name, m in _linear_modules(model).items():
        if per_module is not None:
            chosen = RECIPES.get(per_module.get(name, "none"), recipe)
        n_out, n_in = m.weight.shape
        params = n_out * n_in
        wq = getattr(m, "weight_quantizer", None)
        wfmt = _describe_quantizer(wq) if wq is not None else None
        iq = getattr(m, "input_quantizer", None)
        afmt = _describe_quantizer(iq) if iq is not None else None
        before = params * _DTYPE_BYTES.get(source_dtype, 2)
        if wfmt is None:
            after, precision = params * _DTYPE_BYTES[export_dtype], export_dtype
        else:
            bits = chosen.weight_bits
            if chosen.grouped:
                scales = (params // group_size) * 2
            elif "channel" in wfmt:
                scales = n_out * 4
            else:
                scales = 4
            after = params * bits // 8 + scales
            precision = chosen.quant_algo or wfmt
        out.append(
            {
                "module": name,
                "shape": [int(n_out), int(n_in)],
                "params": int(params),
                "weight": wfmt or export_dtype,
                "activation": afmt or export_dtype,
                "precision": precision,
                "kept_high_precision": excluded.get(name) or (None if wfmt else "ModelOpt default (not quantized by the recipe)"),
                "bytes_before": int(before),
                "bytes_after": int(after),
            }
        )
    return out


def _files_bytes(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern) if p.is_file())


# --------------------------------------------------------------------------- the plain function
def quantize(cfg: Any, export_dir: Path, calib_path: Path | None, out: Path, *, progress: Any = None) -> dict[str, Any]:
    """Quantize the export artifact with ModelOpt and write the quantize artifact into ``out``.

    Steps: source facts -> load the export checkpoint in float32 (CPU calibration) -> checks before
    calibration (:func:`preflight`) -> calibration set (:func:`pipeline.calibration.load_calibration`)
    -> ``mtq.quantize`` -> ``quant_state.*`` -> TensorRT-LLM checkpoint
    (``export_tensorrt_llm_checkpoint``, tp/pp ranks) -> checks after export
    (:func:`check_trtllm_checkpoint`) -> unified HF checkpoint (``export_hf_checkpoint``; for
    ``none`` the export's files, hard-linked) -> ``quant_report.json``/``.md``.

    Args:
        cfg: the whole :class:`pipeline.config.PipelineConfig` (reads ``quant``, ``calibration``, ``target.gpu``).
        export_dir: the export artifact folder (``hf/``, ``model_info.json``).
        calib_path: the resolved calibration file (None for ``none`` or ``format: hf``).
        out: the folder to write into.
        progress: optional ``progress(description, total)`` context manager factory (``StageContext.progress``).
    Returns:
        The stage result (``headline``: recipe, kv_cache, compression, calib_samples).
    Raises:
        InputError: failed checks, bad calibration input.
    """

    import torch

    threads_before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(getattr(cfg.calibration, "threads", 1))))
    try:
        return _quantize(cfg, export_dir, calib_path, out, progress)
    finally:
        torch.set_num_threads(threads_before)


def _quantize(cfg: Any, export_dir: Path, calib_path: Path | None, out: Path, progress: Any) -> dict[str, Any]:
    import contextlib
    import time

    import torch
    import transformers as tf

    qcfg = cfg.quant
    t0 = time.time()
    timings: dict[str, float] = {}
    hf = _hf_dir(export_dir)
    facts = source_facts(hf)
    recipe = RECIPES[qcfg.recipe]
    out = Path(out)
    seed = int(cfg.calibration.seed)
    torch.manual_seed(seed)
    if facts["model_type"] not in DECODER_TYPES and facts["model_type"] not in NO_TRTLLM_CHECKPOINT:
        raise InputError(
            f"model_type={facts['model_type']!r}: ModelOpt {_version('nvidia-modelopt')} cannot write a TensorRT-LLM checkpoint "
            f"for this architecture (supported here: {sorted(DECODER_TYPES)}). Fix: skip the quantize stage for this model "
            "(build from the export artifact) or use a supported architecture."
        )
    model = tf.AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32, trust_remote_code=False)
    model.eval()
    linears = {n: (int(m.in_features), int(m.out_features)) for n, m in _linear_modules(model).items()}
    excluded = excluded_modules(qcfg, list(linears), facts["num_hidden_layers"]) if qcfg.recipe != "none" else {}
    pre = preflight(qcfg, facts, linears, excluded, getattr(cfg.target, "gpu", None))
    if qcfg.recipe == "auto":
        floor = auto_min_bits(qcfg, linears, excluded)
        if float(qcfg.auto.effective_bits) < floor - 1e-6:
            raise InputError(
                f"quant.auto.effective_bits={qcfg.auto.effective_bits}: below the {floor:.2f} bits per weight this model can "
                f"reach with formats {list(qcfg.auto.formats)} ({len(excluded)} Linear layer(s) kept at 16 bits: "
                f"{sorted(excluded)[:4]}). Fix: quant.auto.effective_bits >= {floor:.2f}, or exclude fewer modules."
            )
    timings["load_s"] = time.time() - t0
    prog = progress or (lambda d, t: contextlib.nullcontext(lambda n=1: None))
    calib_stats: dict[str, Any] | None = None
    calib_warnings: list[str] = []
    mcfg: dict[str, Any] | None = None
    auto: dict[str, Any] | None = None
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if qcfg.recipe != "none":
        import modelopt.torch.quantization as mtq

        from .calibration import load_calibration

        tok = tf.AutoTokenizer.from_pretrained(str(hf), trust_remote_code=False)
        cset = load_calibration(cfg.calibration, tok, calib_path)
        calib_stats, calib_warnings = cset.stats, cset.warnings
        t1 = time.time()
        if qcfg.recipe == "auto":
            mcfg = {"auto_quantize": {f: modelopt_config(qcfg, {}, f) for f in qcfg.auto.formats}}
            with prog("searching per-layer formats (auto_quantize)", 1) as advance:
                auto = auto_search(model, qcfg, excluded, [ids for _, ids in cset.batches(int(cfg.calibration.batch_size))], seed)
                advance(1)
            model.eval()
        else:
            mcfg = modelopt_config(qcfg, excluded)
            with prog(f"calibrating {qcfg.recipe}", len(cset.samples)) as advance:
                loop = cset.forward_loop(int(cfg.calibration.batch_size), progress=advance)
                torch.manual_seed(seed)
                with torch.no_grad(), _quiet("mtq.quantize"):
                    mtq.quantize(model, mcfg, loop)
        timings["calibration_s"] = time.time() - t1
        calib_stats["batches"] = len(cset.batches(int(cfg.calibration.batch_size)))
        calib_stats["tokens_trimmed"] = cset.trimmed_tokens(int(cfg.calibration.batch_size))
    precisions = module_precisions(
        model,
        excluded,
        recipe,
        int(qcfg.group_size),
        str(facts["dtype"]),
        qcfg.export_dtype,
        per_module=auto["per_module"] if auto else None,
    )
    quant_algo = auto_quant_algo(auto["per_module"]) if auto else recipe.quant_algo
    meta = {
        "recipe": qcfg.recipe,
        "kv_cache": qcfg.kv_cache_dtype,
        "calib_dtype": "float32",
        "modelopt_config": _encode_state(mcfg, {}) if mcfg is not None else None,
        "quant_algo": quant_algo,
        "kv_cache_quant_algo": KV_CACHE[qcfg.kv_cache_dtype][0],
        "group_size": int(qcfg.group_size),
    }
    if qcfg.recipe == "none":
        from safetensors.torch import save_file

        save_file({}, str(out / QUANT_STATE_TENSORS), metadata={"schema": QUANT_STATE_SCHEMA})
        (out / QUANT_STATE_JSON).write_text(
            json.dumps(
                {"schema": QUANT_STATE_SCHEMA, **meta, "modelopt_state": None, "quantizer_buffers": [], "changed_weights": []},
                indent=1,
                sort_keys=True,
            )
            + "\n",
            encoding="utf-8",
        )
    else:
        probe = torch.tensor([cset.samples[0][:32]], dtype=torch.long)
        save_quant_state(model, base, out, meta, probe_ids=probe)
    del base
    # TensorRT-LLM checkpoint (exporters may rewrite the model's weights in place: export from copies)
    import modelopt.torch.export as mte

    edtype = getattr(torch, qcfg.export_dtype)
    t2 = time.time()
    ckpt = out / "trtllm_checkpoint"
    decoder = DECODER_TYPES.get(facts["model_type"])
    torch.manual_seed(seed)
    hf_notes: list[str] = []
    if decoder is None:  # NO_TRTLLM_CHECKPOINT: recorded here; target=tensorrt_llm refuses the model at config time
        ckpt.mkdir()
        (ckpt / "NOT_EXPORTED").write_text(NO_TRTLLM_CHECKPOINT[facts["model_type"]] + "\n", encoding="utf-8")
        hf_notes.append(f"no TensorRT-LLM checkpoint: {NO_TRTLLM_CHECKPOINT[facts['model_type']]}")
        post: dict[str, Any] = {"skipped": NO_TRTLLM_CHECKPOINT[facts["model_type"]]}
    else:
        with _quiet("export_tensorrt_llm_checkpoint"):
            mte.export_tensorrt_llm_checkpoint(
                copy.deepcopy(model),
                decoder,
                edtype,
                export_dir=ckpt,
                inference_tensor_parallel=int(qcfg.tp_size),
                inference_pipeline_parallel=int(qcfg.pp_size),
            )
        post = check_trtllm_checkpoint(ckpt, facts, qcfg, pre, quant_algo=quant_algo if auto else None)
    timings["export_trtllm_s"] = time.time() - t2
    # unified HF checkpoint
    t3 = time.time()
    if qcfg.recipe == "none":
        _link_tree(hf, out / "hf")
    else:
        hmodel = copy.deepcopy(model)
        if qcfg.kv_cache_dtype == "int8":
            # ModelOpt's unified HF format has no INT8 KV cache (export_hf_checkpoint asserts); the INT8
            # KV scales live in trtllm_checkpoint/, the hf/ copy carries the weights without them.
            for n, mod in hmodel.named_modules():
                if n.endswith(("k_bmm_quantizer", "v_bmm_quantizer")) and hasattr(mod, "disable"):
                    mod.disable()
                    if "_amax" in getattr(mod, "_buffers", {}):
                        del mod._buffers["_amax"]  # the exporter turns any KV amax into a (FP8-only) scale
            hf_notes.append(
                "INT8 KV-cache scales are not representable in ModelOpt's unified HF format; they are only in trtllm_checkpoint/"
            )
        with _quiet("export_hf_checkpoint"):
            mte.export_hf_checkpoint(hmodel, edtype, export_dir=out / "hf")
        del hmodel
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json"):
            if (hf / f).is_file() and not (out / "hf" / f).exists():
                _link_file(hf / f, out / "hf" / f)
    timings["export_hf_s"] = time.time() - t3
    timings["total_s"] = time.time() - t0
    before = _files_bytes(hf, "*.safetensors")
    after = _files_bytes(ckpt, "rank*.safetensors")
    report = {
        "schema": "pipeline.quant_report/v1",
        "recipe": qcfg.recipe,
        "description": recipe.description,
        "kv_cache": qcfg.kv_cache_dtype,
        "quant_algo": quant_algo,
        "kv_cache_quant_algo": KV_CACHE[qcfg.kv_cache_dtype][0],
        "group_size": int(qcfg.group_size) if recipe.grouped or (auto and any(RECIPES[f].grouped for f in auto["formats"])) else None,
        "smoothquant_alpha": float(qcfg.smoothquant_alpha) if qcfg.recipe == "int8_sq" else None,
        "export_dtype": qcfg.export_dtype,
        "source_dtype": facts["dtype"],
        "tp_size": int(qcfg.tp_size),
        "pp_size": int(qcfg.pp_size),
        "preflight": pre,
        "export_checks": post,
        "excluded_modules": excluded,
        "modules": precisions,
        "bytes": {
            "source_safetensors": before,
            "trtllm_rank_files": after,
            "modules_before": sum(p["bytes_before"] for p in precisions),
            "modules_after": sum(p["bytes_after"] for p in precisions),
        },
        "compression": round(before / after, 4) if after else None,
        "auto": {k: v for k, v in auto.items() if k != "per_module"} if auto else None,
        "calibration": calib_stats,
        "warnings": _deprecation_notes(qcfg.recipe) + calib_warnings + hf_notes,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "modelopt_version": _version("nvidia-modelopt"),
        "torch_version": torch.__version__,
    }
    from .store import write_json_atomic

    write_json_atomic(out / "quant_report.json", report)
    (out / "quant_report.md").write_text(render_report_md(report), encoding="utf-8")
    return {
        "headline": {
            "recipe": qcfg.recipe,
            "kv_cache": qcfg.kv_cache_dtype,
            "compression": report["compression"],
            "calib_samples": calib_stats["used"] if calib_stats else 0,
        },
        "quant_algo": quant_algo,
        "kv_cache_quant_algo": KV_CACHE[qcfg.kv_cache_dtype][0],
        "tp_size": int(qcfg.tp_size),
        "pp_size": int(qcfg.pp_size),
        "calibration_s": round(timings.get("calibration_s", 0.0), 3),
        "warnings": report["warnings"],
    }


def _deprecation_notes(recipe: str) -> list[str]:
    """Warnings for a deprecated ``quant.recipe`` name (:data:`pipeline.config.quant.DEPRECATED_RECIPES`); also logged."""
    from .config.quant import DEPRECATED_RECIPES

    if recipe not in DEPRECATED_RECIPES:
        return []
    note = (
        f"quant.recipe={recipe!r} is a deprecated alias of {DEPRECATED_RECIPES[recipe]!r} (same ModelOpt config, same result); "
        f"use quant={DEPRECATED_RECIPES[recipe]}"
    )
    log.warning(note)
    return [note]


class _quiet:
    """Send ModelOpt's ``print`` chatter (stdout) to the debug log instead of the user's terminal."""

    def __init__(self, what: str) -> None:
        import io

        self.what, self.buf = what, io.StringIO()

    def __enter__(self) -> _quiet:
        import contextlib

        self._cm = contextlib.redirect_stdout(self.buf)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)
        text = self.buf.getvalue().strip()
        if text:
            log.debug("%s: %s", self.what, text)


def _version(dist: str) -> str | None:
    from .hostinfo import installed_version

    return installed_version(dist)


def _link_file(src: Path, dst: Path) -> None:
    import os
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link (else copy) every regular file of ``src`` into ``dst`` (no symlinks: artifacts are self-contained)."""
    for p in sorted(src.rglob("*")):
        if p.is_file() and not p.is_symlink():
            _link_file(p, dst / p.relative_to(src))


def render_report_md(r: dict[str, Any]) -> str:
    """The Markdown quant report (same facts as quant_report.json)."""
    mb = 1 << 20
    lines = [
        f"# Quantization report: {r['recipe']}",
        "",
        f"{r['description']}",
        "",
        "| field | value |",
        "|---|---|",
        f"| recipe | {r['recipe']} |",
        f"| quant_algo | {r['quant_algo']} |",
        f"| kv_cache | {r['kv_cache']} ({r['kv_cache_quant_algo']}) |",
        f"| group_size | {r['group_size']} |",
        f"| tp_size x pp_size | {r['tp_size']} x {r['pp_size']} |",
        f"| export dtype | {r['export_dtype']} |",
        f"| source weights | {r['bytes']['source_safetensors'] / mb:.2f} MiB |",
        f"| TensorRT-LLM rank files | {r['bytes']['trtllm_rank_files'] / mb:.2f} MiB |",
        f"| compression (source / rank files) | {r['compression']} |",
    ]
    cal = r.get("calibration")
    if cal:
        lines += [
            f"| calibration samples | {cal['used']} used of {cal['requested']} requested ({cal['available']} read, "
            f"{cal['blank_dropped']} blank dropped, {cal['short']} short, {cal['truncated']} truncated) |",
            f"| calibration tokens / batches | {cal['tokens']} ({cal.get('tokens_trimmed')} trimmed to keep batches padding-free) / {cal.get('batches')} |",
            f"| pad token | {cal['pad_token']!r}{' (set by the pipeline)' if cal['pad_token_set'] else ''} |",
        ]
    t = r["timings_s"]
    lines += [f"| time | calibration {t.get('calibration_s', 0):.2f} s, total {t['total_s']:.2f} s |", ""]
    pre = r.get("preflight") or {}
    for k in ("vocab_padding", "kv_heads_replicated", "target_gpu"):
        if k in pre:
            lines.append(f"- {k}: {pre[k]}")
    if r["export_checks"].get("patched"):
        lines.append(f"- config.json fields written from the source model (exporter omitted them): {r['export_checks']['patched']}")
    for w in r.get("warnings") or []:
        lines.append(f"- warning: {w}")
    auto = r.get("auto")
    if auto:
        eb = auto["effective_bits"]
        lines += [
            "",
            "## Per-layer format search (quant=auto, ModelOpt auto_quantize)",
            "",
            f"Budget {eb['budget']} effective bits, achieved {eb['achieved']:.3f} ({'satisfied' if eb['satisfied'] else 'NOT satisfied'}); "
            f"method {auto['method']} on {auto['num_score_steps']} batches; candidates {auto['formats']} + none. "
            "Sensitivity = the score of the lowest-bit candidate (higher = more sensitive).",
            "",
            "| layer | modules | format | sensitivity | scores |",
            "|---|---|---|---|---|",
        ]
        for g in auto["layers"]:
            sc = ", ".join(f"{k} {v:.4g}" for k, v in g["scores"].items())
            sens = f"{g['sensitivity']:.4g}" if g["sensitivity"] is not None else ""
            lines.append(f"| {g['layer']} | {len(g['modules'])} | {g['format']} | {sens} | {sc} |")
    lines += [
        "",
        "## Per-module precision",
        "",
        "| module | shape | weight | activation | precision | kept high precision | bytes before | bytes after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in r["modules"]:
        lines.append(
            f"| {m['module']} | {m['shape'][0]}x{m['shape'][1]} | {m['weight']} | {m['activation']} | {m['precision']} | "
            f"{m['kept_high_precision'] or ''} | {m['bytes_before']} | {m['bytes_after']} |"
        )
    return "\n".join(lines) + "\n"
