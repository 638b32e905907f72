"""A benchmark report never calls met or better what is not (fresh-user trial): a roofline fraction above 1 is a wrong
bound or a wrong timing, not a met target; a lower prefill share is not a faster model."""

from __future__ import annotations

from pipeline.benchmark import cli as bench_cli
from pipeline.benchmark.core import ratios
from pipeline.benchmark.report import _md_ratios
from pipeline.core.contracts.benchmark import BenchmarkDocument


def _summary(key: str, frac: list[float]) -> dict:
    return {"key": key, "spread": {}, "roofline_fraction": frac}


def test_a_roofline_fraction_above_1_is_not_met_and_says_why():
    r = ratios([_summary("engine/concurrency=1", [1.3, 1.5])], [], judged=["engine_roofline_fraction_c1"])["engine_roofline_fraction_c1"]
    assert r["value"] == 1.4 and r["judged"] is True and r["met"] is None
    assert "faster than the memory-bandwidth bound allows" in r["why"]
    ok = ratios([_summary("engine/concurrency=1", [0.5])], [], judged=["engine_roofline_fraction_c1"])["engine_roofline_fraction_c1"]
    assert ok["met"] is True and ok["why"] is None
    row = [x for x in _md_ratios(BenchmarkDocument.from_json({"ratios": {"engine_roofline_fraction_c1": r}})) if "roofline" in x][0]
    assert "| yes |" not in row and "not judged: above 1" in row
    # a benchmark.json written before this rule (met: true for 1.4) is not shown as met either
    old = {k: v for k, v in r.items() if k != "why"} | {"met": True}
    row = [x for x in _md_ratios(BenchmarkDocument.from_json({"ratios": {"engine_roofline_fraction_c1": old}})) if "roofline" in x][0]
    assert "| yes |" not in row and "not judged: above 1" in row


def _doc(share: float, tpot: float, n: int = 3) -> dict:
    spread = {
        "prefill_decode.prefill_share": {"mean": share, "std": 0.0, "n": n},
        "time_per_output_token.avg": {"mean": tpot, "std": 0.0, "n": n},
    }
    return {"schema": "pipeline.benchmark/v1", "config": {}, "model": {}, "summary": [{"key": "engine/concurrency=1", "spread": spread}]}


def test_compare_does_not_judge_the_prefill_share():
    """B's decode got slower (TPOT x 2), so prefill is a smaller share of each request: compare called that "better"."""
    rows = {r["metric"]: r for r in bench_cli.compare(_doc(0.4, 3.0), _doc(0.25, 6.0))["rows"]}
    assert rows["time_per_output_token.avg"]["verdict"] == "worse"
    share = rows["prefill_decode.prefill_share"]
    assert share["ratio"] == 0.625 and share["verdict"] == "not judged"
    assert bench_cli.compare(_doc(0.4, 3.0), _doc(0.25, 6.0), ["prefill_decode.prefill_share"])["rows"][0]["verdict"] == "not judged"


def test_compare_does_not_judge_one_repeat_on_each_side():
    """Both results of benchmark.repeats=1: the spread read "-" and a ratio of 0.998 read "better" (fresh-user trial).
    Without a spread a difference cannot be told from noise; exactly equal stays "=", and one side's repeats judge."""
    tpot = "time_per_output_token.avg"
    (row,) = bench_cli.compare(_doc(0.4, 10.0, n=1), _doc(0.4, 9.98, n=1), [tpot])["rows"]
    assert row["ratio"] == 0.998 and row["verdict"] == bench_cli.NO_REPEATS == "not judged: 1 repeat, no spread; run benchmark.repeats>=3"
    assert bench_cli.compare(_doc(0.4, 10.0, n=1), _doc(0.4, 10.0, n=1), [tpot])["rows"][0]["verdict"] == "="
    assert bench_cli.compare(_doc(0.4, 10.0, n=1), _doc(0.4, 9.0, n=3), [tpot])["rows"][0]["verdict"] == "better"
