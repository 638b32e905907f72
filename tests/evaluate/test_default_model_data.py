"""Tests for the embedded default model (models/support-llama) and its data sets."""

from __future__ import annotations

import json
import os
import random
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "evaluation"))
import generate_data as gd  # noqa: E402

DATA_DIR = os.path.join(REPO, "evaluation", "data")
EVAL_PATH = os.path.join(DATA_DIR, gd.EVAL_FILENAME)
CALIB_PATH = os.path.join(DATA_DIR, gd.CALIB_FILENAME)
MODEL_DIR = os.path.join(REPO, "models", "support-llama")

METRICS = {"exact_match", "normalized_exact_match", "numeric", "contains", "json_fields", "choice", "regex", "rouge_l"}
N_TRAIN_CHECK = 20000


def _jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def eval_rows():
    return _jsonl(EVAL_PATH)


@pytest.fixture(scope="module")
def calib_rows():
    return _jsonl(CALIB_PATH)


@pytest.fixture(scope="module")
def train_rows():
    return gd.training_examples(gd.DEFAULT_TRAIN_SEED, N_TRAIN_CHECK)


# ---------------------------------------------------------------- data sets
def test_eval_schema(eval_rows):
    assert len(eval_rows) >= 400
    ids = [r["id"] for r in eval_rows]
    assert len(ids) == len(set(ids)), "duplicate ids"
    slices = {}
    for r in eval_rows:
        assert {"id", "prompt", "reference", "slice", "metric", "lang", "max_new_tokens"} <= set(r), r
        assert isinstance(r["id"], str) and r["id"].startswith(r["slice"] + "-")
        assert isinstance(r["prompt"], str) and r["prompt"].strip()
        assert "\n" not in r["prompt"] and "<s>" not in r["prompt"] and "User:" not in r["prompt"]
        ref = r["reference"]
        assert isinstance(ref, str) or (isinstance(ref, list) and ref and all(isinstance(x, str) for x in ref))
        assert r["metric"] in METRICS
        assert r["lang"] in ("en", "zh")
        assert isinstance(r["max_new_tokens"], int) and 8 <= r["max_new_tokens"] <= 64
        if "stop" in r:
            assert isinstance(r["stop"], list)
        if r["metric"] == "numeric":
            float(ref)
        slices[r["slice"]] = slices.get(r["slice"], 0) + 1
    assert len(slices) >= 5
    assert all(n >= 50 for n in slices.values()), slices
    assert len({r["prompt"] for r in eval_rows}) == len(eval_rows)


def test_calib_schema(calib_rows):
    assert len(calib_rows) >= 512
    ids = [r["id"] for r in calib_rows]
    assert len(ids) == len(set(ids))
    for r in calib_rows:
        assert isinstance(r["text"], str) and len(r["text"]) > 10
        p = gd.prompt_from_plain(r["text"])
        assert p.strip()
    assert len({r["text"] for r in calib_rows}) == len(calib_rows)


def test_files_are_deterministic_generator_output(tmp_path):
    ev, cal = gd.write_sets(str(tmp_path))
    for got, want in ((ev, EVAL_PATH), (cal, CALIB_PATH)):
        with open(got, "rb") as a, open(want, "rb") as b:
            assert a.read() == b.read(), f"{want} is stale: rerun evaluation/generate_data.py"


def test_training_stream_deterministic():
    a = gd.training_examples(7, 500)
    b = gd.training_examples(7, 500)
    c = gd.training_examples(8, 500)
    assert gd.dumps_jsonl(a).encode() == gd.dumps_jsonl(b).encode()
    assert a != c
    assert {r["slice"] for r in a} == set(gd.SLICE_NAMES)
    assert all(set(r) == {"prompt", "answer", "slice", "lang"} for r in a)


def test_sets_pairwise_disjoint(eval_rows, calib_rows, train_rows):
    sets = {
        "eval": [r["prompt"] for r in eval_rows],
        "calib": [gd.prompt_from_plain(r["text"]) for r in calib_rows],
        "train": [r["prompt"] for r in train_rows],
    }
    exact = {k: set(v) for k, v in sets.items()}
    norm = {k: {gd.normalize_text(p) for p in v} for k, v in sets.items()}
    names = list(sets)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not exact[a] & exact[b], f"{a}/{b} share prompts"
            assert not norm[a] & norm[b], f"{a}/{b} share normalized prompts"
    # calibration texts are not eval texts either
    eval_texts = {gd.render_plain(r["prompt"], r["reference"]) for r in eval_rows}
    assert not eval_texts & {r["text"] for r in calib_rows}


def test_generator_filter_is_what_keeps_training_disjoint(eval_rows):
    """The raw template stream does hit eval prompts (small template spaces);
    the filter in iter_training_examples is what removes them."""
    held = {gd.normalize_text(r["prompt"]) for r in eval_rows}
    rng = random.Random(gd.DEFAULT_TRAIN_SEED)
    names = gd.SLICE_NAMES
    weights = [gd.TRAIN_WEIGHTS[n] for n in names]
    raw_hits = 0
    for _ in range(N_TRAIN_CHECK):
        name = rng.choices(names, weights=weights)[0]
        prompt, _, _ = gd.SLICES[name][0](rng)
        raw_hits += gd.normalize_text(prompt) in held
    assert raw_hits > 0, "test premise: unfiltered stream collides with the eval set"
    keys = gd.heldout_keys()
    base = gd.base_eval_items()
    assert {gd.text_key(r["prompt"]) for r in base} <= keys
    assert len(keys) == len(base) + len(_jsonl(CALIB_PATH))


