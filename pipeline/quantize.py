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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError

if TYPE_CHECKING:  # torch is imported lazily: `pipeline plan` and cache hits never pay for it
    import torch

log = logging.getLogger("pipeline.quantize")

QUANT_STATE_SCHEMA = "pipeline.quant_state/v1"
QUANT_STATE_JSON = "quant_state.json"
QUANT_STATE_TENSORS = "quant_state.safetensors"
_STATE_TENSOR_PREFIX = "__modelopt_state__."


# --------------------------------------------------------------------------- quant state (no pickle)
def _encode_state(obj: Any, tensors: dict[str, "torch.Tensor"]) -> Any:
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


def _decode_state(obj: Any, tensors: dict[str, "torch.Tensor"]) -> Any:
    import torch

    if isinstance(obj, list):
        return [_decode_state(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1:
            (k, v), = obj.items()
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


def save_quant_state(model: "torch.nn.Module", base_state: dict[str, "torch.Tensor"], out_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
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


def load_simulated_model(quant_dir: Path, export_dir: Path, device: str = "cpu", dtype: "torch.dtype | None" = None) -> "torch.nn.Module":
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
    own = {k: v for k, v in tensors.items() if not k.startswith(_STATE_TENSOR_PREFIX)}
    res = model.load_state_dict(own, strict=False)
    missing_q = [k for k in res.missing_keys if "_quantizer" in k]
    if res.unexpected_keys or missing_q:
        raise InputError(f"{quant_dir / QUANT_STATE_TENSORS}: does not fit the model from {export_dir} "
                         f"(unexpected {res.unexpected_keys[:5]}, missing quantizer buffers {missing_q[:5]}). "
                         "Quantize and export artifacts must come from the same run.")
    if dtype is not None:
        model.to(dtype)
    return model.to(device).eval()
