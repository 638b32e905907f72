"""Issue 24: one decoding policy everywhere (``pipeline/core/decoding.py``).

A tiny real Llama whose ``generation_config.json`` carries ``repetition_penalty`` 1.3 and sampling defaults (the shape
of Qwen2.5-Instruct's file) goes through the real pipeline (export -> quantize none -> onnxruntime-genai build ->
evaluate -> package with the real Triton serving-parity replay).  On the old code transformers' ``generate``
back-filled the penalty into the baseline while the engine and the served model decoded without it: engine ==
baseline on 0/12 items.  Now every runner and the served model apply the same policy, recorded in the report and
the release manifest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiny

from pipeline.core.decoding import DecodingPolicy, policy_from_dict, read_policy
from pipeline.errors import InputError
from pipeline.serve.server import DEFAULT_SERVE_VENV

ROOT = Path(__file__).resolve().parents[2]
# top_k 1: the model's recommended sampling is deterministic, so "omitted fields take the model's values" is testable
QWEN_LIKE = {"repetition_penalty": 1.3, "temperature": 0.6, "top_p": 0.9, "top_k": 1, "do_sample": True}
LOOSE_GATE = ["eval.gate.max_drop=1.0", "eval.gate.slice_max_drop=1.0", "eval.gate.max_kld=1000", "eval.gate.min_top1=0"]


def _checkpoint(out: Path, **gen: object) -> Path:
    p = tiny.make_checkpoint(out, "llama")
    g = json.loads((p / "generation_config.json").read_text())
    g.update(gen)
    (p / "generation_config.json").write_text(json.dumps(g))
    return p


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=str(cwd), env=env, capture_output=True, text=True, timeout=1800)


def test_policy_reads_penalty_and_sampling_and_refuses_what_no_engine_applies(tmp_path):
    p = policy_from_dict({**QWEN_LIKE, "top_k": 20, "num_beams": 4, "eos_token_id": 2})
    assert p.repetition_penalty == 1.3 and p.penalty == 1.3
    assert p.sampling == {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20}
    assert p.ignored == {"num_beams": 4}
    assert DecodingPolicy.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert policy_from_dict({}).penalty is None and read_policy(tmp_path).to_json()["source"] == "none"
    with pytest.raises(InputError, match=r"no_repeat_ngram_size=3 .*Fix: remove no_repeat_ngram_size"):
        policy_from_dict({"no_repeat_ngram_size": 3})
    # min_p: no served runtime has min-p sampling; recorded-and-dropped would let served sampling differ silently
    with pytest.raises(InputError, match=r"min_p=0.05 .*onnxruntime-genai.*min_p input.*Fix: remove min_p"):
        policy_from_dict({**QWEN_LIKE, "min_p": 0.05})
    assert "min_p" not in policy_from_dict({**QWEN_LIKE, "min_p": 0.0}).sampling  # the neutral value is accepted
    for bad in ({"repetition_penalty": 0}, {"top_p": 0}, {"temperature": -1}, {"top_k": -2}):
        with pytest.raises(InputError, match=rf"{next(iter(bad))}=.*is outside"):
            policy_from_dict(bad, "ck/generation_config.json")
    # trial 3: a wrong type was said as "outside [0, 2147483648]", and only the first problem of the file was reported
    for bad, said in (
        ({"repetition_penalty": "x"}, "repetition_penalty='x' is not a number"),
        ({"top_k": 40.5}, "top_k=40.5 is not a whole number"),
    ):
        with pytest.raises(InputError, match=said):
            policy_from_dict(bad)
    with pytest.raises(InputError) as e:
        policy_from_dict({"top_k": "abc", "temperature": -1, "min_p": 0.05}, "ck/generation_config.json")
    msg = str(e.value)
    assert msg.startswith("ck/generation_config.json: 3 problems:") and "top_k='abc' is not a whole number" in msg, msg
    assert "temperature=-1 is outside [0.0, 100.0]" in msg and "min_p=0.05" in msg, msg


@pytest.mark.parametrize("field, value", [("no_repeat_ngram_size", 3), ("min_p", 0.05)])
def test_refused_field_exits_2_before_any_stage(tmp_path, field, value):
    ck = _checkpoint(tmp_path / "ck", **{field: value})
    r = _cli([f"model.path={ck}", "quant=none", "stages=[export]", f"store_dir={tmp_path / 'store'}", "progress=false"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{field}={value}" in r.stderr + r.stdout and "Fix:" in r.stderr + r.stdout
    assert not (tmp_path / "store" / "export").exists() or not any((tmp_path / "store" / "export").iterdir())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")
    from rich.console import Console

    from pipeline.core.config import compose
    from pipeline.runner import run_pipeline

    root = tmp_path_factory.mktemp("decoding")
    ck = _checkpoint(root / "ck", **QWEN_LIKE)
    cfg = compose(
        [
            f"model.path={ck}",
            "quant=none",
            "target=onnxruntime_genai",
            "stages=[package]",
            f"store_dir={root / 'store'}",
            "eval.limit=12",
            "build.max_seq_len=256",
            "build.max_input_len=192",
            "progress=false",
            *LOOSE_GATE,  # random weights score 0: the test compares the runners' ids, not scores
        ]
    )
    summary = run_pipeline(cfg, console=Console(quiet=True))
    assert summary.exit_code == 0, summary.error
    return {r.stage: Path(r.path) for r in summary.stages}


@pytest.mark.slow
def test_baseline_engine_and_served_decode_with_the_checkpoints_penalty(run):
    rows = [json.loads(line) for line in (run["evaluate"] / "outputs.jsonl").read_text().splitlines()]
    by: dict[str, dict] = {}
    for r in rows:
        by.setdefault(r["id"], {})[r["runner"]] = r
    assert len(by) == 12
    for item, v in by.items():  # old code: 0/12 (the baseline inherited the penalty, the engine did not)
        assert v["engine"]["output_ids"] == v["baseline"]["output_ids"], item
    # served (real Triton, the packaged onnxruntime_genai model, unary + streamed) == evaluated, byte for byte
    manifest = json.loads((run["package"] / "release_manifest.json").read_text())
    assert manifest["parity"]["matched"] == manifest["parity"]["total"] == 24, manifest["parity"]
    # ... and the penalty was applied, not dropped by all: transformers without it answers differently
    assert any(_plain_greedy(run["export"]).get(i) != v["baseline"]["output_ids"] for i, v in by.items())
    # record of the one policy, everywhere
    report = json.loads((run["evaluate"] / "eval_report.json").read_text())
    for doc in (report["decoding"], manifest["decoding"], json.loads((run["export"] / "decoding.json").read_text())):
        assert doc["repetition_penalty"] == 1.3 and doc["gate"] == "greedy" and doc["sampling"]["top_k"] == 1
        assert doc["source"] == "generation_config.json"
    served = json.loads((run["package"] / "model_repository" / "onnxruntime_genai" / "1" / "decoding.json").read_text())
    assert served["repetition_penalty"] == 1.3


def _plain_greedy(export: Path) -> dict[str, list[int]]:
    """The export's model in transformers, greedy WITHOUT any penalty, on the evaluate stage's prompts."""
    from pipeline.core.config import compose, resolve_path
    from pipeline.data.evalset import load_eval_set, prepare
    from pipeline.evaluate.runners import HFRunner, load_hf_model, load_tokenizer

    e = compose([]).eval
    tok = load_tokenizer(export / "hf")
    items = load_eval_set(resolve_path(e.eval_set), limit=12)
    prep = prepare(items, tok, max_input_len=192, max_seq_len=256, default_max_new_tokens=e.max_new_tokens, extra_stop=e.stop)
    runner = HFRunner(load_hf_model(export / "hf"), tok, stop_ids=[2], pad_id=3, name="plain")
    return {k: o.output_ids for k, o in runner.run(prep, 4).items()}


def _post(url: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.mark.slow
def test_openai_omitted_sampling_fields_take_the_models_values_and_extra_fields_work(run):
    """Issue 24 case 2 (and 7): a request without temperature samples with the model's recommended values (here
    temperature 0.6, top_p 0.9, top_k 1, i.e. the top token), not OpenAI's temperature 1 over the whole vocabulary;
    top_k / repetition_penalty / ignore_eos / min_tokens are honoured, min_p is refused naming itself."""
    from pipeline.serve.openai_server import OpenAIServer
    from pipeline.serve.server import TritonServer

    repo = run["package"] / "model_repository"
    srv = TritonServer(repo, ready_timeout_s=180).start()
    oai = OpenAIServer(srv.grpc_url, repo, port=0).start()
    try:
        assert oai.frontend is not None and oai.frontend.sampling_defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 1}
        url = oai.url + "/completions"
        base = {"model": "ck", "prompt": "Where is my order ORD-12345?", "max_tokens": 24}
        greedy = _post(url, {**base, "temperature": 0})
        assert greedy[0] == 200, greedy
        for _ in range(3):  # old code: temperature 1, no top-k: random text, differing from greedy
            got = _post(url, base)
            assert got[0] == 200 and got[1]["choices"][0]["text"] == greedy[1]["choices"][0]["text"], (got[1].get("error"), greedy)
        explicit = _post(url, {**base, "temperature": 1.0, "top_k": 1})  # an explicit value wins; top_k honoured
        assert explicit[0] == 200 and explicit[1]["choices"][0]["text"] == greedy[1]["choices"][0]["text"]
        fixed = _post(url, {**base, "temperature": 0, "max_tokens": 40, "ignore_eos": True})
        assert fixed[0] == 200 and fixed[1]["usage"]["completion_tokens"] == 40, fixed
        assert _post(url, {**base, "temperature": 0, "min_tokens": 8, "repetition_penalty": 1.0})[0] == 200
        bad = _post(url, {**base, "min_p": 0.1})
        assert bad[0] == 400 and bad[1]["error"]["param"] == "min_p", bad
    finally:
        oai.stop()
        srv.stop()
