"""The TensorRT-LLM checkpoint: ModelOpt's ``export_tensorrt_llm_checkpoint``, then the checks (and the one
repair) of what it wrote against the source model."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from ..core.contracts.quantize import QuantizeArtifact
from ..errors import InputError
from ..facts.families import DECODER_TYPES, NO_TRTLLM_CHECKPOINT
from ..facts.recipes import RECIPES
from .common import KV_CACHE, _quiet
from .modelopt_config import lm_head_excluded
from .preflight import _Source

#: ModelOpt pads vocab_embedding/lm_head rows to a multiple of this when it exports AWQ-format (W4A16_AWQ, W4A8_AWQ)
#: TensorRT-LLM checkpoints (modelopt/torch/export/model_config_export.py, postprocess.pad_embedding_lm_head).
AWQ_VOCAB_MULTIPLE = 64


def check_trtllm_checkpoint(ckpt: Path, facts: dict[str, Any], qcfg: Any, parallel: Any, quant_algo: str | None = None) -> dict[str, Any]:
    """Repair known exporter omissions, then verify the TensorRT-LLM checkpoint against the source model.

    Repair (recorded in the result's ``patched``): ModelOpt 0.47 reads ``rope_theta``/``rope_scaling`` as
    model-config attributes, which transformers 5 moved into ``rope_parameters``; it then writes no
    ``rotary_base``/``rotary_scaling`` and TensorRT-LLM would silently use base 10000 without scaling.
    Missing fields are written from the source config; a *different* value is never overwritten.

    Checks (InputError listing all mismatches): ``rotary_base``, ``rotary_scaling``,
    ``max_position_embeddings``, ``vocab_size``, ``num_attention_heads``, ``num_key_value_heads``,
    ``head_size``, ``num_hidden_layers``, ``norm_epsilon`` equal the source's; ``quant_algo`` and
    ``kv_cache_quant_algo`` are the recipe's (``quant_algo`` overrides it: quant=auto's result); ``mapping`` has ``parallel``'s tp/pp; one
    ``rank{N}.safetensors`` per rank; with a quantized KV cache every attention layer has a finite,
    positive ``kv_cache_scaling_factor``; embedding/lm_head shards have ``padded_vocab / tp`` rows (the vocabulary padded
    to a multiple of tp_size, as preflight records it, or ModelOpt's AWQ padding).
    """
    cpath = ckpt / "config.json"
    c = json.loads(cpath.read_text(encoding="utf-8"))
    patched = _patch_rope(cpath, c, facts)
    algo = quant_algo if quant_algo is not None else RECIPES[qcfg.recipe].quant_algo
    awq_padded = _awq_padded_vocab(c, facts, algo)
    tp, pp = int(parallel.tp_size), int(parallel.pp_size)
    errs = _config_mismatches(c, facts, qcfg, algo, awq_padded, tp, pp)
    scan = _scan_ranks(ckpt, tp)
    errs += _rank_mismatches(scan, facts, qcfg, awq_padded, tp, pp)
    if errs:
        raise InputError(
            f"{cpath}: the exported TensorRT-LLM checkpoint does not match the source model:\n"
            + "\n".join(f"  - {e}" for e in errs)
            + "\nFix: this is an exporter problem for this architecture/recipe; report it with the quant_report.json."
        )
    return {
        "patched": patched,
        "ranks": [p.name for p in scan.ranks],
        "vocab_padded": (
            {"original": facts["vocab_size"], "padded": awq_padded, "by": "ModelOpt AWQ export (multiple of 64, zero rows)"}
            if awq_padded
            else None
        ),
        "kv_cache_scales": {str(k): v for k, v in sorted(scan.kv_layers.items())},
        "config": {
            k: c.get(k) for k in ("architecture", "dtype", "vocab_size", "rotary_base", "rotary_scaling", "quantization", "mapping")
        },
    }


def _patch_rope(cpath: Path, c: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """Write missing ``rotary_base``/``rotary_scaling`` from the source into ``c`` and ``cpath``; returns what was written."""
    from ..core.store import write_json_atomic

    patched: dict[str, Any] = {}
    if "rotary_base" not in c:
        c["rotary_base"] = facts["rope_theta"]
        patched["rotary_base"] = facts["rope_theta"]
    if facts["rope_scaling"] and not c.get("rotary_scaling"):
        sc = dict(facts["rope_scaling"])
        sc.setdefault("type", sc.get("rope_type"))
        c["rotary_scaling"] = sc
        patched["rotary_scaling"] = sc
    if patched:
        write_json_atomic(cpath, c)
    return patched


def _awq_padded_vocab(c: dict[str, Any], facts: dict[str, Any], algo: str | None) -> int | None:
    """The exported vocab size when ModelOpt padded embedding and lm_head rows to a multiple of 64 for AWQ-format
    weights (modelopt/torch/export/postprocess.py pad_embedding_lm_head; the padded rows are zeros), else None."""
    if (
        facts["vocab_size"] % AWQ_VOCAB_MULTIPLE
        and c.get("vocab_size") == -(-facts["vocab_size"] // AWQ_VOCAB_MULTIPLE) * AWQ_VOCAB_MULTIPLE
        and algo in ("W4A16_AWQ", "W4A8_AWQ", "MIXED_PRECISION")
    ):
        return int(c["vocab_size"])
    return None


def _mismatch(field: str, got: Any, want: Any) -> list[str]:
    """``[message]`` when ``got != want`` (floats: relative tolerance 1e-9), else ``[]``."""
    import math

    same = math.isclose(float(got), float(want), rel_tol=1e-9) if isinstance(want, float) and isinstance(got, (int, float)) else got == want
    return [] if same else [f"{field}: exported {got!r} != source {want!r}"]


def _config_mismatches(
    c: dict[str, Any], facts: dict[str, Any], qcfg: Any, algo: str | None, awq_padded: int | None, tp: int, pp: int
) -> list[str]:
    """:func:`check_trtllm_checkpoint`: the checkpoint's ``config.json`` against the source model and ``quant``."""
    errs = _mismatch("rotary_base", c.get("rotary_base"), facts["rope_theta"])
    want_sc = facts["rope_scaling"]
    got_sc = c.get("rotary_scaling")
    if want_sc:
        if (
            not isinstance(got_sc, dict)
            or any(got_sc.get(k) != v for k, v in want_sc.items() if k not in ("type", "rope_type"))
            or (got_sc.get("rope_type") or got_sc.get("type")) != want_sc.get("rope_type")
        ):
            errs.append(f"rotary_scaling: exported {got_sc!r} != source {want_sc!r}")
    elif got_sc:
        errs.append(f"rotary_scaling: exported {got_sc!r} but the source has none")
    errs += _mismatch("vocab_size", c.get("vocab_size"), awq_padded or facts["vocab_size"])
    for f, k in (
        ("max_position_embeddings", "max_position_embeddings"),
        ("num_attention_heads", "num_attention_heads"),
        ("num_key_value_heads", "num_key_value_heads"),
        ("head_size", "head_dim"),
        ("num_hidden_layers", "num_hidden_layers"),
        ("norm_epsilon", "norm_epsilon"),
    ):
        errs += _mismatch(f, c.get(f), facts[k])
    q = c.get("quantization") or {}
    errs += _mismatch("quantization.quant_algo", q.get("quant_algo"), algo)
    errs += _mismatch("quantization.kv_cache_quant_algo", q.get("kv_cache_quant_algo"), KV_CACHE[qcfg.kv_cache_dtype][0])
    m = c.get("mapping") or {}
    errs += _mismatch("mapping.tp_size", m.get("tp_size"), tp)
    errs += _mismatch("mapping.pp_size", m.get("pp_size", 1), pp)
    return errs


#: safetensors dtype names of unquantized embedding / LM head tables
FLOAT_TABLES = ("F32", "F16", "BF16")


class _RankScan(NamedTuple):
    """What :func:`_scan_ranks` read from the ``rank*.safetensors`` files."""

    ranks: list[Path]
    shard_rows: set[int]  # rows of the embedding/lm_head shards
    kv_layers: dict[int, float]  # global layer index -> smallest kv_cache_scaling_factor (NaN if not finite)


def _scan_ranks(ckpt: Path, tp: int) -> _RankScan:
    """Read shard shapes and KV-cache scales of every rank file. Layer indices are local to a pipeline rank
    (rank = pp_rank * tp_size + tp_rank); they are mapped to global ones."""
    import math

    from safetensors import safe_open

    ranks = sorted(ckpt.glob("rank*.safetensors"))
    kv_local: dict[tuple[int, int], float] = {}
    layers_per_pp: dict[int, int] = {}
    shard_rows: set[int] = set()
    for r, p in enumerate(ranks):
        pp_rank = r // tp
        with safe_open(str(p), "pt") as f:
            for k in f.keys():
                # a quantized LM head (quant.exclude_modules without lm_head) holds packed integers whose row count is
                # not the vocabulary's (two int4 per byte): only float tables are counted
                if k in ("lm_head.weight", "transformer.vocab_embedding.weight"):
                    table = f.get_slice(k)
                    if table.get_dtype() in FLOAT_TABLES:
                        shard_rows.add(table.get_shape()[0])
                if k.startswith("transformer.layers."):
                    local = int(k.split(".")[2])
                    layers_per_pp[pp_rank] = max(layers_per_pp.get(pp_rank, 0), local + 1)
                if k.endswith("attention.kv_cache_scaling_factor"):
                    local = int(k.split(".layers.")[1].split(".")[0])
                    t = f.get_tensor(k).float()
                    v = float(t.min()) if bool(t.isfinite().all()) else float("nan")
                    kv_local[(pp_rank, local)] = min(kv_local.get((pp_rank, local), math.inf), v)
    offsets, acc = {}, 0
    for pr in sorted(layers_per_pp):
        offsets[pr], acc = acc, acc + layers_per_pp[pr]
    return _RankScan(ranks, shard_rows, {offsets.get(pr, 0) + local: v for (pr, local), v in kv_local.items()})


def _rank_mismatches(scan: _RankScan, facts: dict[str, Any], qcfg: Any, awq_padded: int | None, tp: int, pp: int) -> list[str]:
    """:func:`check_trtllm_checkpoint`: one rank file per rank, embedding shard rows, KV-cache scales."""
    import math

    errs: list[str] = []
    world = tp * pp
    if [p.name for p in scan.ranks] != [f"rank{i}.safetensors" for i in range(world)]:
        errs.append(f"rank files: {[p.name for p in scan.ranks]} (expected rank0..rank{world - 1}.safetensors)")
    padded = -(-facts["vocab_size"] // tp) * tp  # preflight's vocab_padding (quant.vocab_padding=reject stopped before)
    if awq_padded:
        padded = -(-awq_padded // tp) * tp
    if scan.shard_rows and scan.shard_rows != {padded // tp}:
        errs.append(f"embedding/lm_head shard rows {sorted(scan.shard_rows)} != padded vocab {padded} / tp_size {tp}")
    if qcfg.kv_cache_dtype != "none":
        missing = [i for i in range(facts["num_hidden_layers"]) if i not in scan.kv_layers]
        bad = {i: v for i, v in scan.kv_layers.items() if not (math.isfinite(v) and v > 0)}
        if missing:
            errs.append(f"kv_cache_scaling_factor missing on attention layer(s) {missing}")
        if bad:
            errs.append(f"kv_cache_scaling_factor not finite and positive on layer(s) {bad}")
    return errs


@dataclasses.dataclass
class _Exported:
    """The TensorRT-LLM checkpoint folder, its post-export checks and the notes for the report."""

    ckpt: Path
    post: dict[str, Any]
    notes: list[str]


def _export_trtllm(out: Path, qcfg: Any, parallel: Any, src: _Source, model: Any, checked_quant_algo: str | None) -> _Exported:
    """Write ``trtllm_checkpoint/`` (ModelOpt ``export_tensorrt_llm_checkpoint`` of ``model``, tp/pp ranks) and check
    it (:func:`check_trtllm_checkpoint`); for :data:`NO_TRTLLM_CHECKPOINT` architectures a ``NOT_EXPORTED`` note
    instead (target=tensorrt_llm refuses the model at config time).

    The exporter rewrites the model's weights and quantizer buffers in place (it re-smooths fused q/k/v and gate/up),
    so ``model`` is not usable afterwards: the caller passes the calibrated model only once its quant state is written,
    and restores the state for anything that follows (:func:`pipeline.quantize.run._quantize`). No copy is made.
    """
    import modelopt.torch.export as mte
    import torch

    ckpt = out / QuantizeArtifact.TRTLLM_CHECKPOINT
    decoder = DECODER_TYPES.get(src.facts["model_type"])
    if decoder is None:
        why = NO_TRTLLM_CHECKPOINT[src.facts["model_type"]]
        ckpt.mkdir()
        (ckpt / "NOT_EXPORTED").write_text(why + "\n", encoding="utf-8")
        return _Exported(ckpt, {"skipped": why}, [f"no TensorRT-LLM checkpoint: {why}"])
    with _quiet("export_tensorrt_llm_checkpoint"), warnings.catch_warnings():
        if lm_head_excluded(src.excluded):  # ModelOpt 0.47 says this for any LM head not disabled by its own padding rule
            warnings.filterwarnings("ignore", message=r"Enable lm_head quantization")
        mte.export_tensorrt_llm_checkpoint(
            model,
            decoder,
            getattr(torch, qcfg.export_dtype),
            export_dir=ckpt,
            inference_tensor_parallel=int(parallel.tp_size),
            inference_pipeline_parallel=int(parallel.pp_size),
        )
    post = check_trtllm_checkpoint(ckpt, src.facts, qcfg, parallel, quant_algo=checked_quant_algo)
    return _Exported(ckpt, post, [])
