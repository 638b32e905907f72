"""Triton Python-backend model ``tensorrt_llm_bls`` of the TensorRT-LLM package: text in, text out, by BLS calls.

Copied by the package stage to ``<repository>/tensorrt_llm_bls/1/model.py``; runs in Triton's Python stub (numpy only);
must not import the ``pipeline`` package.

Interface: the inputs, outputs and parameters of TensorRT-LLM's ``tensorrt_llm_bls`` model (TensorRT-LLM 1.2.1
``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/config.pbtxt``; the list is
``pipeline/package/trtllm_backend_table.py``), plus the ensemble's client names ``min_length``/``random_seed`` (aliases
of ``min_tokens``/``seed``, so one client drives ``ensemble`` and ``tensorrt_llm_bls`` alike).

Behaviour (this file's own implementation; it does what the package's ensemble does, step for step, inside one
``execute``):

1. ``preprocessing``: the ensemble's step-1 ``input_map`` (:data:`PRE_INPUTS`), all of its outputs requested;
2. the engine model (parameter ``tensorrt_llm_model_name``): the ensemble's step-2 ``input_map`` (:data:`ENGINE_FROM_PRE`,
   :data:`ENGINE_FROM_CLIENT`); ``InferenceRequest(...).exec(decoupled=True)`` when this model is decoupled (the
   engine model has the same ``decoupled``; ``validate.py`` checks), one response per engine response;
3. ``postprocessing``: ``TOKENS_BATCH``/``SEQUENCE_LENGTH`` <- ``output_ids``/``sequence_length`` of each engine
   response; its ``OUTPUT`` (BYTES, flat ``[batch * beams]``) is ``text_output``, with the engine's per-sequence
   outputs (``cum_log_probs`` ...) passed through unchanged, so shapes are the backend's.

``accumulate_tokens`` (parameter, default ``false``): when ``true`` and streaming, each response's ``text_output`` is
the decode of all ids generated so far for that (``batch_index``, ``sequence_index``), not of the new ids only.

Draft-model speculative decoding (``num_draft_tokens`` = k > 0, a package whose ``tensorrt_llm_draft_model_name`` is
set): per round, the draft model proposes k ids greedily from the ids so far, the engine model verifies them
(``draft_input_ids``) and returns the accepted ids plus one of its own (k + 1 at most), until ``max_tokens``, an end/stop
token (the engine returned fewer ids than asked) or an empty round. Batch 1 and beam width 1 only; each round's new
ids are one streamed response. Refused by name: ``num_draft_tokens`` > 0 without a draft model in the package, with
more than one prompt or beam, and ``use_draft_logits`` (draft logits are not passed). Requests without draft tokens
are served by the engine model alone.
"""

from __future__ import annotations

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

PRE_INPUTS = {
    "QUERY": "text_input",
    "DECODER_QUERY": "decoder_text_input",
    "REQUEST_OUTPUT_LEN": "max_tokens",
    "BAD_WORDS_DICT": "bad_words",
    "STOP_WORDS_DICT": "stop_words",
    "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
    "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
    "END_ID": "end_id",
    "PAD_ID": "pad_id",
    "PROMPT_TABLE_EXTRA_ID": "prompt_table_extra_id",
}
"""preprocessing input <- client input (the ensemble's step 1)."""
ENGINE_FROM_PRE = {
    "input_ids": "INPUT_ID",
    "decoder_input_ids": "DECODER_INPUT_ID",
    "input_lengths": "REQUEST_INPUT_LEN",
    "decoder_input_lengths": "REQUEST_DECODER_INPUT_LEN",
    "request_output_len": "REQUEST_OUTPUT_LEN",
    "end_id": "OUT_END_ID",
    "pad_id": "OUT_PAD_ID",
    "embedding_bias": "EMBEDDING_BIAS",
    "stop_words_list": "STOP_WORDS_IDS",
    "bad_words_list": "BAD_WORDS_IDS",
    "prompt_table_extra_ids": "OUT_PROMPT_TABLE_EXTRA_IDS",
}
"""engine input <- preprocessing output (the ensemble's step 2)."""
ENGINE_FROM_CLIENT = {
    "runtime_top_k": ("top_k",),
    "runtime_top_p": ("top_p",),
    "len_penalty": ("length_penalty",),
    "streaming": ("stream",),
    "exclude_input_in_output": ("exclude_input_in_output",),
    "temperature": ("temperature",),
    "repetition_penalty": ("repetition_penalty",),
    "min_tokens": ("min_tokens", "min_length"),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "seed": ("seed", "random_seed"),
    "return_log_probs": ("return_log_probs",),
    "return_context_logits": ("return_context_logits",),
    "return_generation_logits": ("return_generation_logits",),
    "return_perf_metrics": ("return_perf_metrics",),
    "return_num_input_tokens": ("return_num_input_tokens",),
    "return_num_output_tokens": ("return_num_output_tokens",),
    "num_return_sequences": ("num_return_sequences",),
    "beam_width": ("beam_width",),
    "prompt_embedding_table": ("prompt_embedding_table",),
    "prompt_vocab_size": ("prompt_vocab_size",),
    "lora_task_id": ("lora_task_id",),
    "lora_weights": ("lora_weights",),
    "lora_config": ("lora_config",),
    "guided_decoding_guide_type": ("guided_decoding_guide_type",),
    "guided_decoding_guide": ("guided_decoding_guide",),
}
"""engine input <- client input names (the first present wins; two present is refused: they mean the same)."""
PASS_OUTPUTS = (
    "cum_log_probs",
    "output_log_probs",
    "context_logits",
    "generation_logits",
    "batch_index",
    "sequence_index",
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "num_input_tokens",
    "num_output_tokens",
)
"""engine outputs returned unchanged (requested from the engine only when the client requested them)."""


