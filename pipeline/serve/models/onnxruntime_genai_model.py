"""Triton Python-backend model: an onnxruntime-genai engine with continuous batching (``og.Engine``).

Copied by the package stage to ``<repository>/onnxruntime_genai/1/model.py``.  It runs inside Triton's
Python backend stub with the serving virtualenv's site-packages (numpy < 2, onnxruntime-genai, tokenizers);
it must not import the ``pipeline`` package.

Tensor interface: the names, data types and shapes of TensorRT-LLM's ``tensorrt_llm`` model (tensorrtllm_backend
``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``), so the ensemble maps to it exactly as it maps to
``tensorrt_llm``.  Inputs (without the batch dim): ``input_ids`` INT32 [-1], ``input_lengths`` INT32 [1],
``request_output_len`` INT32 [1], ``end_id``/``pad_id`` INT32 [1], ``streaming`` BOOL [1], sampling inputs
(``runtime_top_k`` INT32, ``runtime_top_p``/``temperature``/``repetition_penalty`` FP32, ``random_seed`` UINT64,
``min_length`` INT32), ``stop_words_list``/``bad_words_list`` INT32 [2, -1] ...

Outputs of one response (shapes as the TensorRT-LLM C++ backend sends them, ``inflight_batcher_llm/src/
model_instance_state.cc`` ``fillTritonResponse``; every response answers ONE prompt of the request):

* ``output_ids`` INT32 [1, beams, len], ``sequence_length`` INT32 [1, beams];
* ``batch_index``, ``sequence_index`` INT32 [1, 1]; perf metrics (``arrival_time_ns`` ... INT64, ``kv_cache_*`` INT32)
  [1, 1] when ``return_perf_metrics``;
* ``text_output`` BYTES [beams] (our addition; the ensemble maps it straight to its ``text_output`` so a streamed
  token costs one hop, not engine -> postprocessing -> client): the text these ids add, detokenized in-process.

Several prompts in one request (``input_ids`` [N, L], ``input_lengths`` [N, 1], per-row sampling inputs): every
prompt becomes its own engine request; each response carries its ``batch_index``; the request's FINAL flag is sent
with the last prompt's last response (decoupled mode only, as TensorRT-LLM's backend requires).

Streaming (decoupled): one response per generated token (per ``stream_interval`` tokens after the first when the
package sets it); ``output_ids`` holds the new token only (TensorRT-LLM's
streaming convention) and ``text_output`` the text it completes, from an incremental detokenizer (constant work per
token, never a re-decode of the whole sequence: ``TextCodec.stream_decoder`` of ``pipeline/core/tokenization.py``, copied next
to this file; a multi-byte or byte-fallback character is emitted once all its bytes arrived, so the joined stream
equals the non-streamed text).  When the server falls behind the engine (high concurrency on a small model), the
tokens of one prompt that queued up meanwhile leave as ONE response (``output_ids`` [1, 1, k], ``sequence_length``
k, their text): no token waits for this, it only saves a round trip per token under load (``stream_coalescing``
parameter, ``package.stream_coalescing``; TensorRT-LLM streams several tokens per response too, when speculative
decoding accepts several in a step).

Decoding is greedy unless the request asks for sampling (``runtime_top_k`` > 1 or ``runtime_top_p`` > 0 with
``temperature`` > 0), the TensorRT-LLM convention.  A request without ``repetition_penalty`` gets the package's
decoding policy (``decoding.json`` next to ``engine/``: the checkpoint's ``generation_config.json`` penalty, the one
evaluate applied; ``pipeline/core/decoding.py``).  Inputs the engine cannot honour (presence/frequency penalties,
bad words, LoRA, ...) are refused per request with the input's name; nothing is silently ignored (a refusal is raised
from ``execute`` when the call holds one request, so Triton's metrics count it as a failure).  Token ids are
checked against the vocabulary before they reach the engine.

``return_log_probs`` and beam search (``beam_width`` > 1, ``num_return_sequences``): og.Engine 0.18 exposes neither
logits nor beams, so such a request runs on an ``og.Generator`` over the same ``og.Model`` (``_generator_steps``), one
step per engine-loop turn, cancellation checked before each step.  Extra outputs: ``cum_log_probs`` FP32 [1, beams],
``output_log_probs`` FP32 [1, beams, len] (shapes of TensorRT-LLM's C++ backend; values defined in
``_generator_steps``).

Concurrency: ``execute`` only validates and queues; one background thread owns the ``og.Engine`` (admits requests,
calls ``engine.run`` step by step, dispatches token events, ends cancelled requests before the next step).  A second
thread sends the responses in order and polls ``is_cancelled()`` for the running requests at most every 5 ms (a
round trip to the server, kept off the engine thread).  If the engine itself raises, the requests in flight fail with
the reason and the engine is rebuilt before the next request.
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
CANCEL_POLL_S = 0.005  # is_cancelled() is a round trip to the server: once per 5 ms per request, on the sender thread
# TEST-ONLY fault injection, off unless the server's environment sets it when the model loads (a client cannot turn
# it on): with PIPELINE_TEST_FAULT_AFTER_TOKENS=N, a request whose request id starts with FAULT_REQUEST_PREFIX makes the
# engine loop raise when that request generates its N-th token, before the token is sent.  The raise takes the path of
# a real engine failure (``_loop``: every request in flight fails with "engine error", the engine is rebuilt).  It
# exists because no real input fails og.Engine after its first token (tests/serve/test_request_metrics.py).
FAULT_ENV = "PIPELINE_TEST_FAULT_AFTER_TOKENS"
FAULT_REQUEST_PREFIX = "test-fault-"

# Inputs the engine cannot honour: a request that sets them to a non-default value gets a clear error.
_UNSUPPORTED = {
    "decoder_input_ids": "encoder-decoder models",
    "embedding_bias": "embedding_bias",
    "prompt_embedding_table": "prompt tuning",
    "prompt_table_extra_ids": "prompt tuning",
    "lora_weights": "LoRA",
    "lora_config": "LoRA",
    "lora_task_id": "LoRA",
    "guided_decoding_guide": "guided decoding",
    "prompt_vocab_size": "prompt tuning",
}
# The text interface (served as ``ensemble`` and ``tensorrt_llm_bls`` on the CPU target): the ensemble's input names
# for the engine inputs they feed (TensorRT-LLM ensemble step 2 mapping); the prompt and the word lists are text.
TEXT_NAMES = {
    "request_output_len": "max_tokens",
    "streaming": "stream",
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "len_penalty": "length_penalty",
}
_UNSUPPORTED_TEXT = {
    "decoder_text_input": "encoder-decoder models",
    "embedding_bias_words": "embedding bias",
    "embedding_bias_weights": "embedding bias",
    "prompt_embedding_table": "prompt tuning",
    "prompt_table_extra_id": "prompt tuning",
    "prompt_vocab_size": "prompt tuning",
    "lora_weights": "LoRA",
    "lora_config": "LoRA",
    "lora_task_id": "LoRA",
    "guided_decoding_guide": "guided decoding",
    "num_draft_tokens": "speculative decoding",
    "use_draft_logits": "speculative decoding",
}
# FP32 inputs whose neutral value is accepted and any other value refused (og.Engine 0.18 has no such search option).
_NEUTRAL_FLOATS = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "len_penalty": 1.0}


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
    return any(len(s) <= len(tokens) and tokens[-len(s) :] == s for s in sequences)


def load_codec(tokenizer_dir: str) -> Any:
    """``TextCodec.from_dir`` of ``pipeline/core/tokenization.py``, which the package stage copies next to this file."""
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from tokenization import TextCodec

    return TextCodec.from_dir(tokenizer_dir)


def load_request_metrics() -> Any:
    """``request_metrics`` (``pipeline/serve/models/request_metrics.py``, copied next to this file by the package
    stage): the name and labels of the request-outcome counter."""
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import request_metrics

    return request_metrics


def encode_served(codec: Any, text: str) -> list[int]:
    """Ids of a served ``text_input``: already-rendered prompt text (the client applied the chat template, whose
    control tokens are control ids), nothing added; BOS prepended only when the tokenizer itself adds it
    (``TextCodec.adds_bos``: tokenizer post-processor, ``add_bos_token`` or a template that starts with BOS) and the
    text lacks it - never from ``config.json`` (a Qwen2-style tokenizer gets none)."""
    ids = codec.encode_rendered(text)
    if codec.adds_bos and codec.bos_id is not None and (not ids or ids[0] != codec.bos_id):
        ids = [codec.bos_id] + ids
    return ids


@dataclass
class Group:
    """One Triton request: its response sender and how many of its prompts are still running."""

    sender: Any
    request_id: str
    size: int
    open: int
    cancelled: bool = False
    gone: bool = False  # the client cancelled or vanished (set by the sender thread's is_cancelled() polls)
    outcome: tuple[str, str] | None = None  # how it ended, when not a success (request_metrics.REASONS); first wins
    responded: bool = False  # a response of it (a token, a prompt's answer) was queued for the client
    counted: bool = False  # counted in request_metrics.REQUESTS_ENDED (once, when its FINAL flag is sent)


@dataclass
class Job:
    group: Group
    batch_index: int
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
    og_request: Any = None
    turn_id: int = 0
    first_token_ns: int = 0
    scheduled_ns: int = 0  # admitted to og.Engine (or its og.Generator created): first_scheduled_time_ns
    last_token_ns: int = 0  # the latest generated token (wall clock ns): last_token_time_ns
    decoder: Any = None
    done: bool = False
    beams: int = 1  # beam_width (og search option num_beams)
    n_return: int = 1  # sequences returned (num_return_sequences, <= beams)
    log_probs: bool = False  # return_log_probs
    logps: list[float] = field(default_factory=list)  # log prob of each generated token (greedy/sampled Generator path)
    steps: Any = None  # the Generator path's step iterator (None: the job runs on og.Engine)
    held_ids: list[int] = field(default_factory=list)  # streamed tokens not sent yet (stream_interval)
    held_text: str = ""
    held_logps: list[float] = field(default_factory=list)


def _token_made(job: Job) -> None:
    """Stamp a generated token: ``last_token_ns`` now, ``first_token_ns`` too when it is the job's first."""
    job.last_token_ns = time.time_ns()
    job.first_token_ns = job.first_token_ns or job.last_token_ns


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


