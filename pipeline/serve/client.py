"""gRPC client for the served ``ensemble`` (TensorRT-LLM in-flight-batcher interface), and ``pipeline client``.

Everything protocol-specific is read from the server, not hard-coded:

* each input's data type and shape come from the model metadata (``get_model_metadata``); a value that does not
  fit (``max_tokens=1.5`` for INT32, an unknown input name) is a local :class:`InputError` naming the input;
* decoupled mode is read from the configs of the ensemble's step models (an ensemble is decoupled when a step
  is, docs/reference/triton.md §1); a decoupled model is always called through the streaming API, since unary ``infer``
  is refused for decoupled models (tensorrtllm_backend issue #177);
* ``end_id``/``pad_id`` come from the tokenizer when one is given.

Streamed text is the concatenation of the responses' ``text_output``; the server emits stable deltas (see
``pipeline/serve/models/postprocessing_model.py``), so the stream equals the non-streamed text exactly,
multi-byte characters included.

Library use::

    from pipeline.serve.client import LLMClient
    with LLMClient("127.0.0.1:8001") as c:
        r = c.generate("Where is my order?", max_tokens=64, stream=True)
        r.text, r.chunks, r.chunk_times_s    # per-response arrival times (s since submit): TTFT = chunk_times_s[0]

``generate`` is blocking; for concurrency use one client per thread or :func:`generate_concurrent`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EXIT_INPUT, EXIT_PREFLIGHT, InputError, PipelineError

DEFAULT_URL = "127.0.0.1:8001"


class ServerUnavailable(PipelineError):
    """The server cannot be reached (not started, wrong port, crashed) or its model is not ready.

    Exit code 4 (docs/cli.md exit codes: the request cannot run here as things stand; not bad input, not a crash)."""

    exit_code = EXIT_PREFLIGHT


def no_server_message(url: str, detail: str = "") -> str:
    """The one message for "nothing answers at ``url``" (``pipeline client``, ``LLMClient``)."""
    return (
        f"no Triton server answers at {url}{f' ({detail})' if detail else ''}. Fix: start one with `pipeline serve` "
        f"(or `make serve`), which prints its gRPC address, and pass that address as --url (default {DEFAULT_URL})."
    )


def require_server(url: str, timeout_s: float = 10.0) -> None:
    """Raise :class:`ServerUnavailable` (exit 4) unless a Triton server answers ``is_server_live`` at ``url``."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        c = grpcclient.InferenceServerClient(url)
    except Exception as e:  # an address the gRPC library cannot parse
        raise InputError(f"--url {url!r}: not a host:port address ({e}). Fix: pass e.g. --url {DEFAULT_URL}.") from None
    try:
        live = c.is_server_live(client_timeout=timeout_s)
        detail = "" if live else "the server reports it is not live"
    except InferenceServerException as e:
        live, detail = False, ""
        if "UNAVAILABLE" not in str(e.status() or "") and "failed to connect" not in str(e.message() or "").lower():
            detail = str(e.message() or e)
    finally:
        c.close()
    if not live:
        raise ServerUnavailable(no_server_message(url, detail))


class UnknownModel(InputError):
    """The model asked for is not one the server serves (exit 2: the caller's input, not the server's state).

    ``model``: the name asked for; ``served``: the models the server's repository index lists as ready; ``prompt_models``:
    those of them that take a prompt (a ``text_input`` input in their metadata: ``ensemble``, ``tensorrt_llm_bls``);
    ``reason``: what is wrong, which ``pipeline client`` words with its ``--model`` flag."""

    def __init__(self, model: str, url: str, served: list[str], prompt_models: list[str]) -> None:
        self.model, self.served, self.prompt_models = model, served, prompt_models
        takes = f"; of these, {', '.join(prompt_models)} take a prompt" if prompt_models else ""
        self.reason = f"not a model the server at {url} serves (it serves {', '.join(served) or 'no model'}{takes})"
        self.example = "ensemble" if "ensemble" in prompt_models else (prompt_models or served or ["ensemble"])[0]
        super().__init__(f"model {model!r}: {self.reason}. Fix: pass model=<one of them>, e.g. model={self.example!r}.")


