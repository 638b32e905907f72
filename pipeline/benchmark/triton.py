"""Triton mode: start the packaged model repository with :class:`pipeline.serve.server.TritonServer`
(127.0.0.1 only, free ports) and stream requests through :class:`pipeline.serve.client.LLMClient`.

Each in-flight request runs ``LLMClient.generate(stream=True)`` on its own worker thread (one client
per thread, as the client documents). Token arrival times are the client's per-response receive
times (taken on the gRPC callback thread); a response adds as many token arrivals as its
``sequence_length`` says (one per response unless the server joined queued tokens, ``package.stream_coalescing``). ``t_send`` is stamped before the prompt is rendered and sent,
so TTFT includes everything a real client pays per request (rendering, opening the gRPC stream, pre/postprocessing);
the per-thread clients are built in :meth:`TritonBackend.start`, before anything is measured.

Per-hop timing: every request asks for the deployment's perf metrics (``return_perf_metrics``, TensorRT-LLM's
``arrival_time_ns`` ... ``last_token_time_ns`` outputs), and the record keeps them beside the client's own times
(:func:`pipeline.benchmark.metrics.serving_path`). Server and client read the same host's wall clock (the server runs
on 127.0.0.1), so the hops subtract directly.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..serve.client import PERF_TIMES
from .records import RequestRecord
from .workload import BenchRequest

SERVER_TIMES = dict(zip(PERF_TIMES, ("arrival", "scheduled", "first_token", "last_token")))
"""Triton perf-metric output (TensorRT-LLM backend name, :data:`~pipeline.serve.client.PERF_TIMES`) -> key of
:attr:`RequestRecord.server_times`."""


class TritonBackend:
    """Triton over gRPC streaming (see module docstring).

    Args:
        model_repository: the package artifact's ``model_repository/``.
        bcfg: the benchmark config (``ignore_eos`` → ``min_length = max_tokens``).
        model: served model name (``ensemble``).
        tokenizer_dir: tokenizer for the chat template (default: the repository's preprocessing tokenizer).
    """

    name = "triton"

    def __init__(
        self,
        model_repository: Path,
        *,
        bcfg: Any,
        model: str = "ensemble",
        tokenizer_dir: Path | None = None,
        ready_timeout_s: float = 180.0,
        max_workers: int = 64,
    ):
        self.repo = Path(model_repository)
        self.model = model
        self.ignore_eos = bool(bcfg.ignore_eos)
        self.per_hop = bool(bcfg.per_hop)
        self.tokenizer_dir = tokenizer_dir or self.repo / "preprocessing" / "1" / "tokenizer"
        self.ready_timeout_s = ready_timeout_s
        levels = list(bcfg.concurrency) + [int(bcfg.warmup_requests)]
        self._threads = max(levels)  # worker threads whose client is made before measuring (start())
        self._pool = ThreadPoolExecutor(max_workers=max(max_workers, *levels), thread_name_prefix="bench-triton")
        self._local = threading.local()
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        self.server: Any = None
        self.max_batch_size: int | None = None

    def start(self) -> None:
        from transformers import AutoTokenizer

        from ..serve.server import TritonServer

        self.tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer_dir), trust_remote_code=False)
        self.server = TritonServer(
            self.repo, grpc_port=0, http_port=0, metrics_port=0, host="127.0.0.1", ready_timeout_s=self.ready_timeout_s
        )
        self.server.start()
        self._make_clients(self._threads)
        # asked once, while nothing runs, through a worker thread's client
        cfg = self._clients[0].client.get_model_config(self.model, as_json=True, client_timeout=10)["config"]
        self.max_batch_size = int(cfg.get("max_batch_size") or 0) or None

    def _make_clients(self, n: int) -> None:
        """Start ``n`` pool threads and build each one's client now, so no measured request pays for a client (a gRPC
        channel and three metadata calls: 10-110 ms): the tasks wait for each other, so each gets its own thread."""
        barrier = threading.Barrier(n)

        def make() -> None:
            self._client()
            barrier.wait(timeout=60)

        for f in [self._pool.submit(make) for _ in range(n)]:
            f.result()

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.server.grpc_url if self.server else None,
            "model": self.model,
            "model_repository": str(self.repo),
            "client": "pipeline.serve.client.LLMClient (stream=True)",
            "clients_built": len(self._clients),  # before measuring: one per worker thread (_make_clients)
        }

    def _client(self) -> Any:
        c = getattr(self._local, "c", None)
        if c is None:
            from ..serve.client import LLMClient

            c = self._local.c = LLMClient(self.server.grpc_url, self.model, tokenizer=self.tokenizer, timeout_s=600.0)
            with self._lock:
                self._clients.append(c)
        return c

    def _run(self, req: BenchRequest, rec: RequestRecord) -> None:
        extra: dict[str, Any] = {}
        if self.ignore_eos:
            extra["min_length"] = int(req.max_new_tokens)
        c = self._client()
        if self.per_hop and "return_perf_metrics" in c.inputs:
            extra["return_perf_metrics"] = True
        prompt = None if req.messages else req.prompt
        res = c.generate(prompt, int(req.max_new_tokens), stream=True, chat=True, request_id=req.request_id, messages=req.messages, **extra)
        t_after = time.perf_counter()
        t0 = t_after - res.total_s  # the client's own send time, on the perf_counter clock
        rec.t_client_send = t0
        if res.perf and res.sent_ns is not None:
            rec.server_times = {SERVER_TIMES[k]: t0 + (v - res.sent_ns) / 1e9 for k, v in res.perf.items() if k in SERVER_TIMES}
        counts = res.chunk_tokens if len(res.chunk_tokens) == len(res.chunks) else [None] * len(res.chunks)
        # a response carrying k tokens (queued tokens joined by the server) adds k arrivals at its receive time
        rec.token_times = [t0 + t for t, k in zip(res.chunk_times_s, counts) for _ in range(1 if k is None else k)]
        rec.t_done = t_after
        rec.reported_output_len = len(rec.token_times)
        rec.finish_reason = "length" if rec.reported_output_len >= req.max_new_tokens else "eos"

    async def submit(self, req: BenchRequest, rec: RequestRecord) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool, self._run, req, rec)
        except Exception as e:
            rec.error = f"{type(e).__name__}: {e}"
            rec.finish_reason = "error"

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        if self.server is not None:
            self.server.stop()
            if self.server.returncode not in (0, None):
                pass  # the log is kept by TritonServer when it failed
            self.server.cleanup()
