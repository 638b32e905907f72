"""Runners: greedy generation of the same prompts through the baseline, the engine and the
ModelOpt simulated-quantization model, with one stop handling, one tokenization path and one decoding policy
(``pipeline.core.decoding``: greedy with the checkpoint's ``repetition_penalty``, nothing else from its
``generation_config.json``).

- ``baseline``: the *source* checkpoint (``model.path``, never the export) in transformers in the
  reference dtype (``eval.reference_dtype``) on ``eval.device``, batched with left padding and an ``attention_mask``.
- ``simulated``: ``pipeline.core.quant_state.load_simulated_model`` (ModelOpt fake-quant modules in PyTorch),
  driven exactly like the baseline.
- ``engine``: the built engine through its own runtime (``pipeline.core.targets.get_target(t).load_runner``).

Every runner receives the same token ids (``pipeline.core.tokenization.encode_prompt``: the chat template
supplies BOS; no special tokens are added again).  Generated ids are cut at the first id of the whole
eos list (``model_info.json`` ``eos_token_ids``), never at a length a runtime reports, then decoded and
cut at the first configured stop string.  ``finish_reason`` is ``eos`` | ``stop`` | ``length`` |
``error``.  Prompts longer than ``max_input_len`` are marked ``skipped="too_long"`` before any runner
sees them: never truncated, never sent.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.tokenization import cut_at_stop
from ..data.evalset import Prepared

log = logging.getLogger("pipeline.evaluate")


@dataclasses.dataclass
class ItemOutput:
    """One runner's answer to one item."""

    id: str
    text: str
    output_ids: list[int]
    finish_reason: str
    """eos | stop | length | error."""
    latency_s: float
    """Seconds from the submission of the item's batch to the item's completion."""
    error: str | None = None


