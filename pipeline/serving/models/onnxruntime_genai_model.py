"""Triton Python-backend model: an onnxruntime-genai engine with continuous batching (``og.Engine``).

Copied by the package stage to ``<repository>/onnxruntime_genai/1/model.py``.  It runs inside Triton's
Python backend stub with the serving virtualenv's site-packages (numpy < 2, onnxruntime-genai); it must
not import the ``pipeline`` package.

Tensor interface: the same names, data types and shapes as TensorRT-LLM's ``tensorrt_llm`` model
(``shared/reference/triton.md`` sec. 2.4), so the ensemble maps to it exactly as it maps to
``tensorrt_llm``.  Inputs (without the batch dim): ``input_ids`` INT32 [-1], ``input_lengths`` INT32 [1],
``request_output_len`` INT32 [1], ``end_id``/``pad_id`` INT32 [1], ``streaming`` BOOL [1], sampling
inputs (``runtime_top_k`` INT32, ``runtime_top_p``/``temperature``/``repetition_penalty`` FP32,
``random_seed`` UINT64, ``min_length`` INT32), ``stop_words_list``/``bad_words_list`` INT32 [2, -1] ...
Outputs: ``output_ids`` INT32 [-1, -1] (beams x tokens), ``sequence_length`` INT32 [-1] and two
outputs of our own that the postprocessing model uses to stream text correctly:

* ``prev_sequence_length`` INT32 [1]: tokens already covered by earlier responses of this request;
* ``is_final`` BOOL [1]: this is the request's last response.

Streaming (decoupled mode): one response per generated token carrying **all** generated ids so far;
postprocessing decodes the full sequence and emits only the stable new suffix, so multi-byte characters
are never split (never decodes single tokens in isolation; cf. tensorrtllm_backend issue #112).

Decoding is greedy unless the request asks for sampling (``runtime_top_k`` > 1 or ``runtime_top_p`` > 0
with ``temperature`` > 0) - the TensorRT-LLM convention (triton.md sec. 6.4: "greedy by default").

Concurrency: ``execute`` only validates and queues; one background thread owns the ``og.Engine``
(admits requests, calls ``engine.run`` step by step, dispatches token events, polls cancellation).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:  # only inside Triton
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - importable for unit tests of the pure helpers
    pb_utils = None

FLAG_TOKEN, FLAG_TURN_FINISHED, FLAG_FAILED = 1, 2, 8  # og.EngineEventFlags (0.18); re-read from og in initialize()

# Inputs the engine cannot honour: a request that sets them to a non-default value gets a clear error.
_UNSUPPORTED = {
    "decoder_input_ids": "encoder-decoder models", "embedding_bias": "embedding_bias", "prompt_embedding_table": "prompt tuning",
    "prompt_table_extra_ids": "prompt tuning", "lora_weights": "LoRA", "lora_config": "LoRA",
    "guided_decoding_guide": "guided decoding",
}


def parse_words_list(arr: np.ndarray | None) -> list[list[int]]:
    """Token sequences from a TensorRT-LLM ``[2, L]`` words list (row 0: ids, row 1: end offsets, -1 padded)."""
    if arr is None:
        return []
    a = np.asarray(arr).reshape(2, -1) if np.asarray(arr).size else np.zeros((2, 0), np.int32)
    ids, offsets = a[0].tolist(), a[1].tolist()
    out, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end > start:
            out.append([int(t) for t in ids[start:end]])
        start = end
    return out


def ends_with_any(tokens: list[int], sequences: list[list[int]]) -> bool:
    return any(len(s) <= len(tokens) and tokens[-len(s):] == s for s in sequences)


@dataclass
class Job:
    sender: Any
    request_id: str
    input_ids: list[int]
    max_new_tokens: int
    streaming: bool
    exclude_input: bool
    end_id: int | None
    stop_sequences: list[list[int]]
    do_sample: bool
    top_k: int
    top_p: float
    temperature: float
    repetition_penalty: float | None
    min_length: int
    seed: int | None
    perf: bool
    requested: set[str]
    arrival_ns: int = field(default_factory=time.time_ns)
    tokens: list[int] = field(default_factory=list)
    sent: int = 0
    og_request: Any = None
    turn_id: int = 0
    first_token_ns: int = 0
    cancel_sent: bool = False


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        import onnxruntime_genai as og

        self.og = og
        global FLAG_TOKEN, FLAG_TURN_FINISHED, FLAG_FAILED
        F = og.EngineEventFlags
        FLAG_TOKEN, FLAG_TURN_FINISHED, FLAG_FAILED = int(F.TOKEN), int(F.TURN_FINISHED), int(F.FAILED)
        self.model_config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in self.model_config.get("parameters", {}).items()}
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        engine_dir = params.get("engine_dir", "engine")
        if not os.path.isabs(engine_dir):
            engine_dir = os.path.join(version_dir, engine_dir)
        if not os.path.isfile(os.path.join(engine_dir, "genai_config.json")):
            raise pb_utils.TritonModelException(f"engine_dir {engine_dir} has no genai_config.json")
        with open(os.path.join(engine_dir, "genai_config.json"), encoding="utf-8") as f:
            gcfg = json.load(f)
        eos = gcfg.get("model", {}).get("eos_token_id", [])
        self.eos_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos])}
        self.max_input_len = int(params.get("max_input_len") or 0)
        self.max_seq_len = int(params.get("max_seq_len") or gcfg.get("search", {}).get("max_length") or 0)
        self.default_exclude_input = params.get("exclude_input_in_output", "true").lower() in ("1", "true", "yes")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.logger = pb_utils.Logger
        self.engine_dir = engine_dir
        self.buffer_size = int(params.get("event_buffer_size") or 256)
        self.pending: "queue.Queue[Job]" = queue.Queue()
        self.active: dict[int, Job] = {}
        self.draining: dict[int, Any] = {}  # og requests we cancelled; closed once the engine reports the turn finished
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._last_cancel_poll = 0.0
        self._init_error: BaseException | None = None
        # og.Engine operations must all run on the thread that created the engine ("Engine owner thread")
        self.thread = threading.Thread(target=self._owner, name="og-engine", daemon=True)
        self.thread.start()
        self._ready.wait()
        if self._init_error is not None:
            raise pb_utils.TritonModelException(f"cannot load the onnxruntime_genai engine from {engine_dir}: {self._init_error}")
        self.logger.log_info(f"onnxruntime_genai engine loaded from {engine_dir} (og {getattr(og, '__version__', '?')}); "
                             f"max_input_len={self.max_input_len} max_seq_len={self.max_seq_len} decoupled={self.decoupled}")

    # ------------------------------------------------------------------ request parsing
    @staticmethod
    def _get(request: Any, name: str) -> np.ndarray | None:
        t = pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy()

    def _scalar(self, request: Any, name: str, default: Any) -> Any:
        a = self._get(request, name)
        if a is None or a.size == 0:
            return default
        return a.reshape(-1)[0].item()

    def _parse(self, request: Any) -> Job:
        ids_arr = self._get(request, "input_ids")
        if ids_arr is None:
            raise ValueError("input 'input_ids' is missing")
        ids = [int(t) for t in ids_arr.reshape(-1).tolist()]
        n_in = int(self._scalar(request, "input_lengths", len(ids)))
        ids = ids[:n_in]
        if not ids:
            raise ValueError("the prompt is empty (0 tokens); send a non-empty text_input")
        if self.max_input_len and len(ids) > self.max_input_len:
            raise ValueError(f"prompt has {len(ids)} tokens, more than the engine's max_input_len {self.max_input_len}; "
                             f"shorten the prompt (the server never truncates)")
        max_new = int(self._scalar(request, "request_output_len", 0))
        if max_new < 1:
            raise ValueError(f"max_tokens (request_output_len) must be >= 1, got {max_new}")
        if self.max_seq_len:
            room = self.max_seq_len - len(ids)
            if room < 1:
                raise ValueError(f"prompt ({len(ids)} tokens) leaves no room under the engine's max_seq_len {self.max_seq_len}")
            max_new = min(max_new, room)
        streaming = bool(self._scalar(request, "streaming", False))
        if streaming and not self.decoupled:
            raise ValueError("streaming is only supported when the model is deployed in decoupled mode (package.decoupled=true)")
        beam = int(self._scalar(request, "beam_width", 1))
        if beam != 1:
            raise ValueError(f"beam_width={beam}: the onnxruntime_genai engine serves beam width 1 only")
        nrs = int(self._scalar(request, "num_return_sequences", 1))
        if nrs != 1:
            raise ValueError(f"num_return_sequences={nrs}: only 1 is supported by the onnxruntime_genai engine")
        for name, what in _UNSUPPORTED.items():
            a = self._get(request, name)
            if a is not None and a.size and any(bool(x) for x in a.reshape(-1).tolist()):  # zeros / empty strings = unset
                raise ValueError(f"input '{name}' ({what}) is not supported by the onnxruntime_genai engine; remove it")
        bad = parse_words_list(self._get(request, "bad_words_list"))
        if bad:
            raise ValueError("bad_words is not supported by the onnxruntime_genai engine; send an empty bad_words list")
        for name in ("return_log_probs", "return_context_logits", "return_generation_logits"):
            if bool(self._scalar(request, name, False)):
                raise ValueError(f"{name}=true is not supported by the onnxruntime_genai engine")
        top_k = int(self._scalar(request, "runtime_top_k", 0))
        top_p = float(self._scalar(request, "runtime_top_p", 0.0))
        temperature = float(self._scalar(request, "temperature", 1.0))
        if top_k < 0 or not 0.0 <= top_p <= 1.0 or temperature < 0:
            raise ValueError(f"invalid sampling values top_k={top_k} top_p={top_p} temperature={temperature}")
        do_sample = (top_k > 1 or top_p > 0.0) and temperature > 0.0
        rp = self._scalar(request, "repetition_penalty", None)
        if rp is not None and not float(rp) > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {rp}")
        end_id = self._scalar(request, "end_id", None)
        exclude = self._scalar(request, "exclude_input_in_output", None)
        seed = self._scalar(request, "random_seed", None)
        return Job(sender=request.get_response_sender(), request_id=request.request_id(), input_ids=ids, max_new_tokens=max_new,
                   streaming=streaming, exclude_input=self.default_exclude_input if exclude is None else bool(exclude),
                   end_id=None if end_id is None or int(end_id) < 0 else int(end_id),
                   stop_sequences=parse_words_list(self._get(request, "stop_words_list")), do_sample=do_sample, top_k=top_k,
                   top_p=top_p, temperature=temperature, repetition_penalty=None if rp is None else float(rp),
                   min_length=int(self._scalar(request, "min_length", 0)), seed=None if seed is None else int(seed),
                   perf=bool(self._scalar(request, "return_perf_metrics", False)), requested=set(request.requested_output_names()))

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            try:
                job = self._parse(request)
            except Exception as e:  # noqa: BLE001 - every bad request gets its own clean error, the server keeps serving
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"onnxruntime_genai: {e}")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            self.pending.put(job)
        return None

    # ------------------------------------------------------------------ engine loop
    def _admit(self, job: Job) -> None:
        try:
            self._admit_once(job, with_seed=job.seed is not None and job.do_sample)
        except RuntimeError as e:
            if "seed" not in str(e).lower():
                raise
            # og.Engine without dynamic batching refuses per-turn seeds: sample without the reseed (logged)
            self.logger.log_warn(f"request {job.request_id or '-'}: random_seed ignored ({e})")
            self._admit_once(job, with_seed=False)

    def _admit_once(self, job: Job, *, with_seed: bool) -> None:
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
            if with_seed and job.seed is not None:
                opts.set_seed(job.seed)
        if job.repetition_penalty is not None:
            opts.set_repetition_penalty(job.repetition_penalty)
        if job.min_length > 0:
            opts.set_min_generated_tokens(job.min_length)
        try:
            job.turn_id = r.begin_turn(np.asarray(job.input_ids, dtype=np.int32), opts)
        except Exception:
            r.close()
            raise
        job.og_request = r
        self.active[id(r)] = job

    def _owner(self) -> None:
        try:
            self.model = self.og.Model(self.engine_dir)
            self.engine = self.og.Engine(self.model)
            self.buffer = self.engine.create_event_buffer(self.buffer_size)
        except BaseException as e:  # noqa: BLE001 - reported by initialize()
            self._init_error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                idle = not self.active
                try:
                    job = self.pending.get(timeout=0.05) if idle else self.pending.get_nowait()
                except queue.Empty:
                    job = None
                while job is not None:
                    try:
                        self._admit(job)
                    except Exception as e:  # noqa: BLE001 - e.g. prompt too long for the session
                        self._fail(job, f"request rejected by the engine: {e}")
                    try:
                        job = self.pending.get_nowait()
                    except queue.Empty:
                        job = None
                now = time.monotonic()
                if now - self._last_cancel_poll >= 0.05:  # is_cancelled() is an IPC round trip: poll at most every 50 ms
                    self._last_cancel_poll = now
                    self._poll_cancellations()
                if not self.engine.has_pending_requests():
                    continue
                for ev in self.engine.run(self.buffer):
                    self._on_event(ev)
            except Exception:  # noqa: BLE001 - keep serving; fail only the requests in flight
                msg = traceback.format_exc(limit=3)
                self.logger.log_error(f"engine loop error: {msg}")
                for job in list(self.active.values()):
                    self._fail(job, f"engine error: {msg.strip().splitlines()[-1]}")
                time.sleep(0.2)

    def _poll_cancellations(self) -> None:
        for job in list(self.active.values()):
            if not job.cancel_sent and job.sender.is_cancelled():
                job.cancel_sent = True
                job.og_request.cancel_turn(job.turn_id)

    def _on_event(self, ev: Any) -> None:
        flags = int(ev.flags)
        job = self.active.get(id(ev.request))
        if job is None:
            if flags & (FLAG_TURN_FINISHED | FLAG_FAILED):
                r = self.draining.pop(id(ev.request), None)
                if r is not None:
                    try:
                        r.close()
                    except Exception:  # noqa: BLE001
                        pass
            return
        if flags & FLAG_FAILED:
            self._fail(job, f"engine failed the request ({ev.error_code})")
            return
        turn_done = bool(flags & FLAG_TURN_FINISHED)
        finished = turn_done
        if flags & FLAG_TOKEN and ev.token is not None:
            tok = int(ev.token)
            if tok in self.eos_ids or (job.end_id is not None and tok == job.end_id):
                finished = True  # the end token is never part of the output
                if not flags & FLAG_TURN_FINISHED:
                    job.og_request.cancel_turn(job.turn_id)
            else:
                if not job.first_token_ns:
                    job.first_token_ns = time.time_ns()
                job.tokens.append(tok)
                if job.stop_sequences and ends_with_any(job.tokens, job.stop_sequences):
                    finished = True
                    if not flags & FLAG_TURN_FINISHED:
                        job.og_request.cancel_turn(job.turn_id)
                elif job.streaming and not finished:
                    self._send(job, final=False)
        if finished:
            self._finish(job, turn_done)

    def _finish(self, job: Job, turn_done: bool = True) -> None:
        self.active.pop(id(job.og_request), None)
        if job.sender.is_cancelled():
            job.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            self._send(job, final=True)
        if turn_done:
            self._close(job)
        else:
            self.draining[id(job.og_request)] = job.og_request

    def _fail(self, job: Job, msg: str) -> None:
        if job.og_request is not None:
            self.active.pop(id(job.og_request), None)
            try:
                job.og_request.cancel_turn(job.turn_id)
            except Exception:  # noqa: BLE001
                pass
        job.sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"onnxruntime_genai: {msg}")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self._close(job)

    @staticmethod
    def _close(job: Job) -> None:
        if job.og_request is not None:
            try:
                job.og_request.close()
            except Exception:  # noqa: BLE001
                pass

    def _send(self, job: Job, *, final: bool) -> None:
        ids = job.tokens if (job.streaming or job.exclude_input) else job.input_ids + job.tokens
        prev = job.sent if job.streaming else 0
        n = len(ids)
        outs = [
            pb_utils.Tensor("output_ids", np.asarray(ids, dtype=np.int32).reshape(1, 1, n)),
            pb_utils.Tensor("sequence_length", np.asarray([[n]], dtype=np.int32)),
            pb_utils.Tensor("prev_sequence_length", np.asarray([[prev]], dtype=np.int32)),
            pb_utils.Tensor("is_final", np.asarray([[final]], dtype=np.bool_)),
        ]
        req = job.requested
        zero = np.zeros((1, 1), np.int32)
        for name in ("batch_index", "sequence_index"):
            if name in req:
                outs.append(pb_utils.Tensor(name, zero))
        if job.perf:
            now = time.time_ns()
            for name, v in (("arrival_time_ns", job.arrival_ns), ("first_scheduled_time_ns", job.arrival_ns),
                            ("first_token_time_ns", job.first_token_ns or now), ("last_token_time_ns", now)):
                if name in req:
                    outs.append(pb_utils.Tensor(name, np.asarray([[v]], dtype=np.int64)))
        job.sent = len(job.tokens)
        resp = pb_utils.InferenceResponse(output_tensors=outs)
        job.sender.send(resp, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def finalize(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        for job in list(self.active.values()):
            try:
                self._fail(job, "server is shutting down")
            except Exception:  # noqa: BLE001
                pass
