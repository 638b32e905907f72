"""The front end of the OpenAI-compatible endpoint: validated OpenAI parameters -> ``ensemble`` requests over gRPC
(:class:`~pipeline.serve.client.LLMClient`), and the answers back as OpenAI choices.

Rule: everything that knows the deployment (its tokenizer and chat template, its limits, its inputs, its health)
lives in :class:`Frontend`; the HTTP routes (:mod:`pipeline.serve.openai_server`) only call it.

How a request maps onto the ``ensemble`` (TensorRT-LLM backend interface):

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
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import InputError, PipelineError
from .limits import served_max_input_len, served_prompt_limit
from .openai_schema import APIError, check_text

log = logging.getLogger("pipeline.openai")


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
        from ..core.contracts.package import PackageArtifact, ReleaseManifest
        from .client import LLMClient, _load_tokenizer

        self.grpc_url, self.repository, self.timeout_s = grpc_url, Path(repository), float(timeout_s)
        man = PackageArtifact(self.repository.parent).read_release_manifest()
        rm = ReleaseManifest.from_json(man)
        self.model_id = model_id or rm.model_name or self.repository.parent.name
        policy_rp = float(rm.repetition_penalty or 1.0)
        self.default_repetition_penalty = None if policy_rp == 1.0 else policy_rp
        """The package's decoding-policy penalty, sent when a request has none (a TensorRT-LLM ensemble has no default)."""
        recommended = rm.sampling
        self.sampling_defaults = {k: v for k, v in recommended.items() if k in ("temperature", "top_p", "top_k")}
        """The model's recommended sampling values (release manifest ``decoding.sampling``), for omitted fields."""
        if self.sampling_defaults:
            log.warning(
                "requests without temperature/top_p/top_k get the model's recommended values %s (generation_config.json, "
                "recorded in the release manifest 'decoding'); a request's own value wins",
                self.sampling_defaults,
            )
        if rm.min_p:
            log.warning("the model recommends min_p=%s; this engine has no min-p sampling: not applied", rm.min_p)
        self.max_seq_len = int(rm.limits.max_seq_len) if rm.limits.max_seq_len else None  # the engine's, for the room
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
        from .client import served_prompt_tokens

        return served_prompt_tokens(self.codec, text, server_renders=self.server_renders)

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


__all__ = ["Answer", "Frontend", "cut_stop", "ensemble_inputs"]
