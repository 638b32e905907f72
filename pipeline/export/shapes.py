"""Export, step 1 (continued): the decoder's shape against ``config.json``, from the safetensors headers.

:func:`pipeline.export.inspect.check_tensor_shapes` runs these after its vocabulary checks; each raises
:class:`pipeline.errors.InputError` naming the ``config.json`` field, its value, what the weights hold and the fix.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InputError

#: ``facts`` below: a :class:`pipeline.export.inspect.CheckpointFacts` (``Any`` here: inspect imports this module)


#: ``model.layers.<i>.``: a decoder layer's tensors (every supported family names its layers so).
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def check_layer_count(facts: Any) -> None:
    """``num_hidden_layers`` equals the number of decoder layers the weights hold (``model.layers.<i>.`` tensors).

    A config that lists fewer layers made transformers drop the rest as "unexpected" tensors (a warning) and the
    baseline drops the same layers, so the gate passed a model that is not the checkpoint's; one that lists more
    leaves layers random.  Both are refused here, from the headers (other unused tensors, such as
    ``rotary_emb.inv_freq``, stay a warning of the export).

    Raises:
        InputError naming ``num_hidden_layers``, its value, the layers the weights hold and the fix.
    """
    layers = {int(m[1]) for m in map(_LAYER.match, facts.tensors) if m}
    if not layers:
        return
    n, held = facts.config["num_hidden_layers"], max(layers) + 1
    gaps = sorted(set(range(held)) - layers)
    if gaps:  # a recheck: layers 0 and 2 were told "set num_hidden_layers=3", then failed at load on layer 1
        shown = ", ".join(map(str, gaps[:10])) + (", ..." if len(gaps) > 10 else "")
        raise InputError(
            f"{facts.path}: the weights hold no tensors of decoder layer(s) {shown} of model.layers.0..{held - 1} "
            f"(num_hidden_layers={n}): the checkpoint is incomplete. Fix: restore the missing layers' tensors from the "
            f"original checkpoint (a shard missing from the folder or from the index's weight_map)."
        )
    if n != held:
        dropped = f"layer {n}" if held - n == 1 else f"layers {n}..{held - 1}"
        drop = f"; transformers would drop {dropped} of the weights" if n < held else "; the missing layers would be random"
        raise InputError(
            f"{facts.path / 'config.json'}: num_hidden_layers={n} but the weights hold {held} decoder layers "
            f"(model.layers.0..{held - 1}){drop}. Fix: set num_hidden_layers={held} in config.json (or use the "
            f"weights that match the config)."
        )


def check_kv_heads(facts: Any) -> None:
    """``num_attention_heads`` x head_dim equals the rows of every ``q_proj`` weight (else ``head_dim`` is named), and
    ``num_key_value_heads`` x head_dim the rows of every ``k_proj``/``v_proj`` weight (Phi-3's fused
    ``qkv_proj``: ``(num_attention_heads + 2 x num_key_value_heads) x head_dim`` rows), from the headers.

    Raises:
        InputError naming ``num_key_value_heads``, both numbers and the fix (before transformers' own load error,
        which names neither the field nor the shapes).
    """
    cfg = facts.config
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    for name in sorted(facts.tensors, key=lambda n: (not n.endswith("self_attn.q_proj.weight"), n)):  # q first: head_dim
        shape = facts.tensors[name][0]
        if name.endswith("self_attn.q_proj.weight") and (shape[0] if shape else None) != heads * head_dim:
            raise InputError(_head_dim_problem(facts, name, shape[0] if shape else None, head_dim))
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            fused, expected = 0, kv * head_dim
        elif name.endswith("self_attn.qkv_proj.weight"):
            fused, expected = heads * head_dim, (heads + 2 * kv) * head_dim
        else:
            continue
        rows = shape[0] if shape else None
        if rows != expected:
            raise InputError(_kv_heads_problem(facts, name, rows, expected, fused, head_dim))


def _head_dim_problem(facts: Any, name: str, rows: int | None, head_dim: int) -> str:
    """The refusal of a ``q_proj`` whose rows are not ``num_attention_heads x head_dim`` (a recheck: with ``head_dim``
    deleted from config.json, the k_proj check told the user to change ``num_key_value_heads``)."""
    heads = facts.config["num_attention_heads"]
    how = f"head_dim={head_dim}" + ("" if facts.config.get("head_dim") else " (hidden_size / num_attention_heads: no head_dim given)")
    fix = (
        f"set head_dim={rows // heads} in config.json (or use the weights that match the config)"
        if rows and rows % heads == 0
        else "use the config.json that belongs to these weights"
    )
    return (
        f"{facts.path / 'config.json'}: num_attention_heads={heads} x {how} = {heads * head_dim} rows for {name}, but the "
        f"weights ({facts.tensor_file.get(name, 'the weights')}) have {rows} (shape {facts.tensors[name][0]}). Fix: {fix}."
    )


def _kv_heads_problem(facts: Any, name: str, rows: int | None, expected: int, fused: int, head_dim: int) -> str:
    """The refusal of :func:`check_kv_heads`: the field, the rows it gives and the rows the weight has, and the fix."""
    cfg = facts.config
    heads, stated = cfg["num_attention_heads"], cfg.get("num_key_value_heads")
    field = f"num_key_value_heads={stated!r}" + ("" if stated else f" (so num_attention_heads={heads})")
    per_kv = head_dim * (2 if fused else 1)  # a fused qkv_proj holds a K and a V row block per KV head
    gives = f"(num_attention_heads={heads} + 2 x {field}) x head_dim={head_dim}" if fused else f"{field} x head_dim={head_dim}"
    if rows is not None and rows > fused and (rows - fused) % per_kv == 0:
        fix = f"set num_key_value_heads={(rows - fused) // per_kv} in config.json (or use the weights that match the config)"
    else:
        fix = "use the config.json that belongs to these weights"
    return (
        f"{facts.path / 'config.json'}: {gives} = {expected} rows for {name}, but the weights "
        f"({facts.tensor_file.get(name, 'the weights')}) have {rows} (shape {facts.tensors[name][0]}). Fix: {fix}."
    )
