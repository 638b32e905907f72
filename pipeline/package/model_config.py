"""A Python-backend model's ``config.pbtxt`` built from the filled ensemble config (the BLS, the draft model and the LLM-API
adapter models share it), and the copy of a served Python model's ``model.py`` with the sibling module every one imports."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

MODEL_COMMON = "model_common.py"
"""Copied next to every served Python model's ``model.py`` (:func:`copy_served_model`), which imports it from its own
folder (``pipeline/serve/models/model_common.py``: the model config's parameters, a folder parameter, answering
requests)."""


def copy_served_model(models_src: Path, model_py: str, version_dir: Path) -> None:
    """``models_src/model_py`` as ``version_dir/model.py``, with :data:`MODEL_COMMON` next to it."""
    shutil.copy2(models_src / model_py, version_dir / "model.py")
    shutil.copy2(models_src / MODEL_COMMON, version_dir / MODEL_COMMON)


def python_model_from_ensemble(
    ensemble_config: str, name: str, decoupled: bool, instance_count: int, params: dict, extra_inputs: tuple
) -> Any:
    """The filled ensemble config as the ``ModelConfig`` of a Python-backend model ``name`` (every Python model with
    the ensemble's tensor interface: the CPU target's ``ensemble``/``tensorrt_llm_bls``, TensorRT-LLM's
    ``tensorrt_llm_bls``, the LLM-API adapters): the ensemble's tensors, its scheduling dropped, ``decoupled``,
    ``instance_count`` CPU instances, ``params`` as string parameters (bools as ``true``/``false``) and
    ``extra_inputs`` ``(name, TYPE_*, dims)`` added as optional inputs where the ensemble does not declare them.

    Raises ``text_format.ParseError`` when the ensemble text does not parse."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = text_format.Parse(ensemble_config, mc.ModelConfig())
    cfg.name = name
    cfg.ClearField("platform")
    cfg.ClearField("ensemble_scheduling")
    cfg.backend = "python"
    cfg.model_transaction_policy.decoupled = bool(decoupled)
    g = cfg.instance_group.add()
    g.count, g.kind = int(instance_count), mc.ModelInstanceGroup.KIND_CPU
    for k, v in params.items():
        cfg.parameters[k].string_value = str(v).lower() if isinstance(v, bool) else str(v)
    have = {i.name for i in cfg.input}
    for iname, dtype, dims in extra_inputs:
        if iname not in have:
            i = cfg.input.add()
            i.name, i.data_type, i.optional = iname, mc.DataType.Value(dtype), True
            i.dims.extend(dims)
    return cfg
