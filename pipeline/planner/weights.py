"""Weight bytes of a model under a quantization recipe, whole and per tensor/pipeline-parallel rank.

Rule: the one place the planner counts weight bytes (packed weights + their scales + the layers kept in high
precision), from the model's shape alone; every plan (GPU, CPU, the stages' host memory) asks :func:`weight_bytes`.

Formulas and sources:

* **Weights** per recipe = sum over linear layers of the packed weight bytes plus their scales, plus
  the layers kept in high precision (embeddings, norms, biases, ``quant.exclude_modules`` such as
  ``lm_head``, ``quant.sensitive_preset`` layers) in ``quant.export_dtype``.  Packed sizes: FP8 and
  INT8 1 byte, INT4 0.5 byte per weight; scales as ModelOpt exports them for TensorRT-LLM
  (docs/reference/tensorrt_llm.md §3): FP8 one fp32 weight scale and one fp32 activation
  scale per layer; INT8 per-output-channel fp32 weight scales (SmoothQuant adds per-input-channel
  smoothing scales); INT4 AWQ/WO one fp16 scale per ``quant.group_size`` inputs per output channel
  (AWQ adds an fp16 ``prequant_scaling_factor`` per input channel; W4A8 adds an fp32 activation scale).
* **Sharding** (TensorRT-LLM checkpoint layout, docs/source/legacy/architecture/checkpoint.md): column-parallel layers (q, k, v, gate, up)
  split their outputs, row-parallel layers (o, down) their inputs over ``parallel.tp_size``; K/V heads are
  replicated when TP exceeds their count; ``lm_head`` is split along the vocabulary (padded to a
  multiple of TP); the embedding table is replicated (``use_parallel_embedding`` is off by default).
  Pipeline parallelism splits decoder layers as evenly as possible; the embedding sits on the first
  stage, ``lm_head`` and the final norm on the last.  The plan reports the fullest rank.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math

from ..errors import InputError
from ..facts.geometry import DTYPE_BYTES, Linear, ModelShape, kv_heads_per_rank
from ..facts.recipes import RECIPES


def _high_precision(lin: Linear, shape: ModelShape, exclude: list[str], sensitive: str) -> bool:
    names: tuple[str, ...]
    if lin.name == "lm_head":
        names = ("lm_head",)
    else:
        names = (lin.name, lin.name.split(".")[-1])
    if any(fnmatch.fnmatchcase(n, pat) for n in names for pat in exclude):
        return True
    if sensitive in ("first_last", "first_last_attn_out") and lin.layer in (0, shape.num_layers - 1):
        return True
    if sensitive in ("attn_out", "first_last_attn_out") and lin.name.endswith("o_proj"):
        return True
    return False


def _linear_bytes(out_f: int, in_f: int, recipe: str, hp_bytes: float, group: int) -> float:
    """Bytes of one (out_f x in_f) weight under ``recipe`` including its scales (module docstring)."""
    n = out_f * in_f
    if recipe == "auto":  # planned as int8 weight-only: an upper bound at the default 8-bit budget (quant.auto)
        recipe = "int8_wo"
    if recipe == "none":
        return n * hp_bytes
    if recipe == "fp8":
        return n + 2 * 4
    if recipe == "int8_wo":
        return n + out_f * 4
    if recipe == "int8_sq":
        return n + out_f * 4 + in_f * 4
    if recipe in RECIPES and RECIPES[recipe].grouped:  # int4_awq, int4_rtn (int4_wo), w4a8_awq
        b = n / 2 + math.ceil(in_f / group) * out_f * 2
        if recipe in ("int4_awq", "w4a8_awq"):
            b += in_f * 2
        if recipe == "w4a8_awq":
            b += 4
        return b
    raise InputError(f"quant.recipe={recipe!r}: unknown recipe")


def _shard(lin: Linear, shape: ModelShape, tp: int) -> tuple[int, int]:
    """(out, in) features of ``lin`` on one TP rank (see module docstring)."""
    if tp == 1:
        return lin.out_features, lin.in_features
    if lin.split == "col":
        return math.ceil(lin.out_features / tp), lin.in_features
    if lin.split == "row":
        return lin.out_features, math.ceil(lin.in_features / tp)
    if lin.split == "kv":
        return kv_heads_per_rank(shape.num_kv_heads, tp) * shape.head_dim, lin.in_features
    if lin.split == "qkv":
        return (math.ceil(shape.num_heads / tp) + 2 * kv_heads_per_rank(shape.num_kv_heads, tp)) * shape.head_dim, lin.in_features
    if lin.split == "vocab":
        return math.ceil(shape.vocab_size / tp), lin.in_features
    return lin.out_features, lin.in_features


@dataclasses.dataclass
class WeightBreakdown:
    """Bytes per pipeline stage on one TP rank (``stages[i]``) and the totals (whole model, 1 rank).
    ``high_precision_modules`` names what ``high_precision_bytes`` counts under a quantizing recipe: the linear layers
    kept in high precision (``lm_head`` ...), then ``embedding`` and ``norms`` (empty for ``none``: everything is)."""

    total_bytes: int
    quantized_bytes: int
    high_precision_bytes: int
    per_stage_rank_bytes: list[int]
    high_precision_modules: list[str]
    num_parameters: int

    @property
    def max_rank_bytes(self) -> int:
        return max(self.per_stage_rank_bytes)

    @property
    def tp_slice_bytes(self) -> int:
        """All stages of one TP slice: what one token's decode step reads end to end."""
        return sum(self.per_stage_rank_bytes)