def finalize(raw_ids: Sequence[int], stop_ids: Sequence[int], stop_strings: Sequence[str], tokenizer: Any) -> tuple[str, list[int], str]:
    """Cut generated ids at the first stop id, decode, cut at the first stop string.

    Returns ``(text, ids, finish_reason)`` with finish_reason ``eos`` (a stop id was generated),
    ``stop`` (a stop string matched) or ``length`` (neither: the budget ran out).
    """
    ids, reason = cut_at_stop(list(raw_ids), stop_ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    cut = min((i for i in (text.find(s) for s in stop_strings) if i >= 0), default=-1)
    if cut >= 0:
        text, reason = text[:cut], "stop"
    return text, ids, reason or "length"


Advance = Callable[[float], None]


class HFRunner:
    """Greedy batched generation with a ``transformers`` causal LM (baseline and simulated).

    Batches are formed from items sorted by (budget, prompt length) to limit padding; prompts are
    left-padded with ``pad_token_id`` and masked with ``attention_mask`` (padding never attends).
    """

    def __init__(
        self, model: Any, tokenizer: Any, *, stop_ids: Sequence[int], pad_id: int, name: str, repetition_penalty: float | None = None
    ) -> None:
        """``repetition_penalty``: the decoding policy's (``pipeline.core.decoding.DecodingPolicy.penalty``; None = none).

        The model's own ``generation_config`` (the checkpoint's ``generation_config.json``) is replaced by
        transformers' global defaults: ``generate`` would otherwise back-fill every field left unset from it, and the
        baseline would decode with penalties or sampling values no other runner applies (issue 24)."""
        from ..core.decoding import neutral_generation_config

        self.model, self.tokenizer, self.stop_ids, self.pad_id, self.name = model, tokenizer, list(stop_ids), int(pad_id), name
        self.repetition_penalty = repetition_penalty
        self.model.eval()
        self.model.generation_config = neutral_generation_config()

    def generate_ids(self, batch: Sequence[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy continuation ids (uncut; may contain eos and padding) for each prompt in ``batch``."""
        import torch
        from transformers import GenerationConfig

        width = max(len(x) for x in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, x in enumerate(batch):
            ids[i, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[i, width - len(x) :] = 1
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        gc = GenerationConfig(
            do_sample=False,
            num_beams=1,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_ids or None,
            pad_token_id=self.pad_id,
            repetition_penalty=self.repetition_penalty or 1.0,
        )
        with torch.inference_mode():
            seq = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
        return [row[width:].tolist() for row in seq.cpu()]

    def run(self, prepared: Sequence[Prepared], batch_size: int, advance: Advance = lambda n: None) -> dict[str, ItemOutput]:
        todo = sorted((p for p in prepared if not p.skipped), key=lambda p: (p.max_new_tokens, len(p.input_ids)))
        out: dict[str, ItemOutput] = {}
        for s in range(0, len(todo), max(1, batch_size)):
            chunk = todo[s : s + batch_size]
            t0 = time.perf_counter()
            gen = self.generate_ids([p.input_ids for p in chunk], max(p.max_new_tokens for p in chunk))
            dt = time.perf_counter() - t0
            for p, g in zip(chunk, gen):
                text, ids, reason = finalize(g[: p.max_new_tokens], self.stop_ids, p.stop_strings, self.tokenizer)
                out[p.item.id] = ItemOutput(p.item.id, text, ids, reason, dt)
            advance(len(chunk))
        return out

    def teacher_forced_logits(self, seqs: Sequence[Any], batch_size: int, advance: Advance = lambda n: None, into: Any = None) -> Any:
        """One forward pass per batch over ``prompt + continuation`` (right-padded, ``attention_mask``).

        Returns ``into`` (default: a new list) with ``into[i]`` = sequence ``i``'s float32 logits (len(continuation),
        vocab) at the positions predicting each continuation token (``fidelity.TFSequence``). Only the positions from
        the batch's shortest prompt on are projected onto the vocabulary (transformers' ``logits_to_keep``, where the
        model takes it): a batch's logits are ``batch x tokens x vocab`` floats.
        """
        import inspect

        import numpy as np
        import torch

        out: Any = into if into is not None else [None] * len(seqs)
        keep_ok = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].prompt) + len(seqs[i].continuation))
        for s in range(0, len(order), max(1, batch_size)):
            idx = order[s : s + batch_size]
            rows = [list(seqs[i].prompt) + list(seqs[i].continuation)[:-1] for i in idx]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, r in enumerate(rows):
                ids[j, : len(r)] = torch.tensor(r, dtype=torch.long)
                mask[j, : len(r)] = 1
            first = min(len(seqs[i].prompt) - 1 for i in idx)  # the earliest position any row needs
            kw = {"logits_to_keep": width - first} if keep_ok else {}
            with torch.inference_mode():
                logits = self.model(input_ids=ids.to(self.model.device), attention_mask=mask.to(self.model.device), **kw).logits
            shift = width - logits.shape[1]  # logits[:, k] is position shift + k
            for j, i in enumerate(idx):
                a, n = len(seqs[i].prompt) - 1 - shift, len(seqs[i].continuation)
                out[i] = logits[j, a : a + n].float().cpu().numpy().astype(np.float32, copy=True)
            del logits
            advance(len(idx))
        return out

    def close(self) -> None:
        self.model = None


def og_teacher_forced_logits(og_model: Any, prompt: Sequence[int], continuation: Sequence[int], min_length: int = 0) -> Any:
    """Teacher-forced logits from an onnxruntime-genai ``og.Model`` (0.18 ``og.Generator`` API).

    ``min_length``: the smallest KV capacity (``max_length``) the engine accepts; a sliding-window engine needs at least
    its window (onnxruntime-genai 0.18 GroupQueryAttention: "KV cache capacity (n) must be at least local_window_size"),
    so a sequence shorter than the window still gets a cache of the window's size (``OrtEngineRunner.min_length``).

    One prefill: ``append_tokens(prompt + continuation[:-1])``, then ``get_output("logits")`` holds every
    position's logits (1, T, vocab) (measured on 0.18: equal to step-by-step ``get_logits()`` within 5e-5).
    A model whose output holds only the last position falls back to appending one token at a time and
    reading ``get_logits()`` after each.  Returns float32 (len(continuation), vocab).
    """
    import numpy as np
    import onnxruntime_genai as og

    seq = [*prompt, *continuation[:-1]]
    capacity = max(len(seq) + 1, int(min_length))
    gp = og.GeneratorParams(og_model)
    gp.set_search_options(do_sample=False, max_length=capacity)
    g = og.Generator(og_model, gp)
    g.append_tokens(np.asarray([seq], dtype=np.int32))
    full = np.asarray(g.get_output("logits"), dtype=np.float32)
    a, n = len(prompt) - 1, len(continuation)
    if full.ndim == 3 and full.shape[1] == len(seq):
        return np.ascontiguousarray(full[0, a : a + n])
    gp = og.GeneratorParams(og_model)
    gp.set_search_options(do_sample=False, max_length=capacity)
    g = og.Generator(og_model, gp)
    g.append_tokens(np.asarray([list(prompt)], dtype=np.int32))
    rows = []
    for k, t in enumerate(continuation):
        rows.append(np.asarray(g.get_logits(), dtype=np.float32).reshape(1, -1))
        if k + 1 < n:
            g.append_tokens(np.asarray([[int(t)]], dtype=np.int32))
    return np.concatenate(rows, axis=0)


class EngineAdapter:
    """Drives a built engine (``pipeline.core.targets`` EngineRunner) with the same prompts and stop handling."""

    def __init__(
        self, runner: Any, tokenizer: Any, *, stop_ids: Sequence[int], name: str = "engine", repetition_penalty: float | None = None
    ) -> None:
        self.runner, self.tokenizer, self.stop_ids, self.name = runner, tokenizer, list(stop_ids), name
        self.repetition_penalty = repetition_penalty  # the decoding policy's (pipeline.core.decoding), sent with every request

    def run(self, prepared: Sequence[Prepared], batch_size: int, advance: Advance = lambda n: None) -> dict[str, ItemOutput]:
        from ..core.targets.base import GenerationRequest

        todo = [p for p in prepared if not p.skipped]
        bs = max(1, min(batch_size, int(getattr(self.runner, "max_batch_size", batch_size) or batch_size)))
        out: dict[str, ItemOutput] = {}
        for s in range(0, len(todo), bs):
            chunk = todo[s : s + bs]
            reqs = [
                GenerationRequest(
                    input_ids=list(p.input_ids),
                    max_new_tokens=p.max_new_tokens,
                    stop_token_ids=self.stop_ids,
                    request_id=p.item.id,
                    repetition_penalty=self.repetition_penalty,
                )
                for p in chunk
            ]
            t0 = time.perf_counter()
            results = self.runner.generate(reqs)
            dt = time.perf_counter() - t0
            for p, r in zip(chunk, results):
                if r.finish_reason == "error":
                    out[p.item.id] = ItemOutput(p.item.id, "", [], "error", dt, r.error or "engine error")
                    continue
                # never trust the runtime's length: cut again at the first stop id, and at the budget
                text, ids, reason = finalize(list(r.output_ids)[: p.max_new_tokens], self.stop_ids, p.stop_strings, self.tokenizer)
                if reason == "length" and r.finish_reason == "eos" and len(ids) < p.max_new_tokens:
                    reason = "eos"  # the runtime stopped on a stop id and dropped it from output_ids (allowed by the interface)
                lat = r.token_times_s[-1] if r.token_times_s else dt
                out[p.item.id] = ItemOutput(p.item.id, text, ids, reason, lat)
            advance(len(chunk))
        return out

    def teacher_forced_logits(self, seqs: Sequence[Any], batch_size: int, advance: Advance = lambda n: None, into: Any = None) -> Any:
        """Teacher-forced logits from the engine: the engine runner's own ``teacher_forced_logits(prompt,
        continuation) -> (len(continuation), vocab)`` when it has one (e.g. TensorRT-LLM context/generation
        logits), else onnxruntime-genai's generator on the runner's ``og.Model`` (``og_teacher_forced_logits``).
        Fills and returns ``into`` (default: a new list), ``into[i]`` for sequence ``i``.

        Raises ``NotImplementedError`` when the engine exposes no logits (the report says so).
        """
        own = getattr(self.runner, "teacher_forced_logits", None)
        model = getattr(self.runner, "model", None)
        if own is None and not type(model).__module__.startswith("onnxruntime_genai"):
            raise NotImplementedError(f"engine runner {type(self.runner).__name__} exposes no teacher-forced logits")
        out: Any = into if into is not None else [None] * len(seqs)
        for i, s in enumerate(seqs):
            out[i] = (
                own(s.prompt, s.continuation)
                if own is not None
                else og_teacher_forced_logits(model, s.prompt, s.continuation, int(getattr(self.runner, "min_length", 0) or 0))
            )
            advance(1)
        return out

    def close(self) -> None:
        close = getattr(self.runner, "close", None)
        if close:
            close()


def load_hf_model(hf_dir: Path, dtype: str = "float32") -> Any:
    """The export checkpoint in transformers (safetensors only, no remote code), on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=getattr(torch, dtype), trust_remote_code=False, use_safetensors=True)


