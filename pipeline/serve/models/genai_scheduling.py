"""Scheduling of the CPU serving model (``onnxruntime_genai_model.py``): the thread that owns the ``og.Engine``.

Copied by the package stage next to that model's ``model.py`` (``pipeline/package/repository.py``
``MODEL_HELPERS``), which imports it as a sibling module; it runs inside Triton's Python backend stub, so it imports
only numpy and ``onnxruntime_genai`` (handed in as ``og``), never the ``pipeline`` package.

What it holds: :class:`Scheduler`, the in-flight batching loop: it admits queued jobs to ``og.Engine`` (continuous
batching), calls ``engine.run`` step by step and turns its token events into responses (through the
``genai_sending.Responder`` it is given), steps the ``og.Generator`` jobs (``return_log_probs``, beam search) one
step per loop turn, ends cancelled or stopped requests before the next step, and, when the engine raises, fails
the requests in flight with the reason and rebuilds the engine.  All og.Engine operations run on this one thread
("Engine owner thread").
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from genai_requests import Group, Job

# TEST-ONLY fault injection, off unless the server's environment sets it when the model loads (a client cannot turn
# it on): with PIPELINE_TEST_FAULT_AFTER_TOKENS=N, a request whose request id starts with FAULT_REQUEST_PREFIX makes the
# engine loop raise when that request generates its N-th token, before the token is sent.  The raise takes the path of
# a real engine failure (``Scheduler._loop``: every request in flight fails with "engine error", the engine is
# rebuilt).  It exists because no real input fails og.Engine after its first token (tests/serve/test_request_metrics.py).
FAULT_ENV = "PIPELINE_TEST_FAULT_AFTER_TOKENS"
FAULT_REQUEST_PREFIX = "test-fault-"


def fault_after_from_env(logger: Any) -> int:
    """The test-only fault switch (``FAULT_ENV``; 0: off), with a warning in the server log when it is on."""
    n = int(os.environ.get(FAULT_ENV) or 0)
    if n:
        logger.log_warn(
            f"TEST-ONLY fault injection is on ({FAULT_ENV}={n}): requests whose id starts with "
            f"{FAULT_REQUEST_PREFIX!r} fail at their token {n}; unset it for a real deployment"
        )
    return n


def ends_with_any(tokens: list[int], sequences: list[list[int]]) -> bool:
    return any(len(s) <= len(tokens) and tokens[-len(s) :] == s for s in sequences)


def _token_made(job: Job) -> None:
    """Stamp a generated token: ``last_token_ns`` now, ``first_token_ns`` too when it is the job's first."""
    job.last_token_ns = time.time_ns()
    job.first_token_ns = job.first_token_ns or job.last_token_ns


