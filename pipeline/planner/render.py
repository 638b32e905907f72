"""Print a :class:`~pipeline.planner.base.Plan` with rich."""

from __future__ import annotations

from typing import Any

from ..facts.gpus import GPU
from .base import GpuMemory, Plan, Roofline, fmt_bytes


def _params(n: float) -> str:
    """A parameter count the way model cards write it: ``4.59M``, ``8.03B`` (``0.00B`` hid a 4.59 M model)."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{int(n)}"


def _rate(r: Roofline | None) -> str:
    if not r:
        return "-"
    return (
        f"step >= {r.step_s_min * 1e3:.2f} ms -> <= {r.tok_s_per_seq_max:.1f} tok/s per sequence, "
        f"<= {r.tok_s_aggregate_max:.0f} tok/s aggregate (batch {r.batch}, {r.context_tokens} tokens of context each)"
    )


def render(p: Plan, console: Any, *, compact: bool = False) -> None:
    """Print the plan: one table plus warnings/refusals (``compact`` = the short form shown at run start)."""
    from rich.table import Table

    c, tgt, dev = p.config, p.target, p.target.device
    title = (
        f"plan: {p.model.architecture} {_params(p.model.num_parameters)} params, "
        f"quant={c.recipe} kv={c.kv_cache} tp={c.tp_size} pp={c.pp_size} on {(dev.name if dev else None) or tgt.kind}"
    )
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("target", f"{tgt.kind}: {tgt.why}")
    if p.status == "unplanned":
        console.print(t)
        for n in p.notes:
            console.print(f"[yellow]note:[/] {n}")
        return
    w, kv, m, cap, d = p.weights, p.kv_cache, p.memory, p.capacity, p.decode
    assert dev and w and kv and m and cap and d  # a planned plan has every section
    if isinstance(dev, GPU):
        t.add_row(
            "GPU",
            f"{dev.name}: {fmt_bytes(dev.memory_bytes)}, {dev.bandwidth_gb_s} GB/s, SM {dev.compute_capability} ({dev.source})",
        )
    else:
        t.add_row(
            "host",
            f"{fmt_bytes(dev.memory_bytes)} RAM ({fmt_bytes(dev.available_bytes)} available), {dev.bandwidth_gb_s} GB/s measured",
        )
    t.add_row(
        "weights",
        f"{fmt_bytes(w.total_bytes)} total ({w.bits_per_param} bits/param), "
        f"{fmt_bytes(w.per_rank_bytes)} per rank; high precision: {fmt_bytes(w.high_precision_bytes)}"
        + (f" ({', '.join(w.high_precision_modules)})" if w.high_precision_modules and not compact else ""),
    )
    t.add_row(
        "KV cache",
        f"{fmt_bytes(kv.bytes_per_token_model)}/token ({kv.dtype}), {fmt_bytes(kv.bytes_per_token_rank)}/token per rank"
        + (f", block of {kv.tokens_per_block} = {fmt_bytes(kv.bytes_per_block_rank)}" if kv.tokens_per_block else "")
        + f", {fmt_bytes(kv.bytes_per_sequence_rank)} per sequence at max_seq_len={c.max_seq_len}",
    )
    if isinstance(m, GpuMemory):
        t.add_row(
            "memory/rank",
            f"weights {fmt_bytes(m.weights_bytes)} + activations ~{fmt_bytes(m.activations_bytes)} "
            f"(max_num_tokens={c.max_num_tokens}) + runtime ~{fmt_bytes(m.runtime_overhead_bytes)}; "
            f"KV pool {fmt_bytes(m.kv_pool_bytes)} = {c.kv_cache_free_gpu_mem_fraction} x "
            f"{fmt_bytes(max(0, m.free_after_load_bytes))} free",
        )
        t.add_row(
            "capacity",
            f"{cap.kv_tokens} KV tokens ({cap.kv_blocks} blocks) -> {cap.max_sequences_at_max_seq_len} "
            f"sequences at max_seq_len={c.max_seq_len} (max_batch_size={c.max_batch_size})",
        )
    else:
        t.add_row(
            "memory",
            f"weights {fmt_bytes(m.weights_bytes)} + KV {fmt_bytes(m.kv_cache_bytes)} "
            f"({c.max_batch_size} x {c.max_seq_len} tokens) + activations ~{fmt_bytes(m.activations_bytes)} "
            f"= {fmt_bytes(m.total_needed_bytes)}",
        )
    t.add_row("decode bound (1 seq)", _rate(d.batch1))
    if d.full and d.full.batch > 1:
        t.add_row("decode bound (full)", _rate(d.full))
    _add_stage_memory_row(t, p)
    console.print(t)
    for n in p.notes:
        console.print(f"[dim]note:[/] {n}")
    for wmsg in p.warnings:
        console.print(f"[yellow]warning:[/] {wmsg}")
    for r in p.refusals:
        console.print(f"[bold red]refused:[/] {r}")


def _add_stage_memory_row(t: Any, p: Plan) -> None:
    """One row per stage: where it runs and its predicted peak host (and GPU) memory (:mod:`pipeline.core.sizing`);
    a row naming the visible GPUs and their free memory first."""
    if p.target.gpus:
        t.add_row(
            "visible GPUs",
            "; ".join(f"{i}: {g.name}, {fmt_bytes(g.free_bytes)} free of {fmt_bytes(g.memory_bytes)}" for i, g in enumerate(p.target.gpus)),
        )
    if not p.stages or not p.stages.predicted:
        return
    for s, m in p.stages.predicted.items():
        t.add_row(
            f"{s} (predicted peak)",
            (f"on {m.where}: " if m.where else "")
            + f"host {fmt_bytes(m.host_bytes)}"
            + (f", GPU {fmt_bytes(m.gpu_bytes)}" if m.gpu_bytes else ""),
        )
    t.add_row("host RAM", f"{fmt_bytes(p.stages.host_total_bytes)} here (stage peaks: docs/memory.md)")
