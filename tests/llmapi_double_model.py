"""TEST DOUBLE for NVIDIA's LLM-API ``tensorrt_llm`` Triton model (TensorRT-LLM PyTorch backend), used by
``tests/package/test_llmapi_adapter.py``. It is NOT TensorRT-LLM and runs no model: it is a Triton Python model with the
upstream llmapi tensor interface (the package's own ``tensorrt_llm/config.pbtxt`` is kept) whose answer reports what it
received, so a test can check what the adapter sent.

Behaviour (written for the test, mirroring what the upstream ``model.py`` does with the same inputs):

* ``text_input`` must be 1-D (upstream refuses anything else); the generated text is the JSON
  ``{"prompt": <text_input>, "params": {<every sampling_param_* input received, upstream name: value>}}`` (sorted keys);
* ``sampling_param_stop`` (strings): the text is cut before the first stop string found in it, and ``stop_reason`` is
  that string (the LLM API drops the stop string from its text); ``return_stop_reason`` adds ``stop_reason`` to every
  response (``"None"`` when nothing matched), as upstream does;
* ``streaming=true`` (decoupled only): the *cumulative* text in steps of 7 characters, one response each (upstream
  sends ``CompletionOutput.text``, the text so far); otherwise one response with the whole text;
* ``return_cumulative_logprob``: ``cumulative_logprob`` = -1.5 (a fixed test value);
* ``sampling_param_return_perf_metrics``: the timing outputs 1000, 2000, 3000, 4000 (fixed test values, INT64).
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

STEP = 7


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.inputs = [i["name"] for i in self.model_config["input"]]

    def _answer(self, request):
        got = {n: pb_utils.get_input_tensor_by_name(request, n) for n in self.inputs}
        got = {n: t.as_numpy() for n, t in got.items() if t is not None}
        text_input = got["text_input"]
        if text_input.ndim != 1:
            raise ValueError(f"text_input must be 1-D (got shape {list(text_input.shape)})")
        prompt = text_input[0].decode("utf-8")
        params = {}
        for n, a in got.items():
            if n.startswith("sampling_param_") and n != "sampling_param_stop":
                v = a.reshape(-1)[0].item()
                params[n] = round(v, 6) if isinstance(v, float) else v
        text = json.dumps({"prompt": prompt, "params": params}, sort_keys=True, ensure_ascii=False)
        stop_reason = None
        stops = [s.decode("utf-8") for s in got.get("sampling_param_stop", np.zeros(0, dtype=object)).reshape(-1)]
        hits = [(text.find(s), s) for s in stops if s and text.find(s) >= 0]
        if hits:
            at, stop_reason = min(hits)
            text = text[:at]
        streaming = bool(got.get("streaming", np.array([False])).reshape(-1)[0])
        if streaming and not self.decoupled:
            raise ValueError("Streaming is only supported in decoupled mode.")
        cuts = list(range(STEP, len(text), STEP)) + [len(text)] if streaming else [len(text)]

        def flag(n):
            return bool(got[n].reshape(-1)[0]) if n in got else False

        out = []
        for i, c in enumerate(cuts):
            last = i == len(cuts) - 1
            t = [pb_utils.Tensor("text_output", np.asarray([text[:c].encode("utf-8")], dtype=np.object_))]
            if flag("return_stop_reason"):
                t.append(pb_utils.Tensor("stop_reason", np.asarray([str(stop_reason if last else None)], dtype=np.object_)))
            if flag("return_cumulative_logprob"):
                t.append(pb_utils.Tensor("cumulative_logprob", np.asarray([-1.5], dtype=np.float32)))
            if flag("sampling_param_return_perf_metrics"):
                for k, v in (
                    ("arrival_time_ns", 1000),
                    ("first_scheduled_time_ns", 2000),
                    ("first_token_time_ns", 3000),
                    ("last_token_time_ns", 4000),
                ):
                    t.append(pb_utils.Tensor(k, np.asarray([v], dtype=np.int64)))
            out.append(pb_utils.InferenceResponse(output_tensors=t))
        return out

    def execute(self, requests):
        if not self.decoupled:
            res = []
            for r in requests:
                try:
                    res.append(self._answer(r)[-1])
                except Exception as e:
                    res.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))))
            return res
        for r in requests:
            sender = r.get_response_sender()
            try:
                answers = self._answer(r)
            except Exception as e:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
                continue
            for i, a in enumerate(answers):
                sender.send(a, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == len(answers) - 1 else 0)
        return None
