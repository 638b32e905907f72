"""The quantize artifact's ModelOpt state without pickle: ``quant_state.json`` + ``quant_state.safetensors``
(write, and rebuild the simulated-quantization model from them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..artifacts import QuantizeArtifact
from ..errors import InputError
from .common import KV_CACHE, _hf_dir

if TYPE_CHECKING:
    import torch

    from .calibrate import _Calibration

QUANT_STATE_SCHEMA = "pipeline.quant_state/v1"
QUANT_STATE_JSON = QuantizeArtifact.QUANT_STATE_JSON
QUANT_STATE_TENSORS = QuantizeArtifact.QUANT_STATE_TENSORS
_STATE_TENSOR_PREFIX = "__modelopt_state__."
PROBE_IDS, PROBE_LOGITS = "__probe__.input_ids", "__probe__.logits"


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
    model: Any = tf.AutoModelForCausalLM.from_pretrained(str(_hf_dir(export_dir)), dtype=want, trust_remote_code=False)
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


def _write_state(out: Path, qcfg: Any, model: Any, base: dict[str, Any], cal: _Calibration, quant_algo: str | None) -> None:
    """Write ``quant_state.json``/``.safetensors`` (:func:`save_quant_state`; an empty state for ``none``)."""
    import torch

    meta = {
        "recipe": qcfg.recipe,
        "kv_cache": qcfg.kv_cache_dtype,
        "calib_dtype": "float32",
        "modelopt_config": _encode_state(cal.modelopt_cfg, {}) if cal.modelopt_cfg is not None else None,
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
        probe = torch.tensor([cal.cset.samples[0][:32]], dtype=torch.long)
        save_quant_state(model, base, out, meta, probe_ids=probe)
