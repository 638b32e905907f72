"""The unified Hugging Face checkpoint of the quantized model (ModelOpt ``export_hf_checkpoint``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.artifacts import TOKENIZER_COPY_FILES
from ..core.contracts.quantize import QuantizeArtifact
from ..core.hf_compat import write_older_config_spellings
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
    _older_config_spellings(out / QuantizeArtifact.HF_DIR / "config.json", src.hf / "config.json", qcfg.export_dtype)
    for f in TOKENIZER_COPY_FILES:
        if (src.hf / f).is_file() and not (out / QuantizeArtifact.HF_DIR / f).exists():
            _link_file(src.hf / f, out / QuantizeArtifact.HF_DIR / f)
    return notes


def _older_config_spellings(written: Path, exported: Path, export_dtype: str) -> None:
    """Give the ``config.json`` ModelOpt's exporter wrote (transformers 5 ``save_pretrained``: ``rope_parameters`` and
    ``dtype`` only) the spellings transformers 4.x reads, as the export stage wrote them (its ``config.json``:
    ``rope_theta``, ``rope_scaling``); the dtype is the one the exporter wrote (else ``quant.export_dtype``). Without
    them the serving image's transformers 4.57 reads ``rope_theta`` as its default 10000 (docs/package.md)."""
    cfg = json.loads(written.read_text(encoding="utf-8"))
    src = json.loads(exported.read_text(encoding="utf-8"))
    write_older_config_spellings(written, str(cfg.get("dtype") or export_dtype), src.get("rope_theta"), src.get("rope_scaling"))
