"""The LLM-API (TensorRT-LLM PyTorch backend) package's ``ensemble`` / ``tensorrt_llm_bls`` adapter, served for real.

What is real: the model repository as the package stage generates it for ``target=tensorrt_llm_pytorch`` (the adapter
models ``ensemble`` and ``tensorrt_llm_bls`` with their generated ``config.pbtxt`` and ``tensor_map.json``, the LLM-API
``tensorrt_llm/config.pbtxt`` with upstream's tensors), the Triton server (nvidia-pytriton's tritonserver 2.51), the
gRPC clients (plain ``tritonclient`` requests as NVIDIA's clients build them, our ``LLMClient``, the parity replay).

What is a TEST DOUBLE: ``tensorrt_llm/1/model.py`` is ``tests/llmapi_double_model.py``, not NVIDIA's llmapi model.py
and not TensorRT-LLM (which cannot run here): its text is a JSON report of the ``sampling_param_*`` inputs it received,
streamed cumulatively as upstream's model.py streams. Nothing here ran a model on a GPU; what is checked is the
mapping (names, types, streaming, refusals), not generation.
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

HERE = Path(__file__).resolve().parents[1]
LIMITS = {"max_batch_size": 4, "max_input_len": 96, "max_seq_len": 128}
TRTLLM = "1.2.1"  # the default serving image's TensorRT-LLM (pipeline/facts/versions.py), whose option verdicts are recorded


def _repo(tmp: Path, ckpt: Path, *, decoupled: bool = True) -> tuple[Path, dict]:
    from pipeline.package.repository import generate_repository, settings_from_build

    info = tiny.read_json(ckpt / "config.json")
    mi = {"eos_token_ids": [info["eos_token_id"]], "pad_token_id": info["pad_token_id"], "bos_token_id": info["bos_token_id"]}
    bi = {"target": "tensorrt_llm", "backend": "pytorch", "limits": LIMITS}
    s = settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json(mi), PackageConfig(name="tiny", decoupled=decoupled))
    repo = tmp / "repo"
    out = generate_repository(repo, s, engine_dir=ckpt, tokenizer_dirs=[ckpt], trtllm_version=TRTLLM)
    return repo, {**out, "end_id": s.end_id, "pad_id": s.pad_id}


def test_the_llmapi_layout_has_the_adapter_and_the_table_covers_every_input(tmp_path, tiny_llama):
    """Structure only (no server): every ensemble / tensorrt_llm_bls input has one entry, every forwarded name is an
    input of the packaged LLM-API model with its data type, and the repository validates."""
    from pipeline.package import llmapi_adapter as A
    from pipeline.package.validate import parse_config, validate_repository

    repo, info = _repo(tmp_path, tiny_llama)
    assert info["layout"] == "llmapi" and info["models"] == ["ensemble", "tensorrt_llm", "tensorrt_llm_bls"]
    assert validate_repository(repo, limits=LIMITS, target="tensorrt_llm") == []
    llm = parse_config(repo / "tensorrt_llm" / "config.pbtxt")
    assert llm.max_batch_size == 0 and {i.name for i in llm.input} >= {"text_input", "streaming", "sampling_param_max_tokens"}
    for name in A.ADAPTER_MODELS:
        cfg = parse_config(repo / name / "config.pbtxt")
        assert cfg.backend == "python" and cfg.model_transaction_policy.decoupled
        assert not [i.name for i in cfg.input if i.name not in A.INPUT_MAP]  # nothing unmapped
        assert {o.name for o in cfg.output} <= set(A.OUTPUT_MAP) and "text_output" in {o.name for o in cfg.output}
        table = json.loads((repo / name / "1" / "tensor_map.json").read_text())
        assert table["inputs"] == A.INPUT_MAP and table["end_id"] == info["end_id"]
        for ent in A.INPUT_MAP.values():
            if "to" in ent:
                assert ent["to"] in table["llmapi_inputs"], ent
    ens = {i.name for i in parse_config(repo / "ensemble" / "config.pbtxt").input}
    assert len(ens) == 34  # the in-flight-batcher ensemble's inputs, all declared (refused by name when not honourable)
    bls = {i.name for i in parse_config(repo / "tensorrt_llm_bls" / "config.pbtxt").input}
    assert {"num_draft_tokens", "seed", "min_tokens"} <= bls


def test_not_decoupled_the_adapter_and_the_llmapi_model_agree(tmp_path, tiny_llama):
    """package.decoupled=false: the adapter models and the LLM-API model (config.pbtxt and model.yaml triton_config)
    are all non-decoupled, and the repository validates with streaming off."""
    import yaml

    from pipeline.package.validate import parse_config, validate_repository

    repo, _ = _repo(tmp_path, tiny_llama, decoupled=False)
    for name in ("ensemble", "tensorrt_llm_bls", "tensorrt_llm"):
        assert not parse_config(repo / name / "config.pbtxt").model_transaction_policy.decoupled, name
    assert yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())["triton_config"] == {
        "max_batch_size": 0,
        "decoupled": False,
    }
    assert validate_repository(repo, limits=LIMITS, target="tensorrt_llm", streaming=False) == []


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_llama):
    if not (DEFAULT_SERVE_VENV / "bin" / "python3").exists():
        pytest.skip("serving environment missing: run `make serve-env`")
    d = tmp_path_factory.mktemp("llmapi_adapter")
    repo, info = _repo(d, tiny_llama)
    shutil.copy2(HERE / "llmapi_double_model.py", repo / "tensorrt_llm" / "1" / "model.py")  # the double (docstring)
    srv = TritonServer(repo, grpc_port=0, http_port=0, metrics_port=0, ready_timeout_s=120, log_dir=d / "serve-log")
    srv.start()
    try:
        yield SimpleNamespace(url=srv.grpc_url, repo=repo, dir=d, **info)
    finally:
        srv.stop()


def _t(name: str, arr: np.ndarray, dt: str):
    import tritonclient.grpc as g

    i = g.InferInput(name, list(arr.shape), dt)
    i.set_data_from_numpy(arr)
    return i


def _call(url: str, model: str, prompts: list[str], *, stream: bool, outputs=("text_output",), **extra) -> tuple[list, str | None]:
    """One request on a gRPC stream (plain tritonclient, as NVIDIA's end_to_end_grpc_client.py builds it); returns the
    responses (dict output name -> numpy) and the error, if any."""
    import tritonclient.grpc as g

    n = len(prompts)
    inputs = [
        _t("text_input", np.array([[p.encode()] for p in prompts], dtype=object), "BYTES"),
        _t("max_tokens", np.full((n, 1), 9, dtype=np.int32), "INT32"),
        _t("stream", np.full((n, 1), stream, dtype=bool), "BOOL"),
    ]
    inputs += [_t(k, a, dt) for k, (a, dt) in extra.items()]
    q: queue.Queue = queue.Queue()
    cli = g.InferenceServerClient(url)
    cli.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        cli.async_stream_infer(model, inputs, outputs=[g.InferRequestedOutput(o) for o in outputs], enable_empty_final_response=True)
        got: list[dict] = []
        while True:
            r, e = q.get(timeout=60)
            if e is not None:
                return got, str(e)
            resp = r.get_response()
            if resp.outputs:
                got.append({o.name: r.as_numpy(o.name) for o in resp.outputs})
            if resp.parameters.get("triton_final_response") and resp.parameters["triton_final_response"].bool_param:
                return got, None
    finally:
        cli.stop_stream()
        cli.close()


def _text(got: list[dict]) -> str:
    return "".join(r["text_output"].reshape(-1)[0].decode() for r in got)


def _report(prompt: str, **params) -> str:
    """The double's deterministic answer for ``prompt`` and the sampling params it should have received."""
    return json.dumps({"prompt": prompt, "params": {"sampling_param_max_tokens": 9, **params}}, sort_keys=True, ensure_ascii=False)


def test_ensemble_and_bls_answer_through_the_adapter_unary_and_streamed(served):
    p = "Where is my order ORD-12345?"
    for model in ("ensemble", "tensorrt_llm_bls"):
        unary, err = _call(served.url, model, [p], stream=False)
        assert err is None, err
        assert len(unary) == 1 and unary[0]["text_output"].shape == (1,) and isinstance(unary[0]["text_output"][0], bytes)
        assert _text(unary) == _report(p)
        streamed, err = _call(served.url, model, [p], stream=True)
        assert err is None, err
        # the double streams the text so far in steps of 7 characters; the adapter sends only the new text
        assert len(streamed) == -(-len(_report(p)) // 7) and all(len(r["text_output"][0].decode()) <= 7 for r in streamed)
        assert _text(streamed) == _report(p)


def test_sampling_params_arrive_under_the_llmapi_names(served):
    p = "我的订单什么时候到？"
    extra = {
        "temperature": (np.array([[0.5]], np.float32), "FP32"),
        "top_k": (np.array([[3]], np.int32), "INT32"),
        "top_p": (np.array([[0.25]], np.float32), "FP32"),
        "random_seed": (np.array([[11]], np.uint64), "UINT64"),
        "presence_penalty": (np.array([[0.5]], np.float32), "FP32"),
        "frequency_penalty": (np.array([[0.75]], np.float32), "FP32"),
        "return_perf_metrics": (np.array([[True]]), "BOOL"),
    }
    got, err = _call(served.url, "ensemble", [p], stream=False, outputs=("text_output", "arrival_time_ns", "last_token_time_ns"), **extra)
    assert err is None, err
    want = {
        "sampling_param_temperature": 0.5,
        "sampling_param_top_k": 3,
        "sampling_param_top_p": 0.25,
        "sampling_param_seed": 11,
        "sampling_param_presence_penalty": 0.5,
        "sampling_param_frequency_penalty": 0.75,
        "sampling_param_return_perf_metrics": True,
    }
    assert json.loads(_text(got)) == json.loads(_report(p, **want))
    assert got[0]["arrival_time_ns"].tolist() == [[1000]] and got[0]["last_token_time_ns"].tolist() == [[4000]]
    # the BLS name `seed` maps onto the same input; with `random_seed` too it is refused (same input twice)
    got, err = _call(served.url, "tensorrt_llm_bls", [p], stream=False, seed=(np.array([[5]], np.uint64), "UINT64"))
    assert err is None and json.loads(_text(got))["params"]["sampling_param_seed"] == 5
    _, err = _call(
        served.url,
        "tensorrt_llm_bls",
        [p],
        stream=False,
        seed=(np.array([[5]], np.uint64), "UINT64"),
        random_seed=(np.array([[6]], np.uint64), "UINT64"),
    )
    assert err is not None and "'random_seed' and 'seed' were both given" in err


def test_stop_words_are_kept_exclude_input_and_several_prompts(served):
    p = "hello"
    stop = {"stop_words": (np.array([[b'"params"']], dtype=object), "BYTES")}
    for stream in (False, True):
        got, err = _call(served.url, "ensemble", [p], stream=stream, **stop)
        assert err is None, err
        # the double cut its text before the stop string (LLM-API semantics); the ensemble keeps it (backend semantics)
        assert _text(got) == '{"params"', _text(got)
    got, err = _call(served.url, "ensemble", [p], stream=True, exclude_input_in_output=(np.array([[False]]), "BOOL"))
    assert err is None and _text(got) == p + _report(p)
    got, err = _call(served.url, "ensemble", ["a", "b"], stream=False, outputs=("text_output", "batch_index"))
    assert err is None, err
    by_row = {int(r["batch_index"].reshape(-1)[0]): r["text_output"][0].decode() for r in got}
    assert by_row == {0: _report("a"), 1: _report("b")}


@pytest.mark.parametrize(
    "name, arr, dt, words",
    [
        ("bad_words", np.array([[b"refund"]], dtype=object), "BYTES", ["bad_words", "no input for it", "Fix: leave it out"]),
        ("beam_width", np.array([[2]], np.int32), "INT32", ["beam_width=2", "Fix: send beam_width=1"]),
        ("repetition_penalty", np.array([[1.2]], np.float32), "FP32", ["repetition_penalty=1.2 cannot", "Fix"]),
        ("end_id", np.array([[7]], np.int32), "INT32", ["end_id=7", "takes no end_id input"]),
        ("lora_task_id", np.array([[1]], np.uint64), "UINT64", ["lora_task_id", "not supported"]),
        ("return_generation_logits", np.array([[True]]), "BOOL", ["return_generation_logits=True"]),
    ],
)
def test_an_input_the_llmapi_model_cannot_honour_is_refused(served, name, arr, dt, words):
    got, err = _call(served.url, "ensemble", ["hi"], stream=False, **{name: (arr, dt)})
    assert got == [] and err is not None and all(w in err for w in words), err
    ok, err = _call(served.url, "ensemble", ["hi"], stream=False)  # and the model keeps serving
    assert err is None and _text(ok) == _report("hi")


def test_neutral_values_and_the_packages_own_ids_are_accepted(served):
    got, err = _call(
        served.url,
        "ensemble",
        ["hi"],
        stream=False,
        beam_width=(np.array([[1]], np.int32), "INT32"),
        end_id=(np.array([[served.end_id]], np.int32), "INT32"),
        pad_id=(np.array([[served.pad_id]], np.int32), "INT32"),
        bad_words=(np.array([[b""]], dtype=object), "BYTES"),  # an empty list asks for nothing
        return_log_probs=(np.array([[True]]), "BOOL"),
        outputs=("text_output", "cum_log_probs"),
    )
    assert err is None, err
    assert json.loads(_text(got))["params"] == {"sampling_param_max_tokens": 9}
    assert got[0]["cum_log_probs"].tolist() == [[-1.5]]


def test_llmclient_and_the_parity_command_work_unchanged_through_the_adapter(served):
    """Our LLMClient (and so `pipeline client --parity`, the command the manifest names) against the adapter."""
    from pipeline.serve.client import LLMClient
    from pipeline.serve.parity import EXPECTED_FILE, check_against_server, write_expected

    with LLMClient(served.url) as c:
        assert c.decoupled
        r = c.generate("Where is my order?", max_tokens=9, chat=False, stream=True)
        assert r.text == _report("Where is my order?") and len(r.chunks) > 1
        assert c.generate("Where is my order?", max_tokens=9, chat=False).text == r.text
    pkg = served.dir / "pkg"
    pkg.mkdir(exist_ok=True)
    reqs = [
        {"id": i, "text_input": p, "max_tokens": 9, "stop_strings": [], "expected": _report(p), "prompt": p}
        for i, p in enumerate(["a", "订单"])
    ]
    write_expected(pkg / EXPECTED_FILE, reqs, {"sample": 2, "of": 2, "seed": 0, "modes": ["unary", "stream"]})
    res = check_against_server(pkg, served.url)
    assert res["status"] == "passed" and res["matched"] == res["total"] == 4
    reqs[1]["expected"] = "something else"
    write_expected(pkg / EXPECTED_FILE, reqs, {"sample": 2, "of": 2, "seed": 0, "modes": ["unary", "stream"]})
    res = check_against_server(pkg, served.url)
    assert res["status"] == "failed" and res["matched"] == 2 and res["first_mismatch"]["id"] == 1


def test_the_adapter_forwards_only_options_the_serving_trtllm_is_known_to_honour(tmp_path, tiny_llama):
    """Fail closed (pipeline/package/option_support.py): on the recorded 1.2 line every forwarded input is honoured
    and kept; on a line with no recorded verdicts each forwarded option becomes a refusal naming the version and the
    verdict, in the packaged tensor_map.json the served adapter reads (its refusal path is tested on the server above)."""
    from pipeline.package import llmapi_adapter as A

    kept = A.fail_closed_inputs(TRTLLM)
    assert kept == A.INPUT_MAP
    unknown = A.fail_closed_inputs("9.9.0")
    forwarded = [k for k, e in A.INPUT_MAP.items() if "to" in e and A.request_option(e["to"])]
    assert forwarded and all(unknown[k]["kind"] == "refused" and "TensorRT-LLM 9.9.0" in unknown[k]["why"] for k in forwarded)
    assert unknown["text_input"] == A.INPUT_MAP["text_input"]  # the prompt itself is not an option
    repo, _ = _repo(tmp_path, tiny_llama)
    table = json.loads((repo / "ensemble" / "1" / A.TENSOR_MAP_FILE).read_text())
    assert table["trtllm_version"] == TRTLLM and table["inputs"]["temperature"] == A.INPUT_MAP["temperature"]
