"""Memory and speed plan: weights, KV cache, activations, capacity and a decode roofline.

Rule: :func:`plan` is the one entry: it reads the model's shape and the device to plan for, then hands the
:class:`~.base.Knobs` to the plan of that device. Each part lives in its own module with its formulas and sources:

* :mod:`.weights`: weight bytes per recipe, whole and per TP/PP rank (ModelOpt's export, TensorRT-LLM's checkpoint layout);
* :mod:`.base`: the knobs, the :class:`~.base.Plan` document, KV element bytes, activations, the decode roofline;
* :mod:`.gpu`: memory per rank, KV capacity, refusals and fixes on a GPU (TensorRT-LLM memory.md);
* :mod:`.cpu`: host memory and the decode bound on this host's CPU (onnxruntime-genai);
* :mod:`.stages`: each pipeline stage's predicted peak memory on this host (:mod:`pipeline.core.sizing`).
"""

from __future__ import annotations

from typing import Any

from ..core.sizing import load_shape, plan_device
from .base import Plan, knobs
from .cpu import cpu_plan
from .gpu import gpu_plan
from .stages import plan_stages


def plan(cfg: Any) -> Plan:
    """Memory and speed plan for ``cfg`` (a composed :class:`pipeline.core.config.PipelineConfig`).

    It does not validate ``cfg``: its callers have (the runner, ``pipeline plan``, one plan per GPU of ``--gpus``), and
    the public ``pipeline.plan`` (:func:`pipeline.validation.checked_plan`) runs the run's checks first, so a config a
    run refuses is never planned as ``ok``.  This module sits below the stage checks (they import it), so it cannot
    import :mod:`pipeline.validation` itself.

    Never raises for a plan that does not fit: it returns ``status='refused'`` with the numbers.
    Raises :class:`InputError` when the model's config.json cannot be read or ``target.gpu`` is
    unknown.  Does not import torch; on a CPU target it measures host bandwidth (~0.2 s, cached)."""
    shape, src = load_shape(cfg)
    kind, gpu, why = plan_device(cfg)
    k = knobs(cfg, kind)
    b = cfg.build
    model = {
        "source": src,
        "architecture": shape.architecture,
        "num_parameters": shape.num_parameters,
        "layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "heads": shape.num_heads,
        "kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_positions": shape.max_positions,
        "rope_type": shape.rope_type,
        "rope_factor": shape.rope_factor,
        "max_seq_len_limit": shape.max_seq_len_limit,
    }
    conf = {
        "recipe": k.recipe,
        "kv_cache": k.kv_cache,
        "high_precision_dtype": k.hp_dtype,
        "tp_size": k.tp,
        "pp_size": k.pp,
        "max_batch_size": k.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_draft_len": b.speculative.max_draft_len,
        "max_num_tokens": k.max_num_tokens,
        "tokens_per_block": k.tokens_per_block,
        "kv_cache_free_gpu_mem_fraction": k.fraction,
        "max_beam_width": k.beam,
        "build": b.name,
        "allow_unsafe_lengths": bool(getattr(cfg, "allow_unsafe_lengths", False)),
    }
    p = Plan("ok", {"kind": kind, "why": why}, model, conf)
    if conf["allow_unsafe_lengths"] and k.max_seq_len > shape.max_seq_len_limit:
        p.warnings.append(
            f"allow_unsafe_lengths=true: max_seq_len={k.max_seq_len} exceeds the model's {shape.max_seq_len_limit} "
            f"positions; quality beyond that length is untested (recorded in this plan)."
        )
    if shape.sliding_window and shape.sliding_window < k.max_seq_len:
        p.notes.append(
            f"config.json has sliding_window={shape.sliding_window}; the KV sizing assumes a full cache "
            f"(TensorRT-LLM allocates max_attention_window_size = max_seq_len unless told otherwise)."
        )
    plan_stages(p, cfg, shape)
    if kind == "gpu" and gpu is None:
        p.status = "unplanned"
        p.notes.append(f"{why}. Name one: target.gpu=<{'|'.join(sorted(_catalogue_keys()))}>.")
        return p
    if kind == "cpu":
        return cpu_plan(p, shape, k)
    assert gpu is not None  # kind == "gpu" with gpu None returned above
    return gpu_plan(p, shape, k, gpu)


def _catalogue_keys() -> list[str]:
    from ..facts.gpus import CATALOGUE

    return list(CATALOGUE)
