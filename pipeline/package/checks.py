"""The package stage's config checks (run by :func:`pipeline.validation.validate` when the package stage will run).

* ``eval.candidate=simulated``: the package ships the built engine, but the release gate would judge ModelOpt's
  simulated-quantization model, and nothing compares the two (``engine~simulated`` is an optional diagnostic of
  ``eval.runners``, not a check the package requires), so the release would carry a verdict on a model it does not
  ship.  Refused before any work (fresh-user trial: exit 0, no warning).  ``eval.candidate=auto`` stays allowed: it
  gates the engine wherever the target runs it; where it cannot (``target=tensorrt_llm_pytorch`` packaged on a host
  without a GPU, docs/build.md) the simulated model is judged and the package says so loudly (console and release
  manifest ``evaluation.warning``, :func:`pipeline.package.manifest.simulated_candidate_warning`).

Never imports torch.
"""

from __future__ import annotations

from typing import Any

from ..core.config.common import Problem


def checks(cfg: Any) -> list[Problem]:
    """Every package-stage problem of ``cfg`` (a composed ``PipelineConfig``); never raises for bad values."""
    if cfg.eval.candidate != "simulated":
        return []
    return [
        Problem(
            "eval.candidate",
            cfg.eval.candidate,
            "the package stage ships the built engine, but with this candidate the release gate judges ModelOpt's "
            "simulated-quantization model, not that engine (nothing compares the two), so the release would carry a "
            "verdict on a model it does not ship.",
            "eval.candidate=engine to gate what ships (or eval.candidate=auto: the engine wherever the target can run "
            "it, the simulated model only where it cannot, said in the release manifest), or drop package from stages "
            "(e.g. stages=[export,quantize,build,evaluate]).",
        )
    ]
