"""Business evaluation: eval sets as JSONL data (dataset), a metric registry (metrics), greedy runners
(runners), the release gate with paired statistics (gate) and reports (report).  The evaluate stage
(``pipeline/evaluate/stage.py``) wires them together."""

from ..data.evalset import EvalItem, load_eval_set
from ..data.metrics import METRICS, Metric, get_metric, register

__all__ = ["EvalItem", "METRICS", "Metric", "get_metric", "load_eval_set", "register"]
