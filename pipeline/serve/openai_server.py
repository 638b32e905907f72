"""OpenAI-compatible HTTP endpoint in front of the Triton deployment (``pipeline serve --openai``).

Routes (the OpenAI API's shapes; https://platform.openai.com/docs/api-reference):

* ``GET  /v1/models``                 the one served model (its id = the package's model name);
* ``POST /v1/completions``            ``prompt`` (text or list of texts) -> ``choices[i].text``;
* ``POST /v1/chat/completions``       ``messages`` rendered **server-side** with the served package's chat template
  (passed on as the ensemble's ``messages`` input where it has one: user content stays data, docs/package.md).

Both POST routes take ``max_tokens`` (default 16, as OpenAI), ``temperature`` and ``top_p`` (omitted: the model's
recommended values from its ``generation_config.json``, the release manifest's ``decoding.sampling``, as vLLM does;
without any: 1 and 1), the vLLM / trtllm-serve extra fields ``top_k``, ``repetition_penalty`` (omitted: the served
model applies the package's policy), ``min_tokens``, ``ignore_eos`` (exactly ``max_tokens`` tokens, for fixed-length
benchmark loads) and ``min_p`` (0 only: refused otherwise),
``stop`` (text or up to 4 texts), ``n`` (1-16: n independent requests), ``seed``, ``presence_penalty``,
``frequency_penalty``, ``stream`` (Server-Sent Events, ending with ``data: [DONE]``) and
``stream_options.include_usage``.  Every answer carries ``usage`` (prompt / completion / total tokens).

How a request maps onto the ``ensemble`` (TensorRT-LLM backend interface, over gRPC via :class:`LLMClient`):

* ``temperature == 0`` -> greedy (no sampling inputs sent: the backend is greedy by default); ``temperature > 0``
  -> ``temperature`` and ``top_p`` are sent and the engine samples; ``seed`` -> ``random_seed`` (sent with sampling
  only; an onnxruntime-genai engine without ``engine.dynamic_batching``, every CPU engine, refuses it, reported as a
  400 naming ``seed``);
  ``presence_penalty``/``frequency_penalty`` -> the inputs of the same names (non-zero only);
* ``stop`` -> the ensemble's ``stop_words`` (ends generation early) **and** the text is cut before the first stop
  string (OpenAI semantics: the stop text is not returned; ``finish_reason`` = ``"stop"``);
* ``finish_reason`` = ``"length"`` when a limit ended the answer: all of ``max_tokens``, or (``max_tokens`` omitted) the
  room the engine's ``max_seq_len`` leaves after the prompt; else ``"stop"``.  An explicit ``max_tokens`` over that
  room is a 400 naming ``max_tokens`` and the room (as vLLM answers), streamed or not.

Token counts: ``prompt_tokens`` = the ids the served preprocessing feeds the engine (the rendered text encoded by the
served tokenizer without special tokens, plus BOS when the deployment prepends it); ``completion_tokens`` = the
generated token ids, as the deployment reports them (the ensemble's ``sequence_length``, summed over streamed
responses; as vLLM and OpenAI count; the stop id that ended an answer is not counted: the deployment drops it from
the output, whereas vLLM counts the EOS id), never the text re-encoded: sampled ids need not round-trip through their text
(a byte-level piece cut mid-character decodes to U+FFFD, which re-encodes to 3 ids).  The text of a trailing
unfinished UTF-8 sequence at the length limit is kept as U+FFFD, as ``transformers``' ``decode`` of the same ids
gives (streamed: held back until the last response, ``pipeline.core.tokenization.StreamDecoder``).  A package made
before ``sequence_length`` was an ensemble output falls back to re-encoding the text.

Refused with an OpenAI-style error (HTTP 400, ``{"error": {"message", "type", "param", "code"}}``) naming the
field: ``logprobs``/``top_logprobs`` (every value OpenAI answers with log probabilities: completions ``logprobs``
0-5, chat ``logprobs: true`` or any ``top_logprobs``; the served ``ensemble`` computes the sampled tokens' log probs,
``output_log_probs``, but returns no token ids to name the tokens, and no top-k alternatives), ``echo``, ``suffix``, ``best_of`` other
than ``n``, a non-empty ``logit_bias``, ``tools``/``functions``/``response_format`` other than text, an unknown
``model``, values out of range.  Unknown fields are refused too (never silently ignored); ``user`` is accepted as
the caller's metadata and only logged.

Binds to 127.0.0.1 unless told otherwise.  Starlette + uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import InputError, PipelineError
from .limits import LimitError, body_limit, check_prompts, read_json_body, served_max_input_len, served_prompt_limit

if TYPE_CHECKING:  # starlette is imported when the app is built (the serving extra)
    from starlette.requests import Request
    from starlette.responses import JSONResponse

log = logging.getLogger("pipeline.openai")

DEFAULT_PORT = 9000
MAX_N = 16
_KNOWN_COMMON = {
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "n",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "stream",
    "stream_options",
    "user",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "best_of",
    *("top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens"),  # vLLM / trtllm-serve extra sampling fields
}
_KNOWN = {
    "completions": _KNOWN_COMMON | {"prompt", "echo", "suffix"},
    "chat": _KNOWN_COMMON | {"messages", "tools", "tool_choice", "functions", "function_call", "response_format", "parallel_tool_calls"},
}
#: known fields accepted only in their default (off) form and refused otherwise, each naming itself
_DEFAULT_ONLY = {
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "best_of",
    "echo",
    "suffix",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "parallel_tool_calls",
}


class APIError(Exception):
    """An OpenAI-style error response."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None, type_: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = message, param, status, code, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def limited(check: Any, *args: Any) -> None:
    """Run a :mod:`pipeline.serve.limits` check; its LimitError becomes a 400 naming the limit."""
    try:
        check(*args)
    except LimitError as e:
        raise APIError(str(e), e.param, code="request_too_large") from None


