"""Issue 34: what the ``tensorrt_llm_pytorch`` package ships loads on the transformers the serving image has.

TensorRT-LLM 1.2.x (the default serving image's, ``pipeline/facts/versions.py``) pins transformers 4.57.1; the
pipeline writes its files on transformers 5. A ``tokenizer_config.json`` saved by transformers 5
(``tokenizer_class: TokenizersBackend``, ``extra_special_tokens`` as a list) does not load on 4.57, and a ``config.json``
saved by 5 (``rope_parameters`` only) is read by 4.57 with the default ``rope_theta`` 10000.

What is real: a tiny Llama checkpoint saved by transformers 5 (``rope_theta`` 500000, two additional special tokens),
the pipeline CLI (export, ModelOpt FP8 quantization, evaluation, package) writing the LLM-API model repository, and a
separate venv with transformers 4.57.1 + tokenizers + safetensors (``.venv-trtllm-compat``, ``make
trtllm-compat-env``; no torch) that loads ``tensorrt_llm/1/checkpoint`` and ``tensorrt_llm/1/tokenizer`` as the
PyTorch backend does: ``AutoConfig``, ``AutoTokenizer`` + ``apply_chat_template``, ``GenerationConfig``, the
safetensors headers. What is NOT run: TensorRT-LLM itself and the quantized weights' load (needs a GPU and ModelOpt's
format support in TensorRT-LLM).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "pipeline" / "package" / "requirements-trtllm-compat.txt"
COMPAT_VENV = ROOT / ".venv-trtllm-compat"
PROBE = Path(__file__).with_name("trtllm_compat_probe.py")
ROPE_THETA = 500000.0
EXTRA_SPECIALS = ["<|im_start|>", "<|im_end|>"]
CONVERSATION = [
    {"role": "system", "content": "You are a support agent."},
    {"role": "user", "content": "Where is my order ORD-12345?"},
    {"role": "assistant", "content": "It ships on 2024-03-05."},
    {"role": "user", "content": "Please cancel it and refund 129.50 dollars."},
]


def _pin() -> str:
    (v,) = re.findall(r"^transformers==(\S+)", REQUIREMENTS.read_text(encoding="utf-8"), flags=re.M)
    return v


@pytest.fixture(scope="session")
def compat_python() -> Path:
    """The compat venv's python, created once by the Makefile's recipe (``make trtllm-compat-env``; a no-op when its
    stamp is newer than the requirements file)."""
    r = subprocess.run(["make", "-s", "trtllm-compat-env"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    py = COMPAT_VENV / "bin" / "python"
    v = subprocess.run([str(py), "-c", "import transformers; print(transformers.__version__)"], capture_output=True, text=True)
    assert v.stdout.strip() == _pin(), v.stderr[-2000:]
    return py


def _transformers5_checkpoint(d: Path) -> Path:
    """Tiny Llama saved by this environment's transformers 5, with two additional special tokens in its tokenizer."""
    from tiny import make_checkpoint
    from transformers import AutoTokenizer

    make_checkpoint(d, max_position_embeddings=1024, rope_theta=ROPE_THETA)
    tok = AutoTokenizer.from_pretrained(str(d))
    tok.add_special_tokens({"additional_special_tokens": EXTRA_SPECIALS})
    tok.save_pretrained(str(d))
    cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    # the two spellings transformers 4.57 cannot read (module docstring): the input really has them
    assert cfg["tokenizer_class"] == "TokenizersBackend" and cfg["extra_special_tokens"] == EXTRA_SPECIALS, cfg
    return d


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """``model_repository/tensorrt_llm/1`` of the package the CLI writes for target=tensorrt_llm_pytorch (fp8)."""
    from pipeline.core.hostinfo import gpus

    if gpus():
        pytest.skip("packages on a CPU host for a named GPU (test_forward26.py); a GPU host needs tensorrt_llm")
    tmp = tmp_path_factory.mktemp("trtllm_compat")
    ckpt = _transformers5_checkpoint(tmp / "ck")
    over = ["target=tensorrt_llm_pytorch", "target.gpu=h100_sxm", "quant=fp8", f"model.path={ckpt}", "model.name=tiny"]
    r = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *over, f"store_dir={tmp / 'store'}", f"hydra.run.dir={tmp / 'run'}"],
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (pkg,) = [p.parent for p in (tmp / "store" / "package").glob("*/release_manifest.json")]
    return pkg / "model_repository" / "tensorrt_llm" / "1"