class RequestError(PipelineError):
    """The server failed a request (exit 1); the message is the server's.

    ``status``: the status the server's error carried (tritonclient's ``InferenceServerException.status()``: gRPC
    ``StatusCode.INVALID_ARGUMENT`` ..., HTTP ``400`` ...); None for an error a stream delivered, which carries only
    its message (tritonclient ``grpc/_infer_stream.py``)."""

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


class RequestRefused(RequestError):
    """The server refused the request as invalid input (exit 2): the message is the server's reason."""

    exit_code = EXIT_INPUT


class RequestTimeout(RequestError):
    """No complete answer within the timeout (the request was cancelled).

    ``reason``: what happened; the message adds the fix in :class:`LLMClient`'s words (``timeout_s``, ``max_tokens``),
    which ``pipeline client`` words as its flags."""

    def __init__(self, reason: str, status: str | None = None) -> None:
        super().__init__(f"{reason}. Fix: raise timeout_s or lower max_tokens.", status)
        self.reason = reason


@dataclasses.dataclass
class GenerateResult:
    """One request's answer.

    Attributes:
        text: the whole generated text (concatenated stream, or the single response).
        chunks: the text of each response in arrival order (one element when not streaming).
        chunk_times_s: arrival time of each response in seconds since the request was sent (TTFT = [0]).
        total_s: seconds from send to the final response.
        request_id: the id sent with the request.
        cancelled: the request was cancelled by the caller.
        n_tokens: generated token ids (the deployment's ``sequence_length`` summed over responses, first beam); None
            when the served model has no ``sequence_length`` output (packages made before it was added).
        chunk_tokens: token ids each response of ``chunks`` carried (its ``sequence_length``; several when the server
            joined queued tokens or speculative decoding accepted several); None entries when the model does not say.
        perf: with ``return_perf_metrics=True``, the server's timestamps from the last response that carried them
            (``arrival_time_ns``, ``first_scheduled_time_ns``, ``first_token_time_ns``, ``last_token_time_ns``: int,
            nanoseconds of the server's wall clock, TensorRT-LLM's ``RequestPerfMetrics`` timing); else None.
        sent_ns: this client's wall clock (``time.time_ns()``) when the request was sent, comparable with ``perf``
            when client and server share a host clock.
    """

    text: str
    chunks: list[str]
    chunk_times_s: list[float]
    total_s: float
    request_id: str
    cancelled: bool = False
    n_tokens: int | None = None
    chunk_tokens: list[int | None] = dataclasses.field(default_factory=list)
    perf: dict[str, int] | None = None
    sent_ns: int | None = None


PERF_TIMES = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
"""The timing outputs of ``return_perf_metrics`` (TensorRT-LLM backend ``tensorrt_llm/config.pbtxt``)."""


def _np_dtype(triton_dtype: str) -> Any:
    from tritonclient.utils import triton_to_np_dtype

    return np.object_ if triton_dtype == "BYTES" else triton_to_np_dtype(triton_dtype)


