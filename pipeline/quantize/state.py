"""The quantize artifact's ModelOpt state without pickle: ``quant_state.json`` + ``quant_state.safetensors``
(write, and rebuild the simulated-quantization model from them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.contracts.quantize import QuantizeArtifact
from ..core.errors import InputError, SelfCheckError
from .common import KV_CACHE, _hf_dir, log, unused_fields

if TYPE_CHECKING:
    import torch

    from .calibrate import _Calibration
    from .placement import Placement

QUANT_STATE_SCHEMA = "pipeline.quant_state/v1"
QUANT_STATE_JSON = QuantizeArtifact.QUANT_STATE_JSON
QUANT_STATE_TENSORS = QuantizeArtifact.QUANT_STATE_TENSORS
_STATE_TENSOR_PREFIX = "__modelopt_state__."
PROBE_IDS, PROBE_LOGITS = "__probe__.input_ids", "__probe__.logits"
#: allclose tolerance (rtol = atol) of the probe check by calibration dtype: float32 on the same CPU kernels reproduces
#: the logits to rounding; 16-bit calibrations (CUDA) are checked to bfloat16's resolution (2**-7), scaled by max |logit|.
PROBE_TOLERANCE = {"float32": 1e-4, "float16": 2**-7, "bfloat16": 2**-7}


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


def _is_quantizer_key(name: str) -> bool:
    return "_quantizer." in name or name.endswith("_quantizer")


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


def _open_state(path: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The small tensors of a quant state read at once (ModelOpt's own state tensors, the probe) and the names of the
    model tensors, which :func:`_load_tensors` reads one at a time. InputError for a missing or corrupt file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
            small = {k: f.get_tensor(k) for k in names if k.startswith((_STATE_TENSOR_PREFIX, "__probe__."))}
    except (OSError, SafetensorError) as e:
        raise InputError(f"{path}: cannot read the quant state tensors ({e}). Re-run the quantize stage.") from e
    return small, [k for k in names if k not in small]


def _load_tensors(model: torch.nn.Module, path: Path, names: list[str]) -> None:
    """Load the quant state's model tensors into ``model`` one decoder layer at a time, through ``load_state_dict``
    (so ModelOpt's quantizer load hooks run); peak memory: one layer's tensors beyond the model."""
    import re

    from safetensors import safe_open

    groups: dict[str, list[str]] = {}
    for k in names:
        m = re.match(r"(.*?\.layers\.\d+)\.", k)
        groups.setdefault(m.group(1) if m else k, []).append(k)
    for keys in groups.values():
        with safe_open(str(path), framework="pt") as f:  # one mapping per layer: the file's pages do not stay resident
            part = {k: f.get_tensor(k) for k in keys}
        model.load_state_dict(part, strict=False)
        del part


def load_simulated_model(
    quant_dir: Path, export_dir: Path, device: str = "cpu", dtype: torch.dtype | None = None, verify: bool = True
) -> torch.nn.Module:
    """ModelOpt's simulated-quantization (fake-quant) model of a quantize artifact, without pickle.

    Loads the export checkpoint (``export_dir/hf``) with ``transformers`` onto ``device`` in the dtype the
    calibration ran in (``calib_dtype`` of ``quant_state.json``: float32 on the CPU), restores ModelOpt's quantizers with
    ``modelopt.torch.opt.restore_from_modelopt_state`` from the JSON-encoded state, then loads the
    quantizer buffers (amax, pre_quant_scale) and the scale-folded weights from
    ``quant_state.safetensors`` one decoder layer at a time.  Its logits equal those of the model that was calibrated
    (``tests/quantize/test_quantize.py::test_load_simulated_model_reproduces_logits``).

    Args:
        quant_dir: the quantize artifact folder (holds ``quant_state.json``/``.safetensors``).
        export_dir: the export artifact folder (holds ``hf/``) or the ``hf/`` folder itself.
        device: torch device for the returned model ("cpu", "cuda", ...).
        dtype: override the float dtype (default: the calibration dtype, float32 on the CPU).
        verify: when the state carries a probe (the quantize stage always stores one), ``device`` is of the kind
            calibration ran on and the dtype is the calibration's, run it and require the logits to match the calibrated model's
            (``allclose`` within :data:`PROBE_TOLERANCE`; :func:`_check_probe`).
    Returns:
        ``transformers`` causal-LM ``torch.nn.Module`` in eval mode; for recipe ``none`` the plain
        unquantized model.
    Raises:
        InputError: missing/corrupt files, a state that does not fit the model, or an export artifact other than the
            one the state was made from (names the file).
        SelfCheckError: the restored model misses the probe on the calibration's kind of device (exit 1).
    """
    import torch

    quant_dir = Path(quant_dir)
    sj = quant_dir / QUANT_STATE_JSON
    try:
        doc = json.loads(sj.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{sj}: cannot read the quant state ({e}). Pass the quantize stage's artifact folder.") from e
    if doc.get("schema") != QUANT_STATE_SCHEMA:
        raise InputError(f"{sj}: schema {doc.get('schema')!r} is not {QUANT_STATE_SCHEMA!r}; re-run the quantize stage.")
    same_export = _check_export_digest(doc, quant_dir, Path(export_dir))
    want = dtype or getattr(torch, doc.get("calib_dtype", "float32"))
    from ..core.modelio import load_causal_lm

    model: Any = load_causal_lm(_hf_dir(export_dir), want, str(device))
    if doc.get("recipe") == "none" or doc.get("modelopt_state") is None:
        return model
    import modelopt.torch.opt as mto

    tensors, own = _open_state(quant_dir / QUANT_STATE_TENSORS)
    state = _decode_state(doc["modelopt_state"], tensors)
    mto.restore_from_modelopt_state(model, state)
    expected = model.state_dict(keep_vars=True)
    unexpected = [k for k in own if k not in expected]
    missing_q = [k for k in expected if _is_quantizer_key(k) and k not in own]
    if unexpected or missing_q:
        raise InputError(
            f"{quant_dir / QUANT_STATE_TENSORS}: does not fit the model from {export_dir} "
            f"(unexpected {unexpected[:5]}, missing quantizer buffers {missing_q[:5]}). "
            "Quantize and export artifacts must come from the same run."
        )
    _load_tensors(model, quant_dir / QUANT_STATE_TENSORS, own)
    model.eval()
    if verify and PROBE_IDS in tensors and want == getattr(torch, doc.get("calib_dtype", "float32")):
        _check_probe(model, tensors, doc, quant_dir, device, same_export)
    if dtype is not None:
        model.to(dtype)
    return model


def export_digest(export_dir: Path) -> str | None:
    """The export artifact's content digest (``output_digest`` of its ``manifest.json``, written by the store), or None
    for a bare checkpoint folder (``hf/``) or an unreadable manifest."""
    try:
        d = json.loads((Path(export_dir) / "manifest.json").read_text(encoding="utf-8")).get("output_digest")
    except (OSError, ValueError, AttributeError):
        return None
    return d if isinstance(d, str) else None


def _check_export_digest(doc: dict[str, Any], quant_dir: Path, export_dir: Path) -> bool:
    """InputError when the quant state records the export artifact it was made from and ``export_dir`` is another one;
    True when both digests are known and equal (False: cannot tell, e.g. a bare ``hf/`` folder)."""
    made_from, given = doc.get("export_digest"), export_digest(export_dir)
    if made_from and given and made_from != given:
        raise InputError(
            f"{quant_dir}: this quant state was made from the export artifact with digest {made_from[:16]}..., but "
            f"{export_dir} has digest {given[:16]}.... Fix: pass the export artifact of the same run (its manifest's "
            "output_digest), or re-run the quantize stage on this one."
        )
    return bool(made_from and given)


def _check_probe(
    model: Any, tensors: dict[str, torch.Tensor], doc: dict[str, Any], quant_dir: Path, device: str, same_export: bool
) -> None:
    """The restored model reproduces the calibrated model's logits on the stored probe, compared like with like.

    The probe was computed where calibration ran (``calib_device``: the CPU, or CUDA, also when layers were offloaded:
    they are onloaded to the GPU for every forward). On the same kind of device and dtype the restored model must match
    within :data:`PROBE_TOLERANCE`. A miss when the export artifact is known to be the state's own (``same_export``,
    digests equal) is a product fault (:class:`SelfCheckError`, exit 1), not the user's input; without digests (a bare
    ``hf/`` folder) it is most likely another export, said as an InputError. On another kind of device (a CUDA calibration restored on the CPU) the kernels differ (bf16 on 22 layers of
    a 1 B model: max |diff| 0.09 on the H200, 2026-12-04), so the logits are not compared; which export artifact the
    state belongs to is checked by digest instead (:func:`_check_export_digest`)."""
    import torch

    calib_kind = "cpu" if doc.get("calib_device", "cpu") == "cpu" else "cuda"
    if torch.device(device).type != calib_kind:
        log.info("quant state probe not compared: calibrated on %s, restored on %s (other kernels)", calib_kind, device)
        return
    ids = tensors[PROBE_IDS].to(device)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
    want = tensors[PROBE_LOGITS].to(got.device)
    tol = PROBE_TOLERANCE.get(str(doc.get("calib_dtype", "float32")), PROBE_TOLERANCE["float32"])
    if calib_kind != "cpu":  # bounded by the dtype's rounding, scaled by the logits' size
        tol = max(tol, PROBE_TOLERANCE["bfloat16"]) * max(1.0, float(want.abs().max()))
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
        diff = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
        if not same_export:
            raise InputError(
                f"{quant_dir}: the restored model's logits on the stored probe differ from the calibrated model's "
                f"(max |diff| {diff}). The export checkpoint given is most likely not the one this quant state was made from "
                "(it has no artifact digest to check). Fix: pass the export artifact of the same run."
            )
        raise SelfCheckError(
            f"{quant_dir}: self-check failed: the model restored from the quant state does not reproduce the calibrated "
            f"model's logits on the stored probe on the same kind of device ({calib_kind}, {doc.get('calib_dtype')}; max "
            f"|diff| {diff}, tolerance {tol:.3g}). The export artifact is the one the state was made from (digest "
            "checked), so what was saved differs from what was calibrated: a pipeline fault. Report it with the "
            "quant_report.json (placement) and re-run with force=true."
        )


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
