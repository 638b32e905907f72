"""The quantize stage's config checks (run by :func:`pipeline.validation.validate` when the quantize stage will run).

* ``parallel.tp_size`` divides the attention heads; KV heads are divided or replicated (TP a multiple of
  them); a vocabulary not divisible by TP is padded (``quant.vocab_padding=pad``, recorded) or rejected;
  ``parallel.pp_size`` <= layers;
* ``calibration.calib_max_seq_length`` <= the model's positions;
* a local calibration file is in a format the stage reads (its suffix, or ``calibration.format`` and the file's bytes:
  :func:`pipeline.data.calibration.detect_format`) and has no malformed line (each one a problem naming file:line, the field, the value and the
  fix) and holds at least ``calibration.min_samples`` non-blank records (an upper bound of the usable samples the stage
  counts after tokenizing, so this never refuses a set the stage would accept), reported together;
* the recipe on the model's linear layers (from ``config.json``): ``quant.group_size`` divides every quantized
  per-rank input dimension, q/k/v are kept whole, something is left to quantize;
* ``target.gpu`` is a catalogue name; the recipe, the export dtype and the KV cache format are supported by the
  target GPU (:mod:`pipeline.facts.recipes`, TensorRT-LLM support matrix).

Never imports torch.
"""

from __future__ import annotations

import math
from typing import Any

from ..core.config.common import Problem
from ..errors import PipelineError


def checks(cfg: Any) -> list[Problem]:
    """Every quantize-stage problem of ``cfg`` (a composed ``PipelineConfig``); never raises for bad values."""
    from ..core.sizing import shape_or_none

    problems: list[Problem] = []
    shape = shape_or_none(cfg)
    if shape is not None:
        problems.extend(_parallel_problems(cfg, shape))
        problems.extend(_linear_problems(cfg, shape))
        problems.extend(_placement_problems(cfg, shape))
    problems.extend(_gpu_problems(cfg))
    problems.extend(_calibration_size_problems(cfg))
    return problems


def _placement_problems(cfg: Any, shape: Any) -> list[Problem]:
    """With ``calibration.max_device_memory_gb`` set, a model over it is calibrated layer by layer (offloaded): refused
    here, before export, for ``calibration.layerwise=false`` and for ``quant=auto`` (whose search needs the whole model),
    as the stage would refuse it after export (pipeline/quantize/placement.py). The compute dtype is the planner's rule
    (float32 on the CPU, the checkpoint's 16-bit dtype on a GPU: ``calibration.device=auto`` counts as a GPU only when
    nvidia-smi sees one). Without a cap the budget is the free memory at run time: the stage decides."""
    c = cfg.calibration
    cap = getattr(c, "max_device_memory_gb", None)
    if cap is None or cfg.quant.recipe == "none":
        return []
    from ..core.hostinfo import local_gpus
    from ..core.sizing import compute_dtype
    from ..facts.geometry import DTYPE_BYTES

    d = str(c.device).strip().lower()
    on_gpu = d.startswith("cuda") or (d == "auto" and bool(local_gpus()))
    dtype = compute_dtype("cuda" if on_gpu else "cpu", str(getattr(cfg.model, "dtype", None) or "float32"))
    need = shape.num_parameters * DTYPE_BYTES.get(dtype, 4)
    if need <= float(cap) * 1e9:
        return []
    size = f"the model's {need / 1e9:.3g} GB in {dtype} exceed calibration.max_device_memory_gb={cap}"
    out = []
    if str(c.layerwise).lower() == "false":
        out.append(
            Problem(
                "calibration.layerwise",
                c.layerwise,
                f"{size}, which needs layer-by-layer calibration.",
                "calibration.layerwise=auto (onload one layer at a time) or a larger calibration.max_device_memory_gb",
            )
        )
    if cfg.quant.recipe == "auto":
        out.append(
            Problem(
                "quant",
                "auto",
                f"{size}; the per-layer format search needs the whole model on the device.",
                "a larger calibration.max_device_memory_gb, or a fixed recipe (e.g. quant=int4_awq)",
            )
        )
    return out


