"""Triton Python-backend model ``ensemble`` / ``tensorrt_llm_bls`` of the LLM-API (TensorRT-LLM PyTorch backend) package.

Copied by the package stage to ``<repository>/{ensemble,tensorrt_llm_bls}/1/model.py``; runs in Triton's Python stub
(numpy only); must not import the ``pipeline`` package. The tensor mapping is ``tensor_map.json`` next to this file,
written from ``pipeline/package/llmapi_adapter.py`` (``INPUT_MAP`` / ``OUTPUT_MAP``, kinds explained there).

Per request (this file's own implementation):

1. every input present must have a table entry, and its value must be one the LLM-API model honours; otherwise the
   request is refused naming the input, the value and the fix (nothing is dropped);
2. each prompt row of ``text_input`` (``[N, 1]``) becomes one BLS request to the LLM-API model (``text_input`` ``[1]``,
   ``streaming``, ``sampling_param_*``), ``exec(decoupled=True)`` when this model is decoupled (the LLM-API model has
   the same ``decoupled``: both are ``package.decoupled``);
3. each LLM-API response becomes one response: ``text_output`` BYTES ``[1]``; streamed, the new text only (the LLM-API
   model streams the text so far), the matched stop string appended (ensemble semantics keep it), the prompt prepended
   when ``exclude_input_in_output=false``; ``batch_index`` / ``sequence_index`` ``[1, 1]``; ``cum_log_probs`` and the
   perf outputs when asked for.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

# model_common.py: copied next to this file by the package stage, imported from this folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import model_common  # noqa: E402
from model_common import pb_utils  # noqa: E402

NP = {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_UINT64": np.uint64, "TYPE_FP32": np.float32, "TYPE_BOOL": np.bool_}


class AdapterError(ValueError):
    """A request this model refuses (message names the input, the value and the fix)."""


def _strings(a: np.ndarray) -> list[str]:
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in np.asarray(a).reshape(-1) if x not in (b"", "")]


def _row(a: np.ndarray, b: int, n: int, name: str) -> np.ndarray:
    """Row ``b`` of a per-prompt input (a single row applies to every prompt)."""
    a = np.asarray(a)
    a2 = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
    if a2.shape[0] not in (1, n):
        raise AdapterError(f"input {name!r} has {a2.shape[0]} rows but text_input has {n} prompts. Fix: one row, or one per prompt.")
    return a2[b if a2.shape[0] == n else 0]


def check_inputs(present: dict[str, np.ndarray], table: dict[str, Any]) -> None:
    """Refuse (AdapterError) every input present that the LLM-API model cannot honour (see the module docstring)."""
    inputs = table["inputs"]
    for name, a in present.items():
        ent = inputs.get(name)
        if ent is None:
            raise AdapterError(
                f"input {name!r} has no mapping onto the LLM-API model (pipeline/package/llmapi_adapter.py INPUT_MAP). Fix: leave it out."
            )
        kind = ent["kind"]
        if kind == "refused":
            if a.dtype == np.object_ and not _strings(a):
                continue  # an empty word list / string: nothing asked for
            if a.size:
                raise AdapterError(
                    f"input {name!r} is not supported by this TensorRT-LLM PyTorch-backend package: {ent['why']}. Fix: leave it out."
                )
        elif kind == "neutral":
            bad = [round(v, 6) if isinstance(v, float) else v for v in np.asarray(a).reshape(-1).tolist() if v not in ent["values"]]
            if bad:
                raise AdapterError(
                    f"{name}={bad[0]!r} cannot be honoured by this TensorRT-LLM PyTorch-backend package: {ent['why']}. "
                    f"Fix: send {name}={ent['values'][0]!r} or leave it out."
                )
        elif kind == "fixed":
            want = int(table[ent["param"]])
            bad = [int(v) for v in np.asarray(a).reshape(-1).tolist() if int(v) != want]
            if bad:
                raise AdapterError(
                    f"{name}={bad[0]}: the LLM-API model takes no {name} input and uses the checkpoint's own ({name} "
                    f"{want}). Fix: send {name}={want} or leave it out."
                )
    if present.get("random_seed") is not None and present.get("seed") is not None:
        raise AdapterError("inputs 'random_seed' and 'seed' were both given; they set the same sampling_param_seed. Fix: send only one.")


def llmapi_inputs(
    present: dict[str, np.ndarray], table: dict[str, Any], llm_types: dict[str, str], b: int, n: int
) -> dict[str, np.ndarray]:
    """The LLM-API model's inputs for prompt row ``b`` of ``n`` (name -> array of its data type, shape ``[1]`` or ``[k]``)."""
    out: dict[str, np.ndarray] = {}
    for name, a in present.items():
        ent = table["inputs"][name]
        if ent["kind"] == "forward":
            v = _row(a, b, n, name).reshape(-1)
            if name == "text_input":
                out["text_input"] = np.asarray([v[0] if isinstance(v[0], bytes) else str(v[0]).encode("utf-8")], dtype=np.object_)
            else:
                out[ent["to"]] = np.asarray([v[0]], dtype=NP[llm_types[ent["to"]]])
        elif ent["kind"] == "stop":
            words = _strings(_row(a, b, n, name))
            if words:
                out[ent["to"]] = np.asarray([w.encode("utf-8") for w in words], dtype=np.object_)
                out["return_stop_reason"] = np.asarray([True])
    return out


