"""Print a :class:`~pipeline.planner.base.Plan` with rich."""

from __future__ import annotations

from typing import Any

from .base import Plan, fmt_bytes


def _params(n: float) -> str:
    """A parameter count the way model cards write it: ``4.59M``, ``8.03B`` (``0.00B`` hid a 4.59 M model)."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{int(n)}"


def _rate(r: dict[str, Any] | None) -> str:
    if not r:
        return "-"
    return (
        f"step >= {r['step_s_min'] * 1e3:.2f} ms -> <= {r['tok_s_per_seq_max']:.1f} tok/s per sequence, "
        f"<= {r['tok_s_aggregate_max']:.0f} tok/s aggregate (batch {r['batch']}, {r['context_tokens']} tokens of context each)"
    )


def render(p: Plan, console: Any, *, compact: bool = False) -> None:
    """Print the plan: one table plus warnings/refusals (``compact`` = the short form shown at run start)."""
    from rich.table import Table

    c = p.config
    tgt = p.target
    title = (
        f"plan: {p.model.get('architecture')} {_params(p.model.get('num_parameters', 0))} params, "
        f"quant={c['recipe']} kv={c['kv_cache']} tp={c['tp_size']} pp={c['pp_size']} on {tgt.get('name') or tgt.get('kind')}"
    )
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("target", f"{tgt.get('kind')}: {tgt.get('why')}")
    if p.status == "unplanned":
        console.print(t)
        for n in p.notes:
            console.print(f"[yellow]note:[/] {n}")
        return
    if tgt.get("kind") == "gpu":
        t.add_row(
            "GPU",
            f"{tgt.get('name')}: {fmt_bytes(p.memory.get('gpu_bytes'))}, {tgt.get('bandwidth_gb_s')} GB/s, "
            f"SM {tgt.get('compute_capability')} ({tgt.get('source')})",
        )
    else:
        t.add_row(
            "host",
            f"{fmt_bytes(tgt.get('memory_bytes'))} RAM ({fmt_bytes(tgt.get('available_bytes'))} available), "
            f"{tgt.get('bandwidth_gb_s')} GB/s measured",
        )
    w = p.weights
    t.add_row(
        "weights",
        f"{fmt_bytes(w.get('total_bytes'))} total ({w.get('bits_per_param')} bits/param), "
        f"{fmt_bytes(w.get('per_rank_bytes'))} per rank; high precision: {fmt_bytes(w.get('high_precision_bytes'))}"
        + (f" ({', '.join(w.get('high_precision_modules') or [])})" if w.get("high_precision_modules") and not compact else ""),
    )
    kv = p.kv_cache
    t.add_row(
        "KV cache",
        f"{fmt_bytes(kv.get('bytes_per_token_model'))}/token ({kv.get('dtype')}), "
        f"{fmt_bytes(kv.get('bytes_per_token_rank'))}/token per rank"
        + (f", block of {kv.get('tokens_per_block')} = {fmt_bytes(kv.get('bytes_per_block_rank'))}" if kv.get("tokens_per_block") else "")
        + f", {fmt_bytes(kv.get('bytes_per_sequence_rank'))} per sequence at max_seq_len={c['max_seq_len']}",
    )
    m = p.memory
    if tgt.get("kind") == "gpu":
        t.add_row(
            "memory/rank",
            f"weights {fmt_bytes(m['weights_bytes'])} + activations ~{fmt_bytes(m['activations_bytes'])} "
            f"(max_num_tokens={c['max_num_tokens']}) + runtime ~{fmt_bytes(m['runtime_overhead_bytes'])}; "
            f"KV pool {fmt_bytes(m['kv_pool_bytes'])} = {c['kv_cache_free_gpu_mem_fraction']} x "
            f"{fmt_bytes(max(0, m['free_after_load_bytes']))} free",
        )
        cap = p.capacity
        t.add_row(
            "capacity",
            f"{cap['kv_tokens']} KV tokens ({cap['kv_blocks']} blocks) -> {cap['max_sequences_at_max_seq_len']} "
            f"sequences at max_seq_len={c['max_seq_len']} (max_batch_size={c['max_batch_size']})",
        )
    else:
        t.add_row(
            "memory",
            f"weights {fmt_bytes(m['weights_bytes'])} + KV {fmt_bytes(m['kv_cache_bytes'])} "
            f"({c['max_batch_size']} x {c['max_seq_len']} tokens) + activations ~{fmt_bytes(m['activations_bytes'])} "
            f"= {fmt_bytes(m['total_needed_bytes'])}",
        )
    d = p.decode
    t.add_row("decode bound (1 seq)", _rate(d.get("batch1")))
    if d.get("full") and d["full"]["batch"] > 1:
        t.add_row("decode bound (full)", _rate(d.get("full")))
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
    gpus = (p.target or {}).get("gpus") or []
    if gpus:
        t.add_row(
            "visible GPUs",
            "; ".join(
                f"{i}: {g.get('name')}, {fmt_bytes(g.get('free_bytes'))} free of {fmt_bytes(g.get('memory_bytes'))}"
                for i, g in enumerate(gpus)
            ),
        )
    pred = (p.stages or {}).get("predicted") or {}
    if not pred:
        return
    for s, m in pred.items():
        t.add_row(
            f"{s} (predicted peak)",
            (f"on {m['where']}: " if m.get("where") else "")
            + f"host {fmt_bytes(m['host_bytes'])}"
            + (f", GPU {fmt_bytes(m['gpu_bytes'])}" if m.get("gpu_bytes") else ""),
        )
    t.add_row("host RAM", f"{fmt_bytes(p.stages.get('host_total_bytes'))} here (stage peaks: docs/memory.md)")