def _log_softmax_at(logits: np.ndarray, token: int) -> float:
    """``log_softmax(logits)[token]`` in float64 (logits: FP32 [vocab], the model's raw next-token scores)."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    m = float(z.max())
    return float(z[token] - m - np.log(np.exp(z - m).sum()))


def _close_og(r: Any) -> None:
    try:
        r.close()
    except Exception:
        pass


class Scheduler:
    """The og.Engine owner thread (:meth:`start`): jobs queued by ``execute`` (:meth:`submit`, :meth:`stop_request`)
    run here; every response goes out through ``responses`` (a ``genai_sending.Responder``).

    ``og``: the ``onnxruntime_genai`` module; ``lazy``: load the engine on the first request (``load=lazy``);
    ``fault_after``: the test-only fault switch (:func:`fault_after_from_env`).
    """

    def __init__(
        self,
        og: Any,
        engine_dir: str,
        *,
        buffer_size: int,
        lazy: bool,
        eos_ids: set[int],
        responses: Any,
        logger: Any,
        fault_after: int = 0,
    ) -> None:
        self.og, self.engine_dir, self.buffer_size, self.lazy = og, engine_dir, buffer_size, lazy
        self.eos_ids, self.responses, self.logger, self.fault_after = eos_ids, responses, logger, fault_after
        F = og.EngineEventFlags  # og.EngineEventFlags (0.18)
        self.flag_token, self.flag_turn_finished, self.flag_failed = int(F.TOKEN), int(F.TURN_FINISHED), int(F.FAILED)
        self.pending: queue.Queue[list[Job] | str] = queue.Queue()
        self.active: dict[int, Job] = {}
        self.gen_jobs: list[Job] = []  # jobs on the og.Generator path (log probs, beam search), stepped by the owner thread
        self.draining: dict[int, Any] = {}  # og requests we cancelled; closed once the engine reports the turn finished
        self.engine: Any = None
        self.model: Any = None
        self.buffer: Any = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.init_error: BaseException | None = None
        self._engine_broken: str | None = None
        self._next_reload = 0.0
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the model's side
    def start(self) -> None:
        """Start the owner thread and wait until it loaded the engine (or, ``lazy``, is ready to); ``init_error`` says
        why it could not."""
        self.thread = threading.Thread(target=self._owner, name="og-engine", daemon=True)
        self.thread.start()
        self._ready.wait()

    def submit(self, jobs: list[Job]) -> None:
        self.pending.put(jobs)

    def stop_request(self, request_id: str) -> None:
        """A ``stop=true`` request: the engine thread ends the running request(s) with this id."""
        self.pending.put(request_id)

    def running_groups(self) -> list[Group]:
        """The groups of the running jobs (read by the sender thread, which polls their clients)."""
        return [j.group for j in [*list(self.active.values()), *list(self.gen_jobs)]]

    def shutdown(self) -> None:
        """Stop the loop; the jobs in flight fail with "server is shutting down"."""
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        for job in list(self.active.values()):
            try:
                self._fail(job, "server is shutting down")
            except Exception:
                pass

    # ------------------------------------------------------------------ the engine
    def _create_engine(self) -> None:
        self.model = self.og.Model(self.engine_dir)
        self.engine = self.og.Engine(self.model)
        self.buffer = self.engine.create_event_buffer(self.buffer_size)

    def _owner(self) -> None:
        try:
            if not self.lazy:
                self._create_engine()
        except BaseException as e:
            self.init_error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop()

    def _recover(self, reason: str) -> None:
        """The engine raised: fail what is in flight, drop the engine and load a fresh one (same thread)."""
        for job in list(self.active.values()):
            self._fail(job, f"engine error: {reason}")
        self.active.clear()
        for r in self.draining.values():
            _close_og(r)
        self.draining.clear()
        self.buffer = self.engine = self.model = None
        try:
            self._create_engine()
            self._engine_broken = None
            self.logger.log_warn(f"onnxruntime_genai engine (re)loaded ({reason})")
        except Exception as e:
            self._engine_broken = f"{reason}; reloading the engine failed: {e}"
            self._next_reload = time.monotonic() + 5.0
            self.logger.log_error(f"onnxruntime_genai engine unusable: {self._engine_broken}")

    def _admit(self, job: Job) -> None:
        og = self.og
        r = self.engine.create_request()
        opts = og.TurnOptions(r)
        opts.set_max_generated_tokens(job.max_new_tokens)
        opts.set_do_sample(job.do_sample)
        if job.do_sample:
            opts.set_temperature(job.temperature)
            opts.set_top_k(job.top_k)
            if job.top_p > 0:
                opts.set_top_p(job.top_p)
            if job.seed is not None:
                opts.set_seed(job.seed)
        if job.repetition_penalty is not None:
            opts.set_repetition_penalty(job.repetition_penalty)
        if job.min_length > 0:
            opts.set_min_generated_tokens(job.min_length)
        job.scheduled_ns = time.time_ns()
        try:
            job.turn_id = r.begin_turn(np.asarray(job.input_ids, dtype=np.int32), opts)
        except Exception:
            r.close()
            raise
        job.og_request = r
        self.active[id(r)] = job

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._engine_broken is not None and time.monotonic() >= self._next_reload:
                    self._recover(self._engine_broken)
                idle = not self.active and not self.gen_jobs
                try:
                    jobs = self.pending.get(timeout=0.05) if idle else self.pending.get_nowait()
                except queue.Empty:
                    jobs = None
                if jobs is not None and self.engine is None and self._engine_broken is None:
                    self._recover("not loaded yet")  # lazy load (load=lazy): the first request loads the engine
                while jobs is not None:
                    if isinstance(jobs, str):  # a stop request: its id names the request to end
                        self._stop_by_id(jobs)
                        jobs = []
                    for job in jobs:
                        self._start_job(job)
                    try:
                        jobs = self.pending.get_nowait()
                    except queue.Empty:
                        jobs = None
                self._poll_cancellations()
                self._step_generators()
                if self.engine is None or not self.engine.has_pending_requests():
                    continue
                for ev in self.engine.run(self.buffer):
                    self._on_event(ev)
            except Exception:
                msg = traceback.format_exc(limit=3)
                self.logger.log_error(f"engine loop error: {msg}")
                self._recover(msg.strip().splitlines()[-1])

    def _start_job(self, job: Job) -> None:
        """A queued job: ended when already cancelled, failed when the engine is broken, else admitted to og.Engine
        (or put on the og.Generator path); a request og.Engine refuses fails with the reason."""
        if job.group.cancelled:
            self.responses.mark(job.group, self.responses.rm.CANCELLED, "client" if job.group.gone else "stop")
            self._finish(job, True)
            return
        if self._engine_broken is not None:
            self._fail(job, f"the engine is not usable ({self._engine_broken}); restart the server")
            return
        if job.beams > 1 or job.log_probs:
            job.steps = self._generator_steps(job)
            self.gen_jobs.append(job)
            return
        try:
            self._admit(job)
        except Exception as e:
            if "no longer healthy" in str(e):  # og.Engine refuses every request after a failed step
                self._recover(str(e))
                try:
                    self._admit(job)
                    return
                except Exception as e2:
                    e = e2
            self._fail(job, f"request rejected by the engine: {e}")

    def _on_event(self, ev: Any) -> None:
        flags = int(ev.flags)
        job = self.active.get(id(ev.request))
        if job is None:
            if flags & (self.flag_turn_finished | self.flag_failed):
                r = self.draining.pop(id(ev.request), None)
                if r is not None:
                    _close_og(r)
            return
        if flags & self.flag_failed:
            code = str(ev.error_code)
            self._fail(job, f"engine failed the request ({code})")
            if "EXECUTION" in code:  # a failed step leaves og.Engine unhealthy: reload it before the next request
                self._engine_broken = f"a step failed ({code})"
            return
        turn_done = bool(flags & self.flag_turn_finished)
        finished = turn_done
        if flags & self.flag_token and ev.token is not None:
            tok = int(ev.token)
            if tok in self.eos_ids or (job.end_id is not None and tok == job.end_id):
                finished = True  # the end token is never part of the output
                if not turn_done:
                    job.og_request.cancel_turn(job.turn_id)
            else:
                _token_made(job)
                job.tokens.append(tok)
                if self.fault_after and len(job.tokens) >= self.fault_after and job.group.request_id.startswith(FAULT_REQUEST_PREFIX):
                    raise RuntimeError(f"injected fault ({FAULT_ENV}={self.fault_after}, test only) at token {len(job.tokens)}")
                piece = job.decoder.push((tok,)) if job.decoder is not None else ""
                if job.stop_sequences and ends_with_any(job.tokens, job.stop_sequences):
                    finished = True
                    if not turn_done:
                        job.og_request.cancel_turn(job.turn_id)
                if job.streaming:
                    if finished:
                        piece += job.decoder.flush() if job.decoder is not None else ""
                        self.responses.stream(job, tok, piece, None, last=True)
                        self._end(job, turn_done)
                        return
                    self.responses.stream(job, tok, piece, None, last=False)
        if finished:
            self._finish(job, turn_done)

    def _end(self, job: Job, turn_done: bool) -> None:
        self.active.pop(id(job.og_request), None)
        if turn_done:
            self._close(job)
        else:
            self.draining[id(job.og_request)] = job.og_request

    def _finish(self, job: Job, turn_done: bool = True) -> None:
        """The job produced its last token (or was cancelled): send its last response and release the engine request."""
        if job.og_request is not None:
            self._end(job, turn_done)
        if job.group.cancelled:
            self.responses.complete(job)
        else:
            self.responses.final_response(job)

    def _fail(self, job: Job, msg: str) -> None:
        """Release the job's engine request; its request gets ``msg`` (``Responder.fail``)."""
        if job.og_request is not None:
            self.active.pop(id(job.og_request), None)
            try:
                job.og_request.cancel_turn(job.turn_id)
            except Exception:
                pass
            self._close(job)
        self.responses.fail(job, msg)

    @staticmethod
    def _close(job: Job) -> None:
        if job.og_request is not None:
            _close_og(job.og_request)

    # ------------------------------------------------------------------ cancellation
    def _stop_by_id(self, request_id: str) -> None:
        """``stop=true``: mark the running request(s) with this id cancelled; the next poll ends them."""
        found = False
        for job in [*self.active.values(), *self.gen_jobs]:
            if job.group.request_id == request_id:
                job.group.cancelled = found = True
        if found:
            self.logger.log_info(f"request {request_id} stopped by a stop request")

    def _poll_cancellations(self) -> None:
        """Once per engine step: a cancelled or vanished client (``Group.gone``, polled by the sender thread) or a stop
        request (``Group.cancelled``) stops its request before the next step."""
        seen: set[int] = set()
        for job in list(self.active.values()):
            g = job.group
            if id(g) in seen:
                continue
            seen.add(id(g))
            gone = g.gone
            if not (gone or g.cancelled):
                continue
            if not g.cancelled and gone:
                g.cancelled = True
                self.logger.log_info(
                    f"request {g.request_id or '-'} cancelled by the client after "
                    f"{sum(len(j.tokens) for j in self.active.values() if j.group is g)} generated token(s)"
                )
            if g.cancelled:
                self.responses.mark(g, self.responses.rm.CANCELLED, "client" if gone else "stop")
                for j in [j for j in self.active.values() if j.group is g]:
                    if not j.done and not gone:  # stopped by a stop request: answer with what it has
                        self.responses.final_response(j)
                    j.og_request.cancel_turn(j.turn_id)
                    self.active.pop(id(j.og_request), None)
                    self.draining[id(j.og_request)] = j.og_request
                    self.responses.complete(j)

    # ------------------------------------------------------------------ og.Generator path (log probs, beam search)
    def _step_generators(self) -> None:
        """Advance every Generator-path job by one step; cancellation is checked before each step."""
        for job in list(self.gen_jobs):
            g = job.group
            gone = g.gone
            if gone and not g.cancelled:
                g.cancelled = True
                self.logger.log_info(f"request {g.request_id or '-'} cancelled by the client after {len(job.tokens)} generated token(s)")
            if g.cancelled:
                self.responses.mark(g, self.responses.rm.CANCELLED, "client" if gone else "stop")
                self.gen_jobs.remove(job)
                job.steps = None
                if not job.done and not gone:  # stopped by a stop request: answer with what it has
                    self.responses.final_response(job)
                self.responses.complete(job)
                continue
            try:
                next(job.steps)
            except StopIteration:
                self.gen_jobs.remove(job)
                job.steps = None
            except Exception as e:
                self.gen_jobs.remove(job)
                job.steps = None
                self._fail(job, f"generation failed: {e}")

    def _new_generator(self, job: Job, num_beams: int, max_length: int, sample: bool) -> Any:
        og = self.og
        p = og.GeneratorParams(self.model)
        opts: dict[str, Any] = {"max_length": max_length, "num_beams": num_beams, "num_return_sequences": num_beams, "do_sample": sample}
        if sample:
            opts.update(temperature=job.temperature, top_k=job.top_k or 0, top_p=job.top_p if job.top_p > 0 else 1.0)
            if job.seed is not None:
                opts["random_seed"] = job.seed
        if job.repetition_penalty is not None:
            opts["repetition_penalty"] = job.repetition_penalty
        if job.min_length > 0:  # og's min_length counts the prompt too
            opts["min_length"] = min(max_length, len(job.input_ids) + job.min_length)
        if num_beams > 1:
            opts.update(early_stopping=True, length_penalty=1.0)
        p.set_search_options(**opts)
        return og.Generator(self.model, p)

    def _generator_steps(self, job: Job) -> Iterator[None]:
        """The job as an iterator of og.Generator steps (the owner thread advances every such job one step per loop).

        Beam width 1 (:meth:`_greedy_steps`): one token per step; its log prob is ``log_softmax`` of the model's raw
        logits for that step (``og.Generator.get_logits``, before repetition penalty / temperature / top-k / top-p)
        at the token the search chose; streamed tokens go out as they come.  The end token is never part of the output.
        Beam width > 1 (:meth:`_beam_steps`): onnxruntime-genai beam search (``num_beams``, length_penalty 1, early
        stopping) runs to its end; og exposes no per-beam history of log probs, so when ``return_log_probs`` is set
        every returned beam is re-scored token by token with a fresh beam-1 Generator (teacher forcing, same raw
        ``log_softmax``): its ``output_log_probs`` are the model's log probs of that beam's tokens and
        ``cum_log_probs`` their sum (no length penalty; og ranks beams with length_penalty 1, i.e. sum / length).
        """
        if self.model is None:
            self._recover("not loaded yet")
        if self.model is None:
            raise RuntimeError(f"the engine is not usable ({self._engine_broken})")
        job.scheduled_ns = time.time_ns()
        if job.beams == 1:
            yield from self._greedy_steps(job)
        else:
            yield from self._beam_steps(job)

    def _greedy_steps(self, job: Job) -> Iterator[None]:
        g = self._new_generator(job, 1, len(job.input_ids) + job.max_new_tokens, job.do_sample)
        g.append_tokens(np.asarray(job.input_ids, dtype=np.int32))
        while not g.is_done() and len(job.tokens) < job.max_new_tokens:
            logits = g.get_logits()[0, -1] if job.log_probs else None
            g.generate_next_token()
            tok = int(g.get_next_tokens()[0])
            if tok in self.eos_ids or (job.end_id is not None and tok == job.end_id):
                break  # the end token is never part of the output
            lp = _log_softmax_at(logits, tok) if logits is not None else None
            _token_made(job)
            job.tokens.append(tok)
            if lp is not None:
                job.logps.append(lp)
            piece = job.decoder.push((tok,)) if job.decoder is not None else ""
            stop = bool(job.stop_sequences and ends_with_any(job.tokens, job.stop_sequences))
            if job.streaming:
                last = stop or len(job.tokens) >= job.max_new_tokens
                if last:
                    piece += job.decoder.flush() if job.decoder is not None else ""
                self.responses.stream(job, tok, piece, lp, last=last)
                if last:
                    return
            if stop:
                break
            yield
        del g
        self.responses.final_response(job)

    def _beam_steps(self, job: Job) -> Iterator[None]:
        n_in = len(job.input_ids)
        g = self._new_generator(job, job.beams, n_in + job.max_new_tokens, False)
        g.append_tokens(np.asarray(job.input_ids, dtype=np.int32))
        while not g.is_done():
            g.generate_next_token()
            yield
        seqs = []
        for i in range(job.n_return):
            out = [int(t) for t in g.get_sequence(i)[n_in:].tolist()]
            cut = next((k for k, t in enumerate(out) if t in self.eos_ids), len(out))
            seqs.append(out[:cut])
        del g
        _token_made(job)
        logps = None
        if job.log_probs:
            logps = []
            for seq in seqs:
                r = self._new_generator(job, 1, n_in + len(seq) + 1, False)
                r.append_tokens(np.asarray(job.input_ids, dtype=np.int32))
                row = []
                for tok in seq:
                    row.append(_log_softmax_at(r.get_logits()[0, -1], tok))
                    r.append_tokens(np.asarray([tok], dtype=np.int32))
                    yield
                logps.append(row)
                del r
        job.tokens = seqs[0]
        full = [s if job.exclude_input else job.input_ids + s for s in seqs]
        texts = (
            [self.responses.decode(ids) for ids in full] if (self.responses.text or "text_output" in job.requested) else [""] * len(full)
        )
        self.responses.send(job, full, texts, final=True, logps=logps)
