"""One AWQ pre-quant scale per shared input (``quant.resmooth``), so engines fold the scales away.

AWQ calibrates one ``pre_quant_scale`` ``p`` per linear layer: the layer computes ``Q(W') @ (p * x)``.  Linears that
read the same tensor (q/k/v after the attention RMSNorm; gate/up after the MLP RMSNorm) get different ``p``, so an
engine must multiply the shared input by each ``p`` separately (one extra elementwise op per projection and decode
step).  With one scale per shared input, ``p`` folds into the RMSNorm weight (``norm(x) * w * p``) and the
projections read the norm's output directly.  This is what ModelOpt's own deployment exports do
(``modelopt.torch.export.unified_export_hf.requantize_resmooth_fused_llm_layers`` ->
``quant_utils.preprocess_linear_fusion``, 0.47): the shared scale is the mean of the group's scales, and every
member's weights are re-quantized for it (``W' <- W' * p_old / p_new``, weight amax re-collected).  Doing it at
quantize time means the simulated model, the evaluate stage and every engine see the same numbers.

Only weight-only recipes are resmoothed here (activations not quantized: ``int4_awq``).  With quantized
activations (``int8_sq``, ``w4a8_awq``) a new scale changes the activation range the input quantizer was calibrated
on; those recipes are left as calibrated (ModelOpt's TensorRT-LLM export resmooths them itself).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class ResmoothResult:
    """What :func:`resmooth` changed (recorded in ``quant_report.json`` under ``resmooth``).

    Attributes:
        applied: whether any scale changed.
        shared_groups: groups of linears reading one input that now share a scale (e.g. 2 per decoder layer).
        skipped: ``"<modules>: <reason>"`` for each group left as calibrated.
        reason: why nothing was done, when ``applied`` is False and nothing was eligible.
    """

    applied: bool = False
    shared_groups: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _prescale(module: Any) -> Any:
    iq = getattr(module, "input_quantizer", None)
    return None if iq is None else getattr(iq, "pre_quant_scale", None)


def _activations_quantized(module: Any) -> bool:
    iq = getattr(module, "input_quantizer", None)
    return bool(iq is not None and getattr(iq, "is_enabled", False))


def _shared_input_groups(model: Any, device: str | None = None) -> list[list[Any]]:
    """Groups (>= 2) of quantized linears that read the same tensor, found by ModelOpt's forward-hook probe
    (run on ``device``; default: the device of the model's first resident parameter)."""
    import torch
    from modelopt.torch.export.unified_export_hf import collect_shared_input_modules

    dev = device or next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))

    def probe() -> None:
        model(torch.ones([1, 2], dtype=torch.long, device=dev))

    input_to_linear, _ = collect_shared_input_modules(model, probe)
    return [list(mods) for mods in input_to_linear.values() if len(mods) > 1]


def resmooth(model: Any, device: str | None = None) -> ResmoothResult:
    """Give every group of weight-only AWQ linears that share an input one pre-quant scale (module docstring);
    re-quantizes the affected weights in place (an accelerate-offloaded layer is onloaded for it and written back,
    ModelOpt's ``enable_weight_access_and_writeback``).

    Args:
        model: a ModelOpt-calibrated ``transformers`` causal LM (``mtq.quantize`` done).
        device: where the probe forward runs (the calibration device; default: the first resident parameter's).
    Returns:
        :class:`ResmoothResult`.
    """
    import contextlib

    import torch
    from modelopt.torch.export.quant_utils import get_quantization_format, preprocess_linear_fusion
    from modelopt.torch.quantization.utils.core_utils import enable_weight_access_and_writeback

    res = ResmoothResult()
    eligible = False
    name_to_module = dict(model.named_modules())
    with torch.no_grad():
        for mods in _shared_input_groups(model, device):
            names = ",".join(getattr(m, "name", "?") for m in mods)
            scales = [_prescale(m) for m in mods]
            if all(s is None for s in scales):
                continue
            eligible = True
            if any(s is None for s in scales) or len({get_quantization_format(m) for m in mods}) != 1:
                res.skipped.append(f"{names}: the group mixes quantization formats")
            elif any(_activations_quantized(m) for m in mods):
                res.skipped.append(f"{names}: activations are quantized (left to ModelOpt's export)")
            elif not all(torch.equal(scales[0], s) for s in scales[1:]):
                with contextlib.ExitStack() as onloaded:
                    for m in mods:
                        onloaded.enter_context(enable_weight_access_and_writeback(m, model, name_to_module))
                    preprocess_linear_fusion(mods, resmooth_only=True)
                res.shared_groups += 1
    res.applied = bool(res.shared_groups)
    if not eligible:
        res.reason = "no layer has an AWQ/SmoothQuant pre-quant scale"
    return res