def _first(t: Any) -> Any:
    v = np.asarray(t.as_numpy()).reshape(-1)
    return v[0] if v.size else None


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.model_config, params = model_common.model_config(args)
        with open(os.path.join(_HERE, "tensor_map.json"), encoding="utf-8") as f:
            self.table = json.load(f)
        self.llm = params.get("llmapi_model_name") or self.table["llmapi_model"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.inputs = [i["name"] for i in self.model_config.get("input", [])]
        self.out_types = {o["name"]: o["data_type"] for o in self.model_config.get("output", [])}
        self.llm_types = self.table["llmapi_inputs"]  # the LLM-API model's input data types, as packaged

    def _present(self, request: Any) -> dict[str, np.ndarray]:
        out = {}
        for name in self.inputs:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None:
                out[name] = t.as_numpy()
        return out

    def _flag(self, present: dict[str, np.ndarray], name: str, default: bool) -> bool:
        a = present.get(name)
        return default if a is None or not np.asarray(a).size else bool(np.any(a))

    def _run(self, request: Any, send: Any) -> None:
        present = self._present(request)
        check_inputs(present, self.table)
        prompts = np.asarray(present["text_input"])
        n = prompts.shape[0] if prompts.ndim > 1 else 1
        stream = self._flag(present, "stream", False)
        if stream and not self.decoupled:
            raise AdapterError("stream=true needs a decoupled deployment (package.decoupled=true). Fix: send stream=false, or repackage.")
        if n > 1 and not self.decoupled:
            raise AdapterError(
                f"{n} prompts in one request need a decoupled deployment (one response per prompt). Fix: one prompt per request."
            )
        keep_prompt = not self._flag(present, "exclude_input_in_output", True)
        wanted = set(request.requested_output_names()) or set(self.out_types)
        for b in range(n):
            ins = llmapi_inputs(present, self.table, self.llm_types, b, n)
            asked = ["text_output"] + (["stop_reason"] if "return_stop_reason" in ins else [])
            extra = {}
            for out, ent in self.table["outputs"].items():
                if ent["from"] and ent.get("when") and out in wanted and self._flag(present, ent["when"], False):
                    extra[out] = ent["from"]
            asked += sorted(set(extra.values()))
            req = pb_utils.InferenceRequest(
                model_name=self.llm, requested_output_names=asked, inputs=[pb_utils.Tensor(k, v) for k, v in ins.items()]
            )
            stops = set(_strings(_row(present["stop_words"], b, n, "stop_words"))) if "stop_words" in present else set()
            prompt = _row(prompts, b, n, "text_input").reshape(-1)[0]
            prompt_text = prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt)
            sent, first = "", True
            for r in req.exec(decoupled=True) if self.decoupled else [req.exec()]:
                if r.has_error():
                    raise AdapterError(f"{self.llm}: {r.error().message()}")
                t = pb_utils.get_output_tensor_by_name(r, "text_output")
                if t is None:  # the empty final-flag response
                    continue
                v = _first(t)
                text = v.decode("utf-8") if isinstance(v, bytes) else str(v or "")
                if stream:
                    if not text.startswith(sent):
                        raise AdapterError(
                            f"{self.llm} revised text it had streamed ({sent!r} -> {text!r}); the ensemble stream cannot take it back."
                        )
                    new, sent = text[len(sent) :], text
                else:
                    new = text
                sr = pb_utils.get_output_tensor_by_name(r, "stop_reason")
                if sr is not None:
                    s = _first(sr)
                    s = s.decode("utf-8") if isinstance(s, bytes) else str(s)
                    if s in stops:
                        new += s  # the ensemble keeps the stop word (TensorRT-LLM backend semantics)
                if keep_prompt and first:
                    new = prompt_text + new
                first = False
                outs = [
                    pb_utils.Tensor("text_output", np.asarray([new.encode("utf-8")], dtype=np.object_)),
                    pb_utils.Tensor("batch_index", np.asarray([[b]], dtype=np.int32)),
                    pb_utils.Tensor("sequence_index", np.asarray([[0]], dtype=np.int32)),
                ]
                for out, src in extra.items():
                    ot = pb_utils.get_output_tensor_by_name(r, src)
                    if ot is not None:
                        x = _first(ot)
                        x = x.decode("utf-8") if isinstance(x, bytes) else x
                        dt = NP[self.out_types[out]]
                        outs.append(pb_utils.Tensor(out, np.asarray([[float(x) if dt == np.float32 else int(float(x))]], dtype=dt)))
                send(pb_utils.InferenceResponse(output_tensors=[o for o in outs if o.name() in wanted or o.name() == "text_output"]))

    def execute(self, requests: list[Any]) -> list[Any] | None:
        return model_common.execute_sending(requests, self._run, self.model_config["name"], self.decoupled)
