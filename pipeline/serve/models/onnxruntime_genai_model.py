"""Triton Python-backend model: an onnxruntime-genai engine with continuous batching (``og.Engine``).

Copied by the package stage to ``<repository>/onnxruntime_genai/1/model.py`` (and to ``ensemble`` / ``tensorrt_llm_bls``
with ``interface=text``).  It runs inside Triton's Python backend stub with the serving virtualenv's site-packages
(numpy < 2, onnxruntime-genai, tokenizers); it must not import the ``pipeline`` package.  This class only wires its
sibling modules, which the package stage copies next to it (``pipeline/package/repository.py`` ``MODEL_HELPERS``)
and which it imports from its own folder:

* ``genai_requests.py``: request handling (``RequestParser``: request tensors -> ``Job`` s, validation, limits,
  sampling parameters; the ``Group`` / ``Job`` records);
* ``genai_scheduling.py``: scheduling (``Scheduler``: the og.Engine owner thread, in-flight batching, the
  og.Generator path, cancellation and stop requests, engine recovery, the test-only fault switch);
* ``genai_sending.py``: sending (``Responder``: response tensors, streaming and ``stream_interval``, coalescing,
  error responses, the sender thread and its ``is_cancelled()`` polls, the request-outcome counter);
* ``request_metrics.py`` (the counter's name and labels) and ``tokenization.py`` (``pipeline/core/tokenization.py``).

Tensor interface: the names, data types and shapes of TensorRT-LLM's ``tensorrt_llm`` model (tensorrtllm_backend
``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``), so the ensemble maps to it exactly as it maps to
``tensorrt_llm``.  Inputs (without the batch dim): ``input_ids`` INT32 [-1], ``input_lengths`` INT32 [1],
``request_output_len`` INT32 [1], ``end_id``/``pad_id`` INT32 [1], ``streaming`` BOOL [1], sampling inputs
(``runtime_top_k`` INT32, ``runtime_top_p``/``temperature``/``repetition_penalty`` FP32, ``random_seed`` UINT64,
``min_length`` INT32), ``stop_words_list``/``bad_words_list`` INT32 [2, -1] ...

Outputs of one response (shapes as the TensorRT-LLM C++ backend sends them, ``inflight_batcher_llm/src/
model_instance_state.cc`` ``fillTritonResponse``; every response answers ONE prompt of the request):

* ``output_ids`` INT32 [1, beams, len], ``sequence_length`` INT32 [1, beams];
* ``batch_index``, ``sequence_index`` INT32 [1, 1]; perf metrics (``arrival_time_ns`` ... INT64, ``kv_cache_*`` INT32)
  [1, 1] when ``return_perf_metrics``;
* ``text_output`` BYTES [beams] (our addition; the ensemble maps it straight to its ``text_output`` so a streamed
  token costs one hop, not engine -> postprocessing -> client): the text these ids add, detokenized in-process.

Several prompts in one request (``input_ids`` [N, L], ``input_lengths`` [N, 1], per-row sampling inputs): every
prompt becomes its own engine request; each response carries its ``batch_index``; the request's FINAL flag is sent
with the last prompt's last response (decoupled mode only, as TensorRT-LLM's backend requires).

Streaming (decoupled): one response per generated token (per ``stream_interval`` tokens after the first when the
package sets it); ``output_ids`` holds the new token only (TensorRT-LLM's
streaming convention) and ``text_output`` the text it completes, from an incremental detokenizer (constant work per
token, never a re-decode of the whole sequence: ``TextCodec.stream_decoder`` of ``pipeline/core/tokenization.py``, copied next
to this file; a multi-byte or byte-fallback character is emitted once all its bytes arrived, so the joined stream
equals the non-streamed text).  When the server falls behind the engine (high concurrency on a small model), the
tokens of one prompt that queued up meanwhile leave as ONE response (``output_ids`` [1, 1, k], ``sequence_length``
k, their text): no token waits for this, it only saves a round trip per token under load (``stream_coalescing``
parameter, ``package.stream_coalescing``; TensorRT-LLM streams several tokens per response too, when speculative
decoding accepts several in a step).

Decoding is greedy unless the request asks for sampling (``runtime_top_k`` > 1 or ``runtime_top_p`` > 0 with
``temperature`` > 0), the TensorRT-LLM convention.  A request without ``repetition_penalty`` gets the package's
decoding policy (``decoding.json`` next to ``engine/``: the checkpoint's ``generation_config.json`` penalty, the one
evaluate applied; ``pipeline/core/decoding.py``).  Inputs the engine cannot honour (presence/frequency penalties,
bad words, LoRA, ...) are refused per request with the input's name; nothing is silently ignored (a refusal is raised
from ``execute`` when the call holds one request, so Triton's metrics count it as a failure).  Token ids are
checked against the vocabulary before they reach the engine.

``return_log_probs`` and beam search (``beam_width`` > 1, ``num_return_sequences``): og.Engine 0.18 exposes neither
logits nor beams, so such a request runs on an ``og.Generator`` over the same ``og.Model`` (``Scheduler._generator_steps``), one
step per engine-loop turn, cancellation checked before each step.  Extra outputs: ``cum_log_probs`` FP32 [1, beams],
``output_log_probs`` FP32 [1, beams, len] (shapes of TensorRT-LLM's C++ backend; values defined in
``Scheduler._generator_steps``).

Concurrency: ``execute`` only validates and queues; one background thread owns the ``og.Engine`` (admits requests,
calls ``engine.run`` step by step, dispatches token events, ends cancelled requests before the next step).  A second
thread sends the responses in order and polls ``is_cancelled()`` for the running requests at most every 5 ms (a
round trip to the server, kept off the engine thread).  If the engine itself raises, the requests in flight fail with
the reason and the engine is rebuilt before the next request.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

try:  # only inside Triton
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - importable for unit tests of the pure helpers
    pb_utils = None

# The sibling modules the package stage copies next to this file (``MODEL_HELPERS``, ``MODEL_COMMON``), imported from
# this folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import genai_requests  # noqa: E402
import genai_scheduling  # noqa: E402
import genai_sending  # noqa: E402
import model_common  # noqa: E402


def load_codec(tokenizer_dir: str) -> Any:
    """``TextCodec.from_dir`` of ``pipeline/core/tokenization.py``, which the package stage copies next to this file."""
    from tokenization import TextCodec

    return TextCodec.from_dir(tokenizer_dir)


def load_request_metrics() -> Any:
    """``request_metrics`` (``pipeline/serve/models/request_metrics.py``, copied next to this file by the package
    stage): the name and labels of the request-outcome counter."""
    import request_metrics

    return request_metrics


def _flag(params: dict[str, str], name: str, default: str) -> bool:
    return params.get(name, default).lower() in ("1", "true", "yes")


class TritonPythonModel:
    """Wiring: ``execute`` parses (``RequestParser``) and queues (``Scheduler``); ``Responder`` sends."""

    def initialize(self, args: dict[str, Any]) -> None:
        import onnxruntime_genai as og

        self.model_config, params = model_common.model_config(args)
        engine_dir = model_common.folder_param(args, params, "engine_dir", "engine")
        if not os.path.isfile(os.path.join(engine_dir, "genai_config.json")):
            raise pb_utils.TritonModelException(f"engine_dir {engine_dir} has no genai_config.json")
        with open(os.path.join(engine_dir, "genai_config.json"), encoding="utf-8") as f:
            gcfg = json.load(f)
        eos = gcfg.get("model", {}).get("eos_token_id", [])
        eos_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos])}
        text = params.get("interface", "ids") == "text"
        self.logger = pb_utils.Logger
        self.rm = load_request_metrics()
        self.outcomes = self.rm.RequestOutcomes(pb_utils, args.get("model_name", ""), args.get("model_version", ""), self.logger.log_warn)
        self.parser = genai_requests.RequestParser(
            params,
            gcfg,
            load_codec(model_common.folder_param(args, params, "tokenizer_dir", "tokenizer")),
            eos_ids=eos_ids,
            decoupled=pb_utils.using_decoupled_model_transaction_policy(self.model_config),
            text=text,
            default_repetition_penalty=genai_requests.policy_penalty(
                os.path.join(os.path.dirname(os.path.normpath(engine_dir)), "decoding.json")
            ),
        )
        self.responses = genai_sending.Responder(
            outputs={o["name"] for o in self.model_config.get("output", [])},
            text=text,
            eos_ids=eos_ids,
            decode=self.parser.decode,
            coalesce=_flag(params, "stream_coalescing", "true"),  # package.stream_coalescing
            stream_interval=int(params.get("stream_interval") or 1),  # package.stream_interval
            logger=self.logger,
            rm=self.rm,
            outcomes=self.outcomes,
        )
        lazy = params.get("load", "eager") == "lazy"
        self.scheduler = genai_scheduling.Scheduler(
            og,
            engine_dir,
            buffer_size=int(params.get("event_buffer_size") or 256),
            lazy=lazy,
            eos_ids=eos_ids,
            responses=self.responses,
            logger=self.logger,
            fault_after=genai_scheduling.fault_after_from_env(self.logger),
        )
        self.responses.start(self.scheduler.running_groups)
        self.scheduler.start()
        if self.scheduler.init_error is not None:
            raise pb_utils.TritonModelException(f"cannot load the onnxruntime_genai engine from {engine_dir}: {self.scheduler.init_error}")
        p = self.parser
        self.logger.log_info(
            f"onnxruntime_genai engine {'will load on first request' if lazy else 'loaded'} from {engine_dir} (og {getattr(og, '__version__', '?')}); "
            f"vocab_size={p.vocab_size} max_input_len={p.max_input_len} max_seq_len={p.max_seq_len} "
            f"decoupled={p.decoupled} repetition_penalty={p.default_repetition_penalty or 1.0} "
            f"(the package's decoding policy, decoding.json; applied when a request sends none)"
        )

    def execute(self, requests: list[Any]) -> None:
        """Validate and queue each request; a refused one is answered with the reason (raised when it is alone)."""
        for request in requests:
            try:
                stop_id = self.parser.stop_id(request)
                if stop_id is not None:  # answered at once; the engine thread ends the request it names
                    self.scheduler.stop_request(stop_id)
                    self.responses.answer_stop(request)
                    continue
                jobs = self.parser.parse(request)
            except Exception as e:
                if len(requests) == 1:
                    # raised, the refusal is counted by Triton (nv_inference_request_failure{reason="BACKEND"}); an error
                    # sent through the response sender counts as a success (Triton 2.51 python_backend). The wrapper
                    # Triton adds ("Failed to process the request(s) ...", the traceback) is cut by our clients.
                    self.outcomes.count(self.rm.FAILURE, "refused")
                    raise pb_utils.TritonModelException(f"onnxruntime_genai: {e}") from None
                self.responses.refuse(request, e)
                continue
            if jobs:
                self.scheduler.submit(jobs)
        return None

    def finalize(self) -> None:
        self.scheduler.shutdown()  # the requests in flight get "server is shutting down"
        self.responses.stop()  # after the shutdown errors: the sender delivers them, then ends