def stage_layers(num_layers: int, pp: int) -> list[list[int]]:
    """Decoder layer indices per pipeline stage (as even as possible, earlier stages get the extra)."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def weight_bytes(
    shape: ModelShape,
    recipe: str,
    *,
    hp_dtype: str = "float16",
    group_size: int = 128,
    exclude: list[str] | None = None,
    sensitive: str = "none",
    tp: int = 1,
    pp: int = 1,
) -> WeightBreakdown:
    """Weight bytes of ``shape`` under ``recipe`` (see module docstring), whole model and per rank.

    Args:
        hp_dtype: dtype of the tensors kept in high precision (``quant.export_dtype``).
        exclude: fnmatch patterns of modules kept in high precision (``quant.exclude_modules``).
        tp, pp: tensor / pipeline parallel sizes.
    Returns: :class:`WeightBreakdown` (bytes, ints).
    """
    hp = DTYPE_BYTES[hp_dtype]
    exclude = list(exclude or [])
    stages = stage_layers(shape.num_layers, pp)
    layer_stage = {L: s for s, ls in enumerate(stages) for L in ls}
    per_stage = [0.0] * pp
    total = quant = hpb = 0.0
    hp_modules: list[str] = []
    for lin in shape.linears():
        # a tied lm_head is still counted: the engine keeps its own (vocab-parallel) copy on the last stage
        keep = recipe == "none" or _high_precision(lin, shape, exclude, sensitive)
        r = "none" if keep else recipe
        b_full = _linear_bytes(lin.out_features, lin.in_features, r, hp, group_size)
        o, i = _shard(lin, shape, tp)
        b_rank = _linear_bytes(o, i, r, hp, group_size)
        if lin.bias:
            b_full += lin.out_features * hp
            b_rank += o * hp
        total += b_full
        if keep:
            hpb += b_full
            if recipe != "none":
                hp_modules.append(lin.name)
        else:
            quant += b_full
        s = pp - 1 if lin.layer < 0 else layer_stage[lin.layer]
        per_stage[s] += b_rank
    emb = shape.vocab_size * shape.hidden_size * hp
    norms_layer = 2 * shape.hidden_size * hp
    total += emb + norms_layer * shape.num_layers + shape.hidden_size * hp
    hpb += emb + norms_layer * shape.num_layers + shape.hidden_size * hp
    per_stage[0] += emb
    for s, ls in enumerate(stages):
        per_stage[s] += norms_layer * len(ls)
    per_stage[-1] += shape.hidden_size * hp
    if recipe != "none":  # the embedding table and the norms are in high_precision_bytes too: named with the modules
        hp_modules += ["embedding", "norms"]
    return WeightBreakdown(int(total), int(quant), int(hpb), [int(x) for x in per_stage], _compress(hp_modules), shape.num_parameters)


def _compress(names: list[str]) -> list[str]:
    """``model.layers.0.self_attn.o_proj, model.layers.1...`` -> ``*.self_attn.o_proj (x N)``."""
    by_suffix: dict[str, int] = {}
    out = []
    for n in names:
        if n.startswith("model.layers."):
            suf = n.split(".", 3)[3]
            by_suffix[suf] = by_suffix.get(suf, 0) + 1
        else:
            out.append(n)
    return out + [f"model.layers.*.{s} (x{c})" for s, c in by_suffix.items()]