def make_input(name: str, value: Any, meta: dict[str, Any]) -> Any:
    """A ``tritonclient.grpc.InferInput`` for ``value`` shaped ``[1, ...]`` with the data type the server declares.

    Raises :class:`InputError` naming the input when the value does not fit the declared type or shape.
    """
    import tritonclient.grpc as grpcclient

    dt = meta["datatype"]
    dims = [int(d) for d in meta["shape"]][1:]  # the first dim is the batch dim (max_batch_size > 0)
    values = value if isinstance(value, (list, tuple)) else [value]
    try:
        if dt == "BYTES":
            if not all(isinstance(v, (str, bytes)) for v in values):
                raise TypeError(f"expects text, got {[type(v).__name__ for v in values]}")
            arr = np.array([[v.encode("utf-8") if isinstance(v, str) else v for v in values]], dtype=np.object_)
        elif dt == "BOOL":
            if not all(isinstance(v, (bool, np.bool_)) for v in values):
                raise TypeError(f"expects true/false, got {values!r}")
            arr = np.array([values], dtype=np.bool_)
        else:
            npd = _np_dtype(dt)
            if np.issubdtype(npd, np.integer):
                if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
                    raise TypeError(f"expects integers, got {values!r}")
                info = np.iinfo(npd)
                if any(not info.min <= int(v) <= info.max for v in values):
                    raise TypeError(f"value out of range for {dt}: {values!r}")
            elif not all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values):
                raise TypeError(f"expects numbers, got {values!r}")
            arr = np.array([values], dtype=npd)
    except TypeError as e:
        raise InputError(f"input {name!r} ({dt}, shape {dims}) {e}. Fix: pass a value of that type.") from None
    if len(dims) == 1 and dims[0] != -1 and arr.shape[1] != dims[0]:
        raise InputError(f"input {name!r} expects {dims[0]} value(s) per request, got {arr.shape[1]}.")
    inp = grpcclient.InferInput(name, list(arr.shape), dt)
    inp.set_data_from_numpy(arr)
    return inp


