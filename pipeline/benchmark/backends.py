"""Where the load goes: the in-process engine, the transformers baseline, or Triton over gRPC.

Every backend exposes ``async submit(request, record)``: it sets nothing on ``record`` before the
call (the load generator stamps ``t_send``), appends one ``time.perf_counter()`` per generated token
to ``record.token_times`` as tokens become available, and returns when the request is finished.

In-process backends run their model on one worker thread (the engine's own continuous-batching
loop, or a serial transformers decode loop) and hand completions back to the asyncio loop with
``call_soon_threadsafe``; token times are taken on that thread the moment a token is available.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .records import RequestRecord
from .workload import BenchRequest

log = logging.getLogger("pipeline.benchmark")


class _Item:
    __slots__ = ("req", "rec", "fut", "loop")

    def __init__(self, req: BenchRequest, rec: RequestRecord, fut: asyncio.Future, loop: asyncio.AbstractEventLoop):
        self.req, self.rec, self.fut, self.loop = req, rec, fut, loop

    def finish(self) -> None:
        self.rec.t_done = time.perf_counter()

        def _resolve() -> None:
            if not self.fut.done():
                self.fut.set_result(None)

        self.loop.call_soon_threadsafe(_resolve)


class ThreadedBackend:
    """Base: a worker thread consumes submitted requests (``_work``)."""

    name = "threaded"

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fatal: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._guarded, name=f"bench-{self.name}", daemon=True)
        self._thread.start()

    def _guarded(self) -> None:
        try:
            self._work()
        except BaseException as e:
            log.exception("%s backend thread died", self.name)
            self._fatal = e
            while True:
                try:
                    it = self._q.get_nowait()
                except queue.Empty:
                    break
                if it is not None:
                    it.rec.error = f"backend failed: {e}"
                    it.finish()

    def _work(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _next(self) -> _Item | None:
        """The next submitted request, waiting for it; None once closed (the ``None`` sentinel, or stopped and empty)."""
        while True:
            try:
                return self._q.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return None

    async def submit(self, req: BenchRequest, rec: RequestRecord) -> None:
        if self._fatal is not None:
            rec.error = f"backend failed: {self._fatal}"
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._q.put(_Item(req, rec, fut, loop))
        await fut

    def close(self) -> None:
        self._stop.set()
        self._q.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)


# --------------------------------------------------------------------------- onnxruntime-genai
class OrtEngineBackend(ThreadedBackend):
    """The built onnxruntime-genai engine in-process: ``og.Engine`` continuous batching.

    Requests are admitted into the running engine between steps (in-flight batching); each
    ``Engine.run`` step's token events are timestamped when ``run`` returns.

    Args:
        engine_dir: the build artifact's ``engine/`` (genai_config.json + model.onnx).
        ignore_eos: generate exactly ``max_new_tokens`` (EOS masked with ``min_generated_tokens``).
        stop_token_ids: ids that end a request when not ignoring EOS (not counted as output).
    """

    name = "engine"

    def __init__(self, engine_dir: Path, *, ignore_eos: bool, stop_token_ids: Sequence[int]):
        super().__init__()
        import onnxruntime_genai as og

        self._og = og
        self.engine_dir = Path(engine_dir)
        self.ignore_eos = ignore_eos
        self.stop_ids = set(int(s) for s in stop_token_ids)
        self.max_batch_size: int | None = None
        self._ready = threading.Event()
        self.steps = 0
        self.token_events = 0
        self.active_sum = 0

    def counters(self) -> dict[str, int]:
        """Engine.run calls that produced tokens, tokens they produced (= sequences decoded in the step, summed), and
        the sum over those calls of requests admitted (in the engine, running or waiting for a batch slot)."""
        return {"steps": self.steps, "token_events": self.token_events, "active_sum": self.active_sum}

    def start(self) -> None:
        """Load the engine on the worker thread (og.Engine must be used from the thread that owns it)."""
        super().start()
        self._ready.wait()
        if self._fatal is not None:
            raise self._fatal

    def describe(self) -> dict[str, Any]:
        return {"engine_dir": str(self.engine_dir), "driver": "onnxruntime_genai.Engine (in-flight batching)"}

    def _admit(self, it: _Item, active: dict[int, tuple[Any, _Item]]) -> None:
        import numpy as np

        og = self._og
        try:
            r = self.engine.create_request()
            opts = og.TurnOptions(r)
            opts.set_do_sample(False)
            opts.set_max_generated_tokens(int(it.req.max_new_tokens))
            if self.ignore_eos:
                opts.set_min_generated_tokens(int(it.req.max_new_tokens))
            r.begin_turn(np.asarray(it.req.input_ids, dtype=np.int32), opts)
        except Exception as e:
            it.rec.error = f"{type(e).__name__}: {e}"
            it.rec.finish_reason = "error"
            it.finish()
            return
        active[id(r)] = (r, it)

    def _work(self) -> None:
        og = self._og
        try:
            self.model = og.Model(str(self.engine_dir))
            self.engine = og.Engine(self.model)
            self.max_batch_size = int(self.engine.get_capabilities().configured_max_batch_size) or None
        finally:
            self._ready.set()
        tok_flag = int(og.EngineEventFlags.TOKEN.value)
        fin_flag = int(og.EngineEventFlags.TURN_FINISHED.value)
        fail_flag = int(og.EngineEventFlags.FAILED.value)
        buf = self.engine.create_event_buffer(1024)
        active: dict[int, tuple[Any, _Item]] = {}
        while True:
            # admit everything waiting; block briefly only when idle
            while True:
                try:
                    it = self._q.get(timeout=0.05) if not active else self._q.get_nowait()
                except queue.Empty:
                    break
                if it is None:
                    for _r, a in active.values():
                        a.rec.error = "backend closed"
                        a.finish()
                    return
                self._admit(it, active)
            if not active:
                if self._stop.is_set():
                    return
                continue
            n_active = len(active)
            events = self.engine.run(buf)
            now = time.perf_counter()
            n_tok = 0
            for ev in events:
                key = id(ev.request)
                entry = active.get(key)
                if entry is None:
                    continue
                r, it = entry
                flags = int(ev.flags.value)
                if flags & tok_flag:
                    n_tok += 1
                    t = int(ev.token)
                    if self.ignore_eos or t not in self.stop_ids:
                        it.rec.token_times.append(now)
                if flags & fail_flag:
                    it.rec.error = f"engine failure: {ev.error_code.name}"
                    it.rec.finish_reason = "error"
                if flags & (fin_flag | fail_flag):
                    if it.rec.error is None:
                        it.rec.reported_output_len = int(ev.usage.generated_tokens)
                        if not self.ignore_eos and it.rec.reported_output_len > len(it.rec.token_times):
                            it.rec.reported_output_len = len(it.rec.token_times)  # the stop id is not an output token
                        fr = ev.finish_reason.name
                        it.rec.finish_reason = "eos" if fr in ("EOS", "STOP_STRING") else "length"
                    del active[key]
                    try:
                        r.close()
                    except Exception:
                        pass
                    it.finish()
            if n_tok:
                self.steps += 1
                self.token_events += n_tok
                self.active_sum += n_active


# --------------------------------------------------------------------------- any EngineRunner
class RunnerBackend(ThreadedBackend):
    """Any :class:`pipeline.core.targets.base.EngineRunner` (targets without a streaming driver here).

    Requests that arrive while a ``generate`` call runs wait for the next call (batch admission,
    not in-flight admission); token times come from the runner's ``on_token`` callback.
    """

    name = "engine"

    def __init__(self, runner: Any, *, ignore_eos: bool, stop_token_ids: Sequence[int]):
        super().__init__()
        self.runner = runner
        self.max_batch_size = getattr(runner, "max_batch_size", None)
        self.ignore_eos = ignore_eos
        self.stop_ids = list(stop_token_ids)

    def _work(self) -> None:
        from ..core.targets.base import GenerationRequest

        while True:
            first = self._next()
            if first is None:
                return
            items = [first]
            while len(items) < (self.max_batch_size or 1 << 30):
                try:
                    it = self._q.get_nowait()
                except queue.Empty:
                    break
                if it is None:
                    self._stop.set()
                    break
                items.append(it)
            by_id = {it.req.request_id: it for it in items}

            def on_token(rid: str, tok: int, t: float, by_id: dict = by_id) -> None:
                by_id[rid].rec.token_times.append(time.perf_counter())

            gen = [
                GenerationRequest(
                    list(it.req.input_ids), it.req.max_new_tokens, self.stop_ids, it.req.request_id, ignore_eos=self.ignore_eos
                )
                for it in items
            ]
            try:
                results = self.runner.generate(gen, on_token=on_token)
            except Exception as e:
                results = None
                for it in items:
                    it.rec.error = f"{type(e).__name__}: {e}"
            for i, it in enumerate(items):
                if results is not None:
                    res = results[i]
                    it.rec.reported_output_len = len(res.output_ids)
                    it.rec.finish_reason = res.finish_reason
                    if res.error:
                        it.rec.error = res.error
                it.finish()

    def close(self) -> None:
        super().close()
        try:
            self.runner.close()
        except Exception:
            pass


# --------------------------------------------------------------------------- transformers baseline
class TransformersBackend(ThreadedBackend):
    """The unoptimised reference: eager fp32 transformers on the export artifact's ``hf/``.

    One request at a time (no batching), greedy, a manual decode loop with the model's KV cache;
    each token is timestamped after its forward pass and argmax. Concurrent requests queue.
    """

    name = "baseline"

    def __init__(self, hf_dir: Path, *, ignore_eos: bool, stop_token_ids: Sequence[int], threads: int | None = None):
        super().__init__()
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        if threads:
            torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(hf_dir), dtype=torch.float32, attn_implementation="eager", trust_remote_code=False, use_safetensors=True
        )
        self.model.eval()
        import inspect

        # transformers 5.x renamed ``past_key_values`` to ``cache``; use whichever this version takes
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.ignore_eos = ignore_eos
        self.stop_ids = set(int(s) for s in stop_token_ids)
        self.max_batch_size = 1

    @staticmethod
    def _past(out: Any) -> Any:
        for name in ("cache", "past_key_values"):
            v = getattr(out, name, None)
            if v is not None:
                return v
        raise RuntimeError("the model returned no KV cache (use_cache=True had no effect)")

    def _generate(self, it: _Item) -> None:
        torch = self._torch
        rec = it.rec
        with torch.inference_mode():
            ids = torch.tensor([it.req.input_ids], dtype=torch.long)
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
            past = self._past(out)
            n = 0
            finish = "length"
            while n < it.req.max_new_tokens:
                tok = int(out.logits[0, -1].argmax())
                if not self.ignore_eos and tok in self.stop_ids:
                    finish = "eos"
                    break
                rec.token_times.append(time.perf_counter())
                n += 1
                if n >= it.req.max_new_tokens:
                    break
                out = self.model(input_ids=torch.tensor([[tok]], dtype=torch.long), use_cache=True, **{self._cache_kw: past})
                past = self._past(out)
        rec.reported_output_len = n
        rec.finish_reason = finish

    def _work(self) -> None:
        while (it := self._next()) is not None:
            try:
                self._generate(it)
            except Exception as e:
                it.rec.error = f"{type(e).__name__}: {e}"
                it.rec.finish_reason = "error"
            it.finish()
