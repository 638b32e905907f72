"""Triton Python-backend model ``postprocessing``: token ids -> text (TensorRT-LLM ensemble step 3).

Copied by the package stage to ``<repository>/postprocessing/1/model.py``; runs in Triton's Python stub
(``tokenizers``, numpy < 2); must not import the ``pipeline`` package.

Interface and behaviour of TensorRT-LLM's ``postprocessing`` model (tensorrtllm_backend
``all_models/inflight_batcher_llm/postprocessing/1/model.py``): ``TOKENS_BATCH`` INT32 [B, beams, len] and
``SEQUENCE_LENGTH`` INT32 [B, beams] -> ``OUTPUT`` BYTES **flat** [B * beams], each entry the decode of the ids it
received, so for one prompt a client reads ``text_output[0]`` as bytes.

On the CPU target the ensemble does not route through this model (the engine model detokenizes incrementally
in-process and its ``text_output`` goes straight to the client); it stays in the repository for clients and BLS
models that call ``postprocessing`` by name, as NVIDIA's repository has it.  The TensorRT-LLM target's ensemble uses it
as step 3.
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


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        _, params = model_common.model_config(args)
        from tokenization import TextCodec  # pipeline/core/tokenization.py, copied next to this file by the package stage

        self.codec = TextCodec.from_dir(model_common.folder_param(args, params, "tokenizer_dir", "tokenizer"))
        self.skip_special = params.get("skip_special_tokens", "true").lower() == "true"

    def _one(self, request: Any) -> Any:
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1]) if tokens.ndim != 3 else tokens
        lengths = lengths.reshape(tokens.shape[0], -1)
        outs = []
        for b in range(tokens.shape[0]):
            for beam in range(tokens.shape[1]):
                n = int(lengths[b][beam])
                outs.append(self.codec.decode(tokens[b][beam][:n].tolist(), skip_special_tokens=self.skip_special).encode("utf-8"))
        # flat [batch * beams], as TensorRT-LLM's postprocessing returns it: a client reads text_output[0] as bytes
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", np.array(outs, dtype=np.object_))])

    def execute(self, requests: list[Any]) -> list[Any]:
        return model_common.answer_each(requests, self._one, "postprocessing")