class LLMClient:
    """Client of a served text-in/text-out model (``ensemble`` by default).

    Args:
        url: ``host:port`` of Triton's gRPC endpoint (default ``127.0.0.1:8001``).
        model: model name (``ensemble``; ``tensorrt_llm_bls`` has the same interface).
        tokenizer: a ``transformers`` tokenizer or a folder holding one; gives ``end_id``/``pad_id`` and the chat
            template (``chat=True`` renders prompts through :func:`pipeline.core.tokenization.render`).
        timeout_s: default per-request timeout in seconds.
    Raises:
        ServerUnavailable: the server is not reachable or the model is not ready.
        UnknownModel: the server does not serve ``model`` (its repository index does not list it).
    """

    def __init__(self, url: str = DEFAULT_URL, model: str = "ensemble", *, tokenizer: Any = None, timeout_s: float = 120.0) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        self.url, self.model, self.timeout_s = url, model, float(timeout_s)
        self._grpc = grpcclient
        self._exc = InferenceServerException
        self.client = grpcclient.InferenceServerClient(url)
        try:
            if not self.client.is_server_live(client_timeout=10):
                raise ServerUnavailable(f"Triton at {url} is not live.")
            if not self.client.is_model_ready(model, client_timeout=10):
                self._refuse_unknown_model(model)
                raise ServerUnavailable(
                    f"model {model!r} is not ready on {url}. Fix: check the server log; list models with "
                    f"`curl localhost:<http_port>/v2/repository/index`."
                )
            meta = self.client.get_model_metadata(model, as_json=True, client_timeout=10)
            self.inputs = {i["name"]: i for i in meta["inputs"]}
            self.outputs = {o["name"]: o for o in meta["outputs"]}
            self.decoupled = self._is_decoupled(model)
            config = self.client.get_model_config(model, as_json=True, client_timeout=10)
            self.max_seq_len = _config_int(config, "max_seq_len")
            self.max_input_len = _config_int(config, "max_input_len")  # the longest prompt the engine takes
        except InferenceServerException as e:
            self.client.close()
            raise ServerUnavailable(no_server_message(url, e.message() if hasattr(e, "message") else str(e))) from None
        self.tokenizer = _load_tokenizer(tokenizer)

    def _refuse_unknown_model(self, model: str) -> None:
        """Raise :class:`UnknownModel` when the server's repository index does not list ``model`` (a model that is
        listed but not ready is the server's state, left to the caller: exit 4)."""
        index = self.client.get_model_repository_index(as_json=True, client_timeout=10).get("models", [])
        if any(m.get("name") == model for m in index):
            return
        served = sorted({m["name"] for m in index if m.get("name") and m.get("state") == "READY"})
        prompt_models = []
        for name in served:
            with contextlib.suppress(self._exc):
                meta = self.client.get_model_metadata(name, as_json=True, client_timeout=10)
                if any(i.get("name") == "text_input" for i in meta.get("inputs", [])):
                    prompt_models.append(name)
        self.client.close()
        raise UnknownModel(model, self.url, served, prompt_models)

    def _is_decoupled(self, model: str) -> bool:
        cfg = self.client.get_model_config(model, as_json=True, client_timeout=10)["config"]
        if cfg.get("model_transaction_policy", {}).get("decoupled"):
            return True
        steps = cfg.get("ensemble_scheduling", {}).get("step", [])
        return any(self._is_decoupled(s["model_name"]) for s in steps)

    # ------------------------------------------------------------------ requests
    def build_inputs(self, text: str, max_tokens: int, *, stream: bool, **extra: Any) -> list[Any]:
        """Inputs for one request; ``extra`` are further ensemble inputs by name (``temperature=0.7`` ...)."""
        values: dict[str, Any] = {"text_input": text, "max_tokens": max_tokens}
        if "stream" in self.inputs:
            values["stream"] = bool(stream)
        if self.tokenizer is not None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
            pad = getattr(self.tokenizer, "pad_token_id", None)
            if eos is not None and "end_id" in self.inputs:
                values["end_id"] = int(eos)
            pad_or_eos = pad if pad is not None else eos
            if "pad_id" in self.inputs and pad_or_eos is not None:
                values["pad_id"] = int(pad_or_eos)
        for k, v in extra.items():
            if v is not None:
                values[k] = v
        unknown = [k for k in values if k not in self.inputs]
        if unknown:
            if "text_input" in unknown:  # a token-id or pre/post-processing model, called with a prompt
                fix = "send prompts to model ensemble (or tensorrt_llm_bls), the models that take text_input"
            else:
                fix = "drop them, or send inputs the model accepts"
            raise InputError(f"input(s) {unknown} are not inputs of model {self.model!r}; it accepts {sorted(self.inputs)}. Fix: {fix}.")
        return [make_input(k, v, self.inputs[k]) for k, v in values.items()]

    def prompt_text(self, prompt: str, chat: bool = True) -> str:
        """The text sent as ``text_input``: the chat-template rendering when a tokenizer is loaded and ``chat``."""
        if chat and self.tokenizer is not None:
            from ..core.tokenization import render

            return render(self.tokenizer, prompt)
        return prompt

    def chat_inputs(self, prompt: str | None, messages: list[dict] | None, chat: bool) -> tuple[str, dict[str, Any]]:
        """``(text_input, extra inputs)`` of one prompt.

        When the model declares the ``messages`` input (the CPU target's ``ensemble``/``tensorrt_llm_bls``) and the
        prompt is chat (``messages`` given, or ``chat`` with a tokenizer loaded), the conversation is sent as
        ``messages`` (JSON) with an empty ``text_input``: the server renders it with its own chat template and keeps
        user content as data (``TextCodec.encode_prompt``), so a user's ``</s>`` never becomes a control id. Otherwise
        the text is rendered here (:meth:`prompt_text`) and the server encodes it with control tokens parsed.
        Raises InputError: neither prompt nor messages, or messages without a way to render them.
        """
        if messages is None and prompt is None:
            raise InputError("generate() needs a prompt or messages.")
        if messages is not None or (chat and self.tokenizer is not None):
            msgs = list(messages) if messages is not None else [{"role": "user", "content": prompt}]
            if "messages" in self.inputs:
                return "", {"messages": json.dumps(msgs, ensure_ascii=False)}
            if self.tokenizer is None:
                raise InputError(
                    f"model {self.model!r} has no 'messages' input, so messages must be rendered here. Fix: pass "
                    f"tokenizer= (the package's tokenizer folder)."
                )
            from ..core.tokenization import render

            return render(self.tokenizer, messages=msgs), {}
        return str(prompt), {}

    def room(self, prompt: str | None = None, *, chat: bool = True, messages: list[dict] | None = None) -> tuple[int, int] | None:
        """``(prompt tokens, tokens left to generate under the served model's max_seq_len)`` of one request, as the
        served model counts them (:func:`served_prompt_tokens`, the OpenAI endpoint's rule), or None when unknown: no
        tokenizer loaded, or a model whose config states no ``max_seq_len`` parameter.  The served model lowers a
        ``max_tokens`` over the room to the room without a word (``genai_requests.py``); the OpenAI endpoint
        refuses an explicit one (400), and ``pipeline client`` does the same with this."""
        if self.tokenizer is None or not self.max_seq_len:
            return None
        from ..core.tokenization import codec_of

        text, extra = self.chat_inputs(prompt, messages, chat)
        msgs = json.loads(extra["messages"]) if "messages" in extra else None
        n = served_prompt_tokens(codec_of(self.tokenizer), msgs if msgs is not None else text, server_renders=msgs is not None)
        return n, self.max_seq_len - n

    def generate(
        self,
        prompt: str | None = None,
        max_tokens: int = 64,
        *,
        stream: bool = False,
        chat: bool = True,
        timeout_s: float | None = None,
        cancel: threading.Event | None = None,
        on_chunk: Callable[[str, float], None] | None = None,
        request_id: str | None = None,
        messages: list[dict] | None = None,
        **inputs: Any,
    ) -> GenerateResult:
        """Send one prompt and wait for the complete answer.

        Args:
            prompt: user text (a chat turn when ``chat`` and a tokenizer is loaded; see :meth:`chat_inputs`).
            messages: ``[{"role", "content"}, ...]`` instead of ``prompt`` (always chat).
            max_tokens: generated tokens at most.
            stream: ask for a streamed answer (a response per token, or per few tokens: ``chunk_tokens``); needs a decoupled deployment.
            timeout_s: cancel and raise :class:`RequestTimeout` after this many seconds.
            cancel: set it (from another thread) to cancel the request; the result then has ``cancelled=True``.
            on_chunk: called as ``on_chunk(text_delta, t_since_send_s)`` for each response.
            inputs: further ensemble inputs (``temperature``, ``top_k``, ``stop_words`` ...), typed from metadata.
                ``return_perf_metrics=True`` also asks for the timing outputs (:data:`PERF_TIMES`): ``result.perf``.
        Raises:
            InputError (local, before sending), RequestRefused (the server refused the input), RequestError (the
            server failed), RequestTimeout, ServerUnavailable.
        """
        if stream and not self.decoupled:
            raise InputError(
                f"stream=True needs a decoupled deployment, but {self.model!r} on {self.url} is not decoupled. "
                f"Fix: package with package.decoupled=true, or call with stream=False."
            )
        if "messages" in inputs:
            raise InputError("pass messages=[...] as the messages argument (a list), not as a raw input.")
        text, chat_extra = self.chat_inputs(prompt, messages, chat)
        rid = request_id or uuid.uuid4().hex[:16]
        ins = self.build_inputs(text, max_tokens, stream=stream, **chat_extra, **inputs)
        names = ["text_output"] + [n for n in ("sequence_length",) if n in self.outputs]
        if inputs.get("return_perf_metrics"):
            names += [n for n in PERF_TIMES if n in self.outputs]
        outs = [self._grpc.InferRequestedOutput(n) for n in names]
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if not self.decoupled:
            t0, sent_ns = time.perf_counter(), time.time_ns()
            try:
                res = self.client.infer(self.model, ins, outputs=outs, request_id=rid, client_timeout=timeout)
            except self._exc as e:
                raise _classify(e, self.url) from None
            dt = time.perf_counter() - t0
            chunk = _text(res)
            if on_chunk:
                on_chunk(chunk, dt)
            return GenerateResult(chunk, [chunk], [dt], dt, rid, n_tokens=_n_tokens(res), perf=_perf(res), sent_ns=sent_ns)
        return self._stream(ins, outs, rid, timeout, cancel, on_chunk, want_perf=any(n in PERF_TIMES for n in names))

    def _stream(
        self,
        ins: list[Any],
        outs: list[Any],
        rid: str,
        timeout: float,
        cancel: threading.Event | None,
        on_chunk: Callable[[str, float], None] | None,
        *,
        want_perf: bool = False,
    ) -> GenerateResult:
        q: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: q.put((time.perf_counter(), result, error)))
        st = _Stream(want_perf=want_perf)
        t0, sent_ns = time.perf_counter(), time.time_ns()
        cancelled = False
        failed: PipelineError | None = None
        try:
            self.client.async_stream_infer(self.model, ins, outputs=outs, request_id=rid, enable_empty_final_response=True)
            while True:
                remaining = t0 + timeout - time.perf_counter()
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                if remaining <= 0:
                    raise RequestTimeout(f"no complete answer from {self.model!r} within {timeout:g} s (request {rid}); cancelled")
                try:
                    t, result, error = q.get(timeout=min(remaining, 0.05 if cancel is not None else remaining))
                except queue.Empty:
                    continue
                if error is not None:
                    # Triton ends a request with its error response, so nothing is left to cancel: the stream is closed
                    # normally below.  Cancelling it instead (stop_stream(cancel_requests=True)) after the server
                    # refused the stream's first request leaks that request inside Triton 2.51's gRPC frontend and
                    # keeps the model loaded: the server's shutdown then waits out its exit timeout and exits 1
                    # (docs/package.md "Stopping the server").
                    failed = _classify(error, self.url)
                    break
                if st.take(result, t - t0, on_chunk):
                    break
        except BaseException:
            self.client.stop_stream(cancel_requests=True)
            raise
        self.client.stop_stream(cancel_requests=cancelled)
        if failed is not None:
            raise failed
        n_tok = sum(st.counts) if st.counts and "sequence_length" in self.outputs else None
        return GenerateResult(
            "".join(st.chunks),
            st.chunks,
            st.times,
            time.perf_counter() - t0,
            rid,
            cancelled,
            n_tokens=n_tok,
            chunk_tokens=st.chunk_counts,
            perf=st.perf,
            sent_ns=sent_ns,
        )

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclasses.dataclass
class _Stream:
    """What the responses of one streamed request carried so far (:meth:`LLMClient._stream`)."""

    want_perf: bool = False
    chunks: list[str] = dataclasses.field(default_factory=list)
    times: list[float] = dataclasses.field(default_factory=list)
    counts: list[int] = dataclasses.field(default_factory=list)
    chunk_counts: list[int | None] = dataclasses.field(default_factory=list)
    perf: dict[str, int] | None = None

    def take(self, result: Any, t: float, on_chunk: Callable[[str, float], None] | None) -> bool:
        """Record one response received ``t`` s after the send; True when it is the request's final response."""
        resp = result.get_response()
        names = {o.name for o in resp.outputs}
        count = _n_tokens(result) if "sequence_length" in names else None
        if self.want_perf:
            self.perf = _perf(result) or self.perf
        if count is not None:
            self.counts.append(count)
        if "text_output" in names:
            chunk = _text(result)
            self.chunks.append(chunk)
            self.chunk_counts.append(count)
            self.times.append(t)
            if on_chunk:
                on_chunk(chunk, t)
        final = resp.parameters.get("triton_final_response")
        return bool(final.bool_param) if final is not None else False


