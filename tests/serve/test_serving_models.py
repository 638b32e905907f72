"""Unit tests of the served Python models' pure parts and of the package-time checks for the CPU target (no server).

The Triton models import ``triton_python_backend_utils`` only inside Triton; their helpers are importable here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

from pipeline.core.config.package import PackageConfig
from pipeline.core.contracts.build import BuildInfo
from pipeline.core.contracts.export import ModelInfo

MODELS = Path(__file__).resolve().parents[2] / "pipeline" / "serve" / "models"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"served_{name}", MODELS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_words_list_round_trip():
    import numpy as np

    mod = _load("genai_requests")
    pre = _load("preprocessing_model")
    stacked = pre.stack_words([np.array([[5, 6, 7], [2, 3, -1]], np.int32), np.array([[9], [1]], np.int32)])  # [N, 2, L]
    assert stacked.shape == (2, 2, 3)
    assert mod.parse_words_list(stacked[0]) == [[5, 6], [7]] and mod.parse_words_list(stacked[1]) == [[9]]


def test_cpu_target_serves_the_packaged_beam_width():
    from pipeline.package.repository import settings_from_build

    bi = {"target": "onnxruntime_genai", "limits": {"max_batch_size": 8, "max_input_len": 64, "max_seq_len": 128}}
    pc = PackageConfig(name="m", max_beam_width=4)
    s = settings_from_build(
        BuildInfo.from_json(bi), ModelInfo.from_json({"eos_token_ids": [2]}), pc
    )  # og beam search needs no build-time limit
    assert (s.max_beam_width, s.served_max_beam_width) == (4, 4)
    pc.max_beam_width = None
    assert settings_from_build(BuildInfo.from_json(bi), ModelInfo.from_json({"eos_token_ids": [2]}), pc).max_beam_width == 1


def test_python_text_model_config_has_the_ensembles_interface():
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from pipeline.package.repository import TEMPLATES, Settings, fill, python_text_model_config, template_values

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


class _FakeResponseSender:
    """Triton's response sender as the Python backend hands it to a decoupled model: records what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, int]] = []

    def send(self, response=None, flags: int = 0) -> None:
        self.sent.append((response, flags))


def _fake_pb_utils():
    """The slice of ``triton_python_backend_utils`` the response path uses (tensors keep their numpy arrays)."""

    class Tensor:
        def __init__(self, name, arr):
            self.name, self.arr = name, arr

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.outputs = {t.name: t.arr for t in output_tensors}
            self.error = error

    return SimpleNamespace(Tensor=Tensor, InferenceResponse=InferenceResponse, TritonError=str, TRITONSERVER_RESPONSE_COMPLETE_FINAL=1)


def _counter():
    """``request_metrics`` and a recorder in place of its ``RequestOutcomes`` (``.counted``: the (outcome, reason) counted)."""
    from pipeline.serve.models import request_metrics

    counted: list[tuple[str, str]] = []
    return request_metrics, SimpleNamespace(count=lambda outcome, reason: counted.append((outcome, reason)), counted=counted)


def _responder(coalesce: bool, interval: int):
    """The CPU model's ``genai_requests`` module and a ``genai_sending.Responder`` over the fake ``pb_utils``."""
    req, snd = _load("genai_requests"), _load("genai_sending")
    snd.pb_utils = _fake_pb_utils()
    rm, outcomes = _counter()
    logger = SimpleNamespace(log_warn=lambda msg: (_ for _ in ()).throw(AssertionError(msg)))
    m = snd.Responder(
        outputs={"output_ids", "sequence_length", "text_output"},
        text=True,
        eos_ids={2},
        decode=lambda ids: "",
        coalesce=coalesce,
        stream_interval=interval,
        logger=logger,
        rm=rm,
        outcomes=outcomes,
    )
    return req, m


