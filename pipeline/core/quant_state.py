"""Reading a quant state: the quantize artifact's ModelOpt state restored onto its export, without pickle.

The quantize stage writes ``quant_state.json`` (ModelOpt's ``modelopt_state`` as JSON, the calibration dtype, the
export digest) and ``quant_state.safetensors`` (quantizer buffers, scale-folded weights, a probe) with
:func:`pipeline.quantize.state.save_quant_state`; the build, evaluate and measurement tools read it back here
(:func:`load_simulated_model`), one floor below the stages that share it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError, SelfCheckError
from .contracts.export import ExportArtifact
from .contracts.manifest import ArtifactManifest
from .contracts.quantize import QuantizeArtifact, QuantStateRecord

if TYPE_CHECKING:
    import torch


log = logging.getLogger("pipeline.quantize")
PROBE_IDS, PROBE_LOGITS = "__probe__.input_ids", "__probe__.logits"


QUANT_STATE_SCHEMA = "pipeline.quant_state/v1"


QUANT_STATE_JSON = QuantizeArtifact.QUANT_STATE_JSON


QUANT_STATE_TENSORS = QuantizeArtifact.QUANT_STATE_TENSORS


_STATE_TENSOR_PREFIX = "__modelopt_state__."


#: allclose tolerance (rtol = atol) of the probe check by calibration dtype: float32 on the same CPU kernels reproduces
#: the logits to rounding; 16-bit calibrations (CUDA) are checked to bfloat16's resolution (2**-7), scaled by max |logit|.
PROBE_TOLERANCE = {"float32": 1e-4, "float16": 2**-7, "bfloat16": 2**-7}


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
        doc = QuantStateRecord.from_json(json.loads(sj.read_text(encoding="utf-8")))
    except (OSError, ValueError) as e:
        raise InputError(f"{sj}: cannot read the quant state ({e}). Pass the quantize stage's artifact folder.") from e
    if doc.schema != QUANT_STATE_SCHEMA:
        raise InputError(f"{sj}: schema {doc.schema!r} is not {QUANT_STATE_SCHEMA!r}; re-run the quantize stage.")
    same_export = _check_export_digest(doc, quant_dir, Path(export_dir))
    want = dtype or getattr(torch, doc.calib_dtype)
    from ..core.modelio import load_causal_lm

    model: Any = load_causal_lm(ExportArtifact.hf_dir_of(export_dir), want, str(device))
    if doc.recipe == "none" or doc.modelopt_state is None:
        return model
    import modelopt.torch.opt as mto

    tensors, own = _open_state(quant_dir / QUANT_STATE_TENSORS)
    state = _decode_state(doc.modelopt_state, tensors)
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
    if verify and PROBE_IDS in tensors and want == getattr(torch, doc.calib_dtype):
        _check_probe(model, tensors, doc, quant_dir, device, same_export)
    if dtype is not None:
        model.to(dtype)
    return model


def export_digest(export_dir: Path) -> str | None:
    """The export artifact's content digest (``output_digest`` of its ``manifest.json``, written by the store), or None
    for a bare checkpoint folder (``hf/``) or an unreadable manifest."""
    try:
        d = ArtifactManifest.from_json(json.loads((Path(export_dir) / "manifest.json").read_text(encoding="utf-8"))).output_digest
    except (OSError, ValueError):
        return None
    return d if isinstance(d, str) else None


def _check_export_digest(doc: QuantStateRecord, quant_dir: Path, export_dir: Path) -> bool:
    """InputError when the quant state records the export artifact it was made from and ``export_dir`` is another one;
    True when both digests are known and equal (False: cannot tell, e.g. a bare ``hf/`` folder)."""
    made_from, given = doc.export_digest, export_digest(export_dir)
    if made_from and given and made_from != given:
        raise InputError(
            f"{quant_dir}: this quant state was made from the export artifact with digest {made_from[:16]}..., but "
            f"{export_dir} has digest {given[:16]}.... Fix: pass the export artifact of the same run (its manifest's "
            "output_digest), or re-run the quantize stage on this one."
        )
    return bool(made_from and given)


def _check_probe(
    model: Any, tensors: dict[str, torch.Tensor], doc: QuantStateRecord, quant_dir: Path, device: str, same_export: bool
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

    calib_kind = "cpu" if doc.calib_device == "cpu" else "cuda"
    if torch.device(device).type != calib_kind:
        log.info("quant state probe not compared: calibrated on %s, restored on %s (other kernels)", calib_kind, device)
        return
    ids = tensors[PROBE_IDS].to(device)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
    want = tensors[PROBE_LOGITS].to(got.device)
    tol = PROBE_TOLERANCE.get(str(doc.calib_dtype), PROBE_TOLERANCE["float32"])
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
            f"model's logits on the stored probe on the same kind of device ({calib_kind}, {doc.calib_dtype}; max "
            f"|diff| {diff}, tolerance {tol:.3g}). The export artifact is the one the state was made from (digest "
            "checked), so what was saved differs from what was calibrated: a pipeline fault. Report it with the "
            "quant_report.json (placement) and re-run with force=true."
        )