def _text(result: Any) -> str:
    arr = result.as_numpy("text_output")
    if arr is None:
        return ""
    flat = arr.reshape(-1)
    return "".join(x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in flat[:1])


def _n_tokens(result: Any) -> int | None:
    """Generated ids in one response: its ``sequence_length`` ([1, beams] INT32), first beam; None when absent."""
    try:
        arr = result.as_numpy("sequence_length")
    except Exception:
        return None
    if arr is None or arr.size == 0:
        return 0 if arr is not None else None
    return int(arr.reshape(-1)[0])


def _perf(result: Any) -> dict[str, int] | None:
    """The :data:`PERF_TIMES` a response carries (each INT64 [1, 1]); None when it carries none of them."""
    out = {}
    for name in PERF_TIMES:
        try:
            arr = result.as_numpy(name)
        except Exception:
            arr = None
        if arr is not None and arr.size:
            out[name] = int(arr.reshape(-1)[0])
    return out or None


#: the wrapper Triton's Python backend puts around an exception raised by a model's ``execute`` (2.51
#: ``src/python_be.cc``): "Failed to process the request(s) for model '<m>_0_0', message: <Type>: <msg>\n\nAt:\n<traceback>"
_BACKEND_WRAPPER = re.compile(r"^Failed to process the request\(s\) for model '[^']*', message: \w+: (.*?)(?:\n\nAt:\n.*)?$", re.S)