def _calibration_size_problems(cfg: Any) -> list[Problem]:
    """Every malformed line of a local calibration file (file:line, field, value, fix; at most
    :data:`~pipeline.errors.MAX_REPORTED_PROBLEMS` and one saying how many more) and too few records for
    ``calibration.min_samples``, all found before export runs, in one round (fresh-user trial: the stage found them
    after export, one per run).  A file the reader cannot read at all, or a dataset (``format=hf``), is left to the
    field check or the stage."""
    c = cfg.calibration
    if cfg.quant.recipe == "none" or c.format == "hf" or not c.path:
        return []
    from ..core.config.common import file_problems
    from ..data.calibration import CalibrationError, read_raw
    from ..errors import InputError

    out: list[Problem] = []
    malformed = 0
    try:
        rows, blank, _ = read_raw(c, c.path)
    except CalibrationError as e:  # every malformed line, with what the file held besides them
        rows, blank, malformed = e.rows, e.blank, len(e.problems)
        out = file_problems("calibration.path", c.path, e.problems, "malformed line(s)", "correct the line")
    except InputError as e:  # missing: the inputs check names it; a format the reader cannot read: refused here
        return _format_problems(c, str(e))
    if len(rows) >= c.min_samples:
        return out
    bad = f", {malformed} malformed and not counted" if malformed else ""
    return out + [
        Problem(
            "calibration.path",
            c.path,
            f"holds {len(rows)} non-blank record(s) ({blank} blank{bad}), fewer than calibration.min_samples={c.min_samples}.",
            f"provide a larger calibration set, or lower calibration.min_samples (<= {len(rows)})"
            if rows
            else "provide a calibration set with records",
        )
    ]


def _format_problems(c: Any, text: str) -> list[Problem]:
    """The reader's refusal ``text`` of the existing calibration file ``c.path`` (the format rule of
    :func:`pipeline.data.calibration.detect_format`: a suffix ``calibration.format=auto`` cannot map to a format, an
    explicit format the file's bytes contradict, an unknown format) as a problem of the field it names, its own
    wording; none when the file is not there (the inputs check names it: :func:`pipeline.preflight.input_problems`)."""
    from pathlib import Path

    if not Path(c.path).is_file():
        return []
    why, _, fix = text.partition(" Fix: ")
    field, value = ("calibration.format", c.format) if why.startswith("calibration.format=") else ("calibration.path", c.path)
    head = f"{field}={str(value)!r}"
    return [Problem(field, value, why[len(head) :].lstrip(": ") if why.startswith(head) else why, fix)]


def _linear_problems(cfg: Any, shape: Any) -> list[Problem]:
    """The recipe on the model's linear layers, from the shape alone (``config.json``: no weights read), with the
    rules the quantize stage applies again to the loaded model (:func:`pipeline.quantize.preflight.linear_problems`:
    group size vs the per-rank input dimensions, q/k/v kept whole, something left to quantize)."""
    from ..facts.recipes import RECIPES
    from .preflight import excluded_modules, linear_problems

    q = cfg.quant
    if q.recipe == "none" and q.kv_cache_dtype == "none":
        return []
    if q.recipe not in RECIPES or (q.recipe == "auto" and any(f not in RECIPES for f in q.auto.formats)):
        return []  # an unknown recipe or format: the quant field check reports it
    linears = {lin.name: (lin.in_features, lin.out_features) for lin in shape.linears()}
    excluded = excluded_modules(q, list(linears), shape.num_layers)
    return linear_problems(q, linears, excluded, max(1, int(cfg.parallel.tp_size)))


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
    from ..core.sizing import plan_device
    from ..core.targets import TARGETS
    from ..facts.recipes import BF16_MIN_SM, KV_MIN_SM, RECIPE_MIN_SM

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
