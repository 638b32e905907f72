"""Sending of the CPU serving model (``onnxruntime_genai_model.py``): every response, in order, from one thread.

Copied by the package stage next to that model's ``model.py`` (``pipeline/package/repository.py``
``MODEL_HELPERS``), which imports it as a sibling module; it runs inside Triton's Python backend stub, so it imports
only numpy (and Triton's ``triton_python_backend_utils``), never the ``pipeline`` package.

What it holds: :class:`Responder`, which builds the responses (shapes of TensorRT-LLM's C++ backend, the model's
module docstring), holds streamed tokens for ``stream_interval``, settles each prompt and the request's FINAL
flag, answers refused and failed requests with the reason, and records how each request ended
(``request_metrics.REQUESTS_ENDED``, counted once when its FINAL flag is sent).  Its sender thread (:meth:`Responder.run`)
delivers the queued responses in order, joins queued streamed tokens of one prompt (:func:`coalesce`) and polls the
running requests' clients for cancellation (``is_cancelled()``, kept off the engine thread).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from genai_requests import Group, Job

try:  # only inside Triton
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - importable for unit tests of the pure helpers
    pb_utils = None

CANCEL_POLL_S = 0.005  # is_cancelled() is a round trip to the server: once per 5 ms per request, on the sender thread


@dataclass
class Delta:
    """A streamed response not built yet: the token ids one prompt generated since its last response, their text and
    when the last of them was generated (``time.time_ns()``, its ``last_token_time_ns`` when perf metrics are asked)."""

    job: Job
    ids: list[int]
    text: str
    last_token_ns: int = 0


def coalesce(items: list[tuple[Any, Any, int]]) -> list[tuple[Any, Any, int]]:
    """Join queued streamed deltas of the same prompt into one response, keeping every request's order.

    ``items``: ``(group, response, flags)`` in send order; a :class:`Delta` is joined to the previous item of its
    request when that item is a non-final :class:`Delta` of the same prompt (ids and text concatenated, the later
    flags kept). Any other item (a built response, a flags-only FINAL, an error) is kept as it is and ends the run.
    Several tokens in one streamed response is what TensorRT-LLM sends when speculative decoding accepts several
    tokens in a step; a client reads ``sequence_length`` for their count.
    """
    out: list[tuple[Any, Any, int]] = []
    last: dict[int, int] = {}  # id(group) -> index in out of that request's latest item
    for g, response, flags in items:
        i = last.get(id(g))
        if isinstance(response, Delta) and i is not None:
            _, prev, prev_flags = out[i]
            if isinstance(prev, Delta) and prev.job is response.job and prev_flags == 0:
                prev.ids.extend(response.ids)
                prev.text += response.text
                prev.last_token_ns = response.last_token_ns
                out[i] = (g, prev, flags)
                continue
        last[id(g)] = len(out)
        out.append((g, response, flags))
    return out


def _error(msg: str, code: Any = None) -> Any:
    err = pb_utils.TritonError(msg) if code is None else pb_utils.TritonError(msg, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=err)


class Responder:
    """The responses of every request: built here, delivered in order by one sender thread (:meth:`run`).

    ``outputs``: the model's output names; ``text``: the text interface (``text_output`` always sent); ``eos_ids``:
    the pad id of ``output_ids`` when a request names no ``end_id``; ``decode``: ids -> text (the model's codec);
    ``coalesce`` / ``stream_interval``: ``package.stream_coalescing`` / ``package.stream_interval``; ``rm``:
    the ``request_metrics`` module, ``outcomes`` its ``RequestOutcomes`` (or a recorder in tests).
    """

    def __init__(
        self,
        *,
        outputs: set[str],
        text: bool,
        eos_ids: set[int],
        decode: Callable[[list[int]], str],
        coalesce: bool,
        stream_interval: int,
        logger: Any,
        rm: Any,
        outcomes: Any,
    ) -> None:
        self.outputs, self.text, self.eos_ids, self.decode = outputs, text, eos_ids, decode
        self.coalesce, self.stream_interval = coalesce, max(1, stream_interval)
        self.logger, self.rm, self.outcomes = logger, rm, outcomes
        # Responses leave through one FIFO sender thread: pb_utils' sender.send() waits for the server to take each
        # response (a stub->server round trip), and on the engine thread that wait serialized with every step.
        self.outbox: queue.SimpleQueue[tuple[Group, Any, int] | None] = queue.SimpleQueue()
        self.running: Callable[[], Iterable[Group]] = lambda: ()
        self.thread: threading.Thread | None = None

    def start(self, running: Callable[[], Iterable[Group]]) -> None:
        """Start the sender thread; ``running``: the groups of the running requests, polled for cancellation."""
        self.running = running
        self.thread = threading.Thread(target=self.run, name="responses", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """After everything else was queued: the sender delivers it, then ends."""
        self.outbox.put(None)
        if self.thread is not None:
            self.thread.join(timeout=10)

    # ------------------------------------------------------------------ answers from ``execute``
    def refuse(self, request: Any, e: Exception) -> None:
        """Answer a request refused in ``execute`` (one of several in the call) with the reason, FINAL; counted."""
        self.outcomes.count(self.rm.FAILURE, "refused")
        code = pb_utils.TritonError.INVALID_ARG if isinstance(e, ValueError) else pb_utils.TritonError.INTERNAL
        request.get_response_sender().send(_error(f"onnxruntime_genai: {e}", code), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def answer_stop(self, request: Any) -> None:
        """A ``stop=true`` request is answered at once: an empty FINAL, counted a success."""
        request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self.outcomes.count(self.rm.SUCCESS, "none")

    # ------------------------------------------------------------------ a prompt's responses
    def stream(self, job: Job, tok: int, piece: str, lp: float | None, *, last: bool) -> None:
        """A streamed token: sent at once when it is the first or completes ``stream_interval`` held tokens (or is the
        last), else held; a response carries every token held since the previous one."""
        job.held_ids.append(tok)
        job.held_text += piece
        if lp is not None:
            job.held_logps.append(lp)
        if last or len(job.tokens) == 1 or len(job.held_ids) >= self.stream_interval:
            self._send_held(job, final=last)

    def _send_held(self, job: Job, *, final: bool, tail: str = "") -> None:
        """One streamed response with the tokens held since the last one (and ``tail``, text the detokenizer still had)."""
        ids, text, logps = job.held_ids, job.held_text + tail, job.held_logps
        job.held_ids, job.held_text, job.held_logps = [], "", []
        self.send(job, ids, text, final=final, logps=[logps] if job.log_probs else None)

    def final_response(self, job: Job) -> None:
        if job.streaming:  # the held tokens (stream_interval) and what the detokenizer still holds
            self._send_held(job, final=True, tail=job.decoder.flush() if job.decoder is not None else "")
        else:
            ids = job.tokens if job.exclude_input else job.input_ids + job.tokens
            self.send(
                job,
                ids,
                self.decode(ids) if (self.text or "text_output" in job.requested) else "",
                final=True,
                logps=[job.logps] if job.log_probs else None,
            )

    def complete(self, job: Job) -> None:
        """Count the job as done; the last job of its group sends the request's FINAL flag."""
        if job.done:
            return
        job.done = True
        g = job.group
        g.open -= 1
        if g.open == 0:
            self.emit(g, None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def fail(self, job: Job, msg: str) -> None:
        """The job failed (once): its request gets the reason, FINAL when it was the request's last open prompt."""
        if job.done:
            return
        g = job.group
        job.done = True
        g.open -= 1
        self.mark(g, self.rm.FAILURE, "mid_stream" if g.responded else "engine_error")
        where = f"prompt {job.batch_index}: " if g.size > 1 else ""
        self.emit(g, _error(f"onnxruntime_genai: {where}{msg}"), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if g.open == 0 else 0)

    @staticmethod
    def mark(g: Group, outcome: str, reason: str) -> None:
        """Record how ``g`` ends when it is not a success (the first cause wins); counted when its FINAL flag is sent."""
        if g.outcome is None:
            g.outcome = (outcome, reason)

    def send(
        self, job: Job, ids: list[int] | list[list[int]], text: str | list[str], *, final: bool, logps: list[list[float]] | None = None
    ) -> None:
        """One response for one prompt; shapes as TensorRT-LLM's backend (the model's module docstring).

        ``ids``: one sequence, or one per returned beam (then ``text`` is a list too); ``output_ids`` INT32
        [1, beams, max len] padded with the end id, ``sequence_length`` INT32 [1, beams].  ``logps`` (return_log_probs):
        per beam the log prob of each generated token of this response -> ``output_log_probs`` FP32 [1, beams, max len]
        (padded with 0.0) and ``cum_log_probs`` FP32 [1, beams] (the sum over every token generated so far, streamed or
        not).
        """
        if job.streaming and logps is None and not (ids and isinstance(ids[0], list)):
            # the common streamed delta: built by the sender thread, which may join it with the next ones (run)
            job.group.responded = True
            delta = Delta(job, [int(t) for t in ids], str(text), job.last_token_ns)  # type: ignore[arg-type]
            self.emit(job.group, delta, self._settle(job, final))
            return
        job.group.responded = True
        self.emit(job.group, self.response(job, ids, text, logps), self._settle(job, final))

    def _settle(self, job: Job, final: bool) -> int:
        """Count a final response of ``job``; the response flags (FINAL once the request's last prompt is done)."""
        g = job.group
        last = False
        if final and not job.done:
            job.done = True
            g.open -= 1
            last = g.open == 0
        return pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0

    def response(
        self,
        job: Job,
        ids: list[int] | list[list[int]],
        text: str | list[str],
        logps: list[list[float]] | None = None,
        *,
        last_token_ns: int = 0,
    ) -> Any:
        """The ``InferenceResponse`` of :meth:`send` (shapes in its docstring); perf metrics in :meth:`_perf_tensors`."""
        seqs = ids if ids and isinstance(ids[0], list) else [ids]
        texts = text if isinstance(text, list) else [text]
        lens = [len(x) for x in seqs]
        n = max(lens)
        pad = next(iter(sorted(self.eos_ids)), 0) if job.end_id is None else job.end_id
        req = job.requested
        outs = []
        if "output_ids" in self.outputs:
            arr = np.full((1, len(seqs), n), pad, dtype=np.int32)
            for i, x in enumerate(seqs):
                arr[0, i, : len(x)] = x
            outs.append(pb_utils.Tensor("output_ids", arr))
        if "sequence_length" in self.outputs:  # also on the text interface: the ids a client counts (OpenAI usage)
            outs.append(pb_utils.Tensor("sequence_length", np.asarray([lens], dtype=np.int32)))
        if "text_output" in req or self.text:
            outs.append(pb_utils.Tensor("text_output", np.asarray([t.encode("utf-8") for t in texts], dtype=np.object_)))
        if logps is not None:
            outs += self._log_prob_tensors(job, logps)
        if "batch_index" in req:
            outs.append(pb_utils.Tensor("batch_index", np.asarray([[job.batch_index]], np.int32)))
        if "sequence_index" in req:
            outs.append(pb_utils.Tensor("sequence_index", np.zeros((1, 1), np.int32)))
        if job.perf:
            outs += self._perf_tensors(job, last_token_ns)
        return pb_utils.InferenceResponse(output_tensors=outs)

    def _log_prob_tensors(self, job: Job, logps: list[list[float]]) -> list[Any]:
        """``output_log_probs`` FP32 [1, beams, len] and ``cum_log_probs`` FP32 [1, beams], where requested."""
        req, outs = job.requested, []
        width = max(len(r) for r in logps)
        per = np.zeros((1, len(logps), width), dtype=np.float32)
        for i, r in enumerate(logps):
            per[0, i, : len(r)] = r
        if len(logps) == 1 and job.streaming:
            cum = [float(np.sum(job.logps, dtype=np.float64))]
        else:
            cum = [float(np.sum(r, dtype=np.float64)) for r in logps]
        if "output_log_probs" in req and "output_log_probs" in self.outputs:
            outs.append(pb_utils.Tensor("output_log_probs", per))
        if "cum_log_probs" in req and "cum_log_probs" in self.outputs:
            outs.append(pb_utils.Tensor("cum_log_probs", np.asarray([cum], dtype=np.float32)))
        return outs

    @staticmethod
    def _perf_tensors(job: Job, last_token_ns: int) -> list[Any]:
        """Perf metrics (``return_perf_metrics``; INT64 [1, 1], wall-clock ns of this server's ``time.time_ns()``, the
        meaning of TensorRT-LLM's ``RequestPerfMetrics.TimingMetrics``): ``arrival_time_ns`` when ``execute`` parsed the
        request, ``first_scheduled_time_ns`` when the engine admitted the prompt (og.Engine ``begin_turn``, or the
        og.Generator's creation), ``first_token_time_ns`` / ``last_token_time_ns`` when its first / latest token of this
        response was generated (``last_token_ns``: the delta's own time, so a response the sender builds later still
        names when its token was made).  The KV-cache and draft counters are zeros (og exposes none)."""
        req, outs = job.requested, []
        last = last_token_ns or job.last_token_ns or time.time_ns()
        for name, v in (
            ("arrival_time_ns", job.arrival_ns),
            ("first_scheduled_time_ns", job.scheduled_ns or job.arrival_ns),
            ("first_token_time_ns", job.first_token_ns or last),
            ("last_token_time_ns", last),
        ):
            if name in req:
                outs.append(pb_utils.Tensor(name, np.asarray([[v]], dtype=np.int64)))
        for name in (
            "kv_cache_alloc_new_blocks",
            "kv_cache_reused_blocks",
            "kv_cache_alloc_total_blocks",
            "total_accepted_draft_tokens",
            "total_draft_tokens",
        ):
            if name in req:
                outs.append(pb_utils.Tensor(name, np.zeros((1, 1), np.int32)))
        if "acceptance_rate" in req:
            outs.append(pb_utils.Tensor("acceptance_rate", np.zeros((1, 1), np.float32)))
        return outs

    # ------------------------------------------------------------------ the sender thread
    def emit(self, g: Group, response: Any = None, flags: int = 0) -> None:
        """Queue ``response`` for the sender thread (:meth:`run`), which delivers every response in order."""
        self.outbox.put((g, response, flags))

    def _count_end(self, g: Group) -> None:
        """Count ``g`` once in ``request_metrics.REQUESTS_ENDED`` (sender thread, after its FINAL flag was sent)."""
        if g.counted:
            return
        g.counted = True
        try:
            self.outcomes.count(*(g.outcome or (self.rm.SUCCESS, "none")))
        except Exception as e:
            self.logger.log_warn(f"request {g.request_id or '-'}: not counted in {self.rm.REQUESTS_ENDED} ({e})")

    def run(self) -> None:
        """``g.sender.send`` for each queued response, in queue order (so each request's responses stay in order); a
        sender whose client vanished may refuse: log it and go on. Ends at the ``None`` that :meth:`stop` queues.

        Streamed deltas (:class:`Delta`) that queued up while the previous sends were under way are joined per
        prompt by :func:`coalesce` when ``coalesce`` is on: one response then carries several tokens. Nothing
        waits for that to happen, so a server that keeps up still sends one response per token.  Between batches, at
        most every ``CANCEL_POLL_S``, it polls the clients of the running requests (:meth:`_poll_clients`)."""
        polled = 0.0
        while True:
            items: list[tuple[Group, Any, int]] = []
            done = False
            while not done:
                try:
                    item = self.outbox.get(timeout=CANCEL_POLL_S) if not items else self.outbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    done = True
                else:
                    items.append(item)
            for g, response, flags in coalesce(items) if self.coalesce else items:
                self._deliver(g, response, flags)
            if done:
                return
            if time.monotonic() - polled >= CANCEL_POLL_S:
                polled = time.monotonic()
                self._poll_clients()

    def _deliver(self, g: Group, response: Any, flags: int) -> None:
        """Send one queued item (a :class:`Delta` is built here); count the request when this is its FINAL."""
        try:
            if isinstance(response, Delta):
                try:
                    response = self.response(response.job, response.ids, response.text, last_token_ns=response.last_token_ns)
                except Exception as e:  # answer the request with the reason rather than leave it waiting
                    self.mark(g, self.rm.FAILURE, "mid_stream")
                    response = _error(f"onnxruntime_genai: {e}")
            if response is None:
                g.sender.send(flags=flags)
            else:
                g.sender.send(response, flags=flags)
        except Exception as e:
            self.logger.log_warn(f"request {g.request_id or '-'}: response not delivered ({e})")
        finally:
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._count_end(g)

    def _poll_clients(self) -> None:
        """Sender thread: ask the server whether the client of each running request cancelled or vanished
        (``is_cancelled()``, a stub->server round trip, so off the engine thread); the engine acts on ``Group.gone``."""
        for g in {id(g): g for g in self.running()}.values():
            if g.gone:
                continue
            try:
                g.gone = bool(g.sender.is_cancelled())
            except Exception:
                g.gone = True
