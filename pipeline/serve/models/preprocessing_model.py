"""Triton Python-backend model ``preprocessing``: text -> token ids (TensorRT-LLM ensemble step 1).

Copied by the package stage to ``<repository>/preprocessing/1/model.py``; runs in Triton's Python stub with
the serving virtualenv (``tokenizers``, numpy < 2); must not import the ``pipeline`` package.

Tensor names, data types and shapes follow TensorRT-LLM's ``preprocessing`` model (tensorrtllm_backend
``all_models/inflight_batcher_llm/preprocessing``).  Several prompts in one request (``QUERY`` [N, 1]) give
``INPUT_ID`` [N, L] (right-padded with the pad id), ``REQUEST_INPUT_LEN`` [N, 1] and per-row ids/lists, as
NVIDIA's preprocessing pads a batch.
Tokenization is ``pipeline/core/tokenization.py``'s ``TextCodec`` (copied next to this file): ``text_input`` is
already-rendered prompt text, encoded without adding special tokens; BOS is prepended only when the tokenizer
itself adds it and the text lacks it (never from ``config.json``).  ``END_ID``/``PAD_ID``
default to the tokenizer's eos/pad ids (``end_id``/``pad_id`` parameters, written from ``model_info.json``).

Errors (one per request, the server keeps serving): empty ``QUERY`` (naming the prompt), non-UTF-8 text,
per-row inputs whose row count differs from the number of prompts.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

# model_common.py and tokenization.py: copied next to this file by the package stage, imported from this folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import model_common  # noqa: E402
from model_common import pb_utils  # noqa: E402


def words_to_list(codec: Any, words: list[str]) -> np.ndarray:
    """TensorRT-LLM ``[2, L]`` words list: row 0 = concatenated ids, row 1 = end offsets padded with -1."""
    ids: list[int] = []
    offsets: list[int] = []
    for w in words:
        if not w:
            continue
        enc = codec.encode_text(w)  # a stop/bad word is data: special-token strings stay text
        if not enc:
            continue
        ids.extend(enc)
        offsets.append(len(ids))
    if not ids:
        return np.array([[0], [-1]], dtype=np.int32)
    pad = len(ids) - len(offsets)
    return np.array([ids, offsets + [-1] * pad], dtype=np.int32)


def stack_words(lists: list[np.ndarray]) -> np.ndarray:
    """[N, 2, L] from N ``[2, L_i]`` words lists (ids padded with 0, offsets with -1), as TensorRT-LLM pads a batch."""
    width = max(a.shape[1] for a in lists)
    out = np.zeros((len(lists), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for b, a in enumerate(lists):
        out[b, :, : a.shape[1]] = a
    return out


def _strings(arr: np.ndarray | None) -> list[str]:
    if arr is None:
        return []
    out = []
    for x in np.asarray(arr).reshape(-1).tolist():
        out.append(x.decode("utf-8") if isinstance(x, bytes) else str(x))
    return out


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        _, params = model_common.model_config(args)
        from tokenization import TextCodec  # pipeline/core/tokenization.py, copied next to this file by the package stage

        self.codec = TextCodec.from_dir(model_common.folder_param(args, params, "tokenizer_dir", "tokenizer"))
        self.end_id = int(params.get("end_id") or -1)
        self.pad_id = int(params.get("pad_id") or self.end_id)

    def _ids(self, text: str) -> list[int]:
        """Already-rendered prompt text -> ids; BOS only where the tokenizer adds it (``TextCodec.adds_bos``)."""
        c = self.codec
        ids = c.encode_rendered(text)
        if c.adds_bos and c.bos_id is not None and (not ids or ids[0] != c.bos_id):
            ids = [c.bos_id] + ids
        return ids

    def _one(self, request: Any) -> Any:
        """One request of N prompts (``QUERY`` [N, 1]) -> ids padded to [N, L]; per-row inputs may be [N, 1] or [1, 1]."""
        get = lambda n: (lambda t: None if t is None else t.as_numpy())(pb_utils.get_input_tensor_by_name(request, n))  # noqa: E731
        q = get("QUERY")
        queries = [] if q is None else [_strings(row) for row in np.asarray(q).reshape(np.asarray(q).shape[0], -1)]
        if not queries:
            raise ValueError("text_input is empty; send a non-empty prompt")
        n = len(queries)
        for b, row in enumerate(queries):
            if len(row) != 1 or not row[0]:
                where = f" (prompt {b})" if n > 1 else ""
                raise ValueError(
                    f"text_input is empty{where}; send a non-empty prompt"
                    if not row or not row[0]
                    else f"text_input{where} has {len(row)} strings; send one prompt per row ([N, 1])"
                )
        if _strings(get("EMBEDDING_BIAS_WORDS")) and any(_strings(get("EMBEDDING_BIAS_WORDS"))):
            raise ValueError("embedding_bias_words is not supported by this deployment; remove it")

        def rows(name: str, default: int) -> list[int]:
            a = get(name)
            if a is None or a.size == 0:
                return [default] * n
            a = np.asarray(a).reshape(a.shape[0], -1)
            if a.shape[0] not in (1, n):
                raise ValueError(f"{name.lower()} has {a.shape[0]} rows but text_input has {n} prompts")
            return [int(a[b if a.shape[0] == n else 0][0]) for b in range(n)]

        def words(name: str) -> list[list[str]]:
            a = get(name)
            if a is None or a.size == 0:
                return [[] for _ in range(n)]
            a = np.asarray(a).reshape(a.shape[0], -1)
            if a.shape[0] not in (1, n):
                raise ValueError(f"{name.lower()} has {a.shape[0]} rows but text_input has {n} prompts")
            return [_strings(a[b if a.shape[0] == n else 0]) for b in range(n)]

        ids = [self._ids(row[0]) for row in queries]
        out_len = rows("REQUEST_OUTPUT_LEN", 0)
        end_ids = rows("END_ID", self.end_id)
        pad_ids = rows("PAD_ID", self.pad_id)
        width = max(len(x) for x in ids)
        input_ids = np.asarray([x + [pad_ids[b]] * (width - len(x)) for b, x in enumerate(ids)], dtype=np.int32)
        extra = get("PROMPT_TABLE_EXTRA_ID")
        tensors = [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.asarray([[len(x)] for x in ids], dtype=np.int32)),
            pb_utils.Tensor("DECODER_INPUT_ID", np.zeros((n, 0), dtype=np.int32)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.zeros((n, 1), dtype=np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.asarray([[v] for v in out_len], dtype=np.int32)),
            pb_utils.Tensor("BAD_WORDS_IDS", stack_words([words_to_list(self.codec, w) for w in words("BAD_WORDS_DICT")])),
            pb_utils.Tensor("STOP_WORDS_IDS", stack_words([words_to_list(self.codec, w) for w in words("STOP_WORDS_DICT")])),
            pb_utils.Tensor("EMBEDDING_BIAS", np.zeros((n, 0), dtype=np.float32)),
            pb_utils.Tensor("OUT_END_ID", np.asarray([[v] for v in end_ids], dtype=np.int32)),
            pb_utils.Tensor("OUT_PAD_ID", np.asarray([[v] for v in pad_ids], dtype=np.int32)),
            pb_utils.Tensor(
                "OUT_PROMPT_TABLE_EXTRA_IDS",
                np.zeros((n, width), dtype=np.uint64) if extra is None else np.full((n, width), int(extra.reshape(-1)[0]), np.uint64),
            ),
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests: list[Any]) -> list[Any]:
        return model_common.answer_each(requests, self._one, "preprocessing")
