"""Deploy ModelOpt's quantized weights on onnxruntime-genai (CPU) without re-quantizing them.

The quantize stage leaves a ModelOpt *simulated-quantization* model (``pipeline.core.quant_state.load_simulated_model``):
each quantized ``nn.Linear`` holds the (AWQ-smoothed) weight ``W'``, a weight quantizer whose ``amax``
gives the per-block scale ``s = amax / (2**(bits-1) - 1)`` and, for AWQ, an input quantizer with a
``pre_quant_scale`` ``p`` (per input channel).  The simulated output is ``y = Q(W') @ (p * x)`` with
``Q(W') = round(W' / s) * s``.

This module writes those exact integers and scales into a GPTQ-format checkpoint (``qweight`` /
``qzeros`` / ``scales`` / ``g_idx`` + ``quantization_config``, the format onnxruntime-genai's model
builder reads through ``models/loaders/gptq.py``) and handles ``p`` exactly:

* ``p`` shared by every projection that reads an RMSNorm output (q/k/v, gate/up) is folded into the
  norm weight (``RMSNorm(x) * w * p``);
* ``p`` of ``o_proj`` is folded into the output rows of ``v_proj`` when it is constant across the
  query heads that share one KV head (attention output channels are linear in V's channels);
* ``p`` of ``down_proj`` is folded into the output rows of ``up_proj`` (``silu(g) * (u * p)``);
  a row scale of a block-quantized weight is a scale of its block scales, so the integers stay;
* anything else (AWQ gives q/k/v different ``p``) gets an ONNX ``Mul`` by ``p`` in front of that
  projection's ``MatMulNBits`` (:func:`insert_prescale_muls`), so nothing is re-rounded.

No weight is re-quantized: :func:`convert` checks that ``q * s`` reproduces ModelOpt's fake-quantized
weight (max abs error <= 1e-5 x max|W|) and raises :class:`ConversionError` otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ....core.artifacts import TOKENIZER_COPY_FILES as TOKENIZER_FILES  # the one list of tokenizer file names

if TYPE_CHECKING:
    import torch

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


class ConversionError(ValueError):
    """The quantized model cannot be expressed exactly in the onnxruntime-genai checkpoint format."""


def _is_quantized(lin: Any) -> bool:
    wq = getattr(lin, "weight_quantizer", None)
    return wq is not None and bool(getattr(wq, "is_enabled", False))


def _pre_quant_scale(lin: Any) -> torch.Tensor | None:
    iq = getattr(lin, "input_quantizer", None)
    p = getattr(iq, "pre_quant_scale", None) if iq is not None else None
    return None if p is None else p.detach().float().reshape(-1)


def channel_block(in_features: list[int]) -> int:
    """The one block size per-channel quantized weights are written with, for a model whose quantized linears read
    ``in_features``.

    A per-channel scale is constant along a row, so any block that divides ``in`` repeats it exactly; the GPTQ reader
    of onnxruntime-genai takes one ``group_size`` for the whole checkpoint, and ``MatMulNBits`` needs a power of two
    >= 16 (onnxruntime ``contrib_ops/cpu/quantization/matmul_nbits.cc``). So: the largest power of two <= 128 that
    divides every ``in_features`` (128 for the usual widths; 64 when the hidden size is 64).
    Raises ConversionError when that is below 16.
    """
    import math

    g = math.gcd(*in_features) if in_features else 128
    block = 128
    while block >= 16 and g % block:
        block //= 2
    if block < 16:
        raise ConversionError(
            f"in_features {sorted(set(in_features))} have no common power-of-two block >= 16 (MatMulNBits' smallest block)"
        )
    return block


def integer_weights(lin: Any, channel_group: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The integers and scales of a ModelOpt weight-quantized linear.

    Args:
        lin: the quantized linear.
        channel_group: block size for a per-channel quantizer (:func:`channel_block`, one for the whole model);
            ``None`` = 128 when it divides ``in``, else ``in``.
    Returns:
        ``(q, scale, bits, group)``: ``q`` int32 ``[out, in]`` in ``[-2**(bits-1), 2**(bits-1)-1]``,
        ``scale`` float32 ``[out, in // group]``, with ``q * scale`` (repeated over groups) equal to
        ``lin.weight_quantizer(lin.weight)``. Per-channel quantizers are returned with
        ``group = channel_group`` and the channel scale repeated, which is the same dequantized weight.
    Raises:
        ConversionError: non-integer formats (FP8/NVFP4), or integers that do not reproduce the
            fake-quantized weight.
    """
    import torch

    wq = lin.weight_quantizer
    bits = wq.num_bits
    if not isinstance(bits, int):
        raise ConversionError(f"weight format {bits} (floating point) has no onnxruntime-genai CPU kernel")
    w = lin.weight.detach()
    with torch.no_grad():
        fq = wq(w).detach().float()
    out_f, in_f = fq.shape
    maxb = 2 ** (bits - 1) - 1
    amax = wq.amax.detach().float().reshape(out_f, -1)
    nb = amax.shape[1]
    if nb == 1:  # per-channel: express as blocks of channel_group with the same scale
        group = channel_group or (128 if in_f % 128 == 0 else in_f)
        if in_f % group:
            raise ConversionError(f"in_features {in_f} is not a multiple of the block size {group}")
        amax = amax.expand(out_f, in_f // group).contiguous()
    else:
        if in_f % nb:
            raise ConversionError(f"in_features {in_f} is not a multiple of the {nb} quantization blocks")
        group = in_f // nb
    scale = amax / maxb
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(fq.reshape(out_f, -1, group) / safe[..., None]).clamp_(-maxb - 1, maxb)
    q = torch.where(scale[..., None] > 0, q, torch.zeros_like(q))
    err = (q * scale[..., None] - fq.reshape(out_f, -1, group)).abs().max().item()
    tol = 1e-5 * max(fq.abs().max().item(), 1e-12)
    if err > tol:
        raise ConversionError(f"integer weights do not reproduce the fake-quantized weight (max error {err:.3g} > {tol:.3g})")
    return q.reshape(out_f, in_f).to(torch.int32), scale.contiguous(), bits, group


def _pack_int32(vals: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned ``bits``-bit values along ``dim`` into int32 words, lowest bits first (GPTQ/AutoGPTQ layout)."""
    import numpy as np
    import torch

    per = 32 // bits
    a = vals.cpu().numpy().astype(np.uint32)
    if dim == 1:
        a = a.T
    if a.shape[0] % per:
        raise ConversionError(f"dimension {a.shape[0]} is not a multiple of {per} ({bits}-bit packing)")
    a = a.reshape(a.shape[0] // per, per, a.shape[1])
    words = np.zeros((a.shape[0], a.shape[2]), dtype=np.uint32)
    for k in range(per):
        words |= a[:, k, :] << np.uint32(k * bits)
    words = words.view(np.int32)
    if dim == 1:
        words = words.T
    return torch.from_numpy(np.ascontiguousarray(words))


def gptq_tensors(q: torch.Tensor, scale: torch.Tensor, bits: int, group: int) -> dict[str, torch.Tensor]:
    """GPTQ (v1, ``desc_act=false``) tensors for signed integers ``q [out, in]`` and ``scale [out, in/group]``.

    Layout (AutoGPTQ): ``qweight`` int32 ``[in*bits/32, out]``, ``qzeros`` int32 ``[in/group, out*bits/32]``
    holding ``zero - 1`` with ``zero = 2**(bits-1)``, ``scales`` float32 ``[in/group, out]``, ``g_idx``
    int32 ``[in]``.
    """
    import torch

    zero = 2 ** (bits - 1)
    out_f, in_f = q.shape
    qu = (q + zero).T.contiguous()  # [in, out], unsigned
    ng = in_f // group
    zeros = torch.full((ng, out_f), zero - 1, dtype=torch.int32)
    return {
        "qweight": _pack_int32(qu, bits, dim=0),
        "qzeros": _pack_int32(zeros, bits, dim=1),
        "scales": scale.T.contiguous().float(),
        "g_idx": (torch.arange(in_f, dtype=torch.int32) // group),
    }


def _layers(model: Any) -> list[Any]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ConversionError(f"{type(model).__name__}: no model.layers; only decoder-only LLaMA-style models are supported")
    return list(layers)


def reblock(scale: torch.Tensor, group: int, block_size: int | None) -> tuple[torch.Tensor, int]:
    """The same block-quantized weight with smaller blocks: each scale repeated ``group // block_size`` times.

    Exact (every integer keeps its scale); used to pick the MatMulNBits block size that runs fastest.
    Returns ``(scale [out, in/block_size], block_size)``; unchanged when ``block_size`` is None or >= ``group``.
    Raises ConversionError when ``block_size`` does not divide ``group``.
    """
    if not block_size or block_size >= group:
        return scale, group
    if group % block_size:
        raise ConversionError(f"block size {block_size} does not divide the quantization group size {group}")
    return scale.repeat_interleave(group // block_size, dim=1).contiguous(), block_size


def convert(model: Any, hf_dir: Path, out: Path, *, block_size: int | None = None, consume: bool = False) -> dict[str, Any]:
    """Write a GPTQ-format HF checkpoint of ModelOpt's simulated-quant ``model`` into ``out``.

    Args:
        model: ``transformers`` causal LM with ModelOpt quantizers (``load_simulated_model``), float32.
        hf_dir: the export checkpoint folder (config + tokenizer files are copied from it).
        out: output folder (created).
        block_size: MatMulNBits block size (a divisor of the group size; smaller blocks repeat the scales, exact);
            ``None`` = the group size.
        consume: free each decoder layer's weights once converted (the layer is moved to the meta device), so the
            model and its converted copy never coexist whole; ``model`` is unusable afterwards.
    Returns:
        ``{"bits", "group_size", "quantized_linears", "folded": {...}, "prescale_muls": [(node, tensor)],
        "lm_head_quantized", "untied_embeddings"}`` (``untied_embeddings``: the source tied the LM head to the
        embedding; the checkpoint written has both as separate tensors, ``tie_word_embeddings: false``); ``prescale_muls`` must be applied to the built ONNX model with
        :func:`insert_prescale_muls`.
    Raises:
        ConversionError: a layout that cannot be expressed exactly (mixed quantized/unquantized
            projections, fused qkv/gate_up modules, floating-point formats).
    """
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    geom = _KvGeometry(n_kv, n_heads // n_kv, getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
    try:
        chan: int | None = channel_block(_quantized_in_features(model))
    except ConversionError:
        chan = None  # no common block: only a model without per-channel weights converts (else the mixed-size error below)
    acc = _Converted(channel_group=chan)
    sd = {k: v.detach().float() for k, v in model.state_dict().items() if "_quantizer" not in k}
    for k in ("model.embed_tokens.weight", "model.norm.weight"):
        acc.tensors[k] = sd[k].clone()
    for i, layer in enumerate(_layers(model)):
        _convert_layer(i, layer, sd, geom, block_size, acc)
        if consume:
            layer.to("meta")
            sd = {k: v for k, v in sd.items() if not k.startswith(f"model.layers.{i}.")}
    acc.folded["onnx_mul"] = len(acc.muls)
    lm_quant = _convert_lm_head(model, sd, block_size, acc)
    if len(acc.bits_seen) != 1 or len(acc.groups_seen) != 1:
        raise ConversionError(
            f"mixed bit widths {sorted(acc.bits_seen)} / group sizes {sorted(acc.groups_seen)} are not supported by the reader"
        )
    bits, group = acc.bits_seen.pop(), acc.groups_seen.pop()
    blocks = block_size if block_size and block_size < group else group
    save_file({k: v.contiguous() for k, v in acc.tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    tied = _write_config(Path(hf_dir), out, bits, blocks)
    for f in TOKENIZER_FILES:
        if (Path(hf_dir) / f).is_file():
            shutil.copy2(Path(hf_dir) / f, out / f)
    return {
        "bits": bits,
        "group_size": group,
        "block_size": blocks,
        "quantized_linears": acc.n_quant + int(lm_quant),
        "folded": acc.folded,
        "prescale_muls": acc.muls,
        "lm_head_quantized": lm_quant,
        "untied_embeddings": tied,
    }


def _quantized_in_features(model: Any) -> list[int]:
    """``in_features`` of every weight-quantized ``nn.Linear`` in ``model``."""
    return [int(m.weight.shape[1]) for m in model.modules() if _is_quantized(m) and getattr(m, "weight", None) is not None]


class _KvGeometry(NamedTuple):
    n_kv: int  # KV heads
    n_rep: int  # query heads per KV head
    head_dim: int


@dataclasses.dataclass
class _Converted:
    """What :func:`convert` has written so far."""

    tensors: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    muls: list[tuple[str, torch.Tensor]] = dataclasses.field(default_factory=list)  # (ONNX MatMul node, pre-scale)
    folded: dict[str, int] = dataclasses.field(default_factory=lambda: {"norm": 0, "v_rows": 0, "up_rows": 0, "onnx_mul": 0})
    bits_seen: set[int] = dataclasses.field(default_factory=set)
    groups_seen: set[int] = dataclasses.field(default_factory=set)
    n_quant: int = 0
    channel_group: int | None = None  # block size of per-channel quantized weights (:func:`channel_block`)


def _layer_projections(i: int, layer: Any) -> dict[str, Any]:
    """``{projection name: module}`` of decoder layer ``i``; ConversionError unless every projection is there and
    all of them are quantized."""
    attn, mlp = layer.self_attn, layer.mlp
    mods = {}
    for n in ATTN:
        if not hasattr(attn, n):
            raise ConversionError(f"layer {i}: self_attn.{n} missing (fused qkv_proj layouts are not supported by this converter)")
        mods[n] = getattr(attn, n)
    for n in MLP:
        if not hasattr(mlp, n):
            raise ConversionError(f"layer {i}: mlp.{n} missing (fused gate_up_proj layouts are not supported by this converter)")
        mods[n] = getattr(mlp, n)
    quant = {n: _is_quantized(m) for n, m in mods.items()}
    if len(set(quant.values())) != 1:
        raise ConversionError(
            f"layer {i}: some projections are quantized and some are not ({sorted(k for k, v in quant.items() if not v)} kept "
            "in high precision); onnxruntime-genai's quantized-checkpoint reader needs every projection of a layer quantized. "
            "Use quant.sensitive_preset=none for this target."
        )
    if not quant["q_proj"]:
        # the unquantized layer: plain float weights (the reader maps *.weight like *.qweight only
        # when quantization_config is present, so this is rejected there)
        raise ConversionError(f"layer {i}: not quantized; the recipe must quantize every decoder layer for this target")
    return mods


def _convert_layer(i: int, layer: Any, sd: dict[str, torch.Tensor], geom: _KvGeometry, block_size: int | None, acc: _Converted) -> None:
    """Write decoder layer ``i``'s norms and GPTQ projection tensors into ``acc``, pre-quant scales folded."""
    mods = _layer_projections(i, layer)
    pfx = f"model.layers.{i}"
    norms = {"attn": sd[f"{pfx}.input_layernorm.weight"].clone(), "mlp": sd[f"{pfx}.post_attention_layernorm.weight"].clone()}
    pqs = {n: _pre_quant_scale(m) for n, m in mods.items()}
    ints = {n: integer_weights(m, acc.channel_group) for n, m in mods.items()}
    for _n, (_, _, b, g) in ints.items():
        acc.bits_seen.add(b)
        acc.groups_seen.add(g)
    scales = {n: ints[n][1].clone() for n in mods}
    biases = {n: (None if getattr(m, "bias", None) is None else m.bias.detach().float().clone()) for n, m in mods.items()}
    _fold_prescales(i, pqs, scales, biases, norms, geom, acc)
    acc.tensors[f"{pfx}.input_layernorm.weight"] = norms["attn"]
    acc.tensors[f"{pfx}.post_attention_layernorm.weight"] = norms["mlp"]
    for n in mods:
        base = f"{pfx}.{'self_attn' if n in ATTN else 'mlp'}.{n}"
        q, _, b, g = ints[n]
        sc, g = reblock(scales[n], g, block_size)
        for k, v in gptq_tensors(q, sc, b, g).items():
            acc.tensors[f"{base}.{k}"] = v
        bias = biases[n]
        if bias is not None:
            acc.tensors[f"{base}.bias"] = bias
        acc.n_quant += 1


def _fold_prescales(
    i: int,
    pqs: dict[str, torch.Tensor | None],
    scales: dict[str, torch.Tensor],
    biases: dict[str, torch.Tensor | None],
    norms: dict[str, torch.Tensor],
    geom: _KvGeometry,
    acc: _Converted,
) -> None:
    """Fold layer ``i``'s AWQ pre-quant scales exactly (module docstring): into ``scales``/``biases``/``norms`` in
    place, or as ONNX ``Mul`` nodes in ``acc.muls``."""
    import torch

    # o_proj pre_quant_scale -> v_proj output rows (exact when constant within each KV group)
    p = pqs["o_proj"]
    if p is not None:
        pv = p.view(geom.n_kv, geom.n_rep, geom.head_dim)
        if torch.equal(pv, pv[:, :1, :].expand_as(pv)):
            row = pv[:, 0, :].reshape(-1)
            scales["v_proj"] *= row[:, None]
            v_bias = biases["v_proj"]
            if v_bias is not None:
                v_bias *= row
            acc.folded["v_rows"] += 1
        else:
            acc.muls.append((f"/model/layers.{i}/attn/o_proj/MatMul", p))
    # down_proj pre_quant_scale -> up_proj output rows (always exact)
    p = pqs["down_proj"]
    if p is not None:
        scales["up_proj"] *= p[:, None]
        up_bias = biases["up_proj"]
        if up_bias is not None:
            up_bias *= p
        acc.folded["up_rows"] += 1
    # shared-input groups -> the preceding RMSNorm when every member has the same scale
    for group_names, sub in ((("q_proj", "k_proj", "v_proj"), "attn"), (("gate_proj", "up_proj"), "mlp")):
        given = [pqs[n] for n in group_names]
        first = next((x for x in given if x is not None), None)
        if first is None:
            continue
        ps = [torch.ones_like(first) if x is None else x for x in given]
        if all(torch.equal(ps[0], x) for x in ps[1:]):
            norms[sub] *= ps[0]
            acc.folded["norm"] += 1
        else:
            for n, x in zip(group_names, ps):
                if not torch.equal(x, torch.ones_like(x)):
                    acc.muls.append((f"/model/layers.{i}/{sub}/{n}/MatMul", x))


def _convert_lm_head(model: Any, sd: dict[str, torch.Tensor], block_size: int | None, acc: _Converted) -> bool:
    """Write the LM head into ``acc`` (GPTQ tensors when quantized, else its float weight, or the embedding matrix
    when tied and absent from the state dict); returns whether it is quantized."""
    lm = getattr(model, "lm_head", None)
    lm_quant = lm is not None and _is_quantized(lm)
    if lm_quant:
        q, s, b, g = integer_weights(lm, acc.channel_group)
        s, g_blk = reblock(s, g, block_size)
        for k, v in gptq_tensors(q, s, b, g_blk).items():
            acc.tensors[f"lm_head.{k}"] = v
        acc.bits_seen.add(b)
        acc.groups_seen.add(g)
        p = _pre_quant_scale(lm)
        if p is not None:
            acc.muls.append(("/lm_head/MatMul", p))
    elif "lm_head.weight" in sd:
        acc.tensors["lm_head.weight"] = sd["lm_head.weight"].clone()
    elif lm is not None:  # tied and not listed in the state dict: the LM head is the embedding matrix
        acc.tensors["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    return lm_quant


def _write_config(hf_dir: Path, out: Path, bits: int, blocks: int) -> bool:
    """Write ``config.json`` with the GPTQ ``quantization_config``; returns whether the source tied its embeddings.

    Always untied: the embedding stays the float table ModelOpt's simulated model looks up (a Gather), and the LM
    head is its own MatMul (MatMulNBits with ModelOpt's integers when quantized, float otherwise). A tied config
    makes onnxruntime-genai's builder share one matrix and quantize the embedding itself (GatherBlockQuantized)."""
    conf = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    conf["torch_dtype"] = "float32"
    tied = bool(conf.get("tie_word_embeddings", False))
    conf["tie_word_embeddings"] = False
    conf.pop("dtype", None)
    conf["quantization_config"] = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": blocks,
        "desc_act": False,
        "sym": True,
        "checkpoint_format": "gptq",
    }
    (out / "config.json").write_text(json.dumps(conf, indent=2) + "\n", encoding="utf-8")
    return tied


def insert_prescale_muls(onnx_path: Path, muls: list[tuple[str, torch.Tensor]]) -> int:
    """Insert ``Mul(x, p)`` in front of each named projection's MatMulNBits in ``onnx_path`` (in place).

    Args:
        onnx_path: ``model.onnx`` written by the builder (external data stays where it is).
        muls: ``(node_name, p)``; ``node_name`` is the builder's MatMul base name
            (``/model/layers.{i}/attn/q_proj/MatMul``); the node actually emitted is matched by prefix.
    Returns:
        the number of Mul nodes inserted. Raises ConversionError when a projection is not found.
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    if not muls:
        return 0
    onnx_path = Path(onnx_path)
    m = onnx.load(str(onnx_path), load_external_data=False)
    g = m.graph
    dtype = None
    for vi in g.input:
        if vi.name == "inputs_embeds" or vi.name.startswith("past_key_values"):
            dtype = vi.type.tensor_type.elem_type
            break
    np_dtype = np.float16 if dtype == onnx.TensorProto.FLOAT16 else np.float32  # float32 for FLOAT and when no input says
    nodes = list(g.node)
    new_nodes = []
    done = 0
    targets = {name: p for name, p in muls}
    found: set[str] = set()
    for node in nodes:
        hit = next((t for t in targets if node.op_type in ("MatMulNBits", "MatMul") and (node.name == t or node.name.startswith(t))), None)
        if hit is not None and hit not in found:
            found.add(hit)
            base = hit.strip("/").replace("/", ".")
            init = numpy_helper.from_array(targets[hit].numpy().astype(np_dtype), name=f"{base}.pre_quant_scale")
            g.initializer.append(init)
            scaled = f"{hit}/pre_quant_scale/output_0"
            new_nodes.append(helper.make_node("Mul", [node.input[0], init.name], [scaled], name=f"{hit}/pre_quant_scale/Mul"))
            node.input[0] = scaled
            done += 1
        new_nodes.append(node)
    missing = sorted(set(targets) - found)
    if missing:
        raise ConversionError(f"{onnx_path}: projections not found for pre_quant_scale: {missing[:5]}")
    del g.node[:]
    g.node.extend(new_nodes)
    onnx.save(m, str(onnx_path))
    return done


def fix_lm_head_input(onnx_path: Path) -> str | None:
    """Rewire ``/lm_head/MatMul`` to the final norm's output when the builder connected it elsewhere.

    onnxruntime-genai 0.18.0's builder wires the LM head of Phi-3 (``Phi3MiniModel``) to layer 0's
    ``post_attention_layernorm`` output, leaving the final RMSNorm dangling (found by comparing every
    intermediate tensor with transformers; the weights are all correct). This checks the graph and fixes
    that edge in place.

    Returns:
        a description of the fix, or ``None`` when the graph was already right (or has no such nodes).
    """
    import onnx

    onnx_path = Path(onnx_path)
    m = onnx.load(str(onnx_path), load_external_data=False)
    nodes = list(m.graph.node)
    lm = next((n for n in nodes if n.name.startswith("/lm_head/") and n.op_type in ("MatMul", "MatMulNBits")), None)
    final = [n for n in nodes if "/final_norm_layernorm/" in n.name]
    if lm is None or len(final) != 1:
        return None
    out0 = final[0].output[0]
    if lm.input[0] == out0:
        return None
    consumers = [n for n in nodes if out0 in n.input]
    if consumers:  # the final norm feeds something else: not the known defect, leave the graph alone
        return None
    old = lm.input[0]
    lm.input[0] = out0
    onnx.save(m, str(onnx_path))
    return f"{lm.name} input rewired from {old} to {out0} (builder defect: final norm was left unused)"


def check_deployed_graph(onnx_path: Path, lm_head_quantized: bool) -> dict[str, Any]:
    """Check that the built graph deploys what the quant report says; return what it found.

    The embedding must be a float ``Gather`` (ModelOpt never quantizes it): a ``GatherBlockQuantized`` means the
    builder quantized it itself. The LM head must be ``MatMulNBits`` exactly when ``lm_head_quantized``.

    Returns:
        ``{"embedding_op", "lm_head_op", "matmulnbits": n, "mul": n}`` (op types found in the graph).
    Raises:
        ConversionError: the graph differs from the report (names the node and what was expected).
    """
    import onnx

    m = onnx.load(str(onnx_path), load_external_data=False)
    nodes = list(m.graph.node)
    emb = next(
        (n.op_type for n in nodes if n.name.startswith("/model/embed_tokens/") and n.op_type in ("Gather", "GatherBlockQuantized")), None
    )
    lm = next((n.op_type for n in nodes if n.name.startswith("/lm_head/") and n.op_type in ("MatMul", "MatMulNBits")), None)
    found = {
        "embedding_op": emb,
        "lm_head_op": lm,
        "matmulnbits": sum(n.op_type == "MatMulNBits" for n in nodes),
        "mul": sum(n.op_type == "Mul" for n in nodes),
    }
    if emb != "Gather":
        raise ConversionError(
            f"{onnx_path}: the embedding lookup is {emb!r}, expected a float 'Gather' (the quant report keeps "
            "the embedding in high precision; the builder must not quantize it)"
        )
    want = "MatMulNBits" if lm_head_quantized else "MatMul"
    if lm != want:
        raise ConversionError(f"{onnx_path}: /lm_head is {lm!r}, expected {want!r} (lm_head_quantized={lm_head_quantized})")
    return found
