"""Per-request measurement record shared by every backend and the metrics code."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class RequestRecord:
    """What one request measured. All times are seconds from ``time.perf_counter()``.

    Attributes:
        request_id: the :class:`~pipeline.benchmark.workload.BenchRequest` id.
        input_len: prompt tokens as fed to the model.
        requested_output_len: the output budget sent.
        t_send: when the request was handed to the backend (absolute perf_counter seconds).
        token_times: arrival time of every streamed token (absolute perf_counter seconds); one entry
            per token (a streamed response carrying k tokens adds k entries with the same time).
        reported_output_len: the number of generated tokens the backend reported at the end
            (engine usage / final response / generated ids); checked against ``len(token_times)``.
        finish_reason: eos | length | error.
        error: message when the request failed.
        t_client_send: when the client library sent it (absolute perf_counter s; after prompt rendering and the
            hand-off to a client thread), when the backend knows; ``None`` otherwise.
        server_times: the serving model's own timestamps (Triton ``return_perf_metrics``: ``arrival``,
            ``scheduled``, ``first_token``, ``last_token``), converted to absolute perf_counter s; ``None`` when the
            backend has none.
    """

    request_id: str
    input_len: int
    requested_output_len: int
    t_send: float = 0.0
    token_times: list[float] = dataclasses.field(default_factory=list)
    reported_output_len: int | None = None
    finish_reason: str = ""
    error: str | None = None
    t_done: float | None = None
    t_client_send: float | None = None
    server_times: dict[str, float] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times)

    @property
    def output_len(self) -> int:
        return len(self.token_times)

    @property
    def ttft(self) -> float:
        """Time to first token (s): send -> first token."""
        return self.token_times[0] - self.t_send

    @property
    def e2e(self) -> float:
        """Request latency (s): send -> last token (or completion)."""
        end = self.t_done if self.t_done is not None else self.token_times[-1]
        return max(end, self.token_times[-1]) - self.t_send

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (s): (last token - first token) / (osl - 1); None for a one-token
        answer and for one whose tokens all arrived in the first response (unstreamed, or coalesced by the server):
        no decode step was observed, and a TPOT of 0 would pass every "<=" target (trial: a Triton TPOT of 0.00 ms
        was reported as a met overhead ratio)."""
        if len(self.token_times) < 2 or self.token_times[-1] == self.token_times[0]:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def itl(self) -> float | None:
        """Inter-token latency (s) as genai-perf / AIPerf define it: (request latency - TTFT) / (output tokens - 1),
        per request (genai-perf README "Metrics"; AIPerf docs "metrics reference", inter_token_latency); None for a
        one-token answer.  Unlike the pooled gaps, it does not collapse to 0 when a response carries several tokens."""
        if len(self.token_times) < 2:
            return None
        return (self.e2e - self.ttft) / (len(self.token_times) - 1)

    @property
    def response_gaps(self) -> list[float]:
        """Gaps (s) between consecutive streamed responses of the request: the distinct arrival times (tokens that
        arrived together, ``stream_interval`` > 1 or coalesced, are one response)."""
        t = [x for i, x in enumerate(self.token_times) if i == 0 or x != self.token_times[i - 1]]
        return [b - a for a, b in zip(t, t[1:])]
