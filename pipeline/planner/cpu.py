"""The plan on the host CPU (onnxruntime-genai): host memory for weights, the static KV cache and activations, and
the decode bound at the measured memory bandwidth.

Rule: everything the plan says about running on this host's CPU is computed here; weights that cannot fit the host's
RAM refuse the plan with the fix (int4 weights, or a larger host); a tight fit is a warning. More than one rank
(``parallel.tp_size`` / ``pp_size``) refuses it too: the CPU target runs on one device. A run or a named target is
refused that by the target's config check (exit 2); a shapes-only preset with ``target=auto`` is checked for TP geometry
only (``pipeline plan --gpus`` plans it for each GPU), so the CPU plan it resolves to says it here (exit 4).

Formulas and sources: onnxruntime-genai shares past/present KV buffers sized batch x max_length (a static KV cache per
slot, onnxruntime-genai 0.18 ``src/models/kv_cache.cpp``); the decode bound as :func:`~.base.roofline` with the host
bandwidth of :func:`pipeline.core.sizing.host_memory_bandwidth_gbs` (numpy copy of 256 MB, best of 3).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.sizing import host_memory, host_memory_bandwidth_gbs
from ..facts.geometry import ModelShape
from . import base


def _smaller_weights_fix(shape: ModelShape, k: Any, host_total: int) -> str:
    """The fix for weights that do not fit the host's RAM: int4 weights when they would fit, else a larger host."""
    if "int4" in str(k.recipe):
        return "a larger host (the weights are already int4)."
    int4 = base.weights_of(shape, k, recipe="int4_awq", parallel=False)
    if int4.total_bytes < host_total:
        return f"quant=int4_awq ({base.gib(int4.total_bytes)} of weights) or a larger host."
    return f"a larger host (even int4 weights need {base.gib(int4.total_bytes)})."


def cpu_plan(p: base.Plan, shape: ModelShape, k: base.Knobs) -> base.Plan:
    """Fill ``p`` with the plan on this host's CPU: weights, KV cache, memory, capacity, decode bound, refusals and warnings."""
    mem = host_memory()
    bw = host_memory_bandwidth_gbs() * 1e9
    w = base.weights_of(shape, k, parallel=False)
    kv_tok = shape.kv_bytes_per_token(base.kv_elem_bytes(k))
    # onnxruntime-genai shares past/present buffers sized batch x max_length (static KV per slot)
    kv_all = kv_tok * k.max_seq_len * k.max_batch_size * k.beam
    act = base.activation_bytes(shape, dataclasses.replace(k, tp=1))
    host = base.HostCpu("host CPU", mem["total"], mem["available"], round(bw / 1e9, 2), "measured: numpy copy of 256 MB (best of 3)")
    p.target = dataclasses.replace(p.target, device=host)
    p.weights = base.weights_doc(w, w.total_bytes)
    p.kv_cache = base.kv_doc(k, shape, kv_tok, bytes_per_sequence_rank=kv_tok * k.max_seq_len, bytes_all_slots=kv_all)
    need = w.total_bytes + kv_all + act
    p.memory = base.CpuMemory(mem["total"], mem["available"], w.total_bytes, kv_all, act, need)
    avail = mem["available"] or 0
    fit_seqs = max(0, (avail - w.total_bytes - act) // max(1, kv_tok * k.max_seq_len)) if avail else None
    conc = min(fit_seqs, k.max_batch_size) if fit_seqs is not None else k.max_batch_size
    p.capacity = base.PlanCapacity(None, None, fit_seqs, k.max_batch_size, conc)
    p.decode = base.decode_doc(
        w.total_bytes, kv_tok, k, max(1, conc), bw, "memory-bound: weights and each sequence's KV cache (at max_seq_len) read once per step"
    )
    if mem["total"] and w.total_bytes >= mem["total"]:
        p.refusals.append(
            f"weights need {base.gib(w.total_bytes)} but the host has {base.gib(mem['total'])} RAM. Fix: "
            + _smaller_weights_fix(shape, k, mem["total"])
        )
    elif avail and need > avail:
        p.warnings.append(
            f"weights + KV for {k.max_batch_size} x {k.max_seq_len} tokens + activations need {base.gib(need)}; "
            f"{base.gib(avail)} is available now. Fix: lower build.max_batch_size or build.max_seq_len."
        )
    for field, ranks in (("tp_size", k.tp), ("pp_size", k.pp)):  # target=auto on a shapes-only preset reaches here
        if ranks > 1:
            p.refusals.append(
                f"parallel.{field}={ranks}: this plan is for the host CPU (target onnxruntime_genai), which runs on one "
                f"device. Fix: parallel.{field}=1, or target=tensorrt_llm target.gpu=<name> to plan {ranks} GPUs."
            )
    from ..core.targets import get_target

    refusal = get_target("onnxruntime_genai").capabilities().recipe_refusal(k.recipe)
    if refusal is not None:
        p.notes.append(
            f"quant.recipe={k.recipe}: target onnxruntime_genai cannot run it ({refusal}); the sizes assume the recipe's packed weights."
        )
    return p.settle()
