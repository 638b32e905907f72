"""The TensorRT-LLM package's ``tensorrt_llm_bls`` served for real, against the package's own ensemble.

TensorRT-LLM cannot run here, so the ``tensorrt_llm`` model of the generated TensorRT-LLM repository is replaced by a
test double with its token-id interface: the CPU target's ``onnxruntime_genai`` model (a real onnxruntime-genai engine
built from a tiny random Llama, served under the name ``tensorrt_llm``; its config additionally declares the 1.x input
names ``min_tokens``/``seed`` the TensorRT-LLM ensemble maps, unused here). Everything else (``ensemble``,
``preprocessing``, ``postprocessing``, ``tensorrt_llm_bls``) is the generated package as shipped. The outputs below are
the double's, not a TensorRT-LLM engine's: what is checked is that the BLS (preprocessing -> engine -> postprocessing
by BLS calls) answers exactly as the ensemble does, unary and streamed, and that its draft/verify rounds (a draft-model
package: `tensorrt_llm_draft` is the same double) give the greedy answer.
"""

from __future__ import annotations

import json
import queue
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tiny

from pipeline.core.config.package import PackageConfig
from pipeline.core.contracts.build import BuildInfo
from pipeline.core.contracts.export import ModelInfo
from pipeline.serve.server import DEFAULT_SERVE_VENV, TritonServer

pytestmark = pytest.mark.slow

PROMPTS = ["Where is my order ORD-12345?", "我的订单什么时候到？"]
MAX_TOKENS = 10
LIMITS = {"max_batch_size": 4, "max_input_len": 96, "max_seq_len": 128}


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_llama):
    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")
    from pipeline.core.config import compose
    from pipeline.core.targets import get_target
    from pipeline.package.repository import generate_repository, settings_from_build

    d = tmp_path_factory.mktemp("trtbls")
    info = tiny.read_json(tiny_llama / "config.json")
    model_info = {"eos_token_ids": [info["eos_token_id"]], "pad_token_id": info["pad_token_id"], "bos_token_id": info["bos_token_id"]}
    # the real engine behind the double: an fp32 onnxruntime-genai build of the tiny Llama
    cfg = compose(
        [
            "target=onnxruntime_genai",
            "quant=none",
            f"model.path={tiny_llama}",
            "build.max_batch_size=4",
            "build.max_input_len=96",
            "build.max_seq_len=128",
        ]
    )
    (d / "q").mkdir()
    (d / "q" / "hf").symlink_to(tiny_llama, target_is_directory=True)
    (d / "b").mkdir()
    get_target("onnxruntime_genai").build(cfg, d / "q", d / "b", export_dir=d / "q")
    # the double streams one token per response, as TensorRT-LLM's backend does
    pc = PackageConfig(name="tiny", stream_coalescing=False)
    # the TensorRT-LLM package as generated (its engine folder is placeholder test data, never loaded: replaced below)
    trt_engine = d / "trt_engine"
    trt_engine.mkdir()
    (trt_engine / "config.json").write_text(json.dumps({"version": "1.2.1"}))
    (d / "draft_engine").mkdir()
    (d / "draft_engine" / "config.json").write_text(json.dumps({"version": "1.2.1"}))
    # a draft-model build (build.speculative.mode=draft_tokens_external): the package has tensorrt_llm_draft too
    bi = {
        "target": "tensorrt_llm",
        "backend": "tensorrt",
        "limits": LIMITS,
        "versions": {"tensorrt_llm": "1.2.1"},
        "runtime": {"speculative": {"mode": "draft_tokens_external", "max_draft_len": 3, "draft_model_path": str(tiny_llama)}},
    }
    repo = d / "repo"
    generate_repository(
        repo,
        settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json(model_info), pc),
        engine_dir=trt_engine,
        tokenizer_dirs=[tiny_llama],
    )
    assert (repo / "tensorrt_llm_draft" / "config.pbtxt").is_file()
    # the double: the CPU package's onnxruntime_genai model, renamed tensorrt_llm
    cpu = d / "cpu"
    generate_repository(
        cpu,
        settings_from_build(BuildInfo.from_json({**bi, "target": "onnxruntime_genai"}), ModelInfo.from_json(model_info), pc),
        engine_dir=d / "b" / "engine",
        tokenizer_dirs=[tiny_llama],
    )
    # (the draft double is the same engine: with greedy decoding every draft id is the engine's own, and the target
    # double ignores draft_input_ids and generates its k + 1 greedy ids, which is what verification yields when greedy)
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        shutil.rmtree(repo / name)
        shutil.copytree(cpu / "onnxruntime_genai", repo / name)
        c = (repo / name / "config.pbtxt").read_text(encoding="utf-8")
        assert 'name: "onnxruntime_genai"' in c
        c = c.replace('name: "onnxruntime_genai"', f'name: "{name}"', 1).replace(
            "input [",
            'input [\n  { name: "min_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },\n'
            '  { name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true },\n'
            '  { name: "draft_input_ids" data_type: TYPE_INT32 dims: [ -1 ] optional: true allow_ragged_batch: true },',
            1,
        )
        (repo / name / "config.pbtxt").write_text(c, encoding="utf-8")
    # a second BLS with accumulate_tokens=true (the shipped one has false)
    shutil.copytree(repo / "tensorrt_llm_bls", repo / "tensorrt_llm_bls_acc")
    c = (repo / "tensorrt_llm_bls_acc" / "config.pbtxt").read_text(encoding="utf-8")
    assert c.count('name: "tensorrt_llm_bls"') == 1 and c.count('string_value: "false"') == 1
    c = c.replace('name: "tensorrt_llm_bls"', 'name: "tensorrt_llm_bls_acc"').replace('string_value: "false"', 'string_value: "true"')
    (repo / "tensorrt_llm_bls_acc" / "config.pbtxt").write_text(c, encoding="utf-8")
    srv = TritonServer(repo, grpc_port=0, http_port=0, metrics_port=0, ready_timeout_s=120, log_dir=d / "serve-log")
    srv.start()
    try:
        yield SimpleNamespace(server=srv, url=srv.grpc_url, repo=repo)
    finally:
        srv.stop()


