"""Decode roofline: the memory-bandwidth bound on decode speed, and how close a run came to it.

A decode step of a batch of ``b`` sequences must read every weight once plus each sequence's KV
cache (Williams et al., "Roofline", CACM 2009; the standard LLM-decode form, e.g. Pope et al.,
"Efficiently Scaling Transformer Inference", 2022):

    bound_tokens_per_s(b) = b * BW / (W + b * KV(L))

* ``W``  — weight bytes read per step: every initializer of the engine's ONNX graph except
  embedding tables consumed by a ``Gather`` (a lookup reads one row per token, not the table).
* ``KV(L)`` — KV bytes read per sequence at context length ``L``:
  ``2 (K and V) × layers × kv_heads × head_dim × bytes_per_element × L``; ``L`` is the mean
  context during decode, input length + output length / 2.
* ``BW`` — memory bandwidth in bytes/s: measured on this host (a large ``numpy`` copy, counting
  read + write bytes), or from the planner's GPU catalogue on a GPU host.

The achieved decode rate is ``b / TPOT`` (``b`` = sequences decoding together, min(concurrency,
engine max_batch_size)); the report prints achieved / bound as a fraction.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from ..core.contracts.benchmark import Distribution

log = logging.getLogger("pipeline.benchmark")

_ONNX_ELEM_BYTES = {1: 4, 10: 2, 16: 2, 11: 8, 6: 4, 7: 8, 2: 1, 3: 1, 21: 1, 22: 1, 17: 1, 18: 1, 19: 1, 20: 1}


def measure_host_bandwidth_gbs(size_mib: int = 256, repeats: int = 3) -> float:
    """Host memory bandwidth in GB/s (1e9 bytes/s): best of ``repeats`` ``numpy.copyto`` of a
    ``size_mib`` MiB float64 array, counting bytes read + bytes written."""
    import numpy as np

    n = size_mib * 2**20 // 8
    a = np.ones(n)
    b = np.empty_like(a)
    np.copyto(b, a)  # fault in the pages
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best / 1e9


@dataclasses.dataclass
class Bandwidth:
    """``BW`` in GB/s and its source; without a GPU, measured again at the end (``gbs_end``) and the higher kept."""

    gbs: float
    source: str
    gbs_start: float | None = None
    gbs_end: float | None = None


def memory_bandwidth() -> Bandwidth:
    """The GPU catalogue's figure for a visible GPU, else the planner's host measurement, else
    :func:`measure_host_bandwidth_gbs`."""
    from ..core import hostinfo

    gpus = hostinfo.gpus()
    if gpus:
        try:
            from ..facts.gpus import match_local

            g = match_local(gpus[0]["name"], gpus[0].get("memory_mib"))
            if g is not None:
                return Bandwidth(g.bandwidth_bytes_s / 1e9, f"GPU catalogue: {g.name} ({g.source})")
        except Exception as e:
            log.debug("GPU catalogue lookup failed: %s", e)
    try:
        from ..core.sizing import host_memory_bandwidth_gbs

        return Bandwidth(float(host_memory_bandwidth_gbs()), "measured on this host (pipeline.planner.host_memory_bandwidth_gbs)")
    except Exception as e:
        log.debug("planner bandwidth unavailable: %s", e)
    return Bandwidth(measure_host_bandwidth_gbs(), "measured on this host (numpy copy, read+write bytes)")


def onnx_engine_bytes(engine_dir: Path) -> dict[str, Any]:
    """Weight and KV-cache facts of an onnxruntime-genai engine folder.

    Returns ``{weight_bytes_per_step, embedding_bytes, total_initializer_bytes, kv_bytes_per_token,
    kv_dtype_bytes, layers, kv_heads, head_dim}`` (bytes). Reads only the graph (not the weights).
    """
    import onnx

    cfg = json.loads((engine_dir / "genai_config.json").read_text(encoding="utf-8"))
    dec = cfg["model"]["decoder"]
    m = onnx.load(str(engine_dir / dec.get("filename", "model.onnx")), load_external_data=False)
    g = m.graph
    sizes: dict[str, int] = {}
    for t in g.initializer:
        ext = {e.key: e.value for e in t.external_data}
        if "length" in ext:
            n = int(ext["length"])
        elif t.raw_data:
            n = len(t.raw_data)
        else:
            count = 1
            for d in t.dims:
                count *= int(d)
            n = count * _ONNX_ELEM_BYTES.get(t.data_type, 4)
        sizes[t.name] = n
    gathered = {n.input[0] for n in g.node if n.op_type in ("Gather", "GatherBlockQuantized") and n.input and n.input[0] in sizes}
    emb = sum(sizes[k] for k in gathered)
    kv_elem = 4
    past_name = dec["inputs"].get("past_key_names", "past_key_values.%d.key") % 0
    for i in g.input:
        if i.name == past_name:
            kv_elem = _ONNX_ELEM_BYTES.get(i.type.tensor_type.elem_type, 4)
    layers, kvh, hd = int(dec["num_hidden_layers"]), int(dec["num_key_value_heads"]), int(dec["head_size"])
    total = sum(sizes.values())
    return {
        "weight_bytes_per_step": total - emb,
        "embedding_bytes": emb,
        "total_initializer_bytes": total,
        "kv_bytes_per_token": 2 * layers * kvh * hd * kv_elem,
        "kv_dtype_bytes": kv_elem,
        "layers": layers,
        "kv_heads": kvh,
        "head_dim": hd,
    }


def bound_tokens_per_s(bw_bytes_s: float, weight_bytes: float, kv_bytes_per_seq: float, batch: float) -> float:
    """``b * BW / (W + b * KV)`` tokens/s (module docstring); ``batch`` may be a measured mean (sequences per step)."""
    return batch * bw_bytes_s / (weight_bytes + batch * kv_bytes_per_seq)


def roofline_for_level(
    facts: dict[str, Any],
    bw_gbs: float,
    metrics: dict[str, Any],
    concurrency: int | None,
    max_batch_size: int | None,
    measured_batch: float | None = None,
) -> dict[str, Any] | None:
    """Bound, achieved decode rate and their ratio for one measured level (``None`` without TPOT).

    ``b`` is ``measured_batch`` (mean sequences per engine step, engine mode) when given, else
    min(concurrency, max_batch_size)."""
    tpot = Distribution.from_json(metrics["time_per_output_token"]).avg
    isl = Distribution.from_json(metrics["input_sequence_length"]).avg
    osl = Distribution.from_json(metrics["output_sequence_length"]).avg
    if not tpot or isl is None or osl is None:
        return None
    b = measured_batch if measured_batch else max(1, min(concurrency or 1, max_batch_size or (concurrency or 1)))
    ctx = isl + osl / 2.0
    kv = facts["kv_bytes_per_token"] * ctx
    bound = bound_tokens_per_s(bw_gbs * 1e9, facts["weight_bytes_per_step"], kv, b)
    achieved = b * 1000.0 / tpot
    return {
        "batch": b,
        "mean_context_tokens": ctx,
        "kv_bytes_per_seq": kv,
        "bound_tokens_per_s": bound,
        "achieved_decode_tokens_per_s": achieved,
        "fraction": achieved / bound,
    }
