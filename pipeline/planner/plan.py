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
from .base import Plan, PlanConfig, PlanModel, PlanTarget, knobs
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
    model = PlanModel(
        src, shape.architecture, shape.num_parameters, shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads,
        shape.head_dim, shape.vocab_size, shape.max_positions, shape.rope_type, shape.rope_factor, shape.max_seq_len_limit,
    )  # fmt: skip
    unsafe = bool(getattr(cfg, "allow_unsafe_lengths", False))
    conf = PlanConfig(
        k.recipe, k.kv_cache, k.hp_dtype, k.tp, k.pp, k.max_batch_size, b.max_input_len, b.max_seq_len, b.speculative.max_draft_len,
        k.max_num_tokens, k.tokens_per_block, k.fraction, k.beam, b.name, unsafe,
    )  # fmt: skip
    p = Plan("ok", PlanTarget(kind, why), model, conf)
    if unsafe and k.max_seq_len > shape.max_seq_len_limit:
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