def _policy_penalty(path: str) -> float | None:
    """The ``repetition_penalty`` of the package's decoding policy (``decoding.json``, written by the package stage
    from the export's policy, ``pipeline/core/decoding.py``); None when the file is absent or the penalty is 1.0."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        rp = float(json.load(f).get("repetition_penalty", 1.0))
    return None if rp == 1.0 else rp


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
        self.vocab_size = int(gcfg.get("model", {}).get("vocab_size") or 0)
        # og.Engine honours TurnOptions.set_seed only when genai_config.json configures engine.dynamic_batching
        # ("A per-turn seed requires an Engine configured for dynamic batching.", onnxruntime-genai 0.18)
        self.per_turn_seed = isinstance(gcfg.get("engine"), dict) and "dynamic_batching" in gcfg["engine"]
        self.default_repetition_penalty = _policy_penalty(os.path.join(os.path.dirname(os.path.normpath(engine_dir)), "decoding.json"))
        self.max_input_len = int(params.get("max_input_len") or 0)
        self.max_seq_len = int(params.get("max_seq_len") or gcfg.get("search", {}).get("max_length") or 0)
        self.max_beam_width = max(1, int(params.get("max_beam_width") or 1))  # package.max_beam_width
        self.default_exclude_input = params.get("exclude_input_in_output", "true").lower() in ("1", "true", "yes")
        self.skip_special = params.get("skip_special_tokens", "true").lower() in ("1", "true", "yes")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.text = params.get("interface", "ids") == "text"
        self.lazy = params.get("load", "eager") == "lazy"
        self.outputs = {o["name"] for o in self.model_config.get("output", [])}
        self.logger = pb_utils.Logger
        self.engine_dir = engine_dir
        self._init_outcomes(args)
        self.buffer_size = int(params.get("event_buffer_size") or 256)
        self.coalesce = params.get("stream_coalescing", "true").lower() in ("1", "true", "yes")  # package.stream_coalescing
        self.stream_interval = max(1, int(params.get("stream_interval") or 1))  # package.stream_interval
        tok_dir = params.get("tokenizer_dir") or "tokenizer"
        if not os.path.isabs(tok_dir):
            tok_dir = os.path.join(version_dir, tok_dir)
        self.codec = load_codec(tok_dir)
        self.tokenizer = self.codec.tokenizer
        self._init_limits(params)
        if not self.vocab_size:
            self.vocab_size = int(self.tokenizer.get_vocab_size(with_added_tokens=True))
        self.pending: queue.Queue[list[Job]] = queue.Queue()
        self.active: dict[int, Job] = {}
        self.gen_jobs: list[Job] = []  # jobs on the og.Generator path (log probs, beam search), stepped by the owner thread
        self.draining: dict[int, Any] = {}  # og requests we cancelled; closed once the engine reports the turn finished
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._init_error: BaseException | None = None
        self._engine_broken: str | None = None
        self._next_reload = 0.0
        # Responses leave through one FIFO sender thread: pb_utils' sender.send() waits for the server to take each
        # response (a stub->server round trip), and on the engine thread that wait serialized with every step.
        self.outbox: queue.SimpleQueue[tuple[Group, Any, int] | None] = queue.SimpleQueue()
        self.sender_thread = threading.Thread(target=self._sender, name="responses", daemon=True)
        self.sender_thread.start()
        # og.Engine operations must all run on the thread that created the engine ("Engine owner thread")
        self.thread = threading.Thread(target=self._owner, name="og-engine", daemon=True)
        self.thread.start()
        self._ready.wait()
        if self._init_error is not None:
            raise pb_utils.TritonModelException(f"cannot load the onnxruntime_genai engine from {engine_dir}: {self._init_error}")
        self.logger.log_info(
            f"onnxruntime_genai engine {'will load on first request' if self.lazy else 'loaded'} from {engine_dir} (og {getattr(og, '__version__', '?')}); "
            f"vocab_size={self.vocab_size} max_input_len={self.max_input_len} max_seq_len={self.max_seq_len} "
            f"decoupled={self.decoupled} repetition_penalty={self.default_repetition_penalty or 1.0} "
            f"(the package's decoding policy, decoding.json; applied when a request sends none)"
        )

    def _init_outcomes(self, args: dict[str, Any]) -> None:
        """The per-outcome request counter (request_metrics.py) and the test-only fault switch (``FAULT_ENV``)."""
        rm = load_request_metrics()
        self.rm = rm
        self.outcomes = rm.RequestOutcomes(pb_utils, args.get("model_name", ""), args.get("model_version", ""), self.logger.log_warn)
        self.fault_after = int(os.environ.get(FAULT_ENV) or 0)
        if self.fault_after:
            self.logger.log_warn(
                f"TEST-ONLY fault injection is on ({FAULT_ENV}={self.fault_after}): requests whose id starts with "
                f"{FAULT_REQUEST_PREFIX!r} fail at their token {self.fault_after}; unset it for a real deployment"
            )

    # ------------------------------------------------------------------ request parsing
    def _init_limits(self, params: dict[str, str]) -> None:
        """Request limits checked before tokenizing (tokenization.py "request limits"): bytes per prompt
        (``max_prompt_bytes`` parameter, else derived from ``max_input_len`` and the longest token) and prompt rows."""
        from tokenization import MAX_REQUEST_GENERATIONS, max_token_bytes, prompt_byte_limit

        configured = int(params.get("max_prompt_bytes") or 0) or None
        self.max_prompt_bytes = prompt_byte_limit(self.max_input_len or self.max_seq_len, max_token_bytes(self.tokenizer), configured)
        self.max_rows = MAX_REQUEST_GENERATIONS

    def _check_size(self, arr: np.ndarray | None, name: str) -> None:
        """ValueError (INVALID_ARG) when ``arr`` has more rows than ``max_rows`` or a string over ``max_prompt_bytes``."""
        from tokenization import prompt_too_large

        if arr is None or not arr.size:
            return
        if arr.shape[0] > self.max_rows:
            raise ValueError(f"{name} has {arr.shape[0]} prompts, over the limit of {self.max_rows} per request; send fewer per request")
        for b, x in enumerate(np.asarray(arr).reshape(-1).tolist()):
            msg = prompt_too_large(len(x) if isinstance(x, bytes) else len(str(x).encode("utf-8")), self.max_prompt_bytes, name)
            if msg:
                raise ValueError(msg + (f" (prompt {b})" if arr.shape[0] > 1 else ""))

    @staticmethod
    def _get(request: Any, name: str) -> np.ndarray | None:
        t = pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy()

    @staticmethod
    def _row(a: np.ndarray | None, b: int, n: int) -> np.ndarray | None:
        """Row ``b`` of a batched input (a [1, ...] input applies to every row)."""
        if a is None or a.size == 0:
            return None
        if a.ndim == 0:
            return a.reshape(1)
        if a.shape[0] == n:
            return a[b]
        if a.shape[0] == 1:
            return a[0]
        raise ValueError(f"has {a.shape[0]} rows but the request has {n} prompts")

    def _scalar(self, cache: dict, request: Any, name: str, b: int, n: int, default: Any) -> Any:
        if self.text:
            name = TEXT_NAMES.get(name, name)
        if name not in cache:
            cache[name] = self._get(request, name)
        try:
            r = self._row(cache[name], b, n)
        except ValueError as e:
            raise ValueError(f"input '{name}' {e}") from None
        if r is None or np.asarray(r).size == 0:
            return default
        return np.asarray(r).reshape(-1)[0].item()

    def _parse(self, request: Any) -> list[Job]:
        ids_arr: list[list[int]] | np.ndarray  # one row of prompt ids per prompt
        if self.text:
            self._check_size(self._get(request, "text_input"), "text_input")  # before anything is tokenized
            self._check_size(self._get(request, "messages"), "messages")
            ids_arr = self._encode_rows(self._get(request, "text_input"), self._get(request, "messages"))
        else:
            raw = self._get(request, "input_ids")
            if raw is None:
                raise ValueError("input 'input_ids' is missing")
            ids_arr = raw.reshape(1, -1) if raw.ndim == 1 else raw.reshape(raw.shape[0], -1)
        n = int(len(ids_arr))
        if n > 1 and not self.decoupled:
            raise ValueError(
                f"{n} prompts in one request need the model deployed in decoupled mode (package.decoupled=true); "
                f"send one prompt per request"
            )
        cache: dict[str, Any] = {}
        sc = lambda name, b, default: self._scalar(cache, request, name, b, n, default)  # noqa: E731
        for name, what in (_UNSUPPORTED_TEXT if self.text else _UNSUPPORTED).items():
            a = self._get(request, name)
            if a is not None and a.size and any(bool(x) for x in a.reshape(-1).tolist()):  # zeros / empty strings = unset
                raise ValueError(f"input '{name}' ({what}) is not supported by the onnxruntime_genai engine; remove it")
        for name, neutral in _NEUTRAL_FLOATS.items():
            a = self._get(request, TEXT_NAMES.get(name, name) if self.text else name)
            if a is not None and a.size and any(float(x) != neutral for x in a.reshape(-1).tolist()):
                raise ValueError(
                    f"input '{name}'={a.reshape(-1).tolist()[0]} is not supported by the onnxruntime_genai engine "
                    f"(no such search option in onnxruntime-genai 0.18); remove it or send {neutral}"
                )
        for name in ("return_context_logits", "return_generation_logits"):
            a = self._get(request, name)
            if a is not None and a.size and bool(a.reshape(-1).any()):
                raise ValueError(
                    f"{name}=true is not supported by the onnxruntime_genai engine (og.Engine 0.18 exposes no "
                    f"logits or log probs); remove it"
                )
        lp = self._get(request, "return_log_probs")
        log_probs = bool(lp is not None and lp.size and bool(lp.reshape(-1).any()))
        requested = set(request.requested_output_names())
        group = Group(sender=request.get_response_sender(), request_id=request.request_id(), size=n, open=n)
        jobs = []
        for b in range(n):
            where = f"prompt {b}: " if n > 1 else ""
            try:
                jobs.append(self._parse_row(request, ids_arr[b], b, sc, group, requested, log_probs))
            except ValueError as e:
                raise ValueError(f"{where}{e}") from None
        return jobs

    def _encode(self, text: str) -> list[int]:
        """Prompt text -> ids, the preprocessing model's rule (:func:`encode_served`)."""
        return encode_served(self.codec, text)

    def _encode_messages(self, arr: np.ndarray, text: np.ndarray | None) -> list[list[int]]:
        """Rows of the optional ``messages`` input (BYTES [N, 1], each a JSON list of ``{"role", "content"}``): rendered
        with this package's chat template by ``TextCodec.encode_prompt`` (message contents are data: a special-token
        string inside a content never becomes a control id; BOS only where the template puts it), exactly the ids the
        evaluate stage fed the engine.  ``text_input`` must then be empty (it stays a required tensor of the
        TensorRT-LLM interface): sending both is refused, never resolved silently."""
        arr = np.asarray(arr).reshape(arr.shape[0], -1)
        if text is not None and any(
            (x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)) for x in np.asarray(text).reshape(-1).tolist()
        ):
            raise ValueError(
                "both text_input and messages are set; send the conversation as messages with an empty text_input, "
                "or the rendered prompt as text_input without messages"
            )
        out = []
        for b, row in enumerate(arr):
            where = f" (prompt {b})" if len(arr) > 1 else ""
            if row.size != 1:
                raise ValueError(f"messages{where} has {row.size} strings; send one JSON list per row ([N, 1])")
            x = row[0]
            try:
                msgs = json.loads(x.decode("utf-8") if isinstance(x, bytes) else str(x))
            except (UnicodeDecodeError, ValueError) as e:
                raise ValueError(f"messages{where} is not a UTF-8 JSON list of {{role, content}} objects ({e})") from None
            if (
                not isinstance(msgs, list)
                or not msgs
                or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs)
            ):
                raise ValueError(f'messages{where} must be a non-empty JSON list of {{"role": str, "content": str}} objects')
            try:
                out.append(self.codec.encode_prompt(messages=msgs))
            except Exception as e:  # the template refused the conversation, or a content cannot be kept as data
                raise ValueError(f"messages{where}: {e}") from None
        return out

    def _encode_rows(self, arr: np.ndarray | None, messages: np.ndarray | None = None) -> list[list[int]]:
        if messages is not None and messages.size:
            return self._encode_messages(messages, arr)
        if arr is None or arr.size == 0:
            raise ValueError("text_input is empty; send a non-empty prompt")
        arr = np.asarray(arr).reshape(arr.shape[0], -1)
        out = []
        for b, row in enumerate(arr):
            where = f" (prompt {b})" if len(arr) > 1 else ""
            if row.size != 1:
                raise ValueError(f"text_input{where} has {row.size} strings; send one prompt per row ([N, 1])")
            x = row[0]
            try:
                text = x.decode("utf-8") if isinstance(x, bytes) else str(x)
            except UnicodeDecodeError:
                raise ValueError(f"text_input{where} is not valid UTF-8") from None
            if not text:
                raise ValueError(f"text_input is empty{where}; send a non-empty prompt")
            out.append(self._encode(text))
        return out

    def _parse_row(self, request: Any, row_ids: Any, b: int, sc: Any, group: Group, requested: set[str], log_probs: bool = False) -> Job:
        ids, max_new = self._prompt_and_budget(row_ids, b, sc)
        streaming = bool(sc("streaming", b, False))
        if streaming and not self.decoupled:
            raise ValueError("streaming is only supported when the model is deployed in decoupled mode (package.decoupled=true)")
        beam = int(sc("beam_width", b, 1))
        if not 1 <= beam <= self.max_beam_width:
            raise ValueError(
                f"beam_width={beam} is outside this deployment's range 1..{self.max_beam_width} "
                f"(package.max_beam_width); send a beam_width in that range or repackage with a larger "
                f"package.max_beam_width"
            )
        nrs = sc("num_return_sequences", b, None)
        n_return = beam if nrs is None or int(nrs) == 0 else int(nrs)
        if not 1 <= n_return <= beam:
            raise ValueError(
                f"num_return_sequences={nrs} with beam_width={beam}: the onnxruntime_genai engine returns 1.."
                f"beam_width beams of one beam search (several sampled sequences per request are not supported); "
                f"send num_return_sequences <= beam_width, or one request per sampled sequence"
            )
        top_k = int(sc("runtime_top_k", b, 0))
        top_p = float(sc("runtime_top_p", b, 0.0))
        temperature = float(sc("temperature", b, 1.0))
        if top_k < 0 or not 0.0 <= top_p <= 1.0 or temperature < 0:
            raise ValueError(f"invalid sampling values top_k={top_k} top_p={top_p} temperature={temperature}")
        # top_k == 1 keeps only the top token: greedy (TensorRT-LLM's convention; og.Engine 0.18 refuses temperature /
        # top_p next to top_k=1, so a model recommending top_k=1 would otherwise fail every default request)
        do_sample = top_k != 1 and (top_k > 1 or top_p > 0.0) and temperature > 0.0
        rp = sc("repetition_penalty", b, None)
        if rp is None:
            rp = self.default_repetition_penalty  # the model's policy (decoding.json), as evaluate applied it
        if rp is not None and not float(rp) > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {rp}")
        end_id = sc("end_id", b, None)
        exclude = sc("exclude_input_in_output", b, None)
        seed = sc("random_seed", b, None)
        if seed is not None and do_sample and not self.per_turn_seed:
            raise ValueError(
                f"random_seed={seed} with sampling cannot be honoured: this engine was built without onnxruntime-genai's "
                f"engine.dynamic_batching, and og.Engine applies per-request seeds only there; remove random_seed "
                f"(or decode greedily, which is deterministic)"
            )
        if self._words_row(request, "bad_words_list", b):
            raise ValueError("bad_words is not supported by the onnxruntime_genai engine; send an empty bad_words list")
        if beam > 1:
            self._check_beam_search(request, b, sc, beam, streaming, do_sample, end_id)
        job = Job(
            group=group,
            batch_index=b,
            input_ids=ids,
            max_new_tokens=max_new,
            streaming=streaming,
            exclude_input=self.default_exclude_input if exclude is None else bool(exclude),
            end_id=None if end_id is None or int(end_id) < 0 else int(end_id),
            stop_sequences=self._words_row(request, "stop_words_list", b),
            do_sample=do_sample,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            repetition_penalty=None if rp is None else float(rp),
            min_length=int(sc("min_length", b, 0)),
            seed=None if seed is None else int(seed),
            perf=bool(sc("return_perf_metrics", b, False)),
            requested=requested,
            beams=beam,
            n_return=n_return,
            log_probs=log_probs,
        )
        if streaming and (self.text or "text_output" in requested):
            job.decoder = self.codec.stream_decoder(skip_special_tokens=self.skip_special)
        return job

    def _prompt_and_budget(self, row_ids: Any, b: int, sc: Any) -> tuple[list[int], int]:
        """Row ``b``'s prompt ids (cut to ``input_lengths``) and its output budget (``request_output_len`` capped by the
        room under ``max_seq_len``). Raises ValueError for an empty or out-of-vocabulary prompt, a prompt over
        ``max_input_len`` (never truncated), a budget < 1 or no room left."""
        ids = [int(t) for t in (row_ids if isinstance(row_ids, list) else row_ids.tolist())]
        n_in = len(ids) if self.text else int(sc("input_lengths", b, len(ids)))
        if not 0 <= n_in <= len(ids):
            raise ValueError(f"input_lengths={n_in} but input_ids has {len(ids)} ids")
        ids = ids[:n_in]
        if not ids:
            raise ValueError("the prompt is empty (0 tokens); send a non-empty text_input")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"input_ids contains token id {bad[0]} outside the vocabulary [0, {self.vocab_size}); "
                f"send ids produced by this model's tokenizer"
            )
        if self.max_input_len and len(ids) > self.max_input_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens, more than the engine's max_input_len {self.max_input_len}; "
                f"shorten the prompt (the server never truncates)"
            )
        max_new = int(sc("request_output_len", b, 0))
        if max_new < 1:
            raise ValueError(f"max_tokens (request_output_len) must be >= 1, got {max_new}")
        if self.max_seq_len:
            room = self.max_seq_len - len(ids)
            if room < 1:
                raise ValueError(f"prompt ({len(ids)} tokens) leaves no room under the engine's max_seq_len {self.max_seq_len}")
            max_new = min(max_new, room)
        return ids, max_new

    def _check_beam_search(self, request: Any, b: int, sc: Any, beam: int, streaming: bool, do_sample: bool, end_id: Any) -> None:
        """og beam search (Generator, num_beams) runs to its own end; what it cannot honour is refused (ValueError)."""
        for refused, why in (
            (streaming, "streaming"),
            (do_sample, "sampling (top_k > 1 / top_p > 0)"),
            (self._words_row(request, "stop_words_list", b), "stop words"),
            (end_id is not None and int(end_id) >= 0 and int(end_id) not in self.eos_ids, f"end_id={end_id}"),
            (int(sc("min_length", b, 0)) > 0, "min_length"),
        ):
            if refused:
                raise ValueError(
                    f"beam_width={beam} with {why} is not supported by the onnxruntime_genai engine "
                    f"(og.Generator beam search 0.18); send beam_width=1 or remove {why.split(' ')[0]}"
                )

    def _words_row(self, request: Any, name: str, b: int) -> list[list[int]]:
        """Token sequences of row ``b`` of a words-list input ([N, 2, L]; a [1, 2, L] list applies to every row).

        Text interface: ``stop_words``/``bad_words`` BYTES [N, k], each word encoded without special tokens.
        """
        if self.text:
            a = self._get(request, name.replace("_list", ""))
            if a is None or a.size == 0:
                return []
            a = np.asarray(a).reshape(a.shape[0], -1)
            row = a[b] if a.shape[0] > b else a[0]
            words = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in row.tolist()]
            return [ids for ids in (self.codec.encode_text(w) for w in words if w) if ids]
        a = self._get(request, name)
        if a is None or a.size == 0:
            return []
        a = np.asarray(a)
        if a.ndim == 3:
            a = a[b] if a.shape[0] > b else a[0]
        return parse_words_list(a)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            try:
                jobs = self._stop_request(request)
                if jobs is None:
                    jobs = self._parse(request)
            except Exception as e:
                self.outcomes.count(self.rm.FAILURE, "refused")
                if len(requests) == 1:
                    # raised, the refusal is counted by Triton (nv_inference_request_failure{reason="BACKEND"}); an error
                    # sent through the response sender counts as a success (Triton 2.51 python_backend). The wrapper
                    # Triton adds ("Failed to process the request(s) ...", the traceback) is cut by our clients.
                    raise pb_utils.TritonModelException(f"onnxruntime_genai: {e}") from None
                sender = request.get_response_sender()
                code = pb_utils.TritonError.INVALID_ARG if isinstance(e, ValueError) else pb_utils.TritonError.INTERNAL
                sender.send(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"onnxruntime_genai: {e}", code)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            if jobs:
                self.pending.put(jobs)
        return None

    def _stop_request(self, request: Any) -> list[Job] | None:
        """TensorRT-LLM's convention: a request with ``stop=true`` and the running request's id ends that request.
        Such a request is answered at once (an empty FINAL, counted a success) and queues the id for the engine thread;
        returns ``[]`` for it, None for any other request.  Without a request id it is refused (ValueError)."""
        stop = self._get(request, "stop")
        if stop is None or not stop.size or not bool(stop.reshape(-1)[0]):
            return None
        rid = request.request_id()
        if not rid:
            raise ValueError("stop=true needs the request id of the request to stop (send it as request_id)")
        self.pending.put(rid)
        request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self.outcomes.count(self.rm.SUCCESS, "none")
        return []

    # ------------------------------------------------------------------ engine loop
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

    def _create_engine(self) -> None:
        self.model = self.og.Model(self.engine_dir)
        self.engine = self.og.Engine(self.model)
        self.buffer = self.engine.create_event_buffer(self.buffer_size)

    def _owner(self) -> None:
        self.engine = None
        self.model = None
        try:
            if not self.lazy:
                self._create_engine()
        except BaseException as e:
            self._init_error = e
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
            try:
                r.close()
            except Exception:
                pass
        self.draining.clear()
        for name in ("buffer", "engine", "model"):
            setattr(self, name, None)
        try:
            self._create_engine()
            self._engine_broken = None
            self.logger.log_warn(f"onnxruntime_genai engine (re)loaded ({reason})")
        except Exception as e:
            self._engine_broken = f"{reason}; reloading the engine failed: {e}"
            self._next_reload = time.monotonic() + 5.0
            self.logger.log_error(f"onnxruntime_genai engine unusable: {self._engine_broken}")

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
                        if job.group.cancelled:
                            self._mark(job.group, self.rm.CANCELLED, "client" if job.group.gone else "stop")
                            self._finish(job, True)
                            continue
                        if self._engine_broken is not None:
                            self._fail(job, f"the engine is not usable ({self._engine_broken}); restart the server")
                            continue
                        if job.beams > 1 or job.log_probs:
                            job.steps = self._generator_steps(job)
                            self.gen_jobs.append(job)
                            continue
                        try:
                            self._admit(job)
                        except Exception as e:
                            if "no longer healthy" in str(e):  # og.Engine refuses every request after a failed step
                                self._recover(str(e))
                                try:
                                    self._admit(job)
                                    continue
                                except Exception as e2:
                                    e = e2
                            self._fail(job, f"request rejected by the engine: {e}")
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

    # ------------------------------------------------------------------ og.Generator path (log probs, beam search)
    @staticmethod
    def _log_softmax_at(logits: np.ndarray, token: int) -> float:
        """``log_softmax(logits)[token]`` in float64 (logits: FP32 [vocab], the model's raw next-token scores)."""
        z = np.asarray(logits, dtype=np.float64).reshape(-1)
        m = float(z.max())
        return float(z[token] - m - np.log(np.exp(z - m).sum()))

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

    def _generator_steps(self, job: Job) -> Any:
        """The job as an iterator of og.Generator steps (the owner thread advances every such job one step per loop).

        Beam width 1: one token per step; its log prob is ``log_softmax`` of the model's raw logits for that step
        (``og.Generator.get_logits``, before repetition penalty / temperature / top-k / top-p) at the token the
        search chose; streamed tokens go out as they come.  The end token is never part of the output.
        Beam width > 1: onnxruntime-genai beam search (``num_beams``, length_penalty 1, early stopping) runs to its
        end; og exposes no per-beam history of log probs, so when ``return_log_probs`` is set every returned beam is
        re-scored token by token with a fresh beam-1 Generator (teacher forcing, same raw ``log_softmax``): its
        ``output_log_probs`` are the model's log probs of that beam's tokens and ``cum_log_probs`` their sum (no length
        penalty; og ranks beams with length_penalty 1, i.e. sum / length).
        """
        if self.model is None:
            self._recover("not loaded yet")
        if self.model is None:
            raise RuntimeError(f"the engine is not usable ({self._engine_broken})")
        n_in = len(job.input_ids)
        limit = n_in + job.max_new_tokens
        job.scheduled_ns = time.time_ns()
        if job.beams == 1:
            g = self._new_generator(job, 1, limit, job.do_sample)
            g.append_tokens(np.asarray(job.input_ids, dtype=np.int32))
            while not g.is_done() and len(job.tokens) < job.max_new_tokens:
                logits = g.get_logits()[0, -1] if job.log_probs else None
                g.generate_next_token()
                tok = int(g.get_next_tokens()[0])
                if tok in self.eos_ids or (job.end_id is not None and tok == job.end_id):
                    break  # the end token is never part of the output
                lp = self._log_softmax_at(logits, tok) if logits is not None else None
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
                    self._stream(job, tok, piece, lp, last=last)
                    if last:
                        return
                if stop:
                    break
                yield
            del g
            self._final_response(job)
            return
        g = self._new_generator(job, job.beams, limit, False)
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
                    row.append(self._log_softmax_at(r.get_logits()[0, -1], tok))
                    r.append_tokens(np.asarray([tok], dtype=np.int32))
                    yield
                logps.append(row)
                del r
        job.tokens = seqs[0]
        full = [s if job.exclude_input else job.input_ids + s for s in seqs]
        texts = [self._decode(ids) for ids in full] if (self.text or "text_output" in job.requested) else [""] * len(full)
        self._send(job, full, texts, final=True, logps=logps)

    def _step_generators(self) -> None:
        """Advance every Generator-path job by one step; cancellation is checked before each step."""
        for job in list(self.gen_jobs):
            g = job.group
            gone = g.gone
            if gone and not g.cancelled:
                g.cancelled = True
                self.logger.log_info(f"request {g.request_id or '-'} cancelled by the client after {len(job.tokens)} generated token(s)")
            if g.cancelled:
                self._mark(g, self.rm.CANCELLED, "client" if gone else "stop")
                self.gen_jobs.remove(job)
                job.steps = None
                if not job.done and not gone:  # stopped by a stop request: answer with what it has
                    self._final_response(job)
                self._complete(job)
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
                self._mark(g, self.rm.CANCELLED, "client" if gone else "stop")
                for j in [j for j in self.active.values() if j.group is g]:
                    if not j.done and not gone:  # stopped by a stop request: answer with what it has
                        self._final_response(j)
                    j.og_request.cancel_turn(j.turn_id)
                    self.active.pop(id(j.og_request), None)
                    self.draining[id(j.og_request)] = j.og_request
                    self._complete(j)

    def _on_event(self, ev: Any) -> None:
        flags = int(ev.flags)
        job = self.active.get(id(ev.request))
        if job is None:
            if flags & (FLAG_TURN_FINISHED | FLAG_FAILED):
                r = self.draining.pop(id(ev.request), None)
                if r is not None:
                    try:
                        r.close()
                    except Exception:
                        pass
            return
        if flags & FLAG_FAILED:
            code = str(ev.error_code)
            self._fail(job, f"engine failed the request ({code})")
            if "EXECUTION" in code:  # a failed step leaves og.Engine unhealthy: reload it before the next request
                self._engine_broken = f"a step failed ({code})"
            return
        turn_done = bool(flags & FLAG_TURN_FINISHED)
        finished = turn_done
        if flags & FLAG_TOKEN and ev.token is not None:
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
                        self._stream(job, tok, piece, None, last=True)
                        self._end(job, turn_done)
                        return
                    self._stream(job, tok, piece, None, last=False)
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
            self._complete(job)
        else:
            self._final_response(job)

    def _stream(self, job: Job, tok: int, piece: str, lp: float | None, *, last: bool) -> None:
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
        self._send(job, ids, text, final=final, logps=[logps] if job.log_probs else None)

    def _final_response(self, job: Job) -> None:
        if job.streaming:  # the held tokens (stream_interval) and what the detokenizer still holds
            self._send_held(job, final=True, tail=job.decoder.flush() if job.decoder is not None else "")
        else:
            ids = job.tokens if job.exclude_input else job.input_ids + job.tokens
            self._send(
                job,
                ids,
                self._decode(ids) if (self.text or "text_output" in job.requested) else "",
                final=True,
                logps=[job.logps] if job.log_probs else None,
            )

    def _complete(self, job: Job) -> None:
        """Count the job as done; the last job of its group sends the request's FINAL flag."""
        if job.done:
            return
        job.done = True
        g = job.group
        g.open -= 1
        if g.open == 0:
            self._emit(g, None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _fail(self, job: Job, msg: str) -> None:
        if job.og_request is not None:
            self.active.pop(id(job.og_request), None)
            try:
                job.og_request.cancel_turn(job.turn_id)
            except Exception:
                pass
            self._close(job)
        if job.done:
            return
        g = job.group
        job.done = True
        g.open -= 1
        self._mark(g, self.rm.FAILURE, "mid_stream" if g.responded else "engine_error")
        where = f"prompt {job.batch_index}: " if g.size > 1 else ""
        self._emit(
            g,
            pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"onnxruntime_genai: {where}{msg}")),
            pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if g.open == 0 else 0,
        )

    @staticmethod
    def _mark(g: Group, outcome: str, reason: str) -> None:
        """Record how ``g`` ends when it is not a success (the first cause wins); counted when its FINAL flag is sent."""
        if g.outcome is None:
            g.outcome = (outcome, reason)

    def _count_end(self, g: Group) -> None:
        """Count ``g`` once in ``request_metrics.REQUESTS_ENDED`` (sender thread, after its FINAL flag was sent)."""
        if g.counted:
            return
        g.counted = True
        try:
            self.outcomes.count(*(g.outcome or (self.rm.SUCCESS, "none")))
        except Exception as e:
            self.logger.log_warn(f"request {g.request_id or '-'}: not counted in {self.rm.REQUESTS_ENDED} ({e})")

    def _emit(self, g: Group, response: Any = None, flags: int = 0) -> None:
        """Queue ``response`` for the sender thread (:meth:`_sender`), which delivers every response in order."""
        self.outbox.put((g, response, flags))

    def _sender(self) -> None:
        """``g.sender.send`` for each queued response, in queue order (so each request's responses stay in order); a
        sender whose client vanished may refuse: log it and go on. Ends at the ``None`` that :meth:`finalize` queues.

        Streamed deltas (:class:`Delta`) that queued up while the previous sends were under way are joined per
        prompt by :func:`coalesce` when ``stream_coalescing`` is on: one response then carries several tokens. Nothing
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
                try:
                    if isinstance(response, Delta):
                        try:
                            response = self._response(response.job, response.ids, response.text, last_token_ns=response.last_token_ns)
                        except Exception as e:  # answer the request with the reason rather than leave it waiting
                            self._mark(g, self.rm.FAILURE, "mid_stream")
                            response = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"onnxruntime_genai: {e}"))
                    if response is None:
                        g.sender.send(flags=flags)
                    else:
                        g.sender.send(response, flags=flags)
                except Exception as e:
                    self.logger.log_warn(f"request {g.request_id or '-'}: response not delivered ({e})")
                finally:
                    if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                        self._count_end(g)
            if done:
                return
            if time.monotonic() - polled >= CANCEL_POLL_S:
                polled = time.monotonic()
                self._poll_clients()

    def _poll_clients(self) -> None:
        """Sender thread: ask the server whether the client of each running request cancelled or vanished
        (``is_cancelled()``, a stub->server round trip, so off the engine thread); the engine acts on ``Group.gone``."""
        groups = {id(j.group): j.group for j in [*list(self.active.values()), *list(self.gen_jobs)]}
        for g in groups.values():
            if g.gone:
                continue
            try:
                g.gone = bool(g.sender.is_cancelled())
            except Exception:
                g.gone = True

    @staticmethod
    def _close(job: Job) -> None:
        if job.og_request is not None:
            try:
                job.og_request.close()
            except Exception:
                pass

    def _decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids, skip_special_tokens=self.skip_special)

    def _send(
        self, job: Job, ids: list[int] | list[list[int]], text: str | list[str], *, final: bool, logps: list[list[float]] | None = None
    ) -> None:
        """One response for one prompt; shapes as TensorRT-LLM's backend (module docstring).

        ``ids``: one sequence, or one per returned beam (then ``text`` is a list too); ``output_ids`` INT32
        [1, beams, max len] padded with the end id, ``sequence_length`` INT32 [1, beams].  ``logps`` (return_log_probs):
        per beam the log prob of each generated token of this response -> ``output_log_probs`` FP32 [1, beams, max len]
        (padded with 0.0) and ``cum_log_probs`` FP32 [1, beams] (the sum over every token generated so far, streamed or
        not).
        """
        if job.streaming and logps is None and not (ids and isinstance(ids[0], list)):
            # the common streamed delta: built by the sender thread, which may join it with the next ones (_sender)
            job.group.responded = True
            delta = Delta(job, [int(t) for t in ids], str(text), job.last_token_ns)  # type: ignore[arg-type]
            self._emit(job.group, delta, self._settle(job, final))
            return
        job.group.responded = True
        self._emit(job.group, self._response(job, ids, text, logps), self._settle(job, final))

    def _response(
        self,
        job: Job,
        ids: list[int] | list[list[int]],
        text: str | list[str],
        logps: list[list[float]] | None = None,
        *,
        last_token_ns: int = 0,
    ) -> Any:
        """The ``InferenceResponse`` of :meth:`_send` (shapes in its docstring).

        Perf metrics (``return_perf_metrics``; INT64 [1, 1], wall-clock ns of this server's ``time.time_ns()``, the
        meaning of TensorRT-LLM's ``RequestPerfMetrics.TimingMetrics``): ``arrival_time_ns`` when ``execute`` parsed the
        request, ``first_scheduled_time_ns`` when the engine admitted the prompt (og.Engine ``begin_turn``, or the
        og.Generator's creation), ``first_token_time_ns`` / ``last_token_time_ns`` when its first / latest token of this
        response was generated (``last_token_ns``: the delta's own time, so a response the sender builds later still
        names when its token was made).
        """
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
        if "batch_index" in req:
            outs.append(pb_utils.Tensor("batch_index", np.asarray([[job.batch_index]], np.int32)))
        if "sequence_index" in req:
            outs.append(pb_utils.Tensor("sequence_index", np.zeros((1, 1), np.int32)))
        if job.perf:
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
        return pb_utils.InferenceResponse(output_tensors=outs)

    def _settle(self, job: Job, final: bool) -> int:
        """Count a final response of ``job``; the response flags (FINAL once the request's last prompt is done)."""
        g = job.group
        last = False
        if final and not job.done:
            job.done = True
            g.open -= 1
            last = g.open == 0
        return pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0

    def finalize(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        for job in list(self.active.values()):
            try:
                self._fail(job, "server is shutting down")
            except Exception:
                pass
        self.outbox.put(None)  # after the shutdown errors: the sender delivers them, then ends
        self.sender_thread.join(timeout=10)
