"""Unit tests of the served Python models' pure parts and of the package-time checks for the CPU target (no server).

The Triton models import ``triton_python_backend_utils`` only inside Triton; their helpers are importable here.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

MODELS = Path(__file__).resolve().parents[1] / "pipeline" / "serving" / "models"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"served_{name}", MODELS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def _byte_fallback_tokenizer():
    """A Llama-2/Mistral-style SentencePiece BPE with byte fallback (``<0xE5>`` tokens) trained on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens, show_progress=False)
    tok.train_from_iterator(["where is my order", "refund the damaged item", "hello world"] * 20, trainer)
    return tok


def _byte_level_tokenizer(tmp_path: Path):
    import tiny
    from tokenizers import Tokenizer

    tiny.make_tokenizer(tmp_path, vocab_size=320)
    return Tokenizer.from_file(str(tmp_path / "tokenizer.json"))


def _texts(seed: int, n: int = 40) -> list[str]:
    rng = random.Random(seed)
    pools = ["订单退款取消地址发货", "😀🚚📦✅", "Where is my order ORD-12345?", "naïve café ☕", " \n\t"]
    return ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 30))) for _ in range(n)]


@pytest.mark.parametrize("kind", ["byte_level", "byte_fallback"])
def test_incremental_detokenizer_joined_pieces_equal_the_full_decode(tmp_path, kind):
    mod = _load("onnxruntime_genai_model")
    tok = _byte_level_tokenizer(tmp_path) if kind == "byte_level" else _byte_fallback_tokenizer()
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    for text in _texts(1 if kind == "byte_level" else 2):
        ids = tok.encode(text, add_special_tokens=False).ids
        dec = mod.IncrementalDecoder(decode)
        pieces = [dec.push(t) for t in ids] + [dec.flush()]
        assert "".join(pieces) == decode(ids), (text, pieces)
        assert all("\ufffd" not in p for p in pieces[:-1]) or "\ufffd" in decode(ids)
    # a truncated multi-byte character: nothing until flush, which gives what a full decode shows
    ids = tok.encode("订", add_special_tokens=False).ids
    if len(ids) > 1:
        dec = mod.IncrementalDecoder(decode)
        assert dec.push(ids[0]) == "" and dec.flush() == decode(ids[:1])


def test_incremental_detokenizer_work_per_token_does_not_grow(tmp_path):
    mod = _load("onnxruntime_genai_model")
    tok = _byte_level_tokenizer(tmp_path)
    seen: list[int] = []
    dec = mod.IncrementalDecoder(lambda ids: (seen.append(len(ids)), tok.decode(ids))[1])
    for t in tok.encode("where is my order " * 200, add_special_tokens=False).ids:
        dec.push(t)
    assert max(seen) <= 4, max(seen)  # the window decoded per token stays a few ids, not the whole sequence


def test_words_list_round_trip():
    import numpy as np

    mod = _load("onnxruntime_genai_model")
    pre = _load("preprocessing_model")
    stacked = pre.stack_words([np.array([[5, 6, 7], [2, 3, -1]], np.int32), np.array([[9], [1]], np.int32)])
    assert stacked.shape == (2, 2, 3)
    assert mod.parse_words_list(stacked[0]) == [[5, 6], [7]] and mod.parse_words_list(stacked[1]) == [[9]]


def test_cpu_target_refuses_a_served_beam_width_above_one():
    from pipeline.errors import InputError
    from pipeline.packaging.repository import settings_from_build

    bi = {"target": "onnxruntime_genai", "limits": {"max_batch_size": 8, "max_input_len": 64, "max_seq_len": 128}}
    pc = SimpleNamespace(max_batch_size=None, max_input_len=None, max_beam_width=4, decoupled=True, exclude_input_in_output=True,
                         instance_count=1, name="m")
    with pytest.raises(InputError, match=r"package\.max_beam_width=4.*beam width 1"):
        settings_from_build(bi, {"eos_token_ids": [2]}, pc)
    pc.max_beam_width = 1
    assert settings_from_build(bi, {"eos_token_ids": [2]}, pc).target == "onnxruntime_genai"


def test_python_text_model_config_has_the_ensembles_interface():
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from pipeline.packaging.repository import TEMPLATES, Settings, fill, python_text_model_config, template_values

    ens = fill((TEMPLATES / "ensemble" / "config.pbtxt").read_text(), template_values(Settings(target="onnxruntime_genai")))
    text = python_text_model_config(ens, "tensorrt_llm_bls", decoupled=True, instance_count=1, params={"interface": "text"},
                                    extra_inputs=(("num_draft_tokens", "TYPE_INT32", [1]),))
    cfg = text_format.Parse(text, mc.ModelConfig())
    e = text_format.Parse(ens, mc.ModelConfig())
    assert cfg.backend == "python" and cfg.model_transaction_policy.decoupled and cfg.parameters["interface"].string_value == "text"
    assert [i.name for i in e.input] == [i.name for i in cfg.input][: len(e.input)] and cfg.input[-1].name == "num_draft_tokens"
    assert [o.name for o in e.output] == [o.name for o in cfg.output]
    assert not cfg.HasField("ensemble_scheduling") and cfg.platform == ""
