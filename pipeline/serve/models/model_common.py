"""What every served Triton Python model shares: its config's parameters, a folder parameter, and answering requests.

Copied by the package stage next to every served ``model.py`` (``pipeline/package/repository.py`` ``MODEL_COMMON``),
which imports it from its own folder; it runs inside Triton's Python backend stub, so it imports nothing but the
standard library and ``triton_python_backend_utils``, and never the ``pipeline`` package.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

try:  # only inside Triton; the models that import this module take ``pb_utils`` from here
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - importable for unit tests of the pure helpers
    pb_utils = None


def model_config(args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The model's config (``args["model_config"]``, parsed) and its ``parameters``, name -> string value."""
    cfg = json.loads(args["model_config"])
    return cfg, {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}


def folder_param(args: dict[str, Any], params: dict[str, str], name: str, default: str) -> str:
    """The folder parameter ``name`` (``default`` when unset); a relative one is in the model's version folder."""
    d = params.get(name) or default
    return d if os.path.isabs(d) else os.path.join(args["model_repository"], args["model_version"], d)


def _error(model: str, e: Exception) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"{model}: {e}"))


def answer_each(requests: list[Any], answer: Callable[[Any], Any], model: str) -> list[Any]:
    """``execute`` of a model that is not decoupled: one response per request, ``answer(request)``, or the error it
    raised, named after ``model``."""
    responses = []
    for request in requests:
        try:
            responses.append(answer(request))
        except Exception as e:
            responses.append(_error(model, e))
    return responses


def execute_sending(requests: list[Any], run: Callable[[Any, Callable[..., Any]], None], model: str, decoupled: bool) -> list[Any] | None:
    """``execute`` of a model whose ``run(request, send)`` sends each response of a request: decoupled, through the
    request's response sender, then the FINAL flag (an error raised: an error response with the FINAL flag);
    otherwise the last response ``run`` sent, for each request (:func:`answer_each`). Errors are named after ``model``."""
    if not decoupled:

        def last(request: Any) -> Any:
            got: list[Any] = []
            run(request, got.append)
            return got[-1]

        return answer_each(requests, last, model)
    for request in requests:
        sender = request.get_response_sender()
        try:
            run(request, sender.send)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:
            sender.send(_error(model, e), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    return None