@pytest.fixture(scope="module")
def read_there(shipped, compat_python) -> dict[str, Any]:
    """What transformers 4.57 reads from the shipped files (``trtllm_compat_probe.py`` in the compat venv)."""
    r = subprocess.run(
        [str(compat_python), str(PROBE), str(shipped / "checkpoint"), str(shipped / "tokenizer"), json.dumps(CONVERSATION)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_compat_venv_has_the_pinned_transformers_and_no_torch(compat_python):
    r = subprocess.run([str(compat_python), "-c", "import torch"], capture_output=True, text=True)
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr  # kept small: nothing here needs torch


def test_the_checkpoint_config_reads_the_same_on_4_57(shipped, read_there):
    from transformers import AutoConfig

    here = AutoConfig.from_pretrained(str(shipped / "checkpoint"))
    c = read_there["config"]
    assert read_there["transformers"] == _pin() and "error" not in c, c
    assert here.rope_parameters["rope_theta"] == ROPE_THETA
    assert c["rope_theta"] == ROPE_THETA  # was 10000.0: ModelOpt's writer (transformers 5) dropped rope_theta
    assert c["rope_scaling"] is None and c["class"] == "LlamaConfig" and c["quant_algo"] == "FP8"
    assert (c["vocab_size"], c["max_position_embeddings"], c["eos_token_id"]) == (
        here.vocab_size,
        here.max_position_embeddings,
        here.eos_token_id,
    )
    assert c["dtype"] == str(here.dtype).removeprefix("torch.")  # torch_dtype (4.57 without torch keeps the string)


@pytest.mark.parametrize("where", ["checkpoint", "tokenizer"])
def test_the_tokenizer_and_chat_template_load_on_4_57_and_render_as_our_pipeline(shipped, read_there, where):
    """``tensorrt_llm/1/tokenizer`` (model.yaml ``tokenizer``) and the checkpoint's own copy: AutoTokenizer loads on
    4.57 (was: "Tokenizer class TokenizersBackend does not exist"), keeps the chat template and the additional special
    tokens, and renders and tokenizes the conversation exactly as the pipeline's TextCodec does."""
    from pipeline.core.tokenization import TextCodec

    t = read_there["checkpoint_tokenizer" if where == "checkpoint" else "tokenizer"]
    assert "error" not in t, t
    codec = TextCodec.from_dir(shipped / where)
    assert t["class"] == "PreTrainedTokenizerFast" and t["has_chat_template"]
    assert t["rendered"] == codec.render(messages=CONVERSATION)
    assert t["ids"] == codec.encode_prompt(messages=CONVERSATION)
    assert set(EXTRA_SPECIALS) <= set(t["special_tokens"])
    assert (t["eos_token_id"], t["pad_token_id"]) == (codec.eos_id, codec.pad_id)
    assert {codec.tokenizer.token_to_id(s) for s in EXTRA_SPECIALS} <= codec.special_ids  # special to both


@pytest.mark.parametrize("where", ["checkpoint", "tokenizer"])
def test_the_generation_config_loads_on_4_57_with_our_ids(shipped, read_there, where):
    from transformers import GenerationConfig

    here = GenerationConfig.from_pretrained(str(shipped / where))
    there = read_there[f"{where}_generation"]
    assert "error" not in there, there
    assert there == {k: getattr(here, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    assert (there["bos_token_id"], there["eos_token_id"], there["pad_token_id"]) == (1, 2, 3)  # tiny.hf_config


def _header(f: Path) -> dict[str, list]:
    with open(f, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        doc = json.loads(fh.read(n))
    return {k: [v["dtype"], v["shape"]] for k, v in doc.items() if k != "__metadata__"}


def test_the_safetensors_headers_read_the_same_on_4_57(shipped, read_there):
    """Every tensor's name, dtype and shape as the serving image's safetensors reads them (the FP8 weights and their
    scales included); loading the values is ModelOpt's format support inside TensorRT-LLM, not run here."""
    here: dict[str, list] = {}
    for f in sorted((shipped / "checkpoint").glob("*.safetensors")):
        here.update(_header(f))
    there = read_there["headers"]
    assert "error" not in there, there
    assert there == here
    assert any(d == "F8_E4M3" for d, _ in here.values()) and any(k.endswith("weight_scale") for k in here)
