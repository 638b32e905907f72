"""onnxruntime_genai int4 builds: fast kernels by default, and the deployed graph is what the quant report says.

* the default CPU build runs MatMulNBits with accuracy_level 4 (int8 activations, the fastest CPU kernels); level 1
  (fp32 activations, ModelOpt's exact numerics) stays available;
* tied embeddings + int4: the embedding stays the float table ModelOpt's simulated model looks up (no
  GatherBlockQuantized), and the engine agrees with the simulated model as well as an untied one does;
* engine batch limit: ``build.max_batch_size`` reaches the runtime config (og.Engine's configured batch size; the
  0.18 static scheduler still decodes at most 4 sequences per batch on CPU, measured in docs/build.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.config import compose
from pipeline.core.targets import get_target
from pipeline.core.tokenization import encode_prompt

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "evaluation" / "data" / "support_eval_v2.jsonl"
CALIB = ROOT / "evaluation" / "data" / "support_calib_v2.jsonl"


def _prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in EVAL.read_text(encoding="utf-8").splitlines() if line.strip()]
    step = max(1, len(rows) // n)
    return [r["prompt"] for r in rows[::step][:n]]


def _awq(ckpt: Path, quant_cfg: dict | None = None):
    import modelopt.torch.quantization as mtq
    import torch
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(str(ckpt))
    model = tf.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    calib = [json.loads(x)["text"] for x in CALIB.read_text().splitlines()[:4]]

    def loop(m):
        for t in calib:
            m(**tok(t, return_tensors="pt", truncation=True, max_length=64))

    with torch.no_grad():
        return tok, mtq.quantize(model, quant_cfg or mtq.INT4_AWQ_CFG, loop).eval()


def _build(ckpt: Path, out: Path, model, *extra: str):
    cfg = compose(
        [
            "target=onnxruntime_genai",
            "quant=int4_awq",
            f"model.path={ckpt}",
            "build.max_input_len=160",
            "build.max_seq_len=200",
            "build.max_batch_size=6",
            *extra,
        ]
    )
    (out / "q").mkdir(parents=True)
    (out / "q" / "hf").symlink_to(ckpt, target_is_directory=True)
    (out / "b").mkdir()
    info = get_target("onnxruntime_genai").build(cfg, out / "q", out / "b", export_dir=out / "q", model=model)
    return info, out / "b" / "engine"


def _graph_ops(engine: Path) -> dict[str, list]:
    import onnx

    m = onnx.load(str(engine / "model.onnx"), load_external_data=False)
    levels = sorted({a.i for n in m.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"})
    return {
        "ops": [n.op_type for n in m.graph.node],
        "accuracy_levels": levels,
        "embedding": [n.op_type for n in m.graph.node if n.name.startswith("/model/embed_tokens/")],
    }


def _agreement(runner, tok, model, n_prompts: int = 8, n_tok: int = 16) -> tuple[int, int]:
    import torch

    agree = total = 0
    for p in _prompts(n_prompts):
        ids = encode_prompt(tok, p)
        with torch.no_grad():
            seq = model.generate(torch.tensor([ids]), max_new_tokens=n_tok, do_sample=False, min_new_tokens=n_tok, pad_token_id=2)[
                0
            ].tolist()
            ref = model(torch.tensor([seq])).logits[0, len(ids) - 1 : len(seq) - 1].argmax(-1).tolist()
        eng = runner.next_token_logits(ids, seq[len(ids) :])
        agree += sum(a == b for a, b in zip(eng, ref))
        total += len(ref)
    return agree, total


def test_default_cpu_build_uses_int8_activation_kernels_and_level1_stays_available(tiny_llama, tmp_path):
    assert compose(["target=onnxruntime_genai"]).target.accuracy_level == 4
    tok, model = _awq(tiny_llama)
    info, engine = _build(tiny_llama, tmp_path / "fast", model)
    assert info["knobs"]["accuracy_level"] == 4 and "accuracy_level=4" in info["command"]
    assert _graph_ops(engine)["accuracy_levels"] == [4]
    info1, engine1 = _build(tiny_llama, tmp_path / "exact", model, "target.accuracy_level=1")
    assert _graph_ops(engine1)["accuracy_levels"] == [1]
    # the fast engine still follows the simulated model closely (measured; the release gate judges task accuracy)
    with get_target("onnxruntime_genai").load_runner(engine) as runner:
        agree, total = _agreement(runner, tok, model, n_prompts=4)
    print(f"accuracy_level=4 teacher-forced agreement with ModelOpt simulated: {agree}/{total}")
    assert agree / total >= 0.9


def test_tied_embeddings_int4_keeps_float_embedding_and_agrees_with_simulated(make_checkpoint, tmp_path):
    ckpt = make_checkpoint("llama", name="tied", tie_word_embeddings=True)
    assert json.loads((ckpt / "config.json").read_text())["tie_word_embeddings"] is True
    tok, model = _awq(ckpt)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # really tied
    info, engine = _build(ckpt, tmp_path, model, "target.accuracy_level=1")
    g = _graph_ops(engine)
    assert "GatherBlockQuantized" not in g["ops"] and g["embedding"] == ["Gather"], g["embedding"]
    with get_target("onnxruntime_genai").load_runner(engine) as runner:
        agree, total = _agreement(runner, tok, model)
    print(f"tied int4_awq teacher-forced agreement engine vs ModelOpt simulated: {agree}/{total}")
    assert total >= 120 and agree / total >= 0.99
    qw = info["quantized_weights"]  # the report says what the graph holds
    assert qw["lm_head_quantized"] is False and qw["untied_embeddings"] is True
    assert qw["graph"]["embedding_op"] == "Gather" and qw["graph"]["lm_head_op"] == "MatMul"


def test_exclude_modules_empty_quantizes_the_lm_head_and_the_engine_deploys_it_exactly(tiny_llama, tmp_path):
    """quant.exclude_modules=[] quantizes the LM head (ModelOpt's own recipe keeps it unquantized, an entry the quantize
    stage drops then); the build deploys it as MatMulNBits with ModelOpt's integers, and the engine still follows the
    simulated model token for token at accuracy_level=1.  The default (exclude_modules=[lm_head]) keeps a float head."""
    from pipeline.quantize.modelopt_config import modelopt_config
    from pipeline.quantize.preflight import excluded_modules

    linears = ["model.layers.0.self_attn.q_proj", "lm_head"]
    default_q = compose(["quant=int4_awq"]).quant
    assert excluded_modules(default_q, linears, 1) == {"lm_head": "quant.exclude_modules: lm_head"}
    default_cfg = modelopt_config(default_q, excluded_modules(default_q, linears, 1))
    assert {"quantizer_name": "*lm_head*", "enable": False} in default_cfg["quant_cfg"]
    q = compose(["quant=int4_awq", "quant.exclude_modules=[]"]).quant
    cfg = modelopt_config(q, excluded_modules(q, linears, 1))
    assert not [e for e in cfg["quant_cfg"] if "lm_head" in e.get("quantizer_name", "")]
    tok, model = _awq(tiny_llama, cfg)
    assert model.lm_head.weight_quantizer.is_enabled
    info, engine = _build(tiny_llama, tmp_path, model, "target.accuracy_level=1", "quant.exclude_modules=[]")
    qw = info["quantized_weights"]
    assert qw["lm_head_quantized"] is True and qw["graph"]["lm_head_op"] == "MatMulNBits", qw
    with get_target("onnxruntime_genai").load_runner(engine) as runner:
        agree, total = _agreement(runner, tok, model)
    print(f"int4 LM head: teacher-forced agreement engine vs ModelOpt simulated {agree}/{total}")
    assert total >= 120 and agree / total >= 0.99


def test_build_max_batch_size_reaches_the_engine(tiny_llama, tmp_path):
    import onnxruntime_genai as og

    tok, model = _awq(tiny_llama)
    _, engine = _build(tiny_llama, tmp_path, model)
    gc = json.loads((engine / "genai_config.json").read_text())
    assert gc["engine"]["static_batching"]["max_batch_size"] == 6
    eng = og.Engine(og.Model(str(engine)))
    assert eng.get_capabilities().configured_max_batch_size == 6  # without the key onnxruntime-genai 0.18 says 4
