"""How served requests ended: the counter our CPU-target Python models add to Triton's ``/metrics``.

The one place for the metric's name, labels and label values.  Copied by the package stage next to the served
``model.py`` of ``onnxruntime_genai_model.py`` (``ensemble``, ``tensorrt_llm_bls``, ``onnxruntime_genai`` on the CPU
target), so it must not import the ``pipeline`` package; ``pipeline`` code and the tests import it from here.

Why a counter of our own: Triton 2.51's Python backend reports a request's statistics once, when ``execute``
returns (python_backend r24.10 ``src/pb_metric_reporter.cc``), and a decoupled model returns from ``execute`` before
it generates.  So ``nv_inference_request_failure`` counts only the requests our models refuse from ``execute``
(``reason="BACKEND"``); a failure after ``execute`` returned and a cancelled request count there as successes, and
Triton core counts ``reason="CANCELED"`` only for a request cancelled in a batcher's queue.  This counter is
incremented once per request when it ends (its final response, its error or its cancellation), through the Python
backend's custom metrics (``pb_utils.MetricFamily``, python_backend README "Custom Metrics").

Per model and version, ``sum`` over every ``outcome``/``reason`` equals Triton's ``nv_inference_request_success`` +
``nv_inference_request_failure`` for that model, once no request is in flight: both count every request once.
"""

from __future__ import annotations

import threading
from typing import Any

#: Counter family on Triton's metrics endpoint (``--metrics-port``, ``GET /metrics``).
REQUESTS_ENDED = "pipeline_requests_ended_total"
REQUESTS_ENDED_HELP = (
    "Requests that ended, by outcome (success, failure, cancelled) and reason, counted once when the request's final "
    "response, error or cancellation is seen; unlike nv_inference_request_*, also after execute returned (decoupled)"
)
SUCCESS, FAILURE, CANCELLED = "success", "failure", "cancelled"
#: ``outcome`` -> its ``reason`` label values.
#:
#: * ``success``/``none``: the request got its final response (a ``stop=true`` control request included).
#: * ``failure``/``refused``: refused before generation (a bad or unsupported input, no room); also counted by Triton
#:   as ``nv_inference_request_failure{reason="BACKEND"}`` when the model raised it from ``execute``.
#: * ``failure``/``engine_error``: the engine failed the request before any response of it was sent.
#: * ``failure``/``mid_stream``: the request failed after its first response was sent (a streamed token, or the
#:   answer to another prompt of the same request).  Triton counts it as a success.
#: * ``cancelled``/``client``: the client cancelled the request (gRPC stream cancel) or went away while it ran.
#: * ``cancelled``/``stop``: ended by a ``stop=true`` request carrying its request id (TensorRT-LLM's ``stop``).
REASONS: dict[str, tuple[str, ...]] = {
    SUCCESS: ("none",),
    FAILURE: ("refused", "engine_error", "mid_stream"),
    CANCELLED: ("client", "stop"),
}
LABELS = ("model", "version", "outcome", "reason")


class RequestOutcomes:
    """The counter of one served model: ``count(outcome, reason)`` adds 1 (thread-safe).

    Every ``outcome``/``reason`` series is created at load, so each shows on ``/metrics`` from the start (at 0).
    ``pb_utils`` is the Python backend's ``triton_python_backend_utils``; when the server refuses custom metrics
    (``--allow-metrics=false``) the counter logs that once and counts nothing.
    """

    def __init__(self, pb_utils: Any, model: str, version: str, log_warn: Any = None) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[tuple[str, str], Any] = {}
        try:
            # the same name in another model (or instance) refers to the same family (python_backend "Custom Metrics")
            self._family = pb_utils.MetricFamily(name=REQUESTS_ENDED, description=REQUESTS_ENDED_HELP, kind=pb_utils.MetricFamily.COUNTER)
            for outcome, reasons in REASONS.items():
                for reason in reasons:
                    labels = {"model": model, "version": str(version), "outcome": outcome, "reason": reason}
                    self._metrics[(outcome, reason)] = self._family.Metric(labels=labels)
        except Exception as e:  # metrics off in this server: serve without the counter
            self._metrics = {}
            if log_warn is not None:
                log_warn(f"{REQUESTS_ENDED} is not reported: the server refused custom metrics ({e})")

    def count(self, outcome: str, reason: str) -> None:
        if reason not in REASONS.get(outcome, ()):
            raise ValueError(f"unknown request outcome {outcome}/{reason}; known: {REASONS}")
        m = self._metrics.get((outcome, reason))
        if m is not None:
            with self._lock:
                m.increment(1)


def parse_requests_ended(metrics_text: str, model: str) -> dict[tuple[str, str], float]:
    """``{(outcome, reason): value}`` of :data:`REQUESTS_ENDED` for ``model`` in a Prometheus text exposition (the body
    of Triton's ``GET /metrics``), summed over versions."""
    out: dict[tuple[str, str], float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(REQUESTS_ENDED + "{"):
            continue
        labels_text, _, value = line[len(REQUESTS_ENDED) + 1 :].rpartition("} ")
        labels = dict(part.split("=", 1) for part in labels_text.split(","))
        labels = {k.strip(): v.strip().strip('"') for k, v in labels.items()}
        if labels.get("model") != model:
            continue
        key = (labels.get("outcome", ""), labels.get("reason", ""))
        out[key] = out.get(key, 0.0) + float(value)
    return out
