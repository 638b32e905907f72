"""The request side of the OpenAI-compatible endpoint (:mod:`pipeline.serve.openai_server`): a request body ->
validated generation parameters, or an OpenAI-style error naming the field.

Rule: every field a request may send is validated here, before anything reaches the deployment; unknown fields are
refused too (never silently ignored).

Both POST routes take ``max_tokens`` (default 16, as OpenAI), ``temperature`` and ``top_p`` (omitted: the model's
recommended values from its ``generation_config.json``, the release manifest's ``decoding.sampling``, as vLLM does;
without any: 1 and 1), the vLLM / trtllm-serve extra fields ``top_k``, ``repetition_penalty`` (omitted: the served
model applies the package's policy), ``min_tokens``, ``ignore_eos`` (exactly ``max_tokens`` tokens, for fixed-length
benchmark loads) and ``min_p`` (0 only: refused otherwise),
``stop`` (text or up to 4 texts), ``n`` (1-16: n independent requests), ``seed``, ``presence_penalty``,
``frequency_penalty``, ``stream`` (Server-Sent Events, ending with ``data: [DONE]``) and
``stream_options.include_usage`` (OpenAI API reference, https://platform.openai.com/docs/api-reference).

Refused with an OpenAI-style error (HTTP 400, ``{"error": {"message", "type", "param", "code"}}``) naming the
field: ``logprobs``/``top_logprobs`` (every value OpenAI answers with log probabilities: completions ``logprobs``
0-5, chat ``logprobs: true`` or any ``top_logprobs``; the served ``ensemble`` computes the sampled tokens' log probs,
``output_log_probs``, but returns no token ids to name the tokens, and no top-k alternatives), ``echo``, ``suffix``, ``best_of`` other
than ``n``, a non-empty ``logit_bias``, ``tools``/``functions``/``response_format`` other than text, an unknown
``model``, values out of range.  ``user`` is accepted as the caller's metadata and only logged.
"""

from __future__ import annotations

import json
from typing import Any

from .limits import LimitError

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


__all__ = ["MAX_N", "APIError", "check_text", "limited", "parse_common", "parse_sampling"]
