"""TensorRT-LLM engine runner for the evaluate and benchmark stages (the ``engine`` runner of ``target=tensorrt_llm``).

Two runtimes, both TensorRT-LLM 1.2.x, imported lazily (only on a host that has them):

* engine path (``trtllm-build`` output: ``config.json`` + ``rank*.engine``): ``tensorrt_llm.runtime.ModelRunnerCpp``
  (the C++ executor; ``ModelRunner`` when the C++ runner is not importable), as in TensorRT-LLM's
  ``tensorrt_llm/runtime/model_runner_cpp.py``::

      ModelRunnerCpp.from_dir(engine_dir, *, max_batch_size=None, max_input_len=None, max_output_len=None,
                              max_beam_width=None, max_attention_window_size=None, kv_cache_free_gpu_memory_fraction=None,
                              gather_generation_logits=False, ...)
      runner.generate(batch_input_ids: list[torch.Tensor], *, max_new_tokens, end_id, pad_id, stop_words_list,
                      return_dict=True, output_sequence_lengths=True, output_generation_logits=False, ...)
      -> {"output_ids": [batch, beams, prompt + generated] (padded), "sequence_lengths": [batch, beams],
          "generation_logits": [batch, beams, new_tokens, vocab] (when asked), "context_logits": per request [len, vocab]
          (engines built with --gather_context_logits)}

* PyTorch backend (``target.backend=pytorch``: ``engine/llm_api_options.yaml`` + ``engine/hf``): the LLM API,
  ``tensorrt_llm.LLM(model=..., tokenizer=..., **options).generate(inputs, sampling_params=[SamplingParams(...)],
  use_tqdm=False)`` with ``{"prompt_token_ids": ids}`` inputs and ``SamplingParams(max_tokens, end_id, pad_id,
  stop_token_ids, top_k=1, logprobs, return_generation_logits)``; ``RequestOutput.outputs[0].token_ids``.

Greedy decoding only (top_k=1, beam width 1): the same decoding the baseline and simulated runners use. The stop
handling is the pipeline's: ``end_id`` = the first eos id, the other stop ids as one-token stop words; the evaluate
stage cuts again at the first stop id (``pipeline.evaluate.runners.EngineAdapter``).

Without TensorRT-LLM, :func:`load_runner` raises :class:`PreflightError` (exit 4) with the fix.
"""

from __future__ import annotations

import importlib
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ....core.contracts.build import BuildArtifact, BuildInfo, EngineLimits
from ....errors import InputError, PreflightError

INSTALL_FIX = (
    "install TensorRT-LLM 1.2.1 on an NVIDIA GPU host (`pip install 'tensorrt-llm==1.2.1' --extra-index-url "
    "https://pypi.nvidia.com/`, Python 3.10/3.12) or run inside nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3; "
    "or evaluate the simulated model without packaging it: eval.candidate=simulated eval.runners=[baseline,simulated] "
    "stages=[export,quantize,evaluate] "
    "(a package ships the engine, so its gate must judge the engine: pipeline/package/checks.py)"
)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise PreflightError(f"the TensorRT-LLM engine runner needs the `{name}` module ({e}). Fix: {INSTALL_FIX}.") from e


def _engine_limits(engine_dir: Path) -> dict[str, Any]:
    """``build_config`` limits from the engine's ``config.json`` (TensorRT-LLM ``Engine.save`` layout)."""
    p = engine_dir / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: unreadable engine config ({e}). Fix: rebuild the engine with the build stage.") from e
    bc = cfg.get("build_config") or {}
    return {k: bc.get(k) for k in ("max_batch_size", "max_input_len", "max_seq_len", "gather_context_logits", "gather_generation_logits")}


