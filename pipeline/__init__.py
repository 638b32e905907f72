"""pipeline: Hugging Face checkpoint -> quantized, built, evaluated, packaged Triton deployment.

The public Python surface (everything else is private and may change between releases):

* :func:`compose` (``compose(overrides) -> PipelineConfig``): the typed config, as the CLI composes it; an override
  the CLI refuses (an unknown key, ``+key=value`` included, an unknown preset, a wrong type, one Hydra cannot parse,
  a ``${...}`` that cannot be resolved) raises ``ConfigError`` (``exit_code`` 2) with the CLI's message; so does a
  ``hydra.*`` override (``hydra.run.dir=``: no Hydra app runs here; ``run(cfg, summary_dir=...)`` and ``store_dir=``
  say where outputs go); the rules are :func:`validate`'s; ``overrides`` is a list (or tuple) of str: a str is
  refused (``ConfigTypeError``);
* :func:`run` (``run(cfg) -> RunSummary``): run the configured stages (``RunSummary.exit_code`` is the CLI's);
  ``cfg`` is what :func:`compose` returns (or a Hydra ``DictConfig`` of the pipeline's config); a dict or a list of
  overrides raises ``ConfigTypeError``;
* :func:`validate` (``validate(cfg, raise_on_error=True) -> [Problem]``): every check a run makes before any work
  (fields, then each stage that will run); raises ``ConfigError`` listing them all;
* :func:`plan` (``plan(cfg) -> Plan``): the memory and speed plan, no work done; it runs :func:`validate` first and
  raises its ``ConfigError`` (exit 2) for a config a run would refuse (``plan(cfg, check=False)`` skips that);
* one typed reader per stage artifact: :class:`ExportArtifact`, :class:`QuantizeArtifact`, :class:`BuildArtifact`,
  :class:`EvalArtifact`, :class:`PackageArtifact`, :class:`BenchmarkArtifact`;
* :func:`register_metric`: add an eval metric; :func:`register_target`: add a build target;
* :class:`LLMClient`: the gRPC client of a served package.

Names are imported on first use, so ``import pipeline`` stays cheap (no torch, no transformers).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {
    "compose": "pipeline.core.config:compose",
    "run": "pipeline.runner:run_pipeline",
    "plan": "pipeline.validation:checked_plan",
    "validate": "pipeline.validation:validate",
    "ExportArtifact": "pipeline.core.contracts.export:ExportArtifact",
    "QuantizeArtifact": "pipeline.core.contracts.quantize:QuantizeArtifact",
    "BuildArtifact": "pipeline.core.contracts.build:BuildArtifact",
    "EvalArtifact": "pipeline.core.contracts.evaluate:EvalArtifact",
    "PackageArtifact": "pipeline.core.contracts.package:PackageArtifact",
    "BenchmarkArtifact": "pipeline.core.contracts.benchmark:BenchmarkArtifact",
    "register_metric": "pipeline.data.metrics:register",
    "register_target": "pipeline.core.targets:register",
    "LLMClient": "pipeline.serve.client:LLMClient",
}
"""public name -> ``module:attribute`` that defines it."""

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562). Raises ``AttributeError`` for any other name."""
    ref = _PUBLIC.get(name)
    if ref is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}; public names: {__all__}")
    mod, attr = ref.split(":")
    value = getattr(importlib.import_module(mod), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
