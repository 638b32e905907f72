"""Load generation: a closed-loop fixed-concurrency sweep and an open-loop Poisson request rate.

Closed loop (``concurrency=c``): c clients each send a request, wait for its last token, send the
next (genai-perf ``--concurrency``). Open loop (``request_rate=r``): requests are sent at seeded
Poisson arrival times (exponential gaps with mean 1/r s) regardless of completions
(genai-perf ``--request-rate``). Both stop sending at ``max_duration_s``; requests in flight at
the deadline are cancelled and counted as errors only if they had not finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .records import RequestRecord
from .workload import BenchRequest


@dataclasses.dataclass
class LevelRun:
    """The records of one measured level and its wall-clock window (perf_counter seconds)."""

    records: list[RequestRecord]
    t_start: float
    t_end: float
    timed_out: bool = False


def _record(req: BenchRequest) -> RequestRecord:
    return RequestRecord(req.request_id, len(req.input_ids), req.max_new_tokens)


async def _one(backend: Any, req: BenchRequest, rec: RequestRecord) -> None:
    rec.t_send = time.perf_counter()
    try:
        await backend.submit(req, rec)
    except asyncio.CancelledError:
        rec.error = rec.error or "cancelled at the time bound (benchmark.max_duration_s)"
        raise
    except Exception as e:
        rec.error = f"{type(e).__name__}: {e}"
        rec.finish_reason = "error"


async def closed_loop(backend: Any, requests: Sequence[BenchRequest], concurrency: int, max_duration_s: float) -> LevelRun:
    """Send ``requests`` with ``concurrency`` clients; stop sending after ``max_duration_s`` s."""
    todo = list(requests)
    records: list[RequestRecord] = []
    t0 = time.perf_counter()
    deadline = t0 + max_duration_s

    async def client() -> None:
        while todo and time.perf_counter() < deadline:
            req = todo.pop(0)
            rec = _record(req)
            records.append(rec)
            await _one(backend, req, rec)

    tasks = [asyncio.ensure_future(client()) for _ in range(concurrency)]
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()) + max_duration_s * 0.5 + 5)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return LevelRun(records, t0, time.perf_counter(), timed_out=bool(pending) or bool(todo))


async def open_loop(backend: Any, requests: Sequence[BenchRequest], rate: float, seed: int, max_duration_s: float) -> LevelRun:
    """Send ``requests`` at Poisson arrivals of ``rate`` req/s (seeded); stop sending at the bound."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, len(requests))
    arrivals = np.cumsum(gaps) - gaps[0]  # first request at t=0
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task] = []
    t0 = time.perf_counter()
    deadline = t0 + max_duration_s
    for req, at in zip(requests, arrivals):
        delay = t0 + float(at) - time.perf_counter()
        if t0 + float(at) >= deadline:
            break
        if delay > 0:
            await asyncio.sleep(delay)
        rec = _record(req)
        records.append(rec)
        tasks.append(asyncio.ensure_future(_one(backend, req, rec)))
    pending: set = set()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()) + max_duration_s * 0.5 + 5)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return LevelRun(records, t0, time.perf_counter(), timed_out=bool(pending) or len(records) < len(requests))


async def warmup(backend: Any, requests: Sequence[BenchRequest], max_duration_s: float) -> tuple[int, list[str]]:
    """Send the warm-up requests all at once; their records are discarded.

    Returns (how many succeeded, distinct error messages).
    """
    if not requests:
        return 0, []
    run = await closed_loop(backend, requests, len(requests), max_duration_s)
    return sum(1 for r in run.records if r.ok), sorted({str(r.error) for r in run.records if not r.ok})