class TrtllmEngineRunner:
    """``EngineRunner`` over a TensorRT-LLM engine (``ModelRunnerCpp``) or the LLM API (PyTorch backend).

    Args:
        engine_dir: the build artifact's ``engine/`` folder.
        pad_id: padding id for the runtime (the export's pad id, else the first eos id).
        max_attention_window_size: the build's window (``build_info.json`` runtime), passed to the runtime.
        kv_cache_free_gpu_memory_fraction: KV-cache share of free GPU memory.
        generation_logits: also return the logits of every generated token (fidelity metrics).
    """

    def __init__(
        self,
        engine_dir: Path,
        *,
        pad_id: int | None = None,
        max_attention_window_size: int | None = None,
        kv_cache_free_gpu_memory_fraction: float | None = None,
        generation_logits: bool = False,
        limits: dict[str, Any] | None = None,
    ) -> None:
        self.engine_dir = Path(engine_dir)
        self.pad_id = pad_id
        self.generation_logits = generation_logits
        self.last_logits: dict[str, Any] = {}
        """request_id -> generation logits [new_tokens, vocab] of the last generate() call (when asked)."""
        opts_file = self.engine_dir / BuildArtifact.LLM_API_OPTIONS
        self.backend = "pytorch" if opts_file.is_file() else "tensorrt"
        self.streams_tokens = self.backend == "tensorrt"
        if self.backend == "pytorch":
            import yaml

            opts = yaml.safe_load(opts_file.read_text(encoding="utf-8")) or {}
            lim = EngineLimits.from_json({**opts, **{k: v for k, v in (limits or {}).items() if v}})  # the build's, else the options'
            self.max_batch_size = int(lim.max_batch_size or 8)
            self.max_input_len = int(lim.max_input_len or 1024)
            self.max_seq_len = int(lim.max_seq_len or 2048)
            trt = _import("tensorrt_llm")
            self._SamplingParams = trt.SamplingParams
            hf = self.engine_dir / "hf"
            llm_kw = {k: v for k, v in opts.items() if k not in ("model", "tokenizer")}
            if generation_logits:
                llm_kw["gather_generation_logits"] = True
            self._llm = trt.LLM(model=str(hf), tokenizer=str(hf), **llm_kw)
            self._runner = None
        else:
            lim = EngineLimits.from_json({**_engine_limits(self.engine_dir), **{k: v for k, v in (limits or {}).items() if v is not None}})
            self.max_batch_size = int(lim.max_batch_size or 8)
            self.max_input_len = int(lim.max_input_len or 1024)
            self.max_seq_len = int(lim.max_seq_len or 2048)
            rt = _import("tensorrt_llm.runtime")
            cls = getattr(rt, "ModelRunnerCpp", None) or rt.ModelRunner
            kw: dict[str, Any] = {"max_batch_size": self.max_batch_size, "max_input_len": self.max_input_len, "max_beam_width": 1}
            if max_attention_window_size is not None:
                kw["max_attention_window_size"] = [int(max_attention_window_size)]
            if kv_cache_free_gpu_memory_fraction is not None:
                kw["kv_cache_free_gpu_memory_fraction"] = float(kv_cache_free_gpu_memory_fraction)
            if generation_logits:
                kw["gather_generation_logits"] = True
            self._runner = cls.from_dir(str(self.engine_dir), **kw)
            self._llm = None

    # ------------------------------------------------------------------ generation
    def generate(self, requests: Sequence[Any], on_token: Any = None) -> list[Any]:
        """Greedy generation for every request (see ``pipeline.core.targets.base.EngineRunner``).

        A prompt longer than ``max_input_len`` (or leaving no room in ``max_seq_len``) gets ``finish_reason="error"``.
        With ``on_token``, the engine path streams (``generate(..., streaming=True)``) and reports each token when its
        engine step returned it; the LLM-API path is driven non-streaming, so its tokens are reported at completion
        (``streams_tokens`` is False there: in-process TTFT of the PyTorch backend is not measured by this runner; the
        benchmark stage measures streaming through Triton).
        """
        from ....core.targets.base import GenerationResult

        results: dict[int, Any] = {}
        groups: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            if len(r.input_ids) > self.max_input_len or len(r.input_ids) + 1 > self.max_seq_len:
                results[i] = GenerationResult(
                    r.request_id,
                    [],
                    "error",
                    error=f"prompt of {len(r.input_ids)} tokens exceeds the engine's "
                    f"max_input_len={self.max_input_len} / max_seq_len={self.max_seq_len}",
                )
                continue
            budget = min(int(r.max_new_tokens), self.max_seq_len - len(r.input_ids))
            groups[budget].append(i)
        self.last_logits = {}
        for budget, idx in sorted(groups.items()):
            for s in range(0, len(idx), self.max_batch_size):
                chunk = idx[s : s + self.max_batch_size]
                t0 = time.perf_counter()
                batch = [requests[i] for i in chunk]
                if self._llm is not None:
                    outs = [(ids, lg, None) for ids, lg in self._run_llmapi(batch, budget)]
                else:
                    outs = self._run_engine(batch, budget, stream=on_token is not None, t0=t0)
                dt = time.perf_counter() - t0
                for i, (ids, logits, ttimes) in zip(chunk, outs):
                    r = requests[i]
                    stops = set(r.stop_token_ids)
                    cut = next((k for k, t in enumerate(ids) if t in stops), None) if not r.ignore_eos else None
                    reason = "eos" if cut is not None or len(ids) < budget else "length"
                    ids = ids[:cut] if cut is not None else ids
                    times = list(ttimes[: len(ids)]) if ttimes is not None else [dt] * len(ids)
                    if on_token is not None:
                        for t, ts in zip(ids, times):
                            on_token(r.request_id, t, ts)
                    if logits is not None:
                        self.last_logits[r.request_id] = logits
                    results[i] = GenerationResult(r.request_id, list(ids), reason, token_times_s=times)
        return [results[i] for i in range(len(requests))]

    def _ends(self, r: Any) -> tuple[int, int, list[list[int]]]:
        stop = list(r.stop_token_ids)
        end_id = stop[0] if stop and not r.ignore_eos else -1
        pad = self.pad_id if self.pad_id is not None else (stop[0] if stop else 0)
        return end_id, pad, [[s] for s in stop[1:]] if not r.ignore_eos else []

    def _run_engine(self, reqs: list[Any], budget: int, *, stream: bool = False, t0: float = 0.0) -> list[tuple[list[int], Any, Any]]:
        """(generated ids, generation logits or None, per-token times or None) per request.

        ``stream=True`` drives ``generate(..., streaming=True)`` (a generator of the same dicts, one per engine step) and
        records when each token arrived; otherwise one blocking call.
        """
        import torch

        runner = self._runner
        assert runner is not None, "the engine path (backend 'tensorrt') always has a ModelRunner"
        end_id, pad, _ = self._ends(reqs[0])
        kw: dict[str, Any] = dict(
            max_new_tokens=budget,
            end_id=end_id,
            pad_id=pad,
            stop_words_list=[self._ends(r)[2] or None for r in reqs] if any(self._ends(r)[2] for r in reqs) else None,
            return_dict=True,
            output_sequence_lengths=True,
            output_generation_logits=self.generation_logits,
        )
        if reqs[0].repetition_penalty is not None:  # the decoding policy's (pipeline.core.decoding), one value per run
            kw["repetition_penalty"] = float(reqs[0].repetition_penalty)
        batch = [torch.tensor(r.input_ids, dtype=torch.int32) for r in reqs]
        times: list[list[float]] | None = None
        if stream:
            times = [[] for _ in reqs]
            out = None
            for out in runner.generate(batch, streaming=True, **kw):
                now = time.perf_counter() - t0
                for b, r in enumerate(reqs):
                    n = int(out["sequence_lengths"][b][0]) - len(r.input_ids)
                    times[b] += [now] * max(0, n - len(times[b]))
            if out is None:
                raise RuntimeError("TensorRT-LLM streaming generate() yielded nothing")
        else:
            out = runner.generate(batch, **kw)
        ids, lens = out["output_ids"], out["sequence_lengths"]
        gl = out.get("generation_logits") if self.generation_logits else None
        res = []
        for b, r in enumerate(reqs):
            start, end = len(r.input_ids), int(lens[b][0])
            gen = [int(t) for t in ids[b][0][start:end].tolist()]
            res.append((gen, gl[b][0][: len(gen)] if gl is not None else None, times[b] if times is not None else None))
        return res

    def _run_llmapi(self, reqs: list[Any], budget: int) -> list[tuple[list[int], Any]]:
        params = []
        for r in reqs:
            end_id, pad, _ = self._ends(r)
            params.append(
                self._SamplingParams(
                    max_tokens=budget,
                    end_id=end_id,
                    pad_id=pad,
                    top_k=1,
                    stop_token_ids=list(r.stop_token_ids[1:]) or None,
                    ignore_eos=bool(r.ignore_eos),
                    return_generation_logits=self.generation_logits,
                    **({"repetition_penalty": float(r.repetition_penalty)} if r.repetition_penalty is not None else {}),
                )
            )
        outs = self._llm.generate([{"prompt_token_ids": list(r.input_ids)} for r in reqs], sampling_params=params, use_tqdm=False)
        res = []
        for o in outs:
            c = o.outputs[0]
            res.append(([int(t) for t in c.token_ids], getattr(c, "generation_logits", None) if self.generation_logits else None))
        return res

    # ------------------------------------------------------------------ fidelity
    def teacher_forced_logits(self, prompt: Sequence[int], continuation: Sequence[int]) -> Any:
        """Logits at the positions predicting each ``continuation`` token, given ``prompt`` + the continuation so far.

        One context pass over ``prompt + continuation[:-1]`` with context logits: ``ModelRunnerCpp.generate(...,
        max_new_tokens=1, return_dict=True)["context_logits"]`` (engine built with ``--gather_context_logits``,
        ``build.gather_context_logits=true``), or ``SamplingParams(return_context_logits=True)`` ->
        ``RequestOutput.context_logits`` on the PyTorch backend.

        Returns:
            float32 numpy array (len(continuation), vocab).
        Raises:
            NotImplementedError: the engine was built without context logits (the fix is named).
        """
        import numpy as np

        seq = [int(t) for t in list(prompt) + list(continuation)[:-1]]
        n = len(continuation)
        if n == 0:
            raise ValueError("teacher_forced_logits: empty continuation")
        if self._llm is not None:
            sp = self._SamplingParams(max_tokens=1, top_k=1, return_context_logits=True)
            out = self._llm.generate([{"prompt_token_ids": seq}], sampling_params=[sp], use_tqdm=False)[0]
            ctx = getattr(out, "context_logits", None)
        else:
            if not _engine_limits(self.engine_dir).get("gather_context_logits"):
                raise NotImplementedError(
                    f"{self.engine_dir}: the engine was built without context logits. Fix: rebuild with "
                    "build.gather_context_logits=true (trtllm-build --gather_context_logits) to get fidelity metrics."
                )
            import torch

            assert self._runner is not None, "without an LLM-API model the engine path's ModelRunner is set"
            out = self._runner.generate(
                [torch.tensor(seq, dtype=torch.int32)],
                max_new_tokens=1,
                end_id=-1,
                pad_id=self.pad_id if self.pad_id is not None else 0,
                return_dict=True,
            )
            ctx = out.get("context_logits")
            ctx = ctx[0] if ctx is not None else None
        if ctx is None:
            raise NotImplementedError("the TensorRT-LLM runtime returned no context logits")
        arr = ctx.float().cpu().numpy() if hasattr(ctx, "float") else np.asarray(ctx, dtype=np.float32)
        return arr[len(prompt) - 1 : len(prompt) - 1 + n].astype(np.float32, copy=True)

    def close(self) -> None:
        if self._llm is not None and hasattr(self._llm, "shutdown"):
            self._llm.shutdown()
        self._llm = self._runner = None

    def __enter__(self) -> TrtllmEngineRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load_runner(engine_dir: Path, **kw: Any) -> TrtllmEngineRunner:
    """The runner for a ``tensorrt_llm`` build's ``engine/`` folder (lazy imports; see module docstring).

    Keyword args are :class:`TrtllmEngineRunner`'s; the build's ``build_info.json`` (next to ``engine/``) supplies the
    limits, the attention window and the KV-cache fraction when not given.

    Raises:
        PreflightError: TensorRT-LLM is not importable here (exit 4), with the fix.
        InputError: the folder holds neither an engine (config.json + rank*.engine) nor LLM-API options.
    """
    engine_dir = Path(engine_dir)
    if not (engine_dir / BuildArtifact.LLM_API_OPTIONS).is_file() and not (
        (engine_dir / "config.json").is_file() and any(engine_dir.glob("rank*.engine"))
    ):
        raise InputError(
            f"{engine_dir}: no TensorRT-LLM engine (config.json + rank*.engine) and no llm_api_options.yaml. "
            "Fix: rebuild with the build stage (target=tensorrt_llm)."
        )
    try:
        bi = BuildArtifact(engine_dir.parent).build_info()
    except InputError:  # a corrupt build_info.json: the engine's own config still loads
        bi = BuildInfo()
    if bi.recorded:
        kw.setdefault("limits", bi.limits or None)
        kw.setdefault("max_attention_window_size", bi.max_attention_window_size)
        kw.setdefault("kv_cache_free_gpu_memory_fraction", bi.kv_cache_free_gpu_mem_fraction)
    return TrtllmEngineRunner(engine_dir, **kw)
