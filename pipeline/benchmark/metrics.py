"""Benchmark metrics from per-request records, named as genai-perf / trtllm-bench report them.

Definitions (genai-perf README "Metrics"; trtllm-bench ``--streaming`` report):

* ``time_to_first_token`` (TTFT): request sent -> first token received, per request.
* ``inter_token_latency`` (ITL): (request latency - TTFT) / (output tokens - 1), per request (genai-perf / AIPerf
  definition; requests with one token have none).
* ``inter_response_latency``: every gap between consecutive streamed responses of a request, pooled (tokens that
  arrive in one response count once: with ``stream_interval`` > 1 the token gaps inside a response would be 0).
* ``time_per_output_token`` (TPOT): (last token - first token) / (output tokens - 1), per request
  (requests with one token have none).
* ``request_latency``: request sent -> last token (end-to-end latency), per request.
* ``output_token_throughput``: output tokens of completed requests / benchmark duration, where the
  duration runs from the first send to the last completion of the level (tokens/s).
* ``request_throughput``: completed requests / duration (requests/s).
* ``output_token_throughput_per_user``: 1 / TPOT per request (tokens/s/user).
* ``prefill_decode``: share of request time spent before the first token (prefill + queueing)
  vs after it (decode).
* ``serving_path`` (Triton mode, from the deployment's ``return_perf_metrics`` timestamps; :func:`serving_path`):
  where a request's time goes hop by hop, and the engine's own TPOT inside the server next to the client's.

Distributions are reported as ``{unit, avg, min, max, std, p50, p75, p90, p95, p99}`` (``avg`` is
the arithmetic mean; percentiles by linear interpolation, ``numpy.percentile``); times in ms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .records import RequestRecord

PERCENTILES = (50, 75, 90, 95, 99)
DIST_METRICS = (
    "time_to_first_token",
    "inter_token_latency",
    "inter_response_latency",
    "time_per_output_token",
    "request_latency",
    "output_token_throughput_per_user",
    "output_sequence_length",
    "input_sequence_length",
)
# Scalars compared across runs by ``pipeline benchmark compare`` (dotted paths into a level's metrics).
# "lower" = lower is better.
HEADLINE = {
    "time_to_first_token.avg": "lower",
    "time_to_first_token.p50": "lower",
    "time_to_first_token.p90": "lower",
    "time_to_first_token.p99": "lower",
    "time_per_output_token.avg": "lower",
    "time_per_output_token.p50": "lower",
    "time_per_output_token.p90": "lower",
    "time_per_output_token.p99": "lower",
    "inter_token_latency.avg": "lower",
    "inter_token_latency.p99": "lower",
    "request_latency.avg": "lower",
    "request_latency.p50": "lower",
    "request_latency.p90": "lower",
    "request_latency.p99": "lower",
    "output_token_throughput.avg": "higher",
    "request_throughput.avg": "higher",
    "requests.errors": "lower",
    "serving_path.client.avg": "lower",
    "serving_path.request_hop.avg": "lower",
    "serving_path.queue.avg": "lower",
    "serving_path.prefill.avg": "lower",
    "serving_path.first_token_delivery.avg": "lower",
    "serving_path.server_time_per_output_token.avg": "lower",
    "serving_path.last_token_delivery.avg": "lower",
}
# Scalars compared but not judged better or worse: their direction says nothing about speed (name -> why).
UNJUDGED = {
    "prefill_decode.prefill_share": "prefill time / request time: lower when prefill got faster, or when decode got slower",
}
COMPARED = (*HEADLINE, *UNJUDGED)
"""Every scalar ``pipeline benchmark compare`` compares (and the summary's ``spread`` holds): :data:`HEADLINE`, then
:data:`UNJUDGED`."""
SERVING_HOPS = {
    "client": "benchmark send -> the client library sends (hand-off to a client thread, building the inputs, opening "
    "the request's gRPC stream)",
    "request_hop": "client sends -> the engine model has parsed the request (gRPC, the ensemble scheduler, "
    "preprocessing's tokenization, the engine model's execute())",
    "queue": "parsed -> admitted to the engine (first_scheduled_time_ns - arrival_time_ns)",
    "prefill": "admitted -> first token generated (first_token_time_ns - first_scheduled_time_ns); on the CPU target "
    "this includes waiting inside og.Engine for the running static batch to finish",
    "first_token_delivery": "first token generated -> received by the client (response build, the Python backend's "
    "IPC, the ensemble, gRPC, the client's callback)",
    "server_time_per_output_token": "the engine's TPOT inside the server: (last_token_time_ns - first_token_time_ns) / (tokens - 1)",
    "last_token_delivery": "last token generated -> received by the client (how far delivery trails the engine at the end)",
}
"""The hops of :func:`serving_path` and what each spans (ms distributions in a level's ``serving_path``)."""


def distribution(values: Iterable[float], unit: str, scale: float = 1.0) -> dict[str, Any]:
    """Summary statistics of ``values`` × ``scale`` (e.g. s -> ms with 1000). Empty -> ``count: 0``."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64) * scale
    if x.size == 0:
        return {"unit": unit, "count": 0}
    out: dict[str, Any] = {
        "unit": unit,
        "count": int(x.size),
        "avg": float(x.mean()),
        "min": float(x.min()),
        "max": float(x.max()),
        "std": float(x.std()),
    }
    for p, v in zip(PERCENTILES, np.percentile(x, PERCENTILES)):
        out[f"p{p}"] = float(v)
    return out


def level_metrics(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """All metrics of one measured level (see module docstring)."""
    ok = [r for r in records if r.ok]
    errors = [r for r in records if not r.ok]
    if ok:
        t_first = min(r.t_send for r in ok)
        t_last = max(r.t_send + r.e2e for r in ok)
        duration = max(t_last - t_first, 1e-9)
    else:
        duration = 0.0
    out_tokens = sum(r.output_len for r in ok)
    ttft = [r.ttft for r in ok]
    e2e = [r.e2e for r in ok]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    mismatches = [r.request_id for r in ok if r.reported_output_len is not None and r.reported_output_len != r.output_len]
    prefill = float(sum(ttft))
    total = float(sum(e2e))
    m: dict[str, Any] = {
        "requests": {
            "sent": len(records),
            "completed": len(ok),
            "errors": len(errors),
            "error_messages": sorted({str(r.error) for r in errors})[:10],
        },
        "duration_s": duration,
        "time_to_first_token": distribution(ttft, "ms", 1e3),
        "inter_token_latency": distribution([r.itl for r in ok if r.itl is not None], "ms", 1e3),
        "inter_response_latency": distribution([g for r in ok for g in r.response_gaps], "ms", 1e3),
        "time_per_output_token": distribution(tpot, "ms", 1e3),
        "request_latency": distribution(e2e, "ms", 1e3),
        "output_token_throughput_per_user": distribution([1.0 / t for t in tpot if t > 0], "tokens/sec/user"),
        "output_sequence_length": distribution([r.output_len for r in ok], "tokens"),
        "input_sequence_length": distribution([r.input_len for r in ok], "tokens"),
        "output_token_throughput": {"unit": "tokens/sec", "avg": out_tokens / duration if duration else 0.0},
        "request_throughput": {"unit": "requests/sec", "avg": len(ok) / duration if duration else 0.0},
        "output_tokens": out_tokens,
        "prefill_decode": {
            "prefill_s": prefill,
            "decode_s": total - prefill,
            "prefill_share": prefill / total if total else None,
            "decode_share": (total - prefill) / total if total else None,
        },
        "consistency": {
            "token_count_mismatches": mismatches[:10],
            "short_outputs": [r.request_id for r in ok if r.finish_reason == "length" and r.output_len != r.requested_output_len][:10],
        },
    }
    sp = serving_path(ok)
    if sp is not None:
        m["serving_path"] = sp
    return m


def serving_path(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """Per-hop timing of the completed requests that carry server timestamps (:data:`SERVING_HOPS`), ms each.

    The client's TTFT is the sum ``client + request_hop + queue + prefill + first_token_delivery``; the client's
    TPOT differs from ``server_time_per_output_token`` by the change of the delivery lag over the request, i.e.
    ``(last_token_delivery - first_token_delivery) / (tokens - 1)`` (negative when the lag shrinks). ``None`` when no request has server times.
    """
    rs = [r for r in records if r.ok and r.server_times and len(r.server_times) == 4]
    if not rs:
        return None
    hops: dict[str, list[float]] = {k: [] for k in SERVING_HOPS}
    for r in rs:
        s = r.server_times or {}
        sent = r.t_client_send if r.t_client_send is not None else r.t_send
        hops["client"].append(sent - r.t_send)
        hops["request_hop"].append(s["arrival"] - sent)
        hops["queue"].append(s["scheduled"] - s["arrival"])
        hops["prefill"].append(s["first_token"] - s["scheduled"])
        hops["first_token_delivery"].append(r.token_times[0] - s["first_token"])
        hops["last_token_delivery"].append(r.token_times[-1] - s["last_token"])
        if r.output_len > 1:
            hops["server_time_per_output_token"].append((s["last_token"] - s["first_token"]) / (r.output_len - 1))
    out: dict[str, Any] = {k: distribution(v, "ms", 1e3) for k, v in hops.items()}
    out["requests"] = len(rs)
    return out


def get_path(doc: dict[str, Any], path: str) -> Any:
    """``get_path(m, "time_to_first_token.p50")``; ``None`` when absent."""
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def aggregate_repeats(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Spread of each headline scalar over repeated runs: ``{path: {mean, std, min, max, n, values}}``."""
    out: dict[str, dict[str, Any]] = {}
    for path in COMPARED:
        vals = [get_path(r, path) for r in runs]
        vals = [float(v) for v in vals if isinstance(v, (int, float))]
        if not vals:
            continue
        a = np.asarray(vals)
        out[path] = {
            "mean": float(a.mean()),
            "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()),
            "max": float(a.max()),
            "n": int(a.size),
            "values": vals,
        }
    return out
