"""Issue 36: export reads a checkpoint as transformers 5 reads it (weights file, chat template, tokenizer), each case
compared against transformers itself on tiny real-architecture checkpoints (tests/tiny.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tiny

from pipeline.core.tokenization import TextCodec
from pipeline.errors import InputError
from pipeline.export.inspect import inspect_checkpoint
from pipeline.export.write import export_checkpoint

#: texts beyond the probe's own: digit runs, whitespace, unicode (Qwen2 splits digits one by one, NFC-normalises)
TEXTS = [
    "Order ORD-12345 costs 129.50 USD, due 2024-03-05 (ref 0042).",
    "  two  spaces,\ttabs\tand\n\nblank lines  \n",
    "Ünïcödé café naïve – 我的订单什么时候到？😀",
    "Refund 42.00 USD to card ending 1234 on 2024-12-31.",
    "x  \n\n  y\t\tz 100000 9",
    "订单已经发货了，请耐心等待。谢谢！ 3.14159",
    "e\u0301e\u0301 \u212b \ufb01",
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return tiny.make_checkpoint(tmp_path_factory.mktemp("one_reading") / "llama", "llama")


def _sharded(base: Path, dst: Path) -> list[Path]:
    """``base`` re-saved as 3+ shards + index, with its tokenizer files; returns the shards."""
    import transformers as tf

    tf.AutoModelForCausalLM.from_pretrained(str(base)).save_pretrained(str(dst), max_shard_size="300KB")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(base / f, dst / f)
    shards = sorted(dst.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (dst / "model.safetensors.index.json").is_file()
    return shards


def test_stray_model_safetensors_beside_an_index_is_refused(llama, tmp_path):
    """transformers loads the stray model.safetensors, not the indexed shards; the old export wrote the stray
    file's weights with exit 0 while the inspector validated the shards. Now: exit 2 naming both files."""
    import torch
    import transformers as tf
    from safetensors.torch import load_file

    src = tmp_path / "ambiguous"
    _sharded(llama, src)
    other = tiny.make_checkpoint(tmp_path / "other", "llama", seed=1, tokenizer=False)
    shutil.copyfile(other / "model.safetensors", src / "model.safetensors")
    loaded = tf.AutoModelForCausalLM.from_pretrained(str(src))  # what transformers does with this folder
    stray = load_file(str(other / "model.safetensors"))
    assert torch.equal(loaded.state_dict()["model.embed_tokens.weight"], stray["model.embed_tokens.weight"])
    with pytest.raises(InputError, match=r"model\.safetensors and model\.safetensors\.index\.json.*Fix: delete the stale"):
        export_checkpoint(src, tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out" / "hf").exists()


def test_a_config_transformers_cannot_read_is_named_as_config_json(llama, tmp_path):
    """A trial: rope_scaling {type: dynamic} without its factor passed every check and was reported as "the tokenizer
    files could not be loaded" (the tokenizer loads config.json too). Now config.json is named."""
    src = tmp_path / "nofactor"
    shutil.copytree(llama, src)
    c = json.loads((src / "config.json").read_text())
    c.pop("rope_parameters", None)
    (src / "config.json").write_text(json.dumps({**c, "rope_scaling": {"type": "dynamic"}}))
    with pytest.raises(InputError, match=r"config\.json: transformers cannot read it: KeyError.*factor.*Fix: correct config\.json"):
        export_checkpoint(src, tmp_path / "out", dtype="float32")


def test_shards_without_their_index_name_the_missing_shard(llama, tmp_path):
    """Index deleted and a shard missing: transformers cannot load the folder at all; the refusal names the missing
    shard and the index (the old message blamed config.json)."""
    import transformers as tf

    src = tmp_path / "unindexed"
    shards = _sharded(llama, src)
    (src / "model.safetensors.index.json").unlink()
    shards[1].unlink()
    with pytest.raises(OSError):
        tf.AutoModelForCausalLM.from_pretrained(str(src))
    with pytest.raises(InputError, match=rf"missing from the series: \['{shards[1].name}'\].*restore model\.safetensors\.index\.json"):
        inspect_checkpoint(src)


def _two_templates(llama, tmp_path):
    """A copy of ``llama`` whose tokenizer_config.json has a chat_template other than its chat_template.jinja; returns
    (folder, messages, what transformers renders for them: the .jinja's text)."""
    from transformers import AutoTokenizer

    src = shutil.copytree(llama, tmp_path / "two_templates")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}"
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    msgs = [{"role": "user", "content": "Where is order 12345?"}]
    want = AutoTokenizer.from_pretrained(str(src)).apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert "<<user>>" not in want
    return src, msgs, want


def test_chat_template_jinja_wins_over_tokenizer_config_and_is_said(llama, tmp_path):
    """Both a chat_template.jinja and a different tokenizer_config.json chat_template: transformers renders the .jinja;
    so does the codec now (it read tokenizer_config.json first), and export warns naming both files."""

    src, msgs, want = _two_templates(llama, tmp_path)
    assert TextCodec.from_dir(src).render(messages=msgs) == want
    info = export_checkpoint(src, tmp_path / "out", dtype="float32")
    said = [w for w in info["_warnings"] if "chat_template.jinja" in w]
    assert said and "tokenizer_config.json" in said[0]
    assert TextCodec.from_dir(tmp_path / "out" / "hf").render(messages=msgs) == want