def _sent_by_model(coalesce: bool, stream: list[tuple[str, list[int], str, bool]]):
    """Queue streamed responses through the real ``Responder.send``/``Responder.run`` of the CPU model before its sender runs, so
    every one of them is waiting when it starts (a server that fell behind); returns what each request received."""
    req, m = _responder(coalesce, 1)
    senders, jobs = {}, {}
    for name, ids, text, final in stream:
        if name not in jobs:
            senders[name] = _FakeResponseSender()
            g = req.Group(sender=senders[name], request_id=name, size=1, open=1)
            jobs[name] = req.Job(g, 0, [1], 8, True, True, None, [], False, 1, 0.0, 1.0, None, 0, None, False, {"text_output"})
        m.send(jobs[name], ids, text, final=final)
    m.outbox.put(None)
    m.run()
    assert m.outcomes.counted == [("success", "none")] * len(senders)  # each request once, when its FINAL was sent
    return {
        name: [
            (r.outputs["output_ids"].tolist(), int(r.outputs["sequence_length"][0][0]), r.outputs["text_output"][0].decode(), f)
            for r, f in s.sent
        ]
        for name, s in senders.items()
    }


STREAM = [
    ("a", [5], "he", False),
    ("b", [7], "x", False),
    ("a", [6], "llo", False),
    ("a", [9], "!", True),
    ("b", [8], "y", True),
]


def test_queued_stream_tokens_leave_as_one_response_per_request():
    got = _sent_by_model(True, STREAM)
    # request a: three queued tokens, one response carrying all three and the FINAL flag; b likewise with two
    assert got["a"] == [([[[5, 6, 9]]], 3, "hello!", 1)]
    assert got["b"] == [([[[7, 8]]], 2, "xy", 1)]


def test_stream_coalescing_off_sends_one_response_per_token():
    got = _sent_by_model(False, STREAM)
    assert got["a"] == [([[[5]]], 1, "he", 0), ([[[6]]], 1, "llo", 0), ([[[9]]], 1, "!", 1)]
    assert got["b"] == [([[[7]]], 1, "x", 0), ([[[8]]], 1, "y", 1)]


def test_coalesce_keeps_each_requests_order_and_never_joins_across_a_final_or_another_prompt():
    mod = _load("genai_sending")
    g1, g2 = object(), object()
    j1, j2, j3 = object(), object(), object()  # j1, j2: two prompts of request g1; j3: request g2
    D = mod.Delta
    items = [
        (g1, D(j1, [1], "a"), 0),
        (g1, D(j2, [2], "b"), 0),  # another prompt of the same request: not joined to j1
        (g1, D(j1, [3], "c"), 0),  # j1 again after j2's item: kept apart (order within the request)
        (g2, D(j3, [4], "d"), 0),
        (g2, D(j3, [5], "e"), 1),  # joined into j3's first item, FINAL kept
        (g2, D(j3, [6], "f"), 0),  # after a FINAL item: never joined
        (g1, "built", 0),  # a built response (log probs, perf metrics) ends the run
        (g1, D(j1, [7], "g"), 0),
    ]
    out = mod.coalesce(items)
    assert [(g, r if isinstance(r, str) else (r.job, r.ids, r.text), f) for g, r, f in out] == [
        (g1, (j1, [1], "a"), 0),
        (g1, (j2, [2], "b"), 0),
        (g1, (j1, [3], "c"), 0),
        (g2, (j3, [4, 5], "de"), 1),
        (g2, (j3, [6], "f"), 0),
        (g1, "built", 0),
        (g1, (j1, [7], "g"), 0),
    ]


def _model_for_stream(interval: int):
    """The CPU model with a recording response sender, coalescing off (so only ``stream_interval`` groups tokens)."""
    req, m = _responder(False, interval)
    sender = _FakeResponseSender()
    g = req.Group(sender=sender, request_id="r", size=1, open=1)
    job = req.Job(g, 0, [1], 8, True, True, None, [], False, 1, 0.0, 1.0, None, 0, None, False, {"text_output"})
    return m, job, sender


def _received(m, sender):
    m.outbox.put(None)
    m.run()
    return [(r.outputs["output_ids"].reshape(-1).tolist(), r.outputs["text_output"][0].decode(), f) for r, f in sender.sent]


