"""Public names of the quantize domain module; the code lives in :mod:`pipeline.quantization`, one module per concern.

* :func:`load_simulated_model` - rebuild ModelOpt's simulated-quantization (fake-quant) model from a
  quantize artifact plus the export artifact, without pickle (evaluate's ``simulated`` runner, the
  build stage's ORT converter).
* :data:`RECIPES` - recipe -> ModelOpt config + TensorRT-LLM ``quant_algo`` (re-exported from :mod:`pipeline.recipes`).
* :func:`quantize` - the plain function the stage calls.

Re-exports only: to monkeypatch a name, patch it in the module that defines (and uses) it.
"""

from __future__ import annotations

from .quantization.auto import auto_min_bits, auto_quant_algo, auto_search
from .quantization.common import DECODER_TYPES, KV_CACHE, NO_TRTLLM_CHECKPOINT
from .quantization.modelopt_config import modelopt_config
from .quantization.preflight import ATTN_OUT_PATTERNS, excluded_modules, preflight, source_facts
from .quantization.report import module_precisions, render_report_md
from .quantization.run import quantize
from .quantization.state import (
    PROBE_IDS,
    PROBE_LOGITS,
    QUANT_STATE_JSON,
    QUANT_STATE_SCHEMA,
    QUANT_STATE_TENSORS,
    load_simulated_model,
    save_quant_state,
)
from .quantization.trtllm import AWQ_VOCAB_MULTIPLE, check_trtllm_checkpoint
from .recipes import RECIPES

__all__ = [
    "ATTN_OUT_PATTERNS",
    "AWQ_VOCAB_MULTIPLE",
    "DECODER_TYPES",
    "KV_CACHE",
    "NO_TRTLLM_CHECKPOINT",
    "PROBE_IDS",
    "PROBE_LOGITS",
    "QUANT_STATE_JSON",
    "QUANT_STATE_SCHEMA",
    "QUANT_STATE_TENSORS",
    "RECIPES",
    "auto_min_bits",
    "auto_quant_algo",
    "auto_search",
    "check_trtllm_checkpoint",
    "excluded_modules",
    "load_simulated_model",
    "modelopt_config",
    "module_precisions",
    "preflight",
    "quantize",
    "render_report_md",
    "save_quant_state",
    "source_facts",
]