def backend_message(msg: str) -> str:
    """``msg`` without the Python backend's wrapper and traceback (:data:`_BACKEND_WRAPPER`): the model's own words."""
    m = _BACKEND_WRAPPER.match(msg)
    return m.group(1).strip() if m else msg


#: messages of a deployment fault, not of a bad request (Triton python_backend 2.51 ``src/python_be.cc``: a dead stub,
#: answered with the status of a bad request; the served CPU model's own engine failures,
#: ``serve/models/genai_scheduling.py``): ``pipeline client`` exit 1, the OpenAI endpoint's 503 ``server_error``
SERVER_FAULTS = (
    "is not healthy",
    "Stub process",
    "engine error",
    "engine failed",
    "the engine is not usable",
    "generation failed",
    "server is shutting down",
    "Socket closed",
    "failed to connect",
)

#: statuses of a request refused as invalid input: gRPC's ``StatusCode.INVALID_ARGUMENT``, Triton's
#: ``TRITONSERVER_ERROR_INVALID_ARG``, HTTP 400
INVALID_INPUT_STATUSES = ("INVALID_ARGUMENT", "INVALID_ARG", "400")


def is_server_fault(msg: str) -> bool:
    """True when a refused request's ``msg`` says the deployment failed (:data:`SERVER_FAULTS`), not the request."""
    return any(m in msg for m in SERVER_FAULTS)