def checkpoint_dtype(checkpoint: Path) -> str:
    """The ``config.json`` ``torch_dtype`` (``dtype`` in transformers 5) of a checkpoint folder: float32 | bfloat16 |
    float16; float32 when absent, unreadable or another dtype."""
    import json

    try:
        cfg = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return "float32"
    d = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32") if isinstance(cfg, dict) else "float32"
    return d if d in ("float32", "bfloat16", "float16") else "float32"


def reference_dtype(checkpoint: Path | None, requested: str, device: str = "cpu") -> str:
    """The baseline's compute dtype on ``device`` (``cpu`` | ``cuda[:N]``): ``requested`` (float32 | bfloat16 |
    float16); for ``checkpoint`` the source checkpoint's dtype (:func:`checkpoint_dtype`); for ``auto`` float32 on the
    CPU and on CUDA the checkpoint's 16-bit dtype, bfloat16 for a float32 one (the rule of the calibration dtype,
    :func:`pipeline.core.sizing.compute_dtype`)."""
    if requested == "auto":
        if device == "cpu":
            return "float32"
        from ..core.sizing import compute_dtype

        return compute_dtype("cuda", checkpoint_dtype(checkpoint) if checkpoint is not None else "float32")
    if requested == "checkpoint":
        return checkpoint_dtype(checkpoint) if checkpoint is not None else "float32"
    return requested


