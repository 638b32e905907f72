"""The quantize artifact's ModelOpt state without pickle: ``quant_state.json`` + ``quant_state.safetensors``
(written here; read back by :func:`pipeline.core.quant_state.load_simulated_model`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.quant_state import (
    _STATE_TENSOR_PREFIX,
    PROBE_IDS,
    PROBE_LOGITS,
    QUANT_STATE_JSON,
    QUANT_STATE_SCHEMA,
    QUANT_STATE_TENSORS,
    _is_quantizer_key,
)
from .common import KV_CACHE, unused_fields

if TYPE_CHECKING:
    import torch

    from .calibrate import _Calibration
    from .placement import Placement


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


#: Keys of ModelOpt's state that describe this run rather than the quantization, stored as None so the quant state's
#: bytes depend on neither: ``checkpoint_dir`` (the folder of the layer-by-layer checkpoint, ``layerwise.checkpoint_dir``)
#: and ``_input_dtype`` (the dtype a TensorQuantizer last saw in a forward pass, set again by the next one:
#: modelopt/torch/quantization/nn/modules/tensor_quantizer.py, 0.47; a resumed run never forwards the embedding's disabled
#: quantizers again, so it would differ from an uninterrupted run's).
_RUN_KEYS = ("checkpoint_dir", "_input_dtype")


def _without_paths(obj: Any) -> Any:
    """The encoded state with every :data:`_RUN_KEYS` value set to None (recursively)."""
    if isinstance(obj, list):
        return [_without_paths(v) for v in obj]
    if isinstance(obj, dict):
        return {k: None if k in _RUN_KEYS else _without_paths(v) for k, v in obj.items()}
    return obj


def _materialized(model: torch.nn.Module) -> Callable[[str], torch.Tensor]:
    """``name -> tensor`` of ``model.state_dict()`` that also works for an accelerate-offloaded model: a tensor left on
    the meta device is read by onloading its module (``accelerate.utils.align_module_device``) for that one read."""
    import contextlib

    sd = model.state_dict(keep_vars=True)
    modules = dict(model.named_modules())

    def get(name: str) -> torch.Tensor:
        t = sd[name]
        if t.device.type != "meta":
            return t.detach()
        from accelerate.utils import align_module_device

        mod_name, _, attr = name.rpartition(".")
        mod = modules[mod_name]
        with align_module_device(mod, execution_device="cpu") if mod_name in modules else contextlib.nullcontext():
            return getattr(mod, attr).detach().to("cpu").clone()

    return get


def _export_reader(hf_dir: Path) -> Callable[[str], torch.Tensor | None]:
    """``name -> tensor`` of the export checkpoint (``hf/*.safetensors``), one tensor read at a time; None when absent."""
    from safetensors import safe_open

    from ..core.modelio import shard_files

    where: dict[str, Path] = {}
    for f in shard_files(Path(hf_dir)):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                where[k] = f

    def read(name: str) -> torch.Tensor | None:
        f = where.get(name)
        if f is None:
            return None
        with safe_open(str(f), framework="pt") as sf:
            return sf.get_tensor(name)

    return read


def save_quant_state(
    model: torch.nn.Module, export_hf: Path, out_dir: Path, meta: dict[str, Any], probe_ids: torch.Tensor | None = None
) -> dict[str, Any]:
    """Write ``quant_state.safetensors`` + ``quant_state.json`` for a ModelOpt-quantized model, one tensor at a time.

    Stored tensors: every quantizer buffer (``*_quantizer._amax``, ``_pre_quant_scale`` ...), every model tensor
    whose value differs from the export checkpoint's (AWQ and SmoothQuant fold their scales into the weights; compared
    one tensor at a time, read from ``export_hf``), and the tensors inside ModelOpt's ``modelopt_state`` (quantizer
    types/configs, restored with ``modelopt.torch.opt.restore_from_modelopt_state``). No pickle is involved, and no
    copy of the model is made: tensors are written from the model's own storage (:func:`pipeline.core.tensorio.write_streaming`),
    an accelerate-offloaded layer is onloaded for the read of each of its tensors.

    Args:
        model: the quantized model, as calibrated (any device, possibly offloaded).
        export_hf: the export checkpoint folder the model was loaded from (``hf/``).
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

    from ..core.tensorio import write_streaming

    extra: dict[str, torch.Tensor] = {}
    state = _without_paths(_encode_state(mto.modelopt_state(model), extra))
    get, base = _materialized(model), _export_reader(export_hf)
    live = model.state_dict(keep_vars=True)
    shapes = {k: (v.dtype, tuple(v.shape)) for k, v in live.items()}
    first_name: dict[int, str] = {}  # tied tensors (one Parameter under two names) compare with the stored name
    for k, v in live.items():
        first_name.setdefault(id(v), k)
    buffers, changed = [], []
    for name, (dtype, shape) in shapes.items():
        if _is_quantizer_key(name):
            buffers.append(name)
            continue
        b = base(name)
        if b is None and first_name[id(live[name])] != name:
            b = base(first_name[id(live[name])])
        if b is None or tuple(b.shape) != shape or not torch.equal(b.to(dtype), get(name).to("cpu")):
            changed.append(name)
    if probe_ids is not None:
        dev = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
        with torch.no_grad():
            ids = probe_ids.to(dev)
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        extra[PROBE_IDS] = probe_ids.detach().cpu().contiguous()
        extra[PROBE_LOGITS] = logits.detach().float().cpu().contiguous()
    names = [*extra, *buffers, *changed]
    specs = [(n, extra[n].dtype, tuple(extra[n].shape)) if n in extra else (n, *shapes[n]) for n in names]
    write_streaming(
        out_dir / QUANT_STATE_TENSORS, specs, lambda n: extra[n] if n in extra else get(n), metadata={"schema": QUANT_STATE_SCHEMA}
    )
    doc = {
        "schema": QUANT_STATE_SCHEMA,
        "modelopt_version": modelopt.__version__,
        **meta,
        "modelopt_state": state,
        "quantizer_buffers": sorted(buffers),
        "changed_weights": sorted(changed),
    }
    (out_dir / QUANT_STATE_JSON).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return doc


def _write_state(
    out: Path,
    qcfg: Any,
    model: Any,
    export_hf: Path,
    cal: _Calibration,
    quant_algo: str | None,
    placement: Placement,
    made_from: str | None = None,
) -> None:
    """Write ``quant_state.json``/``.safetensors`` (:func:`save_quant_state`; an empty state for ``none``);
    ``made_from`` is the export artifact's digest (:func:`export_digest`)."""
    import torch

    meta = {
        "export_digest": made_from,
        "recipe": qcfg.recipe,
        "kv_cache": qcfg.kv_cache_dtype,
        "calib_dtype": placement.dtype,
        "calib_device": "cpu" if placement.device == "cpu" else "cuda",
        "modelopt_config": _encode_state(cal.modelopt_cfg, {}) if cal.modelopt_cfg is not None else None,
        "quant_algo": quant_algo,
        "kv_cache_quant_algo": KV_CACHE[qcfg.kv_cache_dtype][0],
        "group_size": None if "group_size" in unused_fields(qcfg) else int(qcfg.group_size),
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
        save_quant_state(model, export_hf, out, meta, probe_ids=probe)