def _classify(e: Any, url: str) -> PipelineError:
    msg = backend_message(e.message() if hasattr(e, "message") else str(e))
    status = e.status() if hasattr(e, "status") else None
    code = str(status or "").rsplit(".", 1)[-1]  # "StatusCode.INVALID_ARGUMENT" -> "INVALID_ARGUMENT"
    if code == "UNAVAILABLE" or "failed to connect" in msg.lower() or "connection refused" in msg.lower():
        return ServerUnavailable(no_server_message(url, msg))
    if code == "DEADLINE_EXCEEDED":
        return RequestTimeout(f"request timed out: {msg}", status)
    if not is_server_fault(msg) and (code in INVALID_INPUT_STATUSES or status is None):
        # a streamed error has no status; Triton answers a bad request and a failed model alike there, so the
        # message tells them apart (the rule the OpenAI endpoint applies: 400, or 503 for a fault)
        return RequestRefused(f"the server refused the request: {msg}", status)
    return RequestError(f"server error: {msg}", status)


_TOKENIZER_LOCK = threading.Lock()


def _load_tokenizer(tok: Any) -> Any:
    """A ``transformers`` tokenizer from a folder (``tok`` is returned as is when it is already a tokenizer or None).

    Loading is serialised by a process-wide lock: ``transformers`` resolves its lazily imported tokenizer classes on
    first use, and concurrent first uses from several threads fail with ``ImportError`` (issue 13: 8 threads
    creating an ``LLMClient`` at once).  Raises :class:`InputError` naming the folder when it holds no tokenizer.
    """
    if tok is None or not isinstance(tok, (str, Path)):
        return tok
    if not Path(tok).is_dir():
        raise InputError(f"tokenizer {str(tok)!r} is not a folder. Fix: pass a package's model_repository/preprocessing/1/tokenizer.")
    with _TOKENIZER_LOCK:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(tok), trust_remote_code=False)


