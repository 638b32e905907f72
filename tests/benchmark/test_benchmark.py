"""Benchmark stage: the load generator runs against a real onnxruntime-genai engine, a real Triton server
and the transformers baseline, and its JSON is well-formed and internally consistent.

No timed assertions: speed belongs in the benchmark's own report (docs/benchmark.md).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.benchmark import cli as bench_cli
from pipeline.benchmark.core import BenchInputs, run_benchmark
from pipeline.benchmark.metrics import HEADLINE, distribution
from pipeline.benchmark.report import PLOTS, load
from pipeline.benchmark.workload import build_requests, sample_lengths
from pipeline.core.config import ConfigError, compose
from pipeline.core.contracts.export import ModelInfo
from pipeline.errors import InputError
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]
EVAL_SET = ROOT / "evaluation" / "data" / "support_eval_v2.jsonl"
MODEL_INFO = {"eos_token_ids": [2], "bos_token_id": 1, "pad_token_id": 3}
LIMITS = {"max_batch_size": 4, "max_input_len": 200, "max_seq_len": 256}


# 4 eval items cannot show non-inferiority (the gate says inconclusive): exploratory mode, and the package is allowed
# for the benchmark (the gate itself is tested in tests/evaluate/test_eval_gate.py and tests/test_gate_*.py).
STAGE_OVERRIDES = [
    "quant=none",
    "target=onnxruntime_genai",
    "eval.limit=4",
    "eval.gate.mode=exploratory",
    "package.allow_failed_gate=true",
    "build.max_seq_len=256",
    "build.max_input_len=200",
    "build.max_batch_size=4",
    "progress=false",
]


@pytest.fixture(scope="module")
def stage_run(tiny_llama, tmp_path_factory):
    """``pipeline stages=[benchmark] benchmark=smoke`` on the tiny llama: every upstream stage runs for real
    (export, quantize, onnxruntime-genai build, evaluate, Triton package), then the benchmark stage runs
    engine, triton (a real server on 127.0.0.1) and baseline modes."""
    from rich.console import Console

    from pipeline.runner import run_pipeline

    out = tmp_path_factory.mktemp("bench")
    results = out / "results"
    cfg = compose(
        [
            "stages=[benchmark]",
            "benchmark=smoke",
            f"benchmark.results_dir={results}",
            f"model.path={tiny_llama}",
            f"store_dir={out / 'store'}",
            *STAGE_OVERRIDES,
        ]
    )
    summary = run_pipeline(cfg, console=Console(quiet=True))
    assert summary.exit_code == 0, summary.error
    rep = {r.stage: r for r in summary.stages}
    assert rep["benchmark"].status == "ran"
    art = Path(rep["benchmark"].path)
    return {
        "cfg": cfg,
        "summary": summary,
        "art": art,
        "results": results,
        "build": Path(rep["build"].path),
        "export": Path(rep["export"].path),
        "package": Path(rep["package"].path),
    }


@pytest.fixture(scope="module")
def smoke_doc(stage_run):
    doc = load(stage_run["art"] / "benchmark.json")
    return doc, stage_run["art"], None, stage_run["cfg"]


def _inputs(run) -> BenchInputs:
    return BenchInputs(
        hf_dir=run["export"] / "hf",
        model_info=ModelInfo.from_json(MODEL_INFO),
        engine_dir=run["build"] / "engine",
        model_repository=run["package"] / "model_repository",
        eval_set=EVAL_SET,
        max_input_len=LIMITS["max_input_len"],
        max_seq_len=LIMITS["max_seq_len"],
        max_batch_size=LIMITS["max_batch_size"],
    )


def test_stage_publishes_results_and_is_never_cached(stage_run):
    from pipeline.core.stage import get_stage

    assert get_stage("benchmark").cacheable is False
    res = stage_run["results"]
    # not the embedded default model: its results are named after it, never over the preset's committed files
    assert (res / "tiny_llama-smoke.json").is_file() and (res / "tiny_llama-smoke.md").is_file()
    assert not (res / "smoke.json").exists() and not (res / "smoke.md").exists()
    assert load(res / "tiny_llama-smoke.json") == load(stage_run["art"] / "benchmark.json")
    assert "Model `tiny_llama` (export digest `" in (res / "tiny_llama-smoke.md").read_text(encoding="utf-8")
    head = {r.stage: r for r in stage_run["summary"].stages}["benchmark"].headline
    assert head["errors"] == 0 and head["tpot_ms"] > 0 and head["mode"] == "triton"
    manifest = json.loads((stage_run["art"] / "manifest.json").read_text())
    assert manifest["result"]["ratios"]["failed_requests"] == 0
    doc = load(stage_run["art"] / "benchmark.json")
    assert doc["model"]["quant_recipe"] == "none" and doc["model"]["target"] == "onnxruntime_genai"
    assert set(doc["model"]["artifacts"]) == {"export", "build", "package"}


def _dists(metrics):
    for k, v in metrics.items():
        if isinstance(v, dict) and v.get("count"):
            yield k, v


def test_smoke_json_is_consistent(smoke_doc):
    doc, out, paths, cfg = smoke_doc
    on_disk = load(out / "benchmark.json")  # schema check + valid JSON
    assert on_disk["schema"] == "pipeline.benchmark/v1"
    assert json.loads(json.dumps(doc)) == on_disk
    # every knob, seeds and the dataset digest are recorded
    assert doc["config"]["concurrency"] == [1, 2] and doc["config"]["num_requests"] == 4
    assert doc["seeds"]["base"] == cfg.benchmark.seed and doc["seeds"]["levels"]
    assert len(doc["dataset"]["digest"]) == 64 and doc["dataset"]["source_sha256"]
    modes = list(cfg.benchmark.modes)
    keys = {s["key"] for s in doc["summary"]}
    for m in modes:
        levels = cfg.benchmark.baseline_concurrency if m == "baseline" else cfg.benchmark.concurrency
        assert {f"{m}/concurrency={c}" for c in levels} <= keys
    digests: dict = {}
    for r in doc["runs"]:
        m = r["metrics"]
        # zero failed requests; every request got exactly its output budget (ignore_eos)
        assert m["requests"]["errors"] == 0, m["requests"]["error_messages"]
        assert m["requests"]["sent"] == m["requests"]["completed"] == cfg.benchmark.num_requests
        for q in r["requests"]:
            assert q["osl"] == q["requested"] == q["reported"], q
            assert 0 < q["ttft_ms"] <= q["e2e_ms"]
        assert m["output_tokens"] == sum(q["osl"] for q in r["requests"])
        assert m["output_sequence_length"]["avg"] == pytest.approx(np.mean([q["osl"] for q in r["requests"]]))
        assert m["output_token_throughput"]["avg"] == pytest.approx(m["output_tokens"] / m["duration_s"])
        assert m["request_throughput"]["avg"] == pytest.approx(m["requests"]["completed"] / m["duration_s"])
        assert m["inter_token_latency"]["count"] == sum(1 for q in r["requests"] if q["osl"] > 1)  # one per request
        for name, d in _dists(m):
            assert d["min"] <= d["p50"] <= d["p75"] <= d["p90"] <= d["p95"] <= d["p99"] <= d["max"], name
            assert d["min"] <= d["avg"] <= d["max"], name
        pd = m["prefill_decode"]
        assert pd["prefill_share"] + pd["decode_share"] == pytest.approx(1.0)
        assert m["time_to_first_token"]["p50"] <= m["request_latency"]["p50"]
        # the same workload for every mode at a level
        digests.setdefault((r["kind"], r["concurrency"], r["repeat"]), set()).add(r["dataset_digest"])
        if r["mode"] != "baseline":
            rf = r["roofline"]
            assert rf["bound_tokens_per_s"] > 0 and rf["fraction"] > 0
        # per-hop timing from the deployment's own timestamps: every Triton request has it, nothing else does
        sp = m.get("serving_path")
        assert (sp is not None) == (r["mode"] == "triton"), r["mode"]
        if sp is not None:
            assert sp["requests"] == m["requests"]["completed"]
            assert all(sp[h]["avg"] > 0 for h in ("request_hop", "prefill", "first_token_delivery", "last_token_delivery")), sp
            assert sp["queue"]["min"] >= 0 and sp["server_time_per_output_token"]["avg"] > 0
            parts = ("client", "request_hop", "queue", "prefill", "first_token_delivery")
            assert sum(sp[h]["avg"] for h in parts) == pytest.approx(m["time_to_first_token"]["avg"], rel=1e-6)
    assert all(len(v) == 1 for v in digests.values())
    assert doc["roofline"]["weight_bytes_per_step"] > 0 and doc["roofline"]["bandwidth_gbs"] > 0
    # ratios are computed where both sides ran; never asserted against targets here
    r = doc["ratios"]
    assert r["failed_requests"]["value"] == 0 and r["failed_requests"]["met"] is True
    # the smoke preset holds only failed_requests: 4 requests per level do not judge speed (trial 3 saw "met")
    assert r["triton_overhead_tpot_c1"]["judged"] is False and r["triton_overhead_tpot_c1"]["met"] is None
    assert r["engine_speedup_tpot_c1"]["value"] and r["engine_speedup_tpot_c1"]["value"] > 0
    assert modes == ["engine", "triton", "baseline"]
    assert doc["modes"]["triton"]["url"].startswith("127.0.0.1:")  # loopback only
    # every closed-loop worker thread had its client before measuring (no request pays for building one)
    assert doc["modes"]["triton"]["clients_built"] == max(*cfg.benchmark.concurrency, cfg.benchmark.warmup_requests)
    assert r["triton_overhead_tpot_c1"]["value"] > 0
    assert r["triton_server_tpot_over_engine_c1"]["value"] > 0
    assert doc["headline"]["errors"] == 0 and doc["headline"]["tpot_ms"] > 0


def test_smoke_markdown_and_plots(smoke_doc):
    doc, out, paths, cfg = smoke_doc
    md = (out / "benchmark.md").read_text(encoding="utf-8")
    rows = [ln for ln in md.splitlines() if ln.startswith("| engine |") or ln.startswith("| baseline |") or ln.startswith("| triton |")]
    assert len(rows) == len([r for r in doc["runs"] if r["repeat"] == 0]) == 5
    assert "engine_speedup_tpot_c1" in md
    hops = md.split("Where the Triton path's time goes", 1)[1].split("\n\n", 2)[1].splitlines()
    assert len(hops) == 2 + len(cfg.benchmark.concurrency), hops  # header, rule, one row per Triton level
    for p in PLOTS:
        assert (out / p).stat().st_size > 1000, p


def test_compare_ratios_and_spread(smoke_doc, tmp_path, capsys):
    doc, out, paths, cfg = smoke_doc
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(doc))
    slower = copy.deepcopy(doc)
    slower["config"]["output_len"]["mean"] = 16  # one variable changed
    for s in slower["summary"]:
        s["spread"]["time_per_output_token.avg"]["mean"] *= 2
        s["spread"]["time_per_output_token.avg"]["std"] = 0.1 * s["spread"]["time_per_output_token.avg"]["mean"]
        s["spread"]["time_per_output_token.avg"]["n"] = 3
    b.write_text(json.dumps(slower))
    res = bench_cli.compare(load(a), load(b))
    tp = [r for r in res["rows"] if r["metric"] == "time_per_output_token.avg"]
    assert tp and all(r["ratio"] == pytest.approx(2.0) and r["verdict"] == "worse" for r in tp)
    assert all(r["spread"] == pytest.approx(0.2) for r in tp)  # 2 x sqrt(0 + 0.1^2)
    same = [r for r in res["rows"] if r["metric"] == "output_token_throughput.avg"]
    assert same and all(r["ratio"] == pytest.approx(1.0) for r in same)
    assert [d[0] for d in res["differences"]] == ["benchmark.output_len.mean"]
    # the package settings that change the served numbers are recorded, so a stream_interval A/B is named
    assert doc["model"]["package"]["stream_interval"] == 1 and doc["model"]["package"]["stream_coalescing"] is True
    coarser = copy.deepcopy(doc)
    coarser["model"]["package"]["stream_interval"] = 4
    assert bench_cli.differences(doc, coarser) == [("model.package.stream_interval", 1, 4)]
    # the package artifact's key follows from that one knob: still one variable, so no "more than one" warning
    coarser["model"]["artifacts"]["package"]["key"] = "0" * 24
    diffs = bench_cli.differences(doc, coarser)
    assert len(diffs) == 2 and bench_cli.variables(diffs) == ["model.package.stream_interval"]
    coarser["config"]["num_requests"] = 99
    assert len(bench_cli.variables(bench_cli.differences(doc, coarser))) == 2
    assert bench_cli.main(["compare", str(a), str(b), "--json", str(tmp_path / "cmp.json")]) == 0
    assert "time_per_output_token.avg" in capsys.readouterr().out
    assert json.loads((tmp_path / "cmp.json").read_text())["schema"] == "pipeline.benchmark_compare/v1"
    # bad inputs: exit 2 with the file named
    assert bench_cli.main(["compare", str(a), str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text('{"schema": "other"}')
    assert bench_cli.main(["compare", str(a), str(tmp_path / "bad.json")]) == 2
    assert "bad.json" in capsys.readouterr().err
    with pytest.raises(InputError, match="unknown"):
        bench_cli.compare(load(a), load(b), ["no_such_metric"])


def test_open_loop_poisson_and_repeats(stage_run, tmp_path):
    cfg = compose(
        [
            "benchmark=smoke",
            "benchmark.modes=[engine]",
            "benchmark.concurrency=[1]",
            "benchmark.request_rates=[50.0]",
            "benchmark.repeats=2",
            "benchmark.dataset=synthetic",
            "benchmark.input_len.kind=uniform",
            "benchmark.input_len.mean=24",
            "benchmark.input_len.spread=8",
            f"benchmark.results_dir={tmp_path}",
        ]
    )
    validate(cfg)
    doc = run_benchmark(cfg.benchmark, _inputs(stage_run))
    keys = [s["key"] for s in doc["summary"]]
    assert keys == ["engine/concurrency=1", "engine/request_rate=50"]
    for s in doc["summary"]:
        assert s["repeats"] == 2 and s["errors"] == 0
        assert s["spread"]["time_per_output_token.avg"]["n"] == 2
    rates = [r for r in doc["runs"] if r["kind"] == "request_rate"]
    assert {r["seed"] for r in rates} != {rates[0]["seed"]} or len(rates) == 1  # a fresh seeded workload per repeat
    assert all(r["metrics"]["requests"]["completed"] == 4 for r in rates)
    isl = [q["isl"] for r in doc["runs"] for q in r["requests"]]
    assert len(set(isl)) > 1  # synthetic lengths vary


def test_length_distributions_are_seeded_and_bounded():
    from pipeline.core.config.benchmark import LengthDist

    rng = lambda: np.random.default_rng(7)  # noqa: E731
    for kind, spread in (("fixed", 0), ("uniform", 10), ("normal", 10), ("lognormal", 0.5)):
        d = LengthDist(kind=kind, mean=40, spread=spread, min=5, max=200)
        a, b = sample_lengths(d, 400, rng(), "x"), sample_lengths(d, 400, rng(), "x")
        assert a == b and min(a) >= 5 and max(a) <= 200
        if kind == "fixed":
            assert set(a) == {40}
        else:
            assert abs(np.mean(a) - 40) < 4 and len(set(a)) > 5
    clipped = sample_lengths(LengthDist(kind="normal", mean=40, spread=30, min=30, max=50), 200, rng(), "x")
    assert min(clipped) == 30 and max(clipped) == 50
    with pytest.raises(InputError, match="benchmark.output_len"):
        sample_lengths(LengthDist(min=10, max=5), 1, rng(), "benchmark.output_len")


def test_serving_path_hops_add_up_to_the_clients_times():
    """Per-hop timing of one request with known timestamps (s): every hop is the difference it is defined as."""
    from pipeline.benchmark.metrics import SERVING_HOPS, serving_path
    from pipeline.benchmark.records import RequestRecord

    r = RequestRecord("a", 10, 4, t_send=100.0, token_times=[100.050, 100.060, 100.070, 100.090])
    assert serving_path([r]) is None  # no server timestamps (engine mode)
    r.t_client_send = 100.002
    r.server_times = {"arrival": 100.010, "scheduled": 100.011, "first_token": 100.041, "last_token": 100.080}
    sp = serving_path([r])
    assert sp is not None and set(SERVING_HOPS) <= set(sp) and sp["requests"] == 1
    want = {
        "client": 2.0,
        "request_hop": 8.0,
        "queue": 1.0,
        "prefill": 30.0,
        "first_token_delivery": 9.0,
        "server_time_per_output_token": 13.0,
        "last_token_delivery": 10.0,
    }
    assert {k: round(sp[k]["avg"], 6) for k in want} == want
    assert sum(want[k] for k in ("client", "request_hop", "queue", "prefill", "first_token_delivery")) == pytest.approx(r.ttft * 1e3)


def test_distribution_matches_numpy():
    x = np.random.default_rng(0).lognormal(0, 1, 1001)
    d = distribution(x, "ms", 1000.0)
    assert d["p50"] == pytest.approx(np.median(x) * 1000)
    assert d["p99"] == pytest.approx(np.percentile(x, 99) * 1000)
    assert d["avg"] == pytest.approx(x.mean() * 1000) and d["count"] == 1001
    assert distribution([], "ms") == {"unit": "ms", "count": 0}
    assert set(HEADLINE.values()) == {"lower", "higher"}


def test_bad_config_and_oversized_requests_are_named(tiny_llama):
    with pytest.raises(ConfigError) as ei:
        validate(compose(["benchmark.concurrency=[0,2]", "benchmark.request_rates=[-1.0]", "benchmark.repeats=0", "benchmark.modes=[gpu]"]))
    msg = str(ei.value)
    for field in ("benchmark.concurrency", "benchmark.request_rates", "benchmark.repeats", "benchmark.modes"):
        assert field in msg
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    cfg = compose(["benchmark.output_len.mean=200", "benchmark.output_len.max=300"])
    with pytest.raises(InputError, match="max_seq_len"):
        build_requests(cfg.benchmark, tok, 3, seed=0, eval_set=EVAL_SET, max_input_len=200, max_seq_len=256)
    with pytest.raises(InputError, match="eval.eval_set"):
        build_requests(cfg.benchmark, tok, 3, seed=0, eval_set=None)


def test_eval_items_given_as_messages_are_benchmarked_like_evaluate_renders_them(tiny_llama, tmp_path):
    """Fresh-user trial: ``stages=[benchmark]`` refused an eval set whose items use ``messages`` (a documented
    format) with "expected an object with a string field 'prompt'" and no fix.  Now such an item is a request whose
    ids are the chat-template rendering evaluate feeds the engine; a line with neither is refused with the fix."""
    from transformers import AutoTokenizer

    from pipeline.core.tokenization import encode_prompt

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is my order?"}]
    es = tmp_path / "es.jsonl"
    es.write_text(json.dumps({"id": "m1", "messages": msgs, "reference": "x"}) + "\n")
    cfg = compose(["benchmark.output_len.mean=4", "benchmark.output_len.max=4", "benchmark.output_len.kind=fixed"])
    reqs = build_requests(cfg.benchmark, tok, 2, seed=0, eval_set=es)
    assert [r.messages for r in reqs] == [msgs, msgs]
    assert reqs[0].input_ids == encode_prompt(tok, messages=msgs) and reqs[0].prompt == "Be brief.\nWhere is my order?"
    es.write_text(json.dumps({"id": "m1", "question": "q?"}) + "\n")
    with pytest.raises(InputError, match=r"es\.jsonl:1: expected an object with a string field 'prompt' or a list 'messages'.*Fix:"):
        build_requests(cfg.benchmark, tok, 2, seed=0, eval_set=es)