class BlsError(ValueError):
    """A request this model refuses (message names the input and the fix)."""


def engine_inputs_from_client(present: dict[str, Any]) -> dict[str, Any]:
    """Engine input name -> client tensor for the client inputs in ``present`` (name -> tensor).

    Raises:
        BlsError: two client names for one engine input (``min_tokens`` and ``min_length``, ``seed`` and ``random_seed``).
    """
    out = {}
    for eng, names in ENGINE_FROM_CLIENT.items():
        given = [n for n in names if present.get(n) is not None]
        if len(given) > 1:
            raise BlsError(
                f"inputs {given[0]!r} and {given[1]!r} were both given; they set the same engine input {eng!r}. Fix: send only one of them."
            )
        if given:
            out[eng] = present[given[0]]
    return out


def draft_tokens(present: dict[str, np.ndarray | None], draft_model: str) -> int:
    """k of a speculative request (0: plain decoding). Raises BlsError for ``use_draft_logits`` and for k > 0 without a
    draft model (``draft_model`` empty)."""
    n = present.get("num_draft_tokens")
    k = int(np.max(n)) if n is not None and np.asarray(n).size else 0
    if k > 0 and not draft_model:
        raise BlsError(
            f"num_draft_tokens={k}: this package has no draft model (tensorrt_llm_draft_model_name is empty; "
            f"build with build.speculative.mode=draft_tokens_external). Fix: send num_draft_tokens=0 or leave it out."
        )
    u = present.get("use_draft_logits")
    if u is not None and np.asarray(u).size and bool(np.any(u)):
        raise BlsError(
            "use_draft_logits=true: this tensorrt_llm_bls does not pass draft logits to the engine (the draft "
            "ids are verified against the engine's own tokens). Fix: leave use_draft_logits out (or false)."
        )
    return max(k, 0)


