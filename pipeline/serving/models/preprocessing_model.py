"""Triton Python-backend model ``preprocessing``: text -> token ids (TensorRT-LLM ensemble step 1).

Copied by the package stage to ``<repository>/preprocessing/1/model.py``; runs in Triton's Python stub with
the serving virtualenv (``tokenizers``, numpy < 2); must not import the ``pipeline`` package.

Tensor names, data types and shapes follow TensorRT-LLM's ``preprocessing`` model (triton.md sec. 2.3).
Tokenization follows ``pipeline/tokenization.py``: the text is encoded **without** adding special tokens
(a chat-rendered prompt already carries BOS); when ``prepend_bos`` is true and the ids do not start with
BOS, BOS is prepended (the rule for prompts rendered without a chat template).  ``END_ID``/``PAD_ID``
default to the tokenizer's eos/pad ids (``end_id``/``pad_id`` parameters, written from ``model_info.json``).

Errors (one per request, the server keeps serving): empty ``QUERY``, non-UTF-8 text.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover
    pb_utils = None


def words_to_list(tokenizer: Any, words: list[str]) -> np.ndarray:
    """TensorRT-LLM ``[2, L]`` words list: row 0 = concatenated ids, row 1 = end offsets padded with -1."""
    ids: list[int] = []
    offsets: list[int] = []
    for w in words:
        if not w:
            continue
        enc = tokenizer.encode(w, add_special_tokens=False).ids
        if not enc:
            continue
        ids.extend(enc)
        offsets.append(len(ids))
    if not ids:
        return np.array([[0], [-1]], dtype=np.int32)
    pad = len(ids) - len(offsets)
    return np.array([ids, offsets + [-1] * pad], dtype=np.int32)


def _strings(arr: np.ndarray | None) -> list[str]:
    if arr is None:
        return []
    out = []
    for x in np.asarray(arr).reshape(-1).tolist():
        out.append(x.decode("utf-8") if isinstance(x, bytes) else str(x))
    return out


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        tok_dir = params["tokenizer_dir"]
        if not os.path.isabs(tok_dir):
            tok_dir = os.path.join(args["model_repository"], args["model_version"], tok_dir)
        self.tokenizer = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        self.add_special_tokens = params.get("add_special_tokens", "false").lower() == "true"
        self.prepend_bos = params.get("prepend_bos", "true").lower() == "true"
        self.bos_id = int(params["bos_id"]) if params.get("bos_id", "").lstrip("-").isdigit() else None
        self.end_id = int(params.get("end_id") or -1)
        self.pad_id = int(params.get("pad_id") or self.end_id)

    def _one(self, request: Any) -> Any:
        get = lambda n: (lambda t: None if t is None else t.as_numpy())(pb_utils.get_input_tensor_by_name(request, n))  # noqa: E731
        queries = _strings(get("QUERY"))
        if not queries or not queries[0]:
            raise ValueError("text_input is empty; send a non-empty prompt")
        text = queries[0]
        ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens).ids
        if self.prepend_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        out_len = get("REQUEST_OUTPUT_LEN")
        end = get("END_ID")
        pad = get("PAD_ID")
        end_id = int(end.reshape(-1)[0]) if end is not None and end.size else self.end_id
        pad_id = int(pad.reshape(-1)[0]) if pad is not None and pad.size else self.pad_id
        bias_w = get("EMBEDDING_BIAS_WEIGHTS")
        if _strings(get("EMBEDDING_BIAS_WORDS")) and any(_strings(get("EMBEDDING_BIAS_WORDS"))):
            raise ValueError("embedding_bias_words is not supported by this deployment; remove it")
        extra = get("PROMPT_TABLE_EXTRA_ID")
        n = len(ids)
        tensors = [
            pb_utils.Tensor("INPUT_ID", np.asarray([ids], dtype=np.int32)),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.asarray([[n]], dtype=np.int32)),
            pb_utils.Tensor("DECODER_INPUT_ID", np.zeros((1, 0), dtype=np.int32)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.zeros((1, 1), dtype=np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.asarray(out_len, dtype=np.int32).reshape(1, -1)),
            pb_utils.Tensor("BAD_WORDS_IDS", words_to_list(self.tokenizer, _strings(get("BAD_WORDS_DICT")))[None]),
            pb_utils.Tensor("STOP_WORDS_IDS", words_to_list(self.tokenizer, _strings(get("STOP_WORDS_DICT")))[None]),
            pb_utils.Tensor("EMBEDDING_BIAS", np.zeros((1, 0), dtype=np.float32) if bias_w is None else np.zeros((1, 0), np.float32)),
            pb_utils.Tensor("OUT_END_ID", np.asarray([[end_id]], dtype=np.int32)),
            pb_utils.Tensor("OUT_PAD_ID", np.asarray([[pad_id]], dtype=np.int32)),
            pb_utils.Tensor("OUT_PROMPT_TABLE_EXTRA_IDS",
                            np.zeros((1, n), dtype=np.uint64) if extra is None else np.full((1, n), int(extra.reshape(-1)[0]), np.uint64)),
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as e:  # noqa: BLE001 - a clean per-request error
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"preprocessing: {e}")))
        return responses
