"""Issue 24 case 8: the benchmark's inter-token latency as genai-perf / AIPerf define it.

With ``stream_interval`` > 1 (or coalesced responses) several tokens arrive in one response; the old ITL pooled every
gap between consecutive tokens, so most gaps were 0 and the median ITL was 0 ms.  Now ``inter_token_latency`` is
(request latency - TTFT) / (output tokens - 1) per request and the response gaps are reported as
``inter_response_latency``.
"""

from __future__ import annotations

import pytest

from pipeline.benchmark.metrics import level_metrics
from pipeline.benchmark.records import RequestRecord


def _record(i: int, per_response: int, responses: int, gap_s: float, ttft_s: float) -> RequestRecord:
    t0 = 100.0 + i
    times = [t0 + ttft_s + k * gap_s for k in range(responses) for _ in range(per_response)]
    return RequestRecord(f"r{i}", 8, per_response * responses, t_send=t0, token_times=times, finish_reason="length")


def test_itl_is_per_request_decode_time_over_tokens_not_pooled_zero_gaps():
    recs = [_record(i, per_response=4, responses=3, gap_s=0.040, ttft_s=0.1) for i in range(5)]
    m = level_metrics(recs)
    itl = m["inter_token_latency"]
    assert itl["count"] == 5  # one value per request
    assert itl["p50"] == pytest.approx(2 * 40.0 / 11)  # (e2e - ttft) / (12 - 1) in ms; old code: p50 = 0
    irl = m["inter_response_latency"]
    assert irl["count"] == 5 * 2 and irl["p50"] == pytest.approx(40.0)


def test_one_token_answers_have_no_itl():
    m = level_metrics([_record(0, per_response=1, responses=1, gap_s=0.0, ttft_s=0.05)])
    assert m["inter_token_latency"]["count"] == 0 and m["inter_response_latency"]["count"] == 0


def test_an_answer_that_arrived_in_one_response_has_no_tpot():
    """Trial 2: a c=1 Triton TPOT of 0.00 ms (every token in the first response) passed the ``<= 1.10`` overhead
    target.  No decode step was observed, so the request has no TPOT (count 0: "not measured", never "met")."""
    one = _record(0, per_response=8, responses=1, gap_s=0.0, ttft_s=0.05)
    assert one.tpot is None
    m = level_metrics([one])
    assert m["time_per_output_token"]["count"] == 0 and "avg" not in m["time_per_output_token"]
    streamed = level_metrics([_record(1, per_response=2, responses=4, gap_s=0.010, ttft_s=0.05)])
    assert streamed["time_per_output_token"]["avg"] == pytest.approx(3 * 10.0 / 7)  # (last - first) / (8 - 1), ms