class Accumulator:
    """Ids generated so far per (batch_index, sequence_index), for ``accumulate_tokens=true`` (beam width 1)."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, int], np.ndarray] = {}

    def add(self, key: tuple[int, int], output_ids: np.ndarray, seq_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append one response's ids (``output_ids`` [1, 1, n], ``sequence_length`` [1, 1]); returns all ids so far in the
        same layout. Raises BlsError for beam width > 1 (beams are re-ranked, not appended)."""
        if output_ids.ndim != 3 or output_ids.shape[0] != 1 or output_ids.shape[1] != 1:
            raise BlsError(
                f"accumulate_tokens=true needs one sequence per response (output_ids [1, 1, n]); got shape "
                f"{list(output_ids.shape)}. Fix: beam_width=1, or set the tensorrt_llm_bls parameter accumulate_tokens=false."
            )
        new = output_ids[0, 0, : int(np.asarray(seq_len).reshape(-1)[0])]
        acc = np.concatenate([self.ids.get(key, np.zeros(0, dtype=new.dtype)), new])
        self.ids[key] = acc
        return acc.reshape(1, 1, -1).astype(np.int32), np.asarray([[acc.size]], dtype=np.int32)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.model_config, params = model_common.model_config(args)
        self.engine = params.get("tensorrt_llm_model_name") or "tensorrt_llm"
        self.draft = params.get("tensorrt_llm_draft_model_name") or ""
        self.accumulate = params.get("accumulate_tokens", "false").strip().lower() in ("true", "1", "yes")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.inputs = [i["name"] for i in self.model_config.get("input", [])]
        self.pre_outputs = sorted(set(ENGINE_FROM_PRE.values()))

    # ------------------------------------------------------------------ one request
    def _present(self, request: Any) -> dict[str, Any]:
        out = {}
        for name in self.inputs:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None:
                out[name] = t
        return out

    @staticmethod
    def _check(resp: Any, step: str) -> Any:
        if resp.has_error():
            raise BlsError(f"{step}: {resp.error().message()}")
        return resp

    def _run(self, request: Any, send: Any) -> None:
        present = self._present(request)
        k_draft = draft_tokens({k: present[k].as_numpy() for k in ("num_draft_tokens", "use_draft_logits") if k in present}, self.draft)
        stream = "stream" in present and bool(np.any(present["stream"].as_numpy()))
        if stream and not self.decoupled:
            raise BlsError(
                "stream=true needs tensorrt_llm_bls deployed in decoupled mode (package.decoupled=true). "
                "Fix: send stream=false, or repackage with package.decoupled=true."
            )
        # 1. preprocessing
        pre_in = [pb_utils.Tensor(k, present[v].as_numpy()) for k, v in PRE_INPUTS.items() if v in present]
        pre = self._check(
            pb_utils.InferenceRequest(model_name="preprocessing", requested_output_names=self.pre_outputs, inputs=pre_in).exec(),
            "preprocessing",
        )
        eng_in = []
        for eng, out in ENGINE_FROM_PRE.items():
            t = pb_utils.get_output_tensor_by_name(pre, out)
            if t is not None:
                eng_in.append(pb_utils.Tensor(eng, t.as_numpy()))
        eng_in += [pb_utils.Tensor(k, t.as_numpy()) for k, t in engine_inputs_from_client(present).items()]
        if k_draft > 0:
            return self._speculative(request, present, pre, eng_in, k_draft, stream, send)
        # 2. the engine; requested outputs: ids + the per-sequence outputs the client asked for
        wanted = set(request.requested_output_names())
        passed = [o for o in PASS_OUTPUTS if o in wanted]
        acc = Accumulator() if (self.accumulate and stream) else None
        keys = [o for o in ("batch_index", "sequence_index") if acc is not None and o not in passed]  # to tell streams apart
        ereq = pb_utils.InferenceRequest(
            model_name=self.engine, requested_output_names=["output_ids", "sequence_length", *passed, *keys], inputs=eng_in
        )
        responses = ereq.exec(decoupled=True) if self.decoupled else [ereq.exec()]
        for r in responses:
            self._check(r, self.engine)
            ids = pb_utils.get_output_tensor_by_name(r, "output_ids")
            if ids is None:  # the engine's empty final-flag response
                continue
            ids = ids.as_numpy()
            lens = pb_utils.get_output_tensor_by_name(r, "sequence_length").as_numpy()
            extra = {o: pb_utils.get_output_tensor_by_name(r, o) for o in passed}
            if acc is not None:
                tags = [pb_utils.get_output_tensor_by_name(r, k) for k in ("batch_index", "sequence_index")]
                batch_i, seq_i = (int(x.as_numpy().reshape(-1)[0]) if x is not None else 0 for x in tags)
                ids, lens = acc.add((batch_i, seq_i), ids, lens)
            # 3. postprocessing
            post = self._check(
                pb_utils.InferenceRequest(
                    model_name="postprocessing",
                    requested_output_names=["OUTPUT"],
                    inputs=[pb_utils.Tensor("TOKENS_BATCH", ids), pb_utils.Tensor("SEQUENCE_LENGTH", lens)],
                ).exec(),
                "postprocessing",
            )
            outs = [pb_utils.Tensor("text_output", pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy())]
            outs += [pb_utils.Tensor(o, t.as_numpy()) for o, t in extra.items() if t is not None]
            send(pb_utils.InferenceResponse(output_tensors=outs))

    # ------------------------------------------------------------------ draft-model speculative decoding
    def _ids_call(self, model: str, inputs: list[Any]) -> np.ndarray:
        """One non-streamed call of an id model; returns its generated ids (1-D)."""
        req = pb_utils.InferenceRequest(model_name=model, requested_output_names=["output_ids", "sequence_length"], inputs=inputs)
        got = np.zeros(0, dtype=np.int32)
        for r in req.exec(decoupled=True) if self.decoupled else [req.exec()]:
            self._check(r, model)
            ids = pb_utils.get_output_tensor_by_name(r, "output_ids")
            if ids is not None:
                n = int(pb_utils.get_output_tensor_by_name(r, "sequence_length").as_numpy().reshape(-1)[0])
                got = np.concatenate([got, ids.as_numpy().reshape(-1)[:n].astype(np.int32)])
        return got

    def _speculative(self, request: Any, present: dict[str, Any], pre: Any, eng_in: list[Any], k: int, stream: bool, send: Any) -> None:
        def out(name: str) -> np.ndarray:
            return pb_utils.get_output_tensor_by_name(pre, name).as_numpy()

        ids_in, lens = out("INPUT_ID"), out("REQUEST_INPUT_LEN").reshape(-1)
        if ids_in.shape[0] != 1:
            raise BlsError(
                f"num_draft_tokens={k} with {ids_in.shape[0]} prompts in one request: speculative decoding here "
                f"serves one prompt per request. Fix: send the prompts as separate requests."
            )
        for name in (
            "return_log_probs",
            "return_context_logits",
            "return_generation_logits",
            "return_perf_metrics",
            "return_num_input_tokens",
            "return_num_output_tokens",
        ):
            if name in present and bool(np.any(present[name].as_numpy())):
                raise BlsError(
                    f"{name}=true with num_draft_tokens={k}: the speculative rounds return text_output only. "
                    f"Fix: leave {name} out, or num_draft_tokens=0."
                )
        for name in ("beam_width", "num_return_sequences"):
            if name in present and int(np.max(present[name].as_numpy())) > 1:
                raise BlsError(
                    f"num_draft_tokens={k} with {name}>1: speculative decoding here serves one sequence. "
                    f"Fix: {name}=1, or num_draft_tokens=0."
                )
        prompt = ids_in[0, : int(lens[0])].astype(np.int32)
        max_new = int(out("REQUEST_OUTPUT_LEN").reshape(-1)[0])
        same = {"end_id": out("OUT_END_ID"), "pad_id": out("OUT_PAD_ID")}
        # the client's engine inputs, except those this loop sets itself
        own = {"input_ids", "input_lengths", "request_output_len", "streaming", "exclude_input_in_output", "draft_input_ids"}
        kept = [t for t in eng_in if t.name() not in own]
        exclude = "exclude_input_in_output" not in present or bool(np.any(present["exclude_input_in_output"].as_numpy()))

        def ids_inputs(seq: np.ndarray, n: int) -> list[Any]:
            return [
                pb_utils.Tensor("input_ids", seq.reshape(1, -1)),
                pb_utils.Tensor("input_lengths", np.array([[seq.size]], np.int32)),
                pb_utils.Tensor("request_output_len", np.array([[n]], np.int32)),
                pb_utils.Tensor("exclude_input_in_output", np.array([[True]])),
                pb_utils.Tensor("streaming", np.array([[False]])),
            ]

        def emit(ids: np.ndarray) -> None:
            post = self._check(
                pb_utils.InferenceRequest(
                    model_name="postprocessing",
                    requested_output_names=["OUTPUT"],
                    inputs=[
                        pb_utils.Tensor("TOKENS_BATCH", ids.reshape(1, 1, -1).astype(np.int32)),
                        pb_utils.Tensor("SEQUENCE_LENGTH", np.array([[ids.size]], np.int32)),
                    ],
                ).exec(),
                "postprocessing",
            )
            text = pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy()
            send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", text)]))

        seq, new_total = prompt, np.zeros(0, dtype=np.int32)
        while new_total.size < max_new:
            want = min(k, max_new - new_total.size - 1)
            draft = np.zeros(0, dtype=np.int32)
            if want > 0:
                draft = self._ids_call(self.draft, ids_inputs(seq, want) + [pb_utils.Tensor(n, a) for n, a in same.items()])
            extra = [pb_utils.Tensor("draft_input_ids", draft.reshape(1, -1))] if draft.size else []
            got = self._ids_call(self.engine, ids_inputs(seq, draft.size + 1) + extra + kept)
            if got.size == 0:
                break
            seq, new_total = np.concatenate([seq, got]), np.concatenate([new_total, got])
            if stream:
                emit(got)
            if got.size < draft.size + 1:  # the engine stopped early: end id or stop word
                break
        if not stream:
            emit(new_total if exclude else np.concatenate([prompt, new_total]))

    # ------------------------------------------------------------------ Triton entry points
    def execute(self, requests: list[Any]) -> list[Any] | None:
        return model_common.execute_sending(requests, self._run, "tensorrt_llm_bls", self.decoupled)
