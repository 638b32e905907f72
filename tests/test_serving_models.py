"""Unit tests of the served Python models' pure parts and of the package-time checks for the CPU target (no server).

The Triton models import ``triton_python_backend_utils`` only inside Triton; their helpers are importable here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

MODELS = Path(__file__).resolve().parents[1] / "pipeline" / "serving" / "models"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"served_{name}", MODELS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_words_list_round_trip():
    import numpy as np

    mod = _load("onnxruntime_genai_model")
    pre = _load("preprocessing_model")
    stacked = pre.stack_words([np.array([[5, 6, 7], [2, 3, -1]], np.int32), np.array([[9], [1]], np.int32)])  # [N, 2, L]
    assert stacked.shape == (2, 2, 3)
    assert mod.parse_words_list(stacked[0]) == [[5, 6], [7]] and mod.parse_words_list(stacked[1]) == [[9]]


def test_cpu_target_serves_the_packaged_beam_width():
    from pipeline.packaging.repository import settings_from_build

    bi = {"target": "onnxruntime_genai", "limits": {"max_batch_size": 8, "max_input_len": 64, "max_seq_len": 128}}
    pc = SimpleNamespace(
        max_batch_size=None, max_input_len=None, max_beam_width=4, decoupled=True, exclude_input_in_output=True, instance_count=1, name="m"
    )
    s = settings_from_build(bi, {"eos_token_ids": [2]}, pc)  # og beam search needs no build-time limit
    assert (s.max_beam_width, s.served_max_beam_width) == (4, 4)
    pc.max_beam_width = None
    assert settings_from_build(bi, {"eos_token_ids": [2]}, pc).max_beam_width == 1


def test_python_text_model_config_has_the_ensembles_interface():
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from pipeline.packaging.repository import TEMPLATES, Settings, fill, python_text_model_config, template_values

    ens = fill((TEMPLATES / "ensemble" / "config.pbtxt").read_text(), template_values(Settings(target="onnxruntime_genai")))
    text = python_text_model_config(
        ens,
        "tensorrt_llm_bls",
        decoupled=True,
        instance_count=1,
        params={"interface": "text"},
        extra_inputs=(("num_draft_tokens", "TYPE_INT32", [1]),),
    )
    cfg = text_format.Parse(text, mc.ModelConfig())
    e = text_format.Parse(ens, mc.ModelConfig())
    assert cfg.backend == "python" and cfg.model_transaction_policy.decoupled and cfg.parameters["interface"].string_value == "text"
    assert [i.name for i in e.input] == [i.name for i in cfg.input][: len(e.input)] and cfg.input[-1].name == "num_draft_tokens"
    assert [o.name for o in e.output] == [o.name for o in cfg.output]
    assert not cfg.HasField("ensemble_scheduling") and cfg.platform == ""
