"""Cross-field configuration checks (``cross_field_problems``), run on every invocation.

Called by :func:`pipeline.validation.validate` after the per-group field checks, so every problem of a
config is reported together.  Fast (well under a second for the default model) and never imports
torch or transformers: the model shape comes from ``config.json`` / ``model.hf_config``, prompt lengths
from :class:`pipeline.core.tokenization.TextCodec` (``tokenizers`` + ``jinja2``, no transformers), the one
tokenization path every runtime uses.

Checks (each a :class:`~pipeline.core.config.common.Problem` naming field, value and fix):

* ``build.max_input_len < build.max_seq_len``; ``max_seq_len (+ speculative.max_draft_len) <=
  max_position_embeddings x rope factor`` unless ``allow_unsafe_lengths=true`` (then recorded in the plan);
* ``build.max_num_tokens >= build.max_input_len`` unless ``build.enable_chunked_context``; chunked
  context needs ``build.use_paged_context_fmha`` (TensorRT-LLM plugin/plugin.py);
* ``parallel.tp_size`` divides the attention heads; KV heads are divided or replicated (TP a multiple of
  them); a vocabulary not divisible by TP is padded (``quant.vocab_padding=pad``, recorded) or rejected;
  ``parallel.pp_size`` <= layers;
* ``target.gpu`` is a catalogue name; the recipe and KV format are supported by the target GPU;
* the business eval set's prompts, rendered and tokenized as the engine will see them, fit
  ``build.max_input_len`` (max and P99 reported), and prompt + ``max_new_tokens`` fit ``max_seq_len``;
* ``calibration.calib_max_seq_length`` <= the model's positions.

(``tokens_per_block`` being a power of two is checked by the ``build`` group itself.)
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import Any

from ..core.config.common import Problem
from ..core.errors import PipelineError

_LATER_THAN_QUANTIZE = ("quantize", "build", "evaluate", "package", "benchmark")
_NEEDS_BUILD = ("build", "evaluate", "package", "benchmark")


def cross_field_problems(cfg: Any) -> list[Problem]:
    """Every cross-field problem of ``cfg`` (a composed ``PipelineConfig``); never raises for bad values."""
    from .plan import load_shape

    problems: list[Problem] = []
    b = cfg.build
    stages = set(cfg.stages)
    needs_build = bool(stages & set(_NEEDS_BUILD))  # the engine limits matter only when an engine is built/used
    needs_quant = bool(stages & set(_LATER_THAN_QUANTIZE))
    if needs_build:
        problems.extend(_length_problems(b))
    shape = None
    try:
        shape, _src = load_shape(cfg)
    except PipelineError:
        shape = None  # the export stage / `pipeline plan` reports an unreadable checkpoint with its own message
    if shape is not None:
        if needs_build:
            problems.extend(_position_problems(cfg, shape))
        if needs_quant:
            problems.extend(_parallel_problems(cfg, shape))
    if needs_quant:
        problems.extend(_gpu_problems(cfg))
    if shape is not None:
        problems.extend(_eval_set_problems(cfg))
    return problems


def _length_problems(b: Any) -> list[Problem]:
    problems: list[Problem] = []
    if b.max_input_len >= b.max_seq_len:
        problems.append(
            Problem(
                "build.max_input_len",
                b.max_input_len,
                f"must be below build.max_seq_len={b.max_seq_len} (max_seq_len = prompt + generated tokens).",
                f"set build.max_seq_len > {b.max_input_len} or build.max_input_len < {b.max_seq_len}",
            )
        )
    if b.max_num_tokens < b.max_input_len and not b.enable_chunked_context:
        problems.append(
            Problem(
                "build.max_num_tokens",
                b.max_num_tokens,
                f"is below build.max_input_len={b.max_input_len}: a full prompt cannot be processed in one step.",
                f"set build.max_num_tokens >= {b.max_input_len}, or build.enable_chunked_context=true",
            )
        )
    if b.enable_chunked_context and not b.use_paged_context_fmha:
        problems.append(Problem("build.enable_chunked_context", True, "needs paged context FMHA.", "set build.use_paged_context_fmha=true"))
    return problems


def _position_problems(cfg: Any, shape: Any) -> list[Problem]:
    problems: list[Problem] = []
    b = cfg.build
    if b is not None:
        limit = shape.max_seq_len_limit
        total = b.max_seq_len + max(0, b.speculative.max_draft_len)
        if total > limit and not getattr(cfg, "allow_unsafe_lengths", False):
            extra = f" + speculative.max_draft_len={b.speculative.max_draft_len}" if b.speculative.max_draft_len else ""
            how = (
                f"max_position_embeddings={shape.max_positions} x rope factor {shape.rope_factor:g}"
                if limit != shape.max_positions
                else f"max_position_embeddings={shape.max_positions}"
            )
            problems.append(
                Problem(
                    "build.max_seq_len",
                    b.max_seq_len,
                    f"{extra and extra.lstrip() + f' = {total} '}exceeds the model's {limit} positions ({how}).",
                    f"set build.max_seq_len <= {limit - max(0, b.speculative.max_draft_len)}, "
                    "or allow_unsafe_lengths=true to accept it (recorded in the plan)",
                )
            )
    return problems


def _parallel_problems(cfg: Any, shape: Any) -> list[Problem]:
    problems: list[Problem] = []
    q, par = cfg.quant, cfg.parallel
    if q is not None:
        tp, pp = max(1, par.tp_size), max(1, par.pp_size)
        if shape.num_heads % tp:
            ok = [t for t in (1, 2, 4, 8, 16) if shape.num_heads % t == 0]
            problems.append(
                Problem("parallel.tp_size", par.tp_size, f"does not divide the {shape.num_heads} attention heads.", f"use one of {ok}")
            )
        elif shape.num_kv_heads % tp and tp % shape.num_kv_heads:
            problems.append(
                Problem(
                    "parallel.tp_size",
                    par.tp_size,
                    f"neither divides nor is a multiple of the {shape.num_kv_heads} KV heads (they can be split or replicated, not both).",
                    "use a TP size that divides or is a multiple of the KV heads",
                )
            )
        if shape.vocab_size % tp and q.vocab_padding == "reject":
            padded = math.ceil(shape.vocab_size / tp) * tp
            problems.append(
                Problem(
                    "quant.vocab_padding",
                    "reject",
                    f"vocab_size={shape.vocab_size} is not divisible by tp_size={tp}.",
                    f"set quant.vocab_padding=pad (pads to {padded}) or a TP size dividing {shape.vocab_size}",
                )
            )
        if pp > shape.num_layers:
            problems.append(
                Problem(
                    "parallel.pp_size",
                    par.pp_size,
                    f"exceeds the model's {shape.num_layers} layers.",
                    f"use parallel.pp_size <= {shape.num_layers}",
                )
            )
        if q.recipe != "none" and cfg.calibration.calib_max_seq_length > shape.max_seq_len_limit:
            problems.append(
                Problem(
                    "calibration.calib_max_seq_length",
                    cfg.calibration.calib_max_seq_length,
                    f"exceeds the model's {shape.max_seq_len_limit} positions.",
                    f"set calibration.calib_max_seq_length <= {shape.max_seq_len_limit}",
                )
            )
    return problems


def _gpu_problems(cfg: Any) -> list[Problem]:
    from ..build.targets import TARGETS
    from ..facts.recipes import BF16_MIN_SM, KV_MIN_SM, RECIPE_MIN_SM
    from .plan import plan_device

    if cfg.target.name != "auto" and cfg.target.name not in TARGETS:
        return []  # the target.name field check reports it
    try:
        kind, gpu, _why = plan_device(cfg)
    except PipelineError:
        from ..facts.gpus import CATALOGUE

        return [Problem("target.gpu", cfg.target.gpu, "is not in the GPU catalogue.", f"use one of {sorted(CATALOGUE)}")]
    out: list[Problem] = []
    if kind != "gpu" or gpu is None:
        return out
    q = cfg.quant
    if gpu.sm < RECIPE_MIN_SM.get(q.recipe, 0):
        out.append(
            Problem(
                "quant.recipe",
                q.recipe,
                f"needs compute capability >= {RECIPE_MIN_SM[q.recipe] / 10:.1f}; "
                f"the target {gpu.name} is {gpu.compute_capability} (TensorRT-LLM support matrix).",
                f"use one of {gpu.quant_formats}, or a newer GPU",
            )
        )
    dtype = q.export_dtype if q.recipe != "none" else cfg.model.dtype
    if dtype == "bfloat16" and gpu.sm < BF16_MIN_SM:
        out.append(
            Problem(
                "model.dtype" if q.recipe == "none" else "quant.export_dtype",
                dtype,
                f"bfloat16 needs compute capability >= {BF16_MIN_SM / 10:.1f}; the target {gpu.name} is {gpu.compute_capability}.",
                "use float16 on this GPU, or a newer GPU",
            )
        )
    if gpu.sm < KV_MIN_SM.get(q.kv_cache_dtype, 0):
        out.append(
            Problem(
                "quant.kv_cache_dtype",
                q.kv_cache_dtype,
                f"needs compute capability >= {KV_MIN_SM[q.kv_cache_dtype] / 10:.1f}; the target {gpu.name} is {gpu.compute_capability}.",
                f"use one of {gpu.kv_formats}",
            )
        )
    return out


# --------------------------------------------------------------------------- eval set
def _file_sig(p: Path) -> tuple[str, int, int]:
    st = p.stat()
    return (str(p), st.st_size, st.st_mtime_ns)


def _eval_rows(path: Path) -> list[dict[str, Any]]:
    """The eval set's lines as objects (a foreign format, a task YAML or a question/answer JSONL, as the eval loader
    maps it; malformed lines are left out: the eval loader reports them with their line number)."""
    from ..core.errors import InputError
    from ..evaluate import foreign
    from ..evaluate.dataset import read_eval_set

    text = path.read_text(encoding="utf-8-sig", errors="replace")
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
    if foreign.is_task_yaml(path, text) or foreign.qa_mapping(rows) is not None:
        try:
            items = read_eval_set(path).items
        except InputError:
            return []
        return [
            {"id": it.id, "prompt": it.prompt, "messages": it.messages, "max_new_tokens": it.max_new_tokens, "slice": it.slice}
            for it in items
        ]
    return rows


@functools.lru_cache(maxsize=8)
def _prompt_lengths(
    eval_sig: tuple[str, int, int], tok_sig: tuple[str, int, int], limit: int | None, apply_chat_template: bool, default_new: int
) -> tuple[list[int], list[int], list[str]]:
    """(prompt token lengths, prompt + max_new_tokens, ids) for the eval set; cached per file version."""
    from ..core import tokenization
    from ..core.errors import InputError

    try:
        tok = tokenization.TextCodec.from_dir(Path(tok_sig[0]).parent)
    except tokenization.TokenizationError as e:
        raise InputError(str(e)) from None
    lens, totals, ids = [], [], []
    slices: list[str] = []
    for i, row in enumerate(_eval_rows(Path(eval_sig[0]))):
        prompt, messages = row.get("prompt"), row.get("messages")
        if not isinstance(prompt, str) and not isinstance(messages, list):
            continue
        try:
            n = len(
                tokenization.encode_prompt(
                    tok,
                    prompt if isinstance(prompt, str) else None,
                    messages if isinstance(messages, list) else None,
                    apply_chat_template=apply_chat_template,
                )
            )
        except Exception:
            continue
        mnt = row.get("max_new_tokens")
        mnt = mnt if isinstance(mnt, int) and not isinstance(mnt, bool) and mnt > 0 else default_new
        lens.append(n)
        totals.append(n + mnt)
        ids.append(str(row.get("id", f"line {i + 1}")))
        slices.append(str(row.get("slice", "")))
    if limit is not None and 0 < limit < len(ids):
        # the items the evaluate stage will use: eval.limit takes them round-robin across slices
        from ..evaluate.dataset import EvalItem, stratified_head

        items = [EvalItem(id=f"{k}", slice=sl, metric="", reference=None) for k, sl in enumerate(slices)]
        keep = {int(it.id) for it in stratified_head(items, limit)}
        sel = sorted(keep)
        lens, totals, ids = [lens[k] for k in sel], [totals[k] for k in sel], [ids[k] for k in sel]
    return lens, totals, ids


def eval_prompt_stats(cfg: Any) -> dict[str, Any] | None:
    """Token-length statistics of the eval set's prompts as the engine sees them, or ``None`` when the
    eval set or a fast tokenizer is not available.  Keys: count, max, p99, max_id, max_total, max_total_id."""
    from ..core.config import resolve_path

    if not cfg.eval.eval_set or not cfg.model.path:
        return None
    try:
        ep = resolve_path(cfg.eval.eval_set)
        mp = resolve_path(cfg.model.path)
        if ep is None or mp is None or not ep.is_file() or not (mp / "tokenizer.json").is_file():
            return None
    except (OSError, ValueError):
        return None  # the eval loader / export stage name the bad path
    try:
        lens, totals, ids = _prompt_lengths(
            _file_sig(ep),
            _file_sig(mp / "tokenizer.json"),
            cfg.eval.limit,
            bool(cfg.model.apply_chat_template),
            int(cfg.eval.max_new_tokens),
        )
    except (OSError, ValueError, ImportError):
        return None
    if not lens:
        return None
    s = sorted(lens)
    p99 = s[min(len(s) - 1, max(0, math.ceil(0.99 * len(s)) - 1))]
    imax = max(range(len(lens)), key=lens.__getitem__)
    itot = max(range(len(totals)), key=totals.__getitem__)
    return {
        "count": len(lens),
        "max": lens[imax],
        "p99": p99,
        "max_id": ids[imax],
        "max_total": totals[itot],
        "max_total_id": ids[itot],
        "file": str(ep),
    }


def _eval_set_problems(cfg: Any) -> list[Problem]:
    if not any(s in ("evaluate", "benchmark") for s in cfg.stages):
        return []
    if os.environ.get("PIPELINE_SKIP_EVAL_LENGTH_CHECK") == "1":
        return []
    st = eval_prompt_stats(cfg)
    if st is None:
        return []
    b = cfg.build
    out = []
    if st["max"] > b.max_input_len:
        out.append(
            Problem(
                "build.max_input_len",
                b.max_input_len,
                f"the eval set {st['file']} has prompts up to {st['max']} tokens "
                f"(item {st['max_id']}; P99 {st['p99']} over {st['count']} prompts, rendered with the chat template).",
                f"set build.max_input_len >= {st['max']} (and build.max_seq_len above it), or shorten the prompts",
            )
        )
    if st["max_total"] > b.max_seq_len:
        out.append(
            Problem(
                "build.max_seq_len",
                b.max_seq_len,
                f"prompt + max_new_tokens reaches {st['max_total']} tokens on the eval set (item {st['max_total_id']}).",
                f"set build.max_seq_len >= {st['max_total']}",
            )
        )
    return out
