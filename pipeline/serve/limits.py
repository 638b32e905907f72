"""Request limits of the OpenAI-compatible endpoint, checked before a body is parsed or a prompt is tokenized.

The per-prompt byte limit and the bound on generations per request are the served model's
(:func:`pipeline.core.tokenization.prompt_byte_limit`, :data:`pipeline.core.tokenization.MAX_REQUEST_GENERATIONS`): the front end
reads ``max_input_len`` / ``max_prompt_bytes`` from the served ensemble's config (else the release manifest) and
applies the same numbers, so a request is refused at the first hop with a 400 naming the limit.

* body: at most :func:`body_limit` bytes (``Content-Length`` checked first, then the bytes actually read);
* JSON nesting: at most :data:`MAX_JSON_DEPTH` levels (Python's ``json`` recurses per level: 10^5 ``[`` would raise
  RecursionError, an HTTP 500, instead of a 400);
* prompts x ``n``: at most :data:`pipeline.core.tokenization.MAX_REQUEST_GENERATIONS`;
* each prompt (completion text, or the summed message contents of a chat): at most the prompt byte limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from ..core.contracts.package import ReleaseManifest
from ..core.tokenization import MAX_REQUEST_GENERATIONS, max_token_bytes, prompt_byte_limit, prompt_too_large

#: Deepest JSON nesting a request body may have (an OpenAI request nests about 5 levels).
MAX_JSON_DEPTH = 64
#: Body bytes allowed beyond the prompts themselves (field names, options, JSON framing).
BODY_OVERHEAD_BYTES = 64 << 10

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


class LimitError(ValueError):
    """A request over a limit; ``param`` names the field (or ``None`` for the body)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _params(ensemble_config: dict[str, Any] | None) -> dict[str, str]:
    return {k: (v or {}).get("string_value", "") for k, v in ((ensemble_config or {}).get("parameters") or {}).items()}


def served_max_input_len(ensemble_config: dict[str, Any] | None, manifest: dict[str, Any]) -> int:
    """The longest prompt (tokens) the served engine takes: the ensemble config's ``max_input_len`` parameter (what
    the served model refuses above, ``genai_requests.py``), else the release manifest's ``build.limits``; 0 unknown."""
    limits = ReleaseManifest.from_json(manifest).limits
    return int(_params(ensemble_config).get("max_input_len") or limits.max_input_len or 0)


def served_prompt_limit(ensemble_config: dict[str, Any] | None, manifest: dict[str, Any], tokenizer: Any) -> int:
    # tokenizer: the served ``tokenizers.Tokenizer`` (``TextCodec.tokenizer``)
    """The per-prompt byte limit of the served deployment: the ensemble config's ``max_prompt_bytes`` parameter when
    set, else derived from :func:`served_max_input_len` (else the release manifest's ``max_seq_len``) and the
    served tokenizer's longest token (:func:`pipeline.core.tokenization.prompt_byte_limit`)."""
    limits = ReleaseManifest.from_json(manifest).limits
    max_input_len = served_max_input_len(ensemble_config, manifest) or int(limits.max_seq_len or 0)
    configured = int(_params(ensemble_config).get("max_prompt_bytes") or 0) or None
    return prompt_byte_limit(max_input_len, max_token_bytes(tokenizer), configured)


def body_limit(prompt_limit: int) -> int:
    """Bytes a request body may hold: every generation's prompt at the limit, plus :data:`BODY_OVERHEAD_BYTES`."""
    return prompt_limit * MAX_REQUEST_GENERATIONS + BODY_OVERHEAD_BYTES


async def read_json_body(request: Any, max_bytes: int) -> Any:
    """The parsed JSON body of a Starlette ``request``; LimitError when it holds over ``max_bytes`` bytes (refused
    from ``Content-Length`` before anything is read, else as soon as the bytes read pass it) or nests deeper than
    :data:`MAX_JSON_DEPTH`; ValueError when it is not JSON."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise LimitError(f"the request body holds {int(declared)} bytes, over this endpoint's limit of {max_bytes} bytes.")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > max_bytes:
            raise LimitError(f"the request body holds over {max_bytes} bytes, this endpoint's limit.")
    brackets = _JSON_STRING.sub(b"", bytes(data)).translate(None, _NOT_BRACKETS)
    depth = max(accumulate(1 if c in b"[{" else -1 for c in brackets), default=0)
    if depth > MAX_JSON_DEPTH:
        raise LimitError(f"the request body nests {depth} levels deep, over the limit of {MAX_JSON_DEPTH}.")
    return json.loads(bytes(data))


def check_prompts(prompts: Sequence[Any], n: int, prompt_limit: int, param: str) -> None:
    """LimitError when ``len(prompts) x n`` is over :data:`~pipeline.core.tokenization.MAX_REQUEST_GENERATIONS` or a prompt
    (a text, or a list of ``{"content": ...}`` messages: their contents summed) holds over ``prompt_limit`` UTF-8
    bytes; checked before any prompt is tokenized or rendered."""
    if len(prompts) * n > MAX_REQUEST_GENERATIONS:
        raise LimitError(
            f"{len(prompts)} prompt(s) x n={n} = {len(prompts) * n} generations in one request, over the limit of "
            f"{MAX_REQUEST_GENERATIONS}; send fewer prompts or a smaller n per request.",
            param,
        )
    for i, p in enumerate(prompts):
        if isinstance(p, list):
            nbytes = sum(len(str(m.get("content", "")).encode("utf-8", "surrogatepass")) for m in p if isinstance(m, dict))
        else:
            nbytes = len(str(p).encode("utf-8", "surrogatepass"))
        msg = prompt_too_large(nbytes, prompt_limit, f"{param}[{i}]" if len(prompts) > 1 else param)
        if msg:
            raise LimitError(msg + ".", param)
