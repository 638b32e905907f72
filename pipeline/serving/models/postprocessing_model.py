"""Triton Python-backend model ``postprocessing``: token ids -> text (TensorRT-LLM ensemble step 3).

Copied by the package stage to ``<repository>/postprocessing/1/model.py``; runs in Triton's Python stub
(``tokenizers``, numpy < 2); must not import the ``pipeline`` package.

Inputs ``TOKENS_BATCH`` INT32 [-1, -1] and ``SEQUENCE_LENGTH`` INT32 [-1] as in TensorRT-LLM
(triton.md sec. 2.5), plus two optional inputs written by our engine model for streaming:
``PREV_SEQUENCE_LENGTH`` INT32 [1] and ``IS_FINAL`` BOOL [1].  When they are present the token list
is the request's *whole* generated sequence so far and the output is the **stable new suffix**:

    text_now  = decode(ids[:n])           (trailing U+FFFD of an unfinished UTF-8 character dropped unless final)
    text_prev = decode(ids[:prev])        (same rule; never final)
    OUTPUT    = text_now[len(text_prev):]

so the concatenation of a stream telescopes to ``decode(all ids)`` = the non-streamed text, and a
multi-byte character (Chinese) is emitted only once all its bytes have arrived.  Without them each
response is decoded on its own (TensorRT-LLM's behaviour; tensorrtllm_backend issue #112).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover
    pb_utils = None

REPLACEMENT = "\ufffd"


def stable_text(decode: Callable[[list[int]], str], ids: list[int], final: bool) -> str:
    """``decode(ids)`` without the trailing replacement characters of a not-yet-complete UTF-8 sequence."""
    text = decode(ids) if ids else ""
    return text if final else text.rstrip(REPLACEMENT)


def stream_delta(decode: Callable[[list[int]], str], ids: list[int], prev: int, final: bool) -> str:
    """The text a streaming response adds: stable(decode(ids)) minus stable(decode(ids[:prev])).

    Args:
        decode: token ids -> text (skip special tokens).
        ids: every generated id of the request so far (not just the new ones).
        prev: how many of ``ids`` earlier responses covered.
        final: this is the request's last response (keep a trailing U+FFFD: it is in the full text too).
    """
    now = stable_text(decode, ids, final)
    before = stable_text(decode, ids[:prev], False) if prev > 0 else ""
    if now.startswith(before):
        return now[len(before):]
    # cannot happen for byte-level / byte-fallback decoders; never repeat text already sent
    k = 0
    while k < min(len(now), len(before)) and now[k] == before[k]:
        k += 1
    return now[max(k, len(before)):]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        tok_dir = params["tokenizer_dir"]
        if not os.path.isabs(tok_dir):
            tok_dir = os.path.join(args["model_repository"], args["model_version"], tok_dir)
        self.tokenizer = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        self.skip_special = params.get("skip_special_tokens", "true").lower() == "true"

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def _one(self, request: Any) -> Any:
        get = lambda n: (lambda t: None if t is None else t.as_numpy())(pb_utils.get_input_tensor_by_name(request, n))  # noqa: E731
        tokens = get("TOKENS_BATCH")  # [B, beams, len]
        lengths = get("SEQUENCE_LENGTH")  # [B, beams]
        prev = get("PREV_SEQUENCE_LENGTH")
        final = get("IS_FINAL")
        outs = []
        for b in range(tokens.shape[0]):
            row = []
            for beam in range(tokens.shape[1]):
                n = int(lengths[b][beam])
                ids = [int(t) for t in tokens[b][beam][:n].tolist()]
                if prev is not None and final is not None:
                    row.append(stream_delta(self._decode, ids, int(prev.reshape(tokens.shape[0], -1)[b][0]),
                                            bool(final.reshape(tokens.shape[0], -1)[b][0])))
                else:
                    row.append(self._decode(ids))
            outs.append([s.encode("utf-8") for s in row])
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", np.array(outs, dtype=object))])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as e:  # noqa: BLE001
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"postprocessing: {e}")))
        return responses