# ---------------------------------------------------------------- checkpoint
def test_checkpoint_files_and_config():
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert os.path.isfile(os.path.join(MODEL_DIR, name)), name
    assert os.path.getsize(os.path.join(MODEL_DIR, "model.safetensors")) <= 25 * 1024 * 1024
    with open(os.path.join(MODEL_DIR, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["hidden_size"] % 128 == 0 and cfg["intermediate_size"] % 128 == 0
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert cfg["head_dim"] * cfg["num_attention_heads"] == cfg["hidden_size"]
    assert cfg["tie_word_embeddings"] is False
    assert cfg["hidden_act"] == "silu"
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["rope_theta"] == pytest.approx(10000.0)
    assert 4 <= cfg["num_hidden_layers"] <= 6
    assert cfg["max_position_embeddings"] == 512
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 3)
    with open(os.path.join(MODEL_DIR, "generation_config.json")) as f:
        gen = json.load(f)
    assert gen["do_sample"] is False and gen["max_new_tokens"] == 48
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 3)


def test_checkpoint_loads_in_transformers():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(MODEL_DIR)
    assert cfg.model_type == "llama"
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert emb.data_ptr() != head.data_ptr() and not torch.equal(emb, head)
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.shape[0] == cfg.num_key_value_heads * cfg.head_dim
    assert attn.q_proj.weight.shape[0] == cfg.num_attention_heads * cfg.head_dim
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with torch.no_grad():
        out = model(torch.tensor([[1, 100, 200, 300]]))
    assert out.logits.shape == (1, 4, cfg.vocab_size)


# ---------------------------------------------------------------- tokenizer
@pytest.fixture(scope="module")
def hf_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_tokenizer_special_tokens(hf_tok):
    assert (hf_tok.unk_token, hf_tok.bos_token, hf_tok.eos_token, hf_tok.pad_token) == ("<unk>", "<s>", "</s>", "<pad>")
    assert (hf_tok.unk_token_id, hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (0, 1, 2, 3)
    with open(os.path.join(MODEL_DIR, "config.json")) as f:
        cfg = json.load(f)
    assert len(hf_tok) <= cfg["vocab_size"]
    assert 2048 <= len(hf_tok) <= 4096


def test_tokenizer_json_is_plain_byte_level_bpe():
    with open(os.path.join(MODEL_DIR, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    assert tj["post_processor"] is None, "encoding must not add BOS implicitly"
    assert tj["model"]["type"] == "BPE"
    assert tj["pre_tokenizer"]["type"] == "ByteLevel"
    assert tj["decoder"]["type"] == "ByteLevel"
    specials = {t["content"]: t["id"] for t in tj["added_tokens"] if t["special"]}
    assert specials == {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}


def test_chat_template_and_single_bos(hf_tok):
    for p in ("Where is my order ORD-12345?", "请帮我取消订单ORD-54321。"):
        text = hf_tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        assert text == f"<s>User: {p}\nAssistant:"
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        assert ids[0] == hf_tok.bos_token_id and ids.count(hf_tok.bos_token_id) == 1
        assert hf_tok.eos_token_id not in ids
        # plain encoding adds nothing, even with add_special_tokens=True
        assert hf_tok(p)["input_ids"] == hf_tok(p, add_special_tokens=False)["input_ids"]
        assert hf_tok.bos_token_id not in hf_tok(p)["input_ids"]


def test_tokenizer_round_trip_and_byte_coverage(hf_tok):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(os.path.join(MODEL_DIR, "tokenizer.json"))
    for s in (
        "Your refund for order ORD-48213 has been approved.",
        "您的订单ORD-48213已退款。",
        "2024年3月5日 ¥1,250.50",
        "emoji 🙂 and 韩文 한국어 never seen in training",
    ):
        ids = hf_tok(s, add_special_tokens=False)["input_ids"]
        assert ids == raw.encode(s, add_special_tokens=False).ids
        assert hf_tok.unk_token_id not in ids
        assert hf_tok.decode(ids) == s
    # digits are single tokens (copy-friendly)
    toks = hf_tok.convert_ids_to_tokens(hf_tok("ORD-48213 1250.50", add_special_tokens=False)["input_ids"])
    assert all(len(t.strip("Ġ")) <= 1 for t in toks if any(c.isdigit() for c in t))


def test_eval_max_new_tokens_fits_reference(hf_tok, eval_rows):
    for r in eval_rows:
        refs = r["reference"] if isinstance(r["reference"], list) else [r["reference"]]
        n = max(len(hf_tok(" " + x, add_special_tokens=False)["input_ids"]) for x in refs)
        assert n + 1 <= r["max_new_tokens"], (r["id"], n)
        text = hf_tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False, add_generation_prompt=True)
        assert len(hf_tok(text, add_special_tokens=False)["input_ids"]) + r["max_new_tokens"] <= 512
