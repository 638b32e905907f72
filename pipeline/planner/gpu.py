"""The plan on a GPU (TensorRT-LLM): memory per rank, KV-cache capacity, the decode bound, and the refusals with fixes.

Rule: everything the plan says about one GPU of the catalogue (or the one visible here) is computed here from the
shape and the :class:`~.base.Knobs`; a plan that does not fit is ``refused`` with the numbers and the fixes that
would make it fit, never an exception.

Formulas and sources:

* **KV cache** per token = 2 x layers x KV heads x head_dim x bytes per element (TensorRT-LLM memory.md; docs/reference/tensorrt_llm.md §5);
  the pool holds whole blocks of ``tokens_per_block``.
* **KV capacity**: TensorRT-LLM allocates ``kv_cache_free_gpu_mem_fraction`` of the memory left after
  weights, activations and runtime buffers (memory.md).  Runtime buffers: ``RUNTIME_OVERHEAD_BYTES``
  (assumption: CUDA context + cuBLAS workspaces, about 1 GiB) + per-sequence decoder buffers.
* Support matrix: the recipe's and KV format's minimum compute capability (pipeline/facts/recipes.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..facts.geometry import ModelShape
from ..facts.gpus import GPU
from ..facts.recipes import KV_MIN_SM, RECIPE_MIN_SM, RECIPES
from .base import (
    GiB,
    GpuMemory,
    Knobs,
    Plan,
    PlanCapacity,
    activation_bytes,
    decode_doc,
    gib,
    kv_doc,
    kv_elem_bytes,
    weights_doc,
    weights_of,
)
from .weights import stage_layers

RUNTIME_OVERHEAD_BYTES = 1 * GiB
"""Assumed CUDA context + cuBLAS/TensorRT workspaces per GPU (not published by TensorRT-LLM; an
estimate of the usual 0.3-0.5 GiB context plus workspaces)."""
TP_CHOICES = (1, 2, 4, 8)
FEW_SEQUENCES = 4
"""Fewer sequences than this at max_seq_len makes the plan 'barely works'."""


def _decoder_buffers(k: Knobs) -> int:
    # output ids + sequence-length bookkeeping (int32) for every slot; small next to the KV cache
    return k.max_batch_size * k.beam * k.max_seq_len * 4 * 2


def gpu_numbers(shape: ModelShape, k: Knobs, gpu: GPU) -> dict[str, Any]:
    """Pure computation for one set of knobs on one GPU (no warnings)."""
    w = weights_of(shape, k)
    layers_rank = max(len(x) for x in stage_layers(shape.num_layers, k.pp))
    kv_tok = shape.kv_bytes_per_token(kv_elem_bytes(k), k.tp, layers_rank)
    kv_tok_slice = shape.kv_bytes_per_token(kv_elem_bytes(k), k.tp)  # all layers of one TP slice
    block = kv_tok * k.tokens_per_block
    act = activation_bytes(shape, k)
    overhead = RUNTIME_OVERHEAD_BYTES + _decoder_buffers(k)
    free = gpu.memory_bytes - w.max_rank_bytes - act - overhead
    pool = max(0, int(free * k.fraction))
    blocks = pool // block if block else 0
    blocks_per_seq = math.ceil(k.max_seq_len / k.tokens_per_block)
    seqs = blocks // blocks_per_seq // k.beam
    return dict(
        w=w,
        kv_tok=kv_tok,
        kv_tok_slice=kv_tok_slice,
        block=block,
        act=act,
        overhead=overhead,
        free=free,
        pool=pool,
        blocks=blocks,
        tokens=blocks * k.tokens_per_block,
        blocks_per_seq=blocks_per_seq,
        seqs=seqs,
    )


def gpu_plan(p: Plan, shape: ModelShape, k: Knobs, gpu: GPU) -> Plan:
    """Fill ``p`` with the plan on ``gpu``: weights, KV cache, memory, capacity, decode bound, refusals and warnings."""
    p.target = dataclasses.replace(p.target, device=gpu)
    n = gpu_numbers(shape, k, gpu)
    w = n["w"]
    p.weights = weights_doc(w, w.max_rank_bytes, w.per_stage_rank_bytes)
    p.kv_cache = kv_doc(
        k, shape, n["kv_tok"], tokens_per_block=k.tokens_per_block, bytes_per_block_rank=n["block"],
        blocks_per_sequence=n["blocks_per_seq"], bytes_per_sequence_rank=n["blocks_per_seq"] * n["block"],
    )  # fmt: skip
    unused = max(0, gpu.memory_bytes - w.max_rank_bytes - n["act"] - n["overhead"] - n["pool"])
    p.memory = GpuMemory(gpu.memory_bytes, w.max_rank_bytes, n["act"], n["overhead"], n["free"], n["pool"], unused)
    conc = min(n["seqs"], k.max_batch_size)
    p.capacity = PlanCapacity(n["blocks"], n["tokens"], n["seqs"], k.max_batch_size, conc)
    bw = gpu.bandwidth_bytes_s
    p.decode = decode_doc(
        w.tp_slice_bytes, n["kv_tok_slice"], k, conc, bw,
        "memory-bound: every weight of a rank and each sequence's whole KV cache (at max_seq_len) read once per step",
    )  # fmt: skip
    if bw <= 0:
        p.notes.append("bandwidth of this GPU is unknown (not in the catalogue): no decode bound.")
    _gpu_checks(p, shape, k, gpu, n)
    if k.max_num_tokens < k.tokens_per_block:
        p.notes.append("max_num_tokens is below tokens_per_block; TensorRT-LLM may raise it at build time.")
    return p.settle()


def _gpu_checks(p: Plan, shape: ModelShape, k: Knobs, gpu: GPU, n: dict[str, Any]) -> None:
    """:func:`gpu_plan`'s refusals and warnings: the recipe and KV format on this GPU's compute capability
    (support matrix), then whether weights, one sequence and ``max_batch_size`` sequences fit in memory."""
    w = n["w"]
    # --- support matrix
    if gpu.sm < RECIPE_MIN_SM.get(k.recipe, 0):
        p.refusals.append(
            f"quant.recipe={k.recipe} needs compute capability >= {RECIPE_MIN_SM[k.recipe] / 10:.1f}; "
            f"{gpu.name} is {gpu.compute_capability}. Use one of {gpu.quant_formats}."
        )
    if gpu.sm < KV_MIN_SM.get(k.kv_cache, 0):
        p.refusals.append(
            f"quant.kv_cache_dtype={k.kv_cache} needs compute capability >= {KV_MIN_SM[k.kv_cache] / 10:.1f}; "
            f"{gpu.name} is {gpu.compute_capability}. Use one of {gpu.kv_formats}."
        )
    # --- fit
    g = gpu.memory_bytes
    if w.max_rank_bytes + n["act"] + n["overhead"] >= g:
        fixes = _fit_fixes(shape, k, gpu, need="weights")
        p.refusals.append(
            f"weights alone need {gib(w.max_rank_bytes)} per rank at tp={k.tp} pp={k.pp} (+ {gib(n['act'])} activations, "
            f"{gib(n['overhead'])} runtime) but {gpu.name} has {gib(g)}." + (f" Fix: {fixes}" if fixes else "")
        )
    elif n["seqs"] < 1:
        fixes = _fit_fixes(shape, k, gpu, need="one")
        one = n["blocks_per_seq"] * n["block"]
        p.refusals.append(
            f"zero sequences fit at max_seq_len={k.max_seq_len}: the KV pool is {gib(n['pool'])} "
            f"({n['tokens']} tokens) and one sequence needs {n['blocks_per_seq']} blocks x {k.tokens_per_block} tokens = {gib(one)}."
            + (f" Fix: {fixes}" if fixes else "")
        )
    else:
        if n["seqs"] < FEW_SEQUENCES:
            p.warnings.append(
                f"only {n['seqs']} sequence(s) of max_seq_len={k.max_seq_len} fit in the KV cache "
                f"({n['tokens']} tokens). Fix: {_fit_fixes(shape, k, gpu, need='batch')}"
            )
        elif n["seqs"] < k.max_batch_size:
            p.warnings.append(
                f"the KV cache holds {n['seqs']} sequences of max_seq_len={k.max_seq_len} "
                f"but build.max_batch_size={k.max_batch_size}: concurrency is KV-bound. "
                f"Fix: {_fit_fixes(shape, k, gpu, need='batch')}"
            )


def _fit_fixes(shape: ModelShape, k: Knobs, gpu: GPU, need: str) -> str:
    """Suggested fixes with their effect: lower max_seq_len, FP8 KV, more TP, a smaller recipe."""
    target = 1 if need in ("one", "weights") else k.max_batch_size
    out: list[str] = []
    if need != "weights":
        n = gpu_numbers(shape, k, gpu)
        per_seq_tokens = n["tokens"] // max(1, target * k.beam)
        s = per_seq_tokens // k.tokens_per_block * k.tokens_per_block
        if k.max_input_len < s < k.max_seq_len:
            out.append(f"build.max_seq_len={s} ({target} sequence(s) fit)")
        if k.kv_cache == "none" and "fp8" in gpu.kv_formats and kv_elem_bytes(k) > 1:
            n2 = gpu_numbers(shape, dataclasses.replace(k, kv_cache="fp8"), gpu)
            out.append(f"quant.kv_cache_dtype=fp8 ({n2['seqs']} sequences fit)")
        elif k.kv_cache == "none" and kv_elem_bytes(k) > 1:
            n2 = gpu_numbers(shape, dataclasses.replace(k, kv_cache="int8"), gpu)
            out.append(f"quant.kv_cache_dtype=int8 ({n2['seqs']} sequences fit)")
    for tp in TP_CHOICES:
        if tp <= k.tp or shape.num_heads % tp:
            continue
        n3 = gpu_numbers(shape, dataclasses.replace(k, tp=tp), gpu)
        if n3["seqs"] >= target:
            out.append(f"parallel.tp_size={tp} ({n3['seqs']} sequences fit per {tp} GPUs)")
            break
    if need == "weights" and k.recipe != "auto" and RECIPES[k.recipe].weight_bits >= 8:  # none, fp8, int8_sq, int8_wo
        for r in ("fp8", "int4_awq"):
            if r == k.recipe or r not in gpu.quant_formats:
                continue
            n4 = gpu_numbers(shape, dataclasses.replace(k, recipe=r), gpu)
            if n4["seqs"] >= 1:
                out.append(f"quant={r} ({gib(n4['w'].max_rank_bytes)} weights per rank)")
                break
    return "; or ".join(out) if out else "use a GPU with more memory"