def device_kind(setting: str) -> str:
    """``eval.device`` -> ``cpu`` | ``cuda``, the kind the evaluate key holds: ``auto`` asks torch (a GPU it sees);
    ``cuda``/``cuda:N`` is ``cuda`` without checking (the runner refuses a missing GPU before any work, exit 2)."""
    s = str(setting).strip().lower()
    if s == "auto":
        from ..core.hostinfo import resolve_torch_device

        return "cpu" if resolve_torch_device(s, "eval.device") == "cpu" else "cuda"
    return "cpu" if s == "cpu" else "cuda"


#: ``eval.batch_size=auto`` on the CPU and for the engine runner: the fixed batch before ``auto``, so CPU results and
#: timings are those of earlier runs.
AUTO_BATCH_CPU = 16


def choose_batch(setting: Any, device: str, model_config: Any, seq_len: int, n_items: int, dtype: str) -> tuple[int, str]:
    """The batch of an HF runner (baseline, simulated) and one sentence saying why.

    ``eval.batch_size``: an integer is used as given; ``auto`` is :data:`AUTO_BATCH_CPU` on the CPU, and on CUDA
    ``floor(ACTIVATION_FRACTION x free / per_item)``, at least 1 and at most ``n_items``: ``free`` is
    ``torch.cuda.mem_get_info`` of the device with the model loaded, ``per_item`` one sequence of ``seq_len`` tokens
    by the planner's estimate of an evaluate batch (:func:`pipeline.core.sizing.eval_activation_bytes`: activations,
    KV cache and logits in ``dtype``) and ``ACTIVATION_FRACTION`` the share calibration's ``auto`` batch uses
    (:data:`pipeline.core.sizing.ACTIVATION_FRACTION`, one half).
    """
    from ..core.config.calibration import parse_batch_size

    n = parse_batch_size(setting)
    if n is not None:
        return n, f"eval.batch_size={n}"
    if device == "cpu":
        return AUTO_BATCH_CPU, f"eval.batch_size=auto: {AUTO_BATCH_CPU} on the CPU"
    import torch

    from ..core.sizing import ACTIVATION_FRACTION, eval_activation_bytes
    from ..facts.geometry import DTYPE_BYTES, ModelShape

    shape = ModelShape.from_hf_config(model_config.to_dict())
    b = DTYPE_BYTES[dtype]
    per = eval_activation_bytes(
        shape.hidden_size, shape.intermediate_size, shape.vocab_size, shape.kv_bytes_per_token(b), max(1, seq_len), 1, b
    )
    free = int(torch.cuda.mem_get_info(torch.device(device))[0])
    fit = int(ACTIVATION_FRACTION * free // max(1, per))
    chosen = max(1, min(fit, max(1, n_items)))
    return chosen, (
        f"eval.batch_size=auto: {chosen} ({ACTIVATION_FRACTION:.0%} of the {free / 1e9:.1f} GB free on {device} at "
        f"{per / 1e6:.1f} MB per {seq_len}-token sequence allow {fit}; {n_items} items)"
    )


def load_reference_model(checkpoint: Path, dtype: str, *, allow_pickle: bool = False, device: str = "cpu") -> Any:
    """The *source* checkpoint (the user's ``model.path``, never the export artifact) in ``dtype`` on ``device``
    (loaded there directly: transformers' ``device_map``; the CPU load is the one before ``eval.device``).

    An independent reference: a defect of the export (a lossy cast, a corrupted tensor) shows up as a
    difference between baseline and candidate instead of being shared by both.  safetensors only unless
    ``model.allow_pickle`` (then transformers' ``weights_only`` loader); never remote code.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from ..core.modelio import loadable_view

    with loadable_view(Path(checkpoint)) as load_dir:  # an allowed outside shard (model.allow_external_files)
        kw = {"device_map": device} if device != "cpu" else {}
        return AutoModelForCausalLM.from_pretrained(
            str(load_dir), dtype=getattr(torch, dtype), trust_remote_code=False, use_safetensors=None if allow_pickle else True, **kw
        )


def load_tokenizer(hf_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=False)
    return tok


# --------------------------------------------------------------------------- speculative decoding readiness
@dataclasses.dataclass
class _DraftState:
    """One item's progress through :func:`draft_acceptance`: ``target[:pos]`` is accepted so far."""

    prompt: list[int]
    target: list[int]
    pos: int = 0
    proposed: int = 0
    accepted: int = 0
    steps: int = 0


def draft_acceptance(
    draft: Any,
    prepared: Sequence[Prepared],
    target_outputs: dict[str, ItemOutput],
    *,
    k: int,
    pad_id: int,
    stop_ids: Sequence[int],
    batch_size: int,
    advance: Advance = lambda n: None,
) -> dict[str, dict[str, int]]:
    """Greedy draft-token acceptance of ``draft`` against the target's greedy tokens.

    Simulates draft-target speculative decoding (Leviathan et al. 2023, "Fast Inference from
    Transformers via Speculative Decoding", greedy case): at each step the draft proposes up to ``k``
    tokens greedily after prompt + the target tokens accepted so far; the proposals matching the
    target's greedy tokens (a prefix) are accepted and the target contributes one token. The target
    sequence is the target's greedy output followed by its eos id when it stopped on eos.

    Returns ``{item_id: {"proposed": int, "accepted": int, "steps": int, "tokens": int}}``.
    """
    runner = HFRunner(draft, None, stop_ids=[], pad_id=pad_id, name="draft")
    state: dict[str, _DraftState] = {}
    for p in prepared:
        o = target_outputs.get(p.item.id)
        if p.skipped or o is None or o.finish_reason == "error":
            continue
        tgt = list(o.output_ids) + ([stop_ids[0]] if o.finish_reason == "eos" and stop_ids else [])
        if tgt:
            state[p.item.id] = _DraftState(prompt=p.input_ids, target=tgt)
    while True:
        active = [s for s in state.values() if s.pos < len(s.target)]
        if not active:
            break
        for b in range(0, len(active), max(1, batch_size)):
            chunk = active[b : b + batch_size]
            props = runner.generate_ids([s.prompt + s.target[: s.pos] for s in chunk], k)
            for s, prop in zip(chunk, props):
                want = s.target[s.pos : s.pos + k]
                n = len(want)
                m = 0
                while m < n and m < len(prop) and prop[m] == want[m]:
                    m += 1
                s.proposed += n
                s.accepted += m
                s.steps += 1
                s.pos += m + 1
        advance(1)
    return {i: {"proposed": s.proposed, "accepted": s.accepted, "steps": s.steps, "tokens": len(s.target)} for i, s in state.items()}