def test_qwen2_with_a_non_qwen_tokenizer_follows_transformers(tmp_path):
    """A Qwen2 checkpoint whose tokenizer.json has a plain ByteLevel pre-tokenizer: transformers' AutoTokenizer builds
    Qwen2Tokenizer (Qwen's digit-splitting regex, NFC) around its vocabulary. The exported tokenizer, read by the
    codec every later stage uses, gives transformers' ids; the export says so and records the probe."""
    from transformers import AutoTokenizer

    src = tiny.make_checkpoint(tmp_path / "qwen2", "qwen2")
    hf = AutoTokenizer.from_pretrained(str(src), trust_remote_code=False)
    assert type(hf).__name__ == "Qwen2Tokenizer"
    assert any(TextCodec.from_dir(src).encode_text(t) != hf.encode(t, add_special_tokens=False) for t in TEXTS)
    info = export_checkpoint(src, tmp_path / "out", dtype="float32")
    codec = TextCodec.from_dir(tmp_path / "out" / "hf")
    for t in TEXTS:
        assert codec.encode_text(t) == hf.encode(t, add_special_tokens=False), t
    msgs = [{"role": "user", "content": "Refund 129.50 for order 12345, please."}]
    ids = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert codec.encode_prompt(messages=msgs) == list(ids)
    parity = info["tokenizer_parity"]
    assert parity["followed"] == "Qwen2Tokenizer" and parity["source_mismatches"] > 0
    assert any("tokenizes differently from transformers" in w and "tokenizer.json" in w for w in info["_warnings"])
    written = json.loads((tmp_path / "out" / "model_info.json").read_text())
    assert written["tokenizer_parity"] == parity
    # the exported folder reads the same in transformers
    again = AutoTokenizer.from_pretrained(str(tmp_path / "out" / "hf"))
    assert all(again.encode(t, add_special_tokens=False) == hf.encode(t, add_special_tokens=False) for t in TEXTS)


def test_matching_tokenizer_is_copied_and_recorded(llama, tmp_path):
    """A tokenizer transformers reads as written: tokenizer.json is copied byte for byte, the probe is recorded clean."""
    from pipeline.export.tokenizer import PROBE_TEXTS

    info = export_checkpoint(llama, tmp_path / "out", dtype="float32")
    assert info["tokenizer_parity"]["followed"] is None and info["tokenizer_parity"]["source_mismatches"] == 0
    assert info["tokenizer_parity"]["probes"] >= len(PROBE_TEXTS) + 1  # the texts and one chat conversation
    assert (tmp_path / "out" / "hf" / "tokenizer.json").read_bytes() == (llama / "tokenizer.json").read_bytes()


_RENDER_457 = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps(tok.apply_chat_template(json.loads(sys.argv[2]), add_generation_prompt=True, tokenize=False)))
"""


def test_the_exported_folder_holds_only_the_template_transformers_uses(llama, tmp_path):
    """Fresh-user trial: a source with a chat_template.jinja and a different tokenizer_config.json chat_template was
    exported with both, so a consumer reading hf/tokenizer_config.json (an older transformers, a Triton client) got the
    stale one. Now hf/ holds one template, the one transformers renders from the source: transformers 5 here and 4.57
    (the serving image's, .venv-trtllm-compat) render it from hf/, and hf/tokenizer_config.json read without the
    .jinja beside it offers no other."""
    import subprocess

    from transformers import AutoTokenizer

    src, msgs, want = _two_templates(llama, tmp_path)
    export_checkpoint(src, tmp_path / "out", dtype="float32")
    hf = tmp_path / "out" / "hf"

    assert AutoTokenizer.from_pretrained(str(hf)).apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == want
    compat = Path(__file__).resolve().parents[2] / ".venv-trtllm-compat" / "bin" / "python"
    if compat.exists():
        r = subprocess.run([str(compat), "-c", _RENDER_457, str(hf), json.dumps(msgs)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout.strip().splitlines()[-1]) == want
    # a reader of tokenizer_config.json alone (no chat_template.jinja beside it) finds no second template
    assert "chat_template" not in json.loads((hf / "tokenizer_config.json").read_text())
    only_config = tmp_path / "only_config"
    only_config.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(hf / f, only_config / f)
    assert AutoTokenizer.from_pretrained(str(only_config)).chat_template is None


def test_a_source_with_one_template_keeps_it_where_it_is(llama, tmp_path):
    """Only tokenizer_config.json holds a template (no .jinja): it stays there, and transformers renders it from hf/."""
    from transformers import AutoTokenizer

    src = shutil.copytree(llama, tmp_path / "config_template")
    template = (src / "chat_template.jinja").read_text()
    (src / "chat_template.jinja").unlink()
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    msgs = [{"role": "user", "content": "Where is order 12345?"}]
    want = AutoTokenizer.from_pretrained(str(src)).apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    export_checkpoint(src, tmp_path / "out", dtype="float32")
    hf = tmp_path / "out" / "hf"
    assert not (hf / "chat_template.jinja").exists()
    assert json.loads((hf / "tokenizer_config.json").read_text())["chat_template"] == template
    assert AutoTokenizer.from_pretrained(str(hf)).apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == want
