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

import json
import os
import sys
from typing import Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover
    pb_utils = None


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        tok_dir = params["tokenizer_dir"]
        if not os.path.isabs(tok_dir):
            tok_dir = os.path.join(args["model_repository"], args["model_version"], tok_dir)
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.insert(0, here)
        from tokenization import TextCodec  # pipeline/core/tokenization.py, copied next to this file by the package stage

        self.codec = TextCodec.from_dir(tok_dir)
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
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"postprocessing: {e}")))
        return responses