def _call(url: str, model: str, prompt: str, *, stream: bool, **extra: tuple[np.ndarray, str]) -> tuple[list[bytes], str | None]:
    """One request on a gRPC stream, built with plain tritonclient; returns (text_output chunks, error or None)."""
    import tritonclient.grpc as g

    def t(name: str, arr: np.ndarray, dt: str) -> g.InferInput:
        i = g.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        return i

    inputs = [
        t("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
        t("max_tokens", np.array([[MAX_TOKENS]], dtype=np.int32), "INT32"),
        t("stream", np.array([[stream]], dtype=bool), "BOOL"),
    ]
    inputs += [t(k, a, dt) for k, (a, dt) in extra.items()]
    q: queue.Queue = queue.Queue()
    cli = g.InferenceServerClient(url)
    cli.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        cli.async_stream_infer(model, inputs, outputs=[g.InferRequestedOutput("text_output")], enable_empty_final_response=True)
        chunks: list[bytes] = []
        while True:
            r, e = q.get(timeout=60)
            if e is not None:
                return chunks, str(e)
            resp = r.get_response()
            if resp.outputs:
                chunks += [x for x in r.as_numpy("text_output").reshape(-1)]
            if resp.parameters.get("triton_final_response") and resp.parameters["triton_final_response"].bool_param:
                return chunks, None
    finally:
        cli.stop_stream()
        cli.close()


def test_bls_answers_equal_the_ensemble_unary_and_streamed(served):
    for p in PROMPTS:
        for stream in (False, True):
            ens, err = _call(served.url, "ensemble", p, stream=stream)
            assert err is None, err
            bls, err = _call(served.url, "tensorrt_llm_bls", p, stream=stream)
            assert err is None, err
            assert bls == ens, (p, stream)
            assert b"".join(bls), (p, stream)  # the engine generated something
            if not stream:
                assert len(bls) == 1  # text_output [1]: one entry for batch 1, beam 1
            else:
                assert len(bls) > 1  # one response per generated token


def test_bls_speculative_with_the_draft_model_answers_as_greedy(served):
    """num_draft_tokens=3 (draft/verify rounds through tensorrt_llm_draft and tensorrt_llm): the greedy answer is the
    ensemble's; streamed, one response per round (up to 4 ids each)."""
    k = {"num_draft_tokens": (np.array([[3]], dtype=np.int32), "INT32")}
    for p in PROMPTS:
        ens, err = _call(served.url, "ensemble", p, stream=False)
        assert err is None, err
        spec, err = _call(served.url, "tensorrt_llm_bls", p, stream=False, **k)
        assert err is None, err
        assert spec == ens, p
        chunks, err = _call(served.url, "tensorrt_llm_bls", p, stream=True, **k)
        assert err is None, err
        per_token, _ = _call(served.url, "ensemble", p, stream=True)
        assert 1 < len(chunks) <= -(-MAX_TOKENS // 4) + 1 and len(chunks) < len(per_token), (chunks, per_token)


def test_bls_refuses_draft_logits_and_the_model_keeps_serving(served):
    chunks, err = _call(
        served.url,
        "tensorrt_llm_bls",
        PROMPTS[0],
        stream=False,
        num_draft_tokens=(np.array([[3]], dtype=np.int32), "INT32"),
        use_draft_logits=(np.array([[True]]), "BOOL"),
    )
    assert chunks == [] and err is not None and "use_draft_logits=true" in err
    ok, err = _call(served.url, "tensorrt_llm_bls", PROMPTS[0], stream=False)
    assert err is None and ok


def test_bls_refuses_draft_tokens_without_a_draft_model():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "served_bls", Path(__file__).resolve().parents[2] / "pipeline" / "serve" / "models" / "tensorrt_llm_bls_model.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(mod.BlsError, match="num_draft_tokens=2: this package has no draft model"):
        mod.draft_tokens({"num_draft_tokens": np.array([[2]], np.int32)}, "")
    assert mod.draft_tokens({"num_draft_tokens": np.array([[2]], np.int32)}, "tensorrt_llm_draft") == 2
    assert mod.draft_tokens({}, "") == 0


def test_bls_accumulate_tokens_streams_the_text_so_far(served):
    """accumulate_tokens=true: the k-th streamed text_output decodes the first k ids, so the last one is the whole answer."""
    whole, err = _call(served.url, "ensemble", PROMPTS[0], stream=False)
    assert err is None, err
    deltas, err = _call(served.url, "tensorrt_llm_bls", PROMPTS[0], stream=True)
    assert err is None, err
    acc, err = _call(served.url, "tensorrt_llm_bls_acc", PROMPTS[0], stream=True)
    assert err is None, err
    assert len(acc) == len(deltas) > 1 and acc[-1] == whole[0]
    assert all(acc[k].startswith(acc[k - 1]) for k in range(1, len(acc))), acc


def test_bls_decoupled_follows_the_engine_model(tmp_path):
    """package.decoupled=false: tensorrt_llm and tensorrt_llm_bls are both non-decoupled (and both true otherwise)."""
    from pipeline.package.repository import generate_repository, settings_from_build
    from pipeline.package.validate import parse_config

    eng = tmp_path / "e"
    eng.mkdir()
    (eng / "config.json").write_text("{}")
    tiny.make_tokenizer(tmp_path / "tok")
    bi = {"target": "tensorrt_llm", "backend": "tensorrt", "limits": LIMITS}
    for decoupled in (False, True):
        pc = SimpleNamespace(
            max_batch_size=None,
            max_input_len=None,
            max_beam_width=None,
            decoupled=decoupled,
            exclude_input_in_output=True,
            instance_count=2,
            name="t",
        )
        repo = tmp_path / f"r{decoupled}"
        out = generate_repository(
            repo,
            settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json({"eos_token_ids": [2]}), pc),
            engine_dir=eng,
            tokenizer_dirs=[tmp_path / "tok"],
        )
        assert "tensorrt_llm_bls" in out["models"]
        bls, trt = parse_config(repo / "tensorrt_llm_bls" / "config.pbtxt"), parse_config(repo / "tensorrt_llm" / "config.pbtxt")
        assert bls.model_transaction_policy.decoupled == trt.model_transaction_policy.decoupled == decoupled
        assert bls.backend == "python" and bls.instance_group[0].count == 2 and (repo / "tensorrt_llm_bls" / "1" / "model.py").is_file()
