"""TEST DOUBLE of ``tensorrt_llm.runtime.ModelRunnerCpp`` (TensorRT-LLM 1.2.x ``tensorrt_llm/runtime/model_runner_cpp.py``
signatures: ``from_dir(engine_dir, *, max_batch_size, max_input_len, max_output_len, max_beam_width,
max_attention_window_size, kv_cache_free_gpu_memory_fraction, gather_generation_logits, ...)`` and
``generate(batch_input_ids, *, max_new_tokens, end_id, pad_id, stop_words_list, return_dict, output_sequence_lengths,
output_generation_logits, ...)``). Test data: greedy decoding is delegated to a transformers checkpoint the test placed
in ``<engine_dir>/test_double_hf``; never an engine.
"""

from __future__ import annotations

from typing import Any

from . import CALLS, _greedy


class ModelRunnerCpp:
    def __init__(self, model: Any, max_batch_size: int, max_input_len: int, gather_context_logits: bool = False) -> None:
        self._model, self.max_batch_size, self.max_input_len = model, max_batch_size, max_input_len
        self.gather_context_logits = gather_context_logits

    @classmethod
    def from_dir(
        cls,
        engine_dir: str,
        *,
        lora_dir: str | None = None,
        rank: int = 0,
        max_batch_size: int | None = None,
        max_input_len: int | None = None,
        max_output_len: int | None = None,
        max_beam_width: int | None = None,
        max_attention_window_size: list[int] | None = None,
        sink_token_length: int | None = None,
        kv_cache_free_gpu_memory_fraction: float | None = None,
        cross_kv_cache_fraction: float | None = None,
        gpu_weights_percent: float = 1,
        max_tokens_in_paged_kv_cache: int | None = None,
        kv_cache_enable_block_reuse: bool = False,
        enable_chunked_context: bool = False,
        multi_block_mode: bool = True,
        enable_context_fmha_fp32_acc: bool | None = None,
        cuda_graph_mode: bool | None = None,
        gather_generation_logits: bool = False,
    ) -> ModelRunnerCpp:
        from pathlib import Path

        from transformers import AutoModelForCausalLM

        assert max_attention_window_size is None or isinstance(max_attention_window_size, list)
        CALLS.append(
            (
                "ModelRunnerCpp.from_dir",
                {
                    "engine_dir": engine_dir,
                    "max_batch_size": max_batch_size,
                    "max_input_len": max_input_len,
                    "max_beam_width": max_beam_width,
                    "max_attention_window_size": max_attention_window_size,
                    "kv_cache_free_gpu_memory_fraction": kv_cache_free_gpu_memory_fraction,
                    "gather_generation_logits": gather_generation_logits,
                },
            )
        )
        import json

        m = AutoModelForCausalLM.from_pretrained(str(Path(engine_dir) / "test_double_hf"))
        m.eval()
        bc = json.loads((Path(engine_dir) / "config.json").read_text()).get("build_config") or {}
        return cls(m, max_batch_size or 8, max_input_len or 1024, bool(bc.get("gather_context_logits")))

    def generate(
        self,
        batch_input_ids: list,
        *,
        max_new_tokens: int = 1,
        end_id: int | None = None,
        pad_id: int | None = None,
        bad_words_list: list | None = None,
        stop_words_list: list | None = None,
        return_dict: bool = False,
        output_sequence_lengths: bool = False,
        output_generation_logits: bool = False,
        output_log_probs: bool = False,
        output_cum_log_probs: bool = False,
        streaming: bool = False,
        **kwargs: Any,
    ) -> Any:
        if streaming:
            return self._stream(
                batch_input_ids,
                max_new_tokens=max_new_tokens,
                end_id=end_id,
                pad_id=pad_id,
                stop_words_list=stop_words_list,
                output_generation_logits=output_generation_logits,
            )
        import torch

        assert len(batch_input_ids) <= self.max_batch_size and all(t.dtype == torch.int32 for t in batch_input_ids)
        CALLS.append(
            (
                "ModelRunnerCpp.generate",
                {
                    "n": len(batch_input_ids),
                    "max_new_tokens": max_new_tokens,
                    "end_id": end_id,
                    "pad_id": pad_id,
                    "stop_words_list": stop_words_list,
                },
            )
        )
        rows, lens, logits = [], [], []
        for b, t in enumerate(batch_input_ids):
            ids = t.tolist()
            stops = {end_id} | {w[0] for w in ((stop_words_list or [None] * len(batch_input_ids))[b] or []) if len(w) == 1}
            gen, lg = _greedy(self._model, ids, max_new_tokens, stops, end_id == -1, output_generation_logits)
            if gen and gen[-1] == end_id:
                gen = gen[:-1]  # sequence_lengths do not count the end id
            rows.append(ids + gen)
            lens.append(len(ids) + len(gen))
            logits.append(lg)
        width = max(len(ids) for ids in [t.tolist() for t in batch_input_ids]) + max_new_tokens
        out = torch.full((len(rows), 1, width), end_id if end_id is not None and end_id >= 0 else (pad_id or 0), dtype=torch.int32)
        for b, r in enumerate(rows):
            out[b, 0, : len(r)] = torch.tensor(r, dtype=torch.int32)
        res = {"output_ids": out, "sequence_lengths": torch.tensor([[n] for n in lens], dtype=torch.int32)}
        if output_generation_logits:
            res["generation_logits"] = [[lg] for lg in logits]
        if self.gather_context_logits:  # per request [input_len, vocab] (engines built with --gather_context_logits)
            with torch.inference_mode():
                res["context_logits"] = [self._model(torch.tensor([t.tolist()])).logits[0] for t in batch_input_ids]
        return res if return_dict else out

    def _stream(self, batch_input_ids: list, **kw: Any):
        """Streaming as the real runner: one dict per step, output_ids/sequence_lengths growing (the final dict is the
        non-streaming result)."""
        full = self.generate(batch_input_ids, return_dict=True, output_sequence_lengths=True, **kw)
        in_lens = [len(t) for t in batch_input_ids]
        steps = max(int(full["sequence_lengths"][b][0]) - in_lens[b] for b in range(len(in_lens)))
        for k in range(1, steps + 1):
            lens = full["sequence_lengths"].clone()
            for b in range(len(in_lens)):
                lens[b][0] = min(int(full["sequence_lengths"][b][0]), in_lens[b] + k)
            CALLS.append(("ModelRunnerCpp.generate.stream_step", {"k": k}))
            yield {**full, "sequence_lengths": lens}


ModelRunner = ModelRunnerCpp