def generate_concurrent(
    url: str, prompts: Sequence[str], *, concurrency: int = 8, model: str = "ensemble", tokenizer: Any = None, **kw: Any
) -> list[GenerateResult | Exception]:
    """Run ``LLMClient.generate(prompt, **kw)`` for every prompt with ``concurrency`` threads (one client each).

    Returns results in prompt order; a failed request's slot holds its exception (nothing is retried).
    """
    tok = _load_tokenizer(tokenizer)
    local = threading.local()
    clients: list[LLMClient] = []
    lock = threading.Lock()

    def one(p: str) -> GenerateResult | Exception:
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = LLMClient(url, model, tokenizer=tok)
            with lock:
                clients.append(c)
        try:
            return c.generate(p, **kw)
        except PipelineError as e:
            return e

    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
            return list(ex.map(one, prompts))
    finally:
        for c in clients:
            c.close()


# --------------------------------------------------------------------------- CLI
def _config_int(config: dict[str, Any], name: str) -> int | None:
    """A model config's integer parameter ``name`` (``parameters.<name>.string_value``), None when absent or not > 0."""
    raw = (((config.get("config") or {}).get("parameters") or {}).get(name) or {}).get("string_value", "")
    return int(raw) if str(raw).strip().isdigit() and int(raw) > 0 else None


def served_prompt_tokens(codec: Any, text: str | list[dict], *, server_renders: bool) -> int:
    """Ids the served model feeds the engine for ``text`` (``codec``: the served :class:`~pipeline.core.tokenization.TextCodec`):
    the served encode rule (``encode_served`` in ``serve/models/genai_requests.py``: rendered text as is, BOS only where
    the tokenizer adds it); chat messages the server renders itself (``server_renders``) as ``TextCodec.encode_prompt``."""
    if isinstance(text, list):
        if server_renders:
            return len(codec.encode_prompt(messages=text))
        text = codec.render(messages=text)
    ids = codec.encode_rendered(text)
    if codec.adds_bos and codec.bos_id is not None and (not ids or ids[0] != codec.bos_id):
        return len(ids) + 1
    return len(ids)


def served_tokenizer(url: str) -> Path:
    """The tokenizer folder (chat template included) of the package served at ``url``.

    Read from the record ``pipeline serve`` keeps for that endpoint (:mod:`pipeline.serve.registry`), checked
    against the configs the server reports; never "the newest package" of the store, which need not be the served
    one.  Raises :class:`InputError` with the fix when the served package cannot be identified.
    """
    import tritonclient.grpc as grpcclient

    from .registry import served_repository

    c = grpcclient.InferenceServerClient(url)
    try:
        repo, why = served_repository(url, c)
    finally:
        c.close()
    if repo is None:
        raise InputError(
            f"cannot tell which package the server at {url} serves ({why}), so its tokenizer and chat template are "
            f"unknown. Fix: pass --tokenizer <package>/model_repository/preprocessing/1/tokenizer, or --raw to send "
            f"the text without a chat template."
        )
    return repo / "preprocessing" / "1" / "tokenizer"


def grpc_address(url: str) -> str:
    """The gRPC address tritonclient expects: ``host:port``, no scheme.  ``grpc://host:port`` is accepted and the
    scheme stripped; ``http(s)://`` is refused (Triton's HTTP endpoint is another port and protocol).

    Raises:
        InputError: a URL with any other scheme, naming ``--url`` and the fix.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    if scheme.lower() == "grpc" and rest:
        return rest.rstrip("/")
    raise InputError(
        f"--url {url}: the gRPC address is host:port without a scheme ({scheme}:// is not gRPC). "
        f"Fix: --url {rest.rstrip('/') or DEFAULT_URL} (grpc://host:port is accepted too)."
    )
