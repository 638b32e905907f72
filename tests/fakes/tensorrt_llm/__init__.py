"""TEST DOUBLE of the ``tensorrt_llm`` package (TensorRT-LLM 1.2.x public signatures only). Test data: it is never an
engine and nothing it returns is reported as engine output. Greedy decoding is delegated to a transformers model stored
in the test's folder, so a runner driven through it can be compared token for token with the baseline runner.

Signatures mirror TensorRT-LLM 1.2.x ``tensorrt_llm/llmapi/llm.py`` (``LLM.generate(inputs, sampling_params=None,
use_tqdm=True, ...)``) and ``tensorrt_llm/sampling_params.py`` (keyword-only ``SamplingParams`` fields).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__version__ = "0.0.0+test-double"
CALLS: list[tuple[str, dict[str, Any]]] = []

_LLM_ARGS = {
    "model",
    "tokenizer",
    "backend",
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "max_input_len",
    "max_beam_width",
    "enable_chunked_prefill",
    "cuda_graph_config",
    "kv_cache_config",
    "scheduler_config",
    "speculative_config",
    "gather_generation_logits",
    "trust_remote_code",
    "dtype",
    "tensor_parallel_size",
}


@dataclasses.dataclass(kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop_token_ids: list[int] | None = None
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    generation_logits: Any = None


@dataclasses.dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    context_logits: Any = None


def _greedy(model: Any, ids: list[int], max_new: int, stops: set[int], ignore_eos: bool, want_logits: bool):
    import torch

    seq, out, logits = list(ids), [], []
    with torch.inference_mode():
        for _ in range(max_new):
            lg = model(torch.tensor([seq])).logits[0, -1]
            t = int(lg.argmax())
            out.append(t)
            logits.append(lg)
            seq.append(t)
            if t in stops and not ignore_eos:
                break
    return out, (torch.stack(logits) if want_logits and logits else None)


class LLM:
    def __init__(self, model: str, tokenizer: str | None = None, **kwargs: Any) -> None:
        unknown = set(kwargs) - _LLM_ARGS
        if unknown:  # the real LLM args model is extra="forbid"
            raise ValueError(f"unknown LLM() arguments: {sorted(unknown)}")
        from transformers import AutoModelForCausalLM

        CALLS.append(("LLM", {"model": model, "tokenizer": tokenizer, **kwargs}))
        self._model = AutoModelForCausalLM.from_pretrained(model)
        self._model.eval()

    def generate(self, inputs: Any, sampling_params: Any = None, use_tqdm: bool = True, lora_request: Any = None, **kw: Any) -> Any:
        batch = inputs if isinstance(inputs, list) else [inputs]
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(batch)
        CALLS.append(("LLM.generate", {"n": len(batch), "use_tqdm": use_tqdm}))
        outs = []
        for i, (inp, sp) in enumerate(zip(batch, sps)):
            ids = list(inp["prompt_token_ids"])
            assert sp.top_k == 1, "the pipeline's runner asks for greedy decoding"
            stops = {sp.end_id, *(sp.stop_token_ids or [])}
            gen, lg = _greedy(self._model, ids, sp.max_tokens, stops, sp.ignore_eos, sp.return_generation_logits)
            reason = "stop" if gen and gen[-1] in stops else "length"
            if gen and gen[-1] == sp.end_id:
                gen = gen[:-1]  # the end id is not part of token_ids
            ctx = None
            if sp.return_context_logits:
                import torch

                with torch.inference_mode():
                    ctx = self._model(torch.tensor([ids])).logits[0]
            outs.append(RequestOutput(i, ids, [CompletionOutput(0, "", gen, reason, lg)], context_logits=ctx))
        return outs

    def shutdown(self) -> None:
        self._model = None