# --------------------------------------------------------------------------- request validation
def _num(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= float(v) <= hi:
        raise APIError(f"{name}={v!r}: must be a number in [{lo}, {hi}].", name)
    return float(v)


def _int(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise APIError(f"{name}={v!r}: must be an integer >= {lo}" + (f" and <= {hi}." if hi is not None else "."), name)
    return v


def check_text(value: str, field: str) -> str:
    """``value`` when it is valid Unicode text; a lone UTF-16 surrogate (JSON ``"\\ud800"``, which Python's JSON
    decoder lets through) is a 400 naming ``field`` instead of a 500 or a tokenizer error.  Raises :class:`APIError`."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(
            f"{field} contains a lone UTF-16 surrogate (U+{ord(value[e.start]):04X} at character {e.start}): not valid "
            f"Unicode text. Fix: send well-formed text (pair every surrogate, or remove it).",
            field,
        ) from None
    return value


def parse_sampling(body: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``temperature``, ``top_p``, ``top_k`` and the vLLM / trtllm-serve extra fields of ``body``; a field the request
    omits takes the model's recommended value (``defaults``: the package's decoding policy ``sampling``, from the
    checkpoint's ``generation_config.json``, ``pipeline/core/decoding.py``; as vLLM's ``--generation-config auto``), else
    OpenAI's default.  An explicit request value always wins.

    ``top_k`` (0 or -1 = off), ``repetition_penalty`` (> 0; omitted: the served model applies the policy's),
    ``min_tokens`` (>= 0), ``ignore_eos`` (bool: generate exactly ``max_tokens``) are honoured; ``min_p`` > 0 is
    refused (onnxruntime-genai 0.18 search options have no min-p).  Raises :class:`APIError` naming the field.
    """
    top_k = _int(body, "top_k", int(defaults.get("top_k", 0)), -1)
    if body.get("min_p") not in (None, 0, 0.0):
        raise APIError(f"min_p={body['min_p']!r}: min-p sampling is not supported by this engine. Fix: remove min_p.", "min_p")
    rp = body.get("repetition_penalty")
    if rp is not None and (isinstance(rp, bool) or not isinstance(rp, (int, float)) or not 0 < float(rp) <= 10):
        raise APIError(f"repetition_penalty={rp!r}: must be a number in (0, 10].", "repetition_penalty")
    if not isinstance(body.get("ignore_eos", False), bool):
        raise APIError(f"ignore_eos={body.get('ignore_eos')!r}: must be true or false.", "ignore_eos")
    return {
        "temperature": _num(body, "temperature", float(defaults.get("temperature", 1.0)), 0.0, 2.0),
        "top_p": _num(body, "top_p", float(defaults.get("top_p", 1.0)), 0.0, 1.0),
        "top_k": max(0, top_k or 0),
        "repetition_penalty": None if rp is None else float(rp),
        "min_tokens": _int(body, "min_tokens", 0, 0) or 0,
        "ignore_eos": bool(body.get("ignore_eos", False)),
    }


def parse_common(body: dict[str, Any], kind: str, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate the fields both routes share; returns the generation parameters (sampling: :func:`parse_sampling`
    with the model's recommended ``defaults``).  Raises :class:`APIError`."""
    unknown = sorted(set(body) - _KNOWN[kind])
    if unknown:
        raise APIError(
            f"unsupported field(s) {unknown}: this endpoint honours {sorted(_KNOWN[kind] - _DEFAULT_ONLY)} "
            f"(and accepts {sorted(_KNOWN[kind] & _DEFAULT_ONLY)} only unset or in their default form). Fix: remove them.",
            unknown[0],
        )
    # every value OpenAI answers with log probabilities is refused (completions: any integer, 0 included; chat:
    # logprobs=true, any top_logprobs): the served ensemble returns no token ids to label them with (module docstring)
    off = (None,) if kind == "completions" else (None, False)
    for name, allowed in (("logprobs", off), ("top_logprobs", (None,))):
        if name in body and body[name] not in allowed:
            raise APIError(
                f"{name}={json.dumps(body[name])}: this endpoint returns no log probabilities (the deployment's text "
                f"interface carries no token ids to label them with). Fix: remove {name}.",
                name,
            )
    if body.get("logit_bias"):
        raise APIError("logit_bias is not supported by this deployment. Fix: remove it.", "logit_bias")
    n = _int(body, "n", 1, 1, MAX_N)
    if body.get("best_of") not in (None, n):
        raise APIError(f"best_of={body['best_of']!r}: only best_of == n is supported (no server-side ranking).", "best_of")
    max_tokens = _int(body, "max_completion_tokens", None, 1) or _int(body, "max_tokens", 16 if kind == "completions" else None, 1)
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stops = list(stop)
    else:
        raise APIError(f"stop={stop!r}: must be a string or a list of up to 4 strings.", "stop")
    stops = [check_text(s, f"stop[{i}]") for i, s in enumerate(stops) if s]
    so = body.get("stream_options")
    if so is not None and (not isinstance(so, dict) or set(so) - {"include_usage"}):
        raise APIError(f"stream_options={so!r}: only {{'include_usage': bool}} is supported.", "stream_options")
    if not isinstance(body.get("stream", False), bool):
        raise APIError(f"stream={body.get('stream')!r}: must be true or false.", "stream")
    if so is not None and not body.get("stream"):  # as vLLM: "Stream options can only be defined when stream=True"
        raise APIError("stream_options is only allowed with stream=true. Fix: remove stream_options or send stream=true.", "stream_options")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
        raise APIError(f"seed={seed!r}: must be an integer in [0, 2**64).", "seed")
    return {
        "n": n,
        "max_tokens": max_tokens,
        "max_tokens_sent": body.get("max_completion_tokens") is not None or body.get("max_tokens") is not None,
        **parse_sampling(body, defaults or {}),
        "stop": stops,
        "seed": seed,
        "presence_penalty": _num(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _num(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "stream": bool(body.get("stream", False)),
        "include_usage": bool((so or {}).get("include_usage", False)),
    }


def ensemble_inputs(p: dict[str, Any]) -> dict[str, Any]:
    """OpenAI parameters -> extra ``ensemble`` inputs (see module docstring)."""
    extra: dict[str, Any] = {}
    if p["temperature"] > 0:
        extra.update(temperature=p["temperature"], top_p=p["top_p"])
        if p.get("top_k"):
            extra["top_k"] = int(p["top_k"])
        if p["seed"] is not None:
            extra["random_seed"] = int(p["seed"])
    if p.get("repetition_penalty") is not None:
        extra["repetition_penalty"] = float(p["repetition_penalty"])
    if p.get("min_tokens"):
        extra["min_length"] = int(p["min_tokens"])
    if p["stop"]:
        extra["stop_words"] = list(p["stop"])
    for k in ("presence_penalty", "frequency_penalty"):
        if p[k]:
            extra[k] = p[k]
    return extra


def _as_openai_error(e: Exception, p: dict[str, Any]) -> APIError:
    """A deployment's refusal as an OpenAI error naming the field the client sent.

    The ensemble names its own inputs; ``random_seed`` is what this front end sends for ``seed``
    (:func:`ensemble_inputs`), so its refusal is reported as ``seed`` with that field's fix.
    """
    from .client import is_server_fault

    msg = str(e)
    if is_server_fault(msg):  # the deployment failed, not the request: a server error, never a 400
        return APIError(msg, status=503, type_="server_error")
    if p.get("seed") is not None and "random_seed" in msg:
        log.info("seed refused by the deployment (as random_seed): %s", msg)
        return APIError(
            f"seed={p['seed']} with sampling (temperature={p['temperature']} > 0) cannot be honoured by this deployment: "
            "its onnxruntime-genai engine was built without engine.dynamic_batching, where og.Engine applies per-request "
            "seeds. Fix: remove seed, or send temperature=0 (greedy decoding is deterministic).",
            "seed",
        )
    return APIError(msg, status=400)


class Answer(NamedTuple):
    """One choice: the text returned (cut before a stop string), ``finish_reason`` and the generated token count."""

    text: str
    reason: str  # "stop" | "length"
    completion_tokens: int


def cut_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` before the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


# --------------------------------------------------------------------------- the front end
class Frontend:
    """Translates OpenAI requests into ``ensemble`` requests.

    Args:
        grpc_url: Triton's gRPC endpoint serving ``repository``.
        repository: the served model repository (its ``preprocessing/1/tokenizer`` gives the chat template and counts).
        model_id: the id clients pass as ``model`` (default: the release manifest's model name, else the folder name).
        max_tokens_default: budget for chat requests without ``max_tokens`` (default: the engine's room).
    """

    def __init__(self, grpc_url: str, repository: Path, model_id: str | None = None, *, timeout_s: float = 300.0) -> None:
        from ..core.contracts.package import PackageArtifact
        from .client import LLMClient, _load_tokenizer

        self.grpc_url, self.repository, self.timeout_s = grpc_url, Path(repository), float(timeout_s)
        man = PackageArtifact(self.repository.parent).read_release_manifest()
        self.model_id = model_id or (man.get("model") or {}).get("name") or self.repository.parent.name
        policy_rp = float((man.get("decoding") or {}).get("repetition_penalty") or 1.0)
        self.default_repetition_penalty = None if policy_rp == 1.0 else policy_rp
        """The package's decoding-policy penalty, sent when a request has none (a TensorRT-LLM ensemble has no default)."""
        recommended = (man.get("decoding") or {}).get("sampling") or {}
        self.sampling_defaults = {k: v for k, v in recommended.items() if k in ("temperature", "top_p", "top_k")}
        """The model's recommended sampling values (release manifest ``decoding.sampling``), for omitted fields."""
        if self.sampling_defaults:
            log.warning(
                "requests without temperature/top_p/top_k get the model's recommended values %s (generation_config.json, "
                "recorded in the release manifest 'decoding'); a request's own value wins",
                self.sampling_defaults,
            )
        if recommended.get("min_p"):
            log.warning("the model recommends min_p=%s; this engine has no min-p sampling: not applied", recommended["min_p"])
        limits = (man.get("build") or {}).get("limits") or {}
        self.max_seq_len = int(limits["max_seq_len"]) if limits.get("max_seq_len") else None  # the engine's, for the room
        self.created = int(time.time())
        from ..core.tokenization import codec_of

        self.tokenizer = _load_tokenizer(self.repository / "preprocessing" / "1" / "tokenizer")
        self.codec = codec_of(self.tokenizer)
        probe = LLMClient(grpc_url, timeout_s=self.timeout_s)
        try:
            self.decoupled = probe.decoupled
            self.server_renders = "messages" in probe.inputs  # the CPU target's ensemble renders chat itself
            ens_cfg = probe.client.get_model_config("ensemble", as_json=True, client_timeout=10).get("config")
        finally:
            probe.close()
        self.prompt_limit = served_prompt_limit(ens_cfg, man, self.codec.tokenizer)  # request limits (serving/limits.py)
        self.max_input_len = served_max_input_len(ens_cfg, man)  # the longest prompt the engine takes (0: unknown)
        self._local = threading.local()
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        self.unhealthy: str | None = None
        """Set by ``pipeline serve`` when the engine's backend process died: /health and every request answer 503."""
        self.watch: Any = None
        """``TritonServer.failure`` of the server behind ``grpc_url`` when this process started it (:class:`OpenAIServer`)."""

    def down(self) -> str | None:
        """Why every request would fail now, or None: the one condition of ``/health`` and of each request (checked
        before it is sent): :attr:`unhealthy`, else the served server's ``failure()`` (a dead engine process is seen
        at once, not at ``pipeline serve``'s next look)."""
        return self.unhealthy or (self.watch() if self.watch is not None else None)

    def not_ready(self) -> str | None:
        """Why the deployment cannot answer (Triton unreachable, server or ``ensemble`` not ready), or None."""
        try:
            c = self.client().client
            if not (c.is_server_ready(client_timeout=5) and c.is_model_ready("ensemble", client_timeout=5)):
                return "Triton reports the server or the ensemble not ready"
        except Exception as e:  # unreachable: the server is down
            return f"Triton is unreachable: {type(e).__name__}"
        return None

    # -- helpers
    def client(self) -> Any:
        from .client import LLMClient

        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = LLMClient(self.grpc_url, timeout_s=self.timeout_s)
            with self._lock:
                self._clients.append(c)
        return c

    def close(self) -> None:
        with self._lock:
            for c in self._clients:
                c.close()
            self._clients.clear()

    def prompt_tokens(self, text: str | list[dict]) -> int:
        """Ids the served model feeds the engine for ``text``: the served encode rule (``encode_served`` in
        ``serve/models/genai_requests.py``: rendered text as is, BOS only where the tokenizer adds it);
        for chat messages rendered server-side, ``TextCodec.encode_prompt`` (what the served model runs)."""
        c = self.codec
        if isinstance(text, list):
            if self.server_renders:
                return len(c.encode_prompt(messages=text))
            text = c.render(messages=text)
        ids = c.encode_rendered(text)
        if c.adds_bos and c.bos_id is not None and (not ids or ids[0] != c.bos_id):
            return len(ids) + 1
        return len(ids)

    def completion_tokens(self, text: str) -> int:
        """Fallback count for a deployment without a ``sequence_length`` output: ``text`` re-encoded (over-counts
        text that does not round-trip, e.g. a U+FFFD from an unfinished UTF-8 sequence)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0

    def render_chat(self, messages: Any) -> list[dict]:
        """The validated conversation ``[{"role", "content"}, ...]``; sent as the ensemble's ``messages`` input when
        the deployment renders chat itself (user content stays data), else rendered here (TensorRT-LLM target)."""
        if not isinstance(messages, list) or not messages:
            raise APIError("messages must be a non-empty list of {role, content} objects.", "messages")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
                raise APIError(f"messages[{i}]: role must be system, developer, user or assistant.", f"messages[{i}].role")
            content = m.get("content")
            if isinstance(content, list):  # content parts: text only
                if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                    raise APIError(f"messages[{i}].content: only text parts are supported.", f"messages[{i}].content")
                content = "".join(p.get("text", "") for p in content)
            if not isinstance(content, str):
                raise APIError(f"messages[{i}].content must be text.", f"messages[{i}].content")
            msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": check_text(content, f"messages[{i}].content")}
            if m.get("name") is not None:  # kept for the chat template (OpenAI's participant name), never dropped
                if not isinstance(m["name"], str):
                    raise APIError(f"messages[{i}].name must be text.", f"messages[{i}].name")
                msg["name"] = check_text(m["name"], f"messages[{i}].name")
            out.append(msg)
        try:
            self.codec.encode_prompt(messages=out)  # the template accepts them (refused here, as a 400, before sending)
            return out
        except Exception as e:
            raise APIError(f"the model's chat template refused these messages: {e}", "messages") from None

    def _inputs(self, p: dict[str, Any], budget: int) -> dict[str, Any]:
        """The ensemble inputs of one request: :func:`ensemble_inputs`, the policy's ``repetition_penalty`` when the
        request sends none, ``min_length = budget`` for ``ignore_eos`` (exactly ``max_tokens`` tokens)."""
        extra = ensemble_inputs(p)
        if "repetition_penalty" not in extra and self.default_repetition_penalty is not None:
            extra["repetition_penalty"] = self.default_repetition_penalty
        if p.get("ignore_eos"):
            extra["min_length"] = budget
        return extra

    def budget(self, p: dict[str, Any], text: str | list[dict] | None = None) -> int:
        """Tokens this request may generate: ``max_tokens`` (omitted: 256 for chat), capped by the room the engine's
        ``max_seq_len`` leaves after the prompt (release manifest ``build.limits``) when ``max_tokens`` is omitted.

        Raises:
            APIError: 400 naming the prompt (``prompt`` or ``messages``), its token count and the limit, when the
                prompt alone is too long: over the engine's ``max_input_len`` (the served model refuses it, whatever
                ``max_tokens``) or leaving no room under ``max_seq_len``; else 400 naming ``max_tokens`` when an
                explicit ``max_tokens`` exceeds the room (vLLM refuses it the same way, ``serving_engine.py``
                "maximum context length"): only then does lowering it help.
        """
        asked = int(p["max_tokens"]) if p["max_tokens"] is not None else None
        if text is None:
            return asked if asked is not None else 256
        n_prompt = self.prompt_tokens(text)
        field = "messages" if isinstance(text, list) else "prompt"
        if self.max_input_len and n_prompt > self.max_input_len:
            raise APIError(
                f"{field} has {n_prompt} tokens, over this model's max_input_len of {self.max_input_len} tokens (the "
                f"longest prompt its engine takes). Fix: shorten the prompt to at most "
                f"{self.max_input_len} tokens.",
                field,
                code="context_length_exceeded",
            )
        if not self.max_seq_len:
            return asked if asked is not None else 256
        room = self.max_seq_len - n_prompt
        if room < 1:
            raise APIError(
                f"{field} has {n_prompt} tokens, leaving no room to generate under this model's maximum context length "
                f"of {self.max_seq_len} tokens. Fix: shorten the prompt to at most {self.max_seq_len - 1} tokens.",
                field,
                code="context_length_exceeded",
            )
        if not p.get("max_tokens_sent", True):  # a default (16 for completions, 256 for chat) is capped, never refused
            asked = min(asked or 256, room)
        if asked is not None and asked > room:
            raise APIError(
                f"max_tokens={asked} exceeds the room left: this model's maximum context length is {self.max_seq_len} "
                f"tokens and the prompt has {n_prompt}, leaving {room}. Fix: send max_tokens <= {room} or shorten the prompt.",
                "max_tokens",
            )
        return asked if asked is not None else min(256, room)

    def generate(self, text: str | list[dict], p: dict[str, Any], *, on_chunk: Any = None, cancel: threading.Event | None = None) -> Answer:
        """Blocking: one ensemble request for a prompt text or chat messages.

        ``completion_tokens`` counts the generated ids the deployment reports (``sequence_length``), not the text
        re-encoded; the text is the deployment's decode of those ids (a trailing unfinished UTF-8 sequence decodes to
        U+FFFD, as ``transformers``' ``decode`` gives)."""
        from .client import RequestError

        why = self.down()
        if why:
            raise APIError(f"the deployment is down: {why}", status=503, type_="server_error")
        budget = self.budget(p, text)
        stream = on_chunk is not None and self.decoupled
        sent = {"n": 0}
        held = {"text": ""}
        stops = p["stop"]

        def chunk(delta: str, _t: float) -> None:
            # hold back text that could be the start of a stop string; never emit text past a stop string
            held["text"] += delta
            safe, found = cut_stop(held["text"], stops)
            if found:
                emit = safe[sent["n"] :]
            else:
                keep = max((len(s) - 1 for s in stops), default=0)
                emit = held["text"][sent["n"] : max(sent["n"], len(held["text"]) - keep)]
            if emit:
                sent["n"] += len(emit)
                on_chunk(emit)

        try:
            if isinstance(text, list) and not self.server_renders:
                text = self.codec.render(messages=text)
            how = {"messages": text} if isinstance(text, list) else {"prompt": text}
            r = self.client().generate(
                max_tokens=budget,
                stream=stream,
                chat=False,
                cancel=cancel,
                on_chunk=chunk if stream else None,
                **how,
                **self._inputs(p, budget),
            )
        except InputError as e:
            raise APIError(str(e)) from None
        except RequestError as e:  # the deployment refused or failed this request: its message names the input
            raise _as_openai_error(e, p) from None
        except PipelineError as e:
            raise APIError(str(e), status=503, type_="server_error") from None
        out, stopped = cut_stop(r.text, stops)
        if stream and len(out) > sent["n"]:
            on_chunk(out[sent["n"] :])
        n = r.n_tokens if r.n_tokens is not None else self.completion_tokens(r.text)
        reason = "stop" if stopped or n < budget else "length"  # budget: max_tokens or the engine's room (issue 24)
        return Answer(out, reason, n)


def build_app(fe: Frontend) -> Any:
    """The Starlette application for ``fe`` (routes: :class:`_Handlers`)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    h = _Handlers(fe)
    return Starlette(
        routes=[
            Route("/v1/models", h.models, methods=["GET"]),
            Route("/v1/completions", h.completions, methods=["POST"]),
            Route("/v1/chat/completions", h.chat, methods=["POST"]),
            Route("/health", h.health, methods=["GET"]),
        ]
    )


class _Handlers:
    """The OpenAI-compatible routes of :func:`build_app` over one :class:`Frontend`."""

    def __init__(self, fe: Frontend) -> None:
        self.fe = fe

    async def models(self, _request: Request) -> JSONResponse:
        from starlette.responses import JSONResponse

        return JSONResponse(
            {"object": "list", "data": [{"id": self.fe.model_id, "object": "model", "created": self.fe.created, "owned_by": "pipeline"}]}
        )

    async def body_of(self, request: Request, kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            body = await read_json_body(request, body_limit(self.fe.prompt_limit))
        except LimitError as e:
            raise APIError(str(e), e.param, code="request_too_large") from None
        except (ValueError, UnicodeDecodeError):
            raise APIError("the request body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object.")
        if body.get("model") != self.fe.model_id:
            raise APIError(
                f"model {body.get('model')!r} does not exist here; this endpoint serves {self.fe.model_id!r} (GET /v1/models).",
                "model",
                status=404,
                code="model_not_found",
            )
        p = parse_common(body, kind, self.fe.sampling_defaults)
        if p["stream"] and not self.fe.decoupled:
            raise APIError("stream=true needs a decoupled deployment (package.decoupled=true).", "stream")
        return body, p

    # a prompt is completion text, or chat messages (Frontend.render_chat) when the deployment renders chat itself
    async def run_choices(self, texts: Sequence[str | list[dict]], p: dict[str, Any]) -> list[Answer]:
        jobs = [asyncio.to_thread(self.fe.generate, t, p) for t in texts for _ in range(p["n"])]
        return list(await asyncio.gather(*jobs))

    def usage(self, prompts: Sequence[str | list[dict]], answers: Sequence[Answer | None]) -> dict[str, int]:
        """OpenAI ``usage``: each prompt counted once however many choices (``n``) it has, as OpenAI's API and vLLM's
        server count it; every choice's generated ids."""
        pt = sum(self.fe.prompt_tokens(t) for t in prompts)
        ct = sum(a.completion_tokens for a in answers if a is not None)
        return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}

    def _chunk(
        self, kind: str, p: dict[str, Any], rid: str, created: int, idx: int, content: str | None, reason: str | None, first: bool = False
    ) -> bytes:
        """One SSE event of a streamed answer (OpenAI's chunk shapes for completions and chat)."""
        obj = "text_completion" if kind == "completions" else "chat.completion.chunk"
        if kind == "completions":
            choice: dict[str, Any] = {"index": idx, "text": content or "", "logprobs": None, "finish_reason": reason}
        else:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if content:
                delta["content"] = content
            choice = {"index": idx, "delta": delta, "logprobs": None, "finish_reason": reason}
        ev = {"id": rid, "object": obj, "created": created, "model": self.fe.model_id, "choices": [choice]}
        if p["include_usage"]:
            ev["usage"] = None
        return f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode()

    async def stream_response(self, kind: str, texts: Sequence[str | list[dict]], p: dict[str, Any], rid: str, created: int) -> Any:
        """A streamed answer. The response starts once the first event is there: a request the deployment refuses before
        any token gets the same HTTP status and error body as unstreamed (vLLM / OpenAI), never 200 + an error event."""
        from starlette.responses import JSONResponse, StreamingResponse

        obj = "text_completion" if kind == "completions" else "chat.completion.chunk"
        n_choices = len(texts) * p["n"]
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        answers: list[Answer | None] = [None] * n_choices

        def worker(idx: int, text: str) -> None:
            def on_chunk(delta: str) -> None:
                loop.call_soon_threadsafe(q.put_nowait, ("delta", idx, delta))

            try:
                ans = self.fe.generate(text, p, on_chunk=on_chunk, cancel=cancel)
                loop.call_soon_threadsafe(q.put_nowait, ("done", idx, ans))
            except APIError as e:
                loop.call_soon_threadsafe(q.put_nowait, ("error", idx, e))

        # the references keep the tasks alive until the stream ends
        running = [asyncio.create_task(asyncio.to_thread(worker, i, texts[i // p["n"]])) for i in range(n_choices)]
        first = await q.get()
        if first[0] == "error":
            cancel.set()
            return JSONResponse(first[2].body(), status_code=first[2].status)

        async def events() -> AsyncIterator[bytes]:
            pending, _keep = [first], running
            try:
                if kind == "chat":
                    for i in range(n_choices):
                        yield self._chunk(kind, p, rid, created, i, None, None, first=True)
                done = 0
                while done < n_choices:
                    what, idx, val = pending.pop() if pending else await q.get()
                    if what == "delta":
                        yield self._chunk(kind, p, rid, created, idx, val, None)
                    elif what == "done":
                        done += 1
                        answers[idx] = val
                        yield self._chunk(kind, p, rid, created, idx, None, val.reason)
                    else:
                        cancel.set()
                        yield f"data: {json.dumps(val.body())}\n\n".encode()
                        return
                if p["include_usage"]:
                    ev: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": self.fe.model_id, "choices": []}
                    yield f"data: {json.dumps({**ev, 'usage': self.usage(texts, answers)}, ensure_ascii=False)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                cancel.set()  # a client that went away cancels its requests in Triton (LLMClient stops the stream)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(self, request: Request) -> Any:
        from starlette.responses import JSONResponse

        try:
            body, p = await self.body_of(request, "completions")
            for f in ("echo", "suffix"):
                if body.get(f):
                    raise APIError(f"{f} is not supported by this endpoint. Fix: remove it.", f)
            prompt = body.get("prompt")
            texts = [prompt] if isinstance(prompt, str) else prompt
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
                raise APIError(
                    "prompt must be a non-empty string or a list of non-empty strings (token-id prompts are not supported).", "prompt"
                )
            texts = [check_text(t, "prompt" if isinstance(prompt, str) else f"prompt[{i}]") for i, t in enumerate(texts)]
            limited(check_prompts, texts, p["n"], self.fe.prompt_limit, "prompt")  # bytes of valid text, before tokenizing
            rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
            for t in texts:  # a max_tokens over the room is a 400 before any stream starts (streamed or not)
                self.fe.budget(p, t)
            if p["stream"]:
                return await self.stream_response("completions", texts, p, rid, created)
            outs = await self.run_choices(texts, p)
            choices = [{"index": i, "text": a.text, "logprobs": None, "finish_reason": a.reason} for i, a in enumerate(outs)]
            return JSONResponse(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": self.fe.model_id,
                    "choices": choices,
                    "usage": self.usage(texts, outs),
                }
            )
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status)

    async def chat(self, request: Request) -> Any:
        from starlette.responses import JSONResponse

        try:
            body, p = await self.body_of(request, "chat")
            if body.get("tools") or body.get("functions"):
                raise APIError("tool/function calling is not supported by this deployment. Fix: remove tools/functions.", "tools")
            rf = body.get("response_format")
            if rf not in (None, {"type": "text"}):
                raise APIError(f"response_format={rf!r}: only text is supported.", "response_format")
            msgs = body.get("messages")
            limited(check_prompts, [msgs] if isinstance(msgs, list) else [], p["n"], self.fe.prompt_limit, "messages")
            text = self.fe.render_chat(msgs)
            rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
            self.fe.budget(p, text)  # a max_tokens over the room is a 400 before any stream starts
            if p["stream"]:
                return await self.stream_response("chat", [text], p, rid, created)
            outs = await self.run_choices([text], p)
            choices = [
                {"index": i, "message": {"role": "assistant", "content": a.text}, "logprobs": None, "finish_reason": a.reason}
                for i, a in enumerate(outs)
            ]
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": self.fe.model_id,
                    "choices": choices,
                    "usage": self.usage([text], outs),
                }
            )
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status)

    async def health(self, _request: Request) -> JSONResponse:
        """200 ``{"status": "ok"}``; 503 ``{"status": "unhealthy", "reason"}`` as soon as requests would get a 503
        (:meth:`Frontend.down`: the engine process died, tritonserver exited) or Triton reports the served model not
        ready."""
        from starlette.responses import JSONResponse

        why = self.fe.down() or await asyncio.to_thread(self.fe.not_ready)
        if why:
            return JSONResponse({"status": "unhealthy", "reason": why}, status_code=503)
        return JSONResponse({"status": "ok"})


class OpenAIServer:
    """uvicorn serving :func:`build_app` in a background thread (context manager).

    Args:
        grpc_url, repository, model_id: see :class:`Frontend`.
        host: bind address (default 127.0.0.1: this machine only); port: 0 = a free one.
        triton: the :class:`~pipeline.serve.server.TritonServer` behind ``grpc_url`` when this process started it: its
            ``failure()`` (a dead engine process, tritonserver gone) turns ``/health`` and every request to 503 at once.
    Attributes after :meth:`start`: ``port``, ``url`` (``http://host:port/v1``).
    Raises :class:`InputError` when the port is taken.
    """

    def __init__(
        self,
        grpc_url: str,
        repository: Path,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        model_id: str | None = None,
        triton: Any = None,
    ) -> None:
        self.grpc_url, self.repository, self.host, self.requested_port, self.model_id = (
            grpc_url,
            Path(repository),
            host,
            int(port),
            model_id,
        )
        self.port = 0
        self.triton = triton
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.frontend: Frontend | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout_s: float = 60.0) -> OpenAIServer:
        import uvicorn

        from .server import check_port_free, free_port

        if self.requested_port:
            check_port_free(self.requested_port, self.host, "package.openai_port")
        self.port = self.requested_port or free_port(self.host)
        self.frontend = Frontend(self.grpc_url, self.repository, self.model_id)
        self.frontend.watch = self.triton.failure if self.triton is not None else None
        cfg = uvicorn.Config(
            build_app(self.frontend), host=self.host, port=self.port, log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, name="openai-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise PipelineError(f"the OpenAI endpoint could not start on {self.host}:{self.port} (see the log above).")
            if time.monotonic() > deadline:
                raise PipelineError(f"the OpenAI endpoint did not start within {timeout_s:.0f} s.")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self.frontend is not None:
            self.frontend.close()

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["APIError", "DEFAULT_PORT", "Frontend", "OpenAIServer", "build_app", "cut_stop", "ensemble_inputs", "parse_common"]
