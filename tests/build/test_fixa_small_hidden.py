"""Weight-only recipes on a small-hidden model (hidden 64, tied embeddings): onnxruntime_genai builds them.

Regression: per-channel int8 (int8_wo) was written with block = in_features when 128 did not divide it, so a model
with in_features 64 (q/k/v/o/gate/up, lm_head) and 128 (down_proj) got group sizes [64, 128], which the
onnxruntime-genai GPTQ reader (one group_size per checkpoint) refuses; the build exited 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.config import compose
from pipeline.core.targets import get_target
from pipeline.core.tokenization import encode_prompt

ROOT = Path(__file__).resolve().parents[2]


def _quantized(ckpt: Path, cfg_name: str):
    import modelopt.torch.quantization as mtq
    import torch
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(str(ckpt))
    model = tf.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    calib = [json.loads(x)["text"] for x in (ROOT / "evaluation/data/support_calib_v2.jsonl").read_text().splitlines()[:4]]

    def loop(m):
        for t in calib:
            m(**tok(t, return_tensors="pt", truncation=True, max_length=64))

    with torch.no_grad():
        model = mtq.quantize(model, getattr(mtq, cfg_name), loop).eval()
    return tok, model


@pytest.mark.parametrize(
    ("recipe", "cfg_name", "bits"),
    [("int8_wo", "INT8_WEIGHT_ONLY_CFG", 8), ("int4_rtn", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG", 4), ("int4_awq", "INT4_AWQ_CFG", 4)],
)
def test_weight_only_recipes_build_on_hidden_64(small_qwen2, tmp_path, recipe, cfg_name, bits):
    import torch

    tok, model = _quantized(small_qwen2, cfg_name)
    cfg = compose(
        [
            "target=onnxruntime_genai",
            f"quant={recipe}",
            f"model.path={small_qwen2}",
            "build.max_input_len=160",
            "build.max_seq_len=200",
            "build.max_batch_size=2",
            "target.accuracy_level=1",  # fp32 activations: ModelOpt's exact numerics
        ]
    )
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "hf").symlink_to(small_qwen2, target_is_directory=True)
    (tmp_path / "b").mkdir()
    info = get_target("onnxruntime_genai").build(cfg, tmp_path / "q", tmp_path / "b", export_dir=tmp_path / "q", model=model)
    qw = info["quantized_weights"]
    assert qw["bits"] == bits and qw["group_size"] == 64
    # the engine deploys ModelOpt's integers: its teacher-forced next tokens agree with the simulated-quant model
    agree = total = 0
    with get_target("onnxruntime_genai").load_runner(tmp_path / "b" / "engine") as runner:
        for p in ["Where is my order ORD-12345?", "Please cancel order ORD-99871 and refund it.", "Change the address."]:
            ids = encode_prompt(tok, p)
            with torch.no_grad():
                seq = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, min_new_tokens=12, pad_token_id=2)[0].tolist()
                ref = model(torch.tensor([seq])).logits[0, len(ids) - 1 : len(seq) - 1].argmax(-1).tolist()
            eng = runner.next_token_logits(ids, seq[len(ids) :])
            agree += sum(a == b for a, b in zip(eng, ref))
            total += len(ref)
    assert total == 36 and agree / total >= 0.97, (agree, total)


def test_channel_block_divides_every_in_features():
    from pipeline.build.targets.onnxruntime_genai.quant import ConversionError, channel_block

    assert channel_block([64, 128]) == 64  # the hidden-64 model: one block for q/k/v/o/gate/up/lm_head and down_proj
    assert channel_block([896, 4864]) == 128  # Qwen2-0.5B widths: unchanged from before
    assert channel_block([96, 256]) == 32
    with pytest.raises(ConversionError, match="no common power-of-two block"):
        channel_block([24, 40])
