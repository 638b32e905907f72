"""The unified Hugging Face checkpoint of the quantized model (ModelOpt ``export_hf_checkpoint``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.artifacts import TOKENIZER_COPY_FILES
from .artifact import QuantizeArtifact
from .common import _link_file, _link_tree, _quiet
from .preflight import _Source


def _export_hf(out: Path, qcfg: Any, src: _Source, restore: Callable[[], Any]) -> list[str]:
    """Write the unified HF checkpoint ``hf/`` (ModelOpt ``export_hf_checkpoint``; for ``none`` the export's files,
    hard-linked) plus the tokenizer files. Returns notes for the report.

    ``restore()`` returns the calibrated model (restored from the quant state just written); the exporter replaces its
    weights with the exported ones in place, so the model is consumed here and freed when the export is done."""
    if qcfg.recipe == "none":
        _link_tree(src.hf, out / QuantizeArtifact.HF_DIR)
        return []
    import modelopt.torch.export as mte
    import torch

    notes: list[str] = []
    hmodel = restore()
    if qcfg.kv_cache_dtype == "int8":
        # ModelOpt's unified HF format has no INT8 KV cache (export_hf_checkpoint asserts); the INT8
        # KV scales live in trtllm_checkpoint/, the hf/ copy carries the weights without them.
        for n, mod in hmodel.named_modules():
            if n.endswith(("k_bmm_quantizer", "v_bmm_quantizer")) and hasattr(mod, "disable"):
                mod.disable()
                if "_amax" in getattr(mod, "_buffers", {}):
                    del mod._buffers["_amax"]  # the exporter turns any KV amax into a (FP8-only) scale
        notes.append("INT8 KV-cache scales are not representable in ModelOpt's unified HF format; they are only in trtllm_checkpoint/")
    with _quiet("export_hf_checkpoint"):
        mte.export_hf_checkpoint(hmodel, getattr(torch, qcfg.export_dtype), export_dir=out / QuantizeArtifact.HF_DIR)
    del hmodel
    for f in TOKENIZER_COPY_FILES:
        if (src.hf / f).is_file() and not (out / QuantizeArtifact.HF_DIR / f).exists():
            _link_file(src.hf / f, out / QuantizeArtifact.HF_DIR / f)
    return notes
