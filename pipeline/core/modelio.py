"""Load a Hugging Face causal LM one tensor at a time, holding one copy of the weights and nothing else.

``transformers``' ``from_pretrained`` memory-maps the safetensors shards and keeps the mapping while it loads; with a
dtype conversion (a bfloat16 checkpoint loaded in float32 for CPU calibration) every page of the file is touched and
stays resident beside the converted copy, so the peak is the checkpoint plus the model (measured on the 412 M shape:
2.9 GB for a 1.65 GB float32 model, docs/memory.md). Here the model is built with empty (meta) parameters
(``accelerate.init_empty_weights``; buffers such as RoPE's ``inv_freq`` are computed as usual), and each tensor is
read through its own short ``safe_open`` (the mapping ends with the read) and assigned in the requested dtype
(``accelerate.utils.set_module_tensor_to_device``). Peak: the model plus one tensor.

Only checkpoints whose tensor names are the model's own ``state_dict`` names are read this way: the export stage
writes them with ``save_pretrained`` (no key renaming). Anything else is refused with the names, never guessed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError


@contextlib.contextmanager
def loadable_view(src: Path) -> Iterator[Path]:
    """``src`` itself, or, when its safetensors index names a shard outside it (``../x.safetensors``, accepted only
    with ``model.allow_external_files`` by the export stage's checks), a temporary folder
    of symlinks: every top-level file of ``src`` but the index, each shard as ``external-<i>-<name>``, and an index
    rewritten to those names. transformers >= 5.25 refuses such shard names outright
    (``transformers/utils/hub.py`` ``_check_shard_filenames_stay_in_model_dir``, which checks names, not resolved
    paths, because Hub-cache shards are symlinks), so the view keeps an explicitly allowed checkpoint loadable on
    every transformers the project supports. Nothing is copied; the folder is removed on exit."""
    import tempfile

    index_path = src / "model.safetensors.index.json"
    if not index_path.is_file():
        yield src
        return
    index = json.loads(index_path.read_text(encoding="utf-8"))
    names = list(dict.fromkeys(index["weight_map"].values()))
    if not any(".." in Path(n).parts for n in names):
        yield src
        return
    with tempfile.TemporaryDirectory(prefix="pipeline-load-view-") as tmp:
        view = Path(tmp)
        for f in src.iterdir():
            if f.is_file() and f.name != index_path.name:
                (view / f.name).symlink_to(f.resolve())
        renamed = {n: (n if ".." not in Path(n).parts else f"external-{i}-{Path(n).name}") for i, n in enumerate(names)}
        for n, local in renamed.items():
            target = view / local
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to((src / n).resolve())
        index["weight_map"] = {t: renamed[n] for t, n in index["weight_map"].items()}
        (view / index_path.name).write_text(json.dumps(index), encoding="utf-8")
        yield view


def shard_files(hf_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: those of ``model.safetensors.index.json`` (in order), else ``*.safetensors``."""
    hf_dir = Path(hf_dir)
    idx = hf_dir / "model.safetensors.index.json"
    if idx.is_file():
        weight_map = json.loads(idx.read_text(encoding="utf-8")).get("weight_map", {})
        return [hf_dir / f for f in dict.fromkeys(weight_map.values())]
    return sorted(hf_dir.glob("*.safetensors"))


def load_causal_lm(hf_dir: Path, dtype: Any, device: str = "cpu") -> Any:
    """``AutoModelForCausalLM`` of ``hf_dir`` in ``dtype`` on ``device`` (eval mode), loaded tensor by tensor.

    Args:
        hf_dir: a checkpoint folder with ``config.json`` and safetensors weights named as the model's state dict.
        dtype: torch dtype of the floating-point weights.
        device: torch device of the weights.
    Raises:
        InputError: a tensor the model does not have, or one the model needs that the checkpoint lacks (names both).
    """
    import accelerate
    import transformers as tf
    from accelerate.utils import set_module_tensor_to_device
    from safetensors import safe_open

    hf_dir = Path(hf_dir)
    cfg = tf.AutoConfig.from_pretrained(str(hf_dir), trust_remote_code=False)
    with accelerate.init_empty_weights(include_buffers=False):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype, trust_remote_code=False)
    wanted = set(model.state_dict().keys())
    unexpected: list[str] = []
    for f in shard_files(hf_dir):
        with safe_open(str(f), framework="pt") as sf:
            names = list(sf.keys())
        for name in names:
            if name not in wanted:
                unexpected.append(name)
                continue
            with safe_open(str(f), framework="pt") as sf:  # one mapping per tensor: nothing of the file stays resident
                t = sf.get_tensor(name)
            set_module_tensor_to_device(model, name, device, value=t.to(dtype) if t.is_floating_point() else t)
            del t
    if unexpected:
        raise InputError(f"{hf_dir}: tensors the {cfg.architectures} model does not have: {unexpected[:5]}. Re-run the export stage.")
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise InputError(
            f"{hf_dir}: the checkpoint lacks {len(missing)} tensor(s) the model needs, e.g. {missing[:5]}. Re-run the export stage."
        )
    if device != "cpu":
        model.to(device)  # buffers created on the CPU at init
    if (hf_dir / "generation_config.json").is_file():
        model.generation_config = tf.GenerationConfig.from_pretrained(str(hf_dir))
    model.config.name_or_path = str(hf_dir)
    model.eval()
    return model


def read_model_config(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """``config.json`` of the checkpoint at ``path`` (resolved like ``model.path``), or None when unreadable."""
    if not path:
        return None
    from .config import resolve_path

    try:
        p = resolve_path(str(path))
        cj = p / "config.json" if p is not None else None
        if cj is None or not cj.is_file():
            return None
        doc = json.loads(cj.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the export stage / planner report an unreadable checkpoint with their own message
    return doc if isinstance(doc, dict) else None


def transformers_config(src: str | os.PathLike, trust_remote_code: bool = False) -> Any:
    """transformers' ``AutoConfig`` of the checkpoint folder ``src``: the one reading of its ``config.json`` that
    export, ``pipeline plan`` and ``pipeline.plan`` share (a config transformers refuses, e.g. ``rope_scaling``
    ``{"type": "dynamic"}`` without its ``factor``, is refused by each with this message, exit 2).  Imports
    transformers (and so torch).

    Raises:
        InputError: transformers cannot read ``config.json``.
    """
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(src), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise InputError(
            f"{Path(src) / 'config.json'}: transformers cannot read it: {type(e).__name__}: {e}. Fix: correct config.json "
            "(compare it with the original model's)."
        ) from None