def test_stream_interval_sends_the_first_token_then_every_nth():
    m, job, sender = _model_for_stream(3)
    for i, tok in enumerate([11, 12, 13, 14, 15, 16, 17]):
        job.tokens.append(tok)
        m.stream(job, tok, chr(97 + i), None, last=tok == 17)
    assert _received(m, sender) == [([11], "a", 0), ([12, 13, 14], "bcd", 0), ([15, 16, 17], "efg", 1)]


def test_stream_interval_tokens_held_at_an_end_token_leave_with_the_final_response():
    m, job, sender = _model_for_stream(4)
    for i, tok in enumerate([11, 12, 13]):
        job.tokens.append(tok)
        m.stream(job, tok, chr(97 + i), None, last=False)
    m.final_response(job)  # the engine produced the end token: nothing more comes
    assert _received(m, sender) == [([11], "a", 0), ([12, 13], "bc", 1)]


def test_perf_metrics_name_admission_and_the_tokens_own_time_even_when_queued_tokens_are_joined():
    """A streamed request with ``return_perf_metrics`` stays on the coalescing sender path; the response built later
    says when the engine admitted it and when its newest token was made, not when the response was built."""
    m, job, sender = _model_for_stream(1)
    m.coalesce = True
    job.perf = True
    job.requested = {"text_output", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns"}
    job.arrival_ns, job.scheduled_ns = 100, 200
    for i, (tok, made) in enumerate([(11, 300), (12, 400), (13, 500)]):
        job.tokens.append(tok)
        job.first_token_ns, job.last_token_ns = 300, made  # as _token_made stamps them
        m.stream(job, tok, chr(97 + i), None, last=tok == 13)
    m.outbox.put(None)
    m.run()  # all three were queued before the sender ran: they leave as one response
    got = [
        (
            [
                int(r.outputs[n].reshape(-1)[0])
                for n in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
            ],
            f,
        )
        for r, f in sender.sent
    ]
    assert got == [([100, 200, 300, 500], 1)]


def test_stream_interval_is_validated_and_refused_on_the_tensorrt_llm_target():
    import pytest

    from pipeline.core.config import compose
    from pipeline.core.config.package import validate
    from pipeline.errors import InputError
    from pipeline.package.repository import settings_from_build

    bad = compose(["package.stream_interval=0"]).package
    assert [p.field for p in validate(bad)] == ["package.stream_interval"]
    pc = PackageConfig(name="m", stream_interval=4)
    lim = {"max_batch_size": 8, "max_input_len": 64, "max_seq_len": 128}
    assert (
        settings_from_build(
            BuildInfo.from_json({"target": "onnxruntime_genai", "limits": lim}), ModelInfo.from_json({"eos_token_ids": [2]}), pc
        ).stream_interval
        == 4
    )
    with pytest.raises(InputError, match=r"package\.stream_interval=4: the TensorRT-LLM target streams every token"):
        settings_from_build(
            BuildInfo.from_json({"target": "tensorrt_llm", "limits": lim, "versions": {"tensorrt_llm": "1.2.1"}}),
            ModelInfo.from_json({"eos_token_ids": [2]}),
            pc,
        )


def test_a_failed_request_is_counted_once_as_mid_stream_after_a_response_else_engine_error():
    m, job, sender = _model_for_stream(1)
    job.tokens.append(11)
    m.stream(job, 11, "a", None, last=False)
    m.fail(job, "engine error: boom")
    m.fail(job, "engine error: again")  # a job fails once
    m2, job2, sender2 = _model_for_stream(1)
    m2.fail(job2, "engine error: boom")
    for model in (m, m2):
        model.outbox.put(None)
        model.run()
    # a token, then the error with the FINAL flag; the other request: only its error, FINAL
    assert [(r.error is not None, f) for r, f in sender.sent] == [(False, 0), (True, 1)], sender.sent
    assert [(r.error is not None, f) for r, f in sender2.sent] == [(True, 1)], sender2.sent
    assert m.outcomes.counted == [("failure", "mid_stream")], m.outcomes.counted
    assert m2.outcomes.counted == [("failure", "engine_error")], m2.outcomes.counted
