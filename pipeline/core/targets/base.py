"""The small interface every build target implements, and the engine-runner interface that the
evaluate and benchmark stages use to drive a built engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config import PipelineConfig
    from ..config.common import Problem


@dataclasses.dataclass
class GenerationRequest:
    """One greedy generation request (token ids in, token ids out)."""

    input_ids: list[int]
    max_new_tokens: int
    stop_token_ids: list[int]
    """The whole eos list plus extra stop ids; generation ends at the first one."""
    request_id: str = ""
    ignore_eos: bool = False
    """Benchmarks: generate exactly max_new_tokens."""
    repetition_penalty: float | None = None
    """The decoding policy's repetition penalty (``pipeline.core.decoding``; None = none), applied to greedy decoding."""


@dataclasses.dataclass
class GenerationResult:
    request_id: str
    output_ids: list[int]
    """Generated ids, cut before the first stop id (never includes the stop id or padding)."""
    finish_reason: str
    """eos | length | stop (a stop string, set by the caller) | error."""
    token_times_s: list[float] = dataclasses.field(default_factory=list)
    """Wall-clock time (s, from submission) at which each generated token became available."""
    error: str | None = None


TokenCallback = Callable[[str, int, float], None]
"""on_token(request_id, token_id, t_seconds_since_submit) for streaming measurements."""


class EngineRunner(Protocol):
    """A loaded engine that can run greedy generation (continuous batching where supported)."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int

    def generate(self, requests: Sequence[GenerationRequest], on_token: TokenCallback | None = None) -> list[GenerationResult]:
        """Run all requests to completion (concurrently, up to max_batch_size); results in request order.

        A request whose prompt exceeds ``max_input_len`` gets ``finish_reason="error"`` and an
        ``error`` message; it never crashes the batch and is never truncated.
        """
        ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What one target (and backend) can do; the one place config validation, preflight, the planner and the
    evaluate stage look this up (:func:`pipeline.core.targets.capabilities`).

    Every recipe the project knows (``pipeline.core.config.quant.RECIPES``) is either in ``recipes`` or refused
    with a reason in ``refused_recipes`` (tests/facts/test_target_capabilities.py checks both against ``check_config``).
    """

    name: str
    """Registry name: onnxruntime_genai | tensorrt_llm | tensorrt_llm_pytorch."""
    device: str
    """Where its engine runs by default: cpu | gpu."""
    recipes: tuple[str, ...]
    """``quant.recipe`` values it builds and runs."""
    refused_recipes: dict[str, str]
    """recipe -> why this target cannot run it (shown to the user, with the fix)."""
    kv_cache_dtypes: tuple[str, ...]
    """``quant.kv_cache_dtype`` values its runtime deploys."""
    beam_search: bool
    """Builds engines with ``build.max_beam_width`` > 1."""
    logits: bool
    """Its engine runner returns teacher-forced logits (the evaluate stage's fidelity metrics)."""
    sliding_window: bool
    """Honours a model's ``sliding_window`` (windowed KV cache)."""
    streaming: bool
    """Its runner reports each token as it is generated (``on_token``; TTFT/TPOT measurements)."""
    max_batch_size: int | None
    """Largest ``build.max_batch_size`` it accepts; ``None`` = no limit of its own."""

    def recipe_refusal(self, recipe: str) -> str | None:
        """``None`` when ``recipe`` is buildable here, else the reason it is refused."""
        if recipe in self.recipes:
            return None
        return self.refused_recipes.get(recipe, f"target {self.name} does not know recipe {recipe!r} (it supports {list(self.recipes)})")


class Target(Protocol):
    """A build target (``onnxruntime_genai``, ``tensorrt_llm``); implementations in this package, registered in
    :data:`pipeline.core.targets.TARGETS` and checked against this protocol by mypy and tests/facts/test_target_capabilities.py."""

    name: str

    def capabilities(self, cfg: PipelineConfig | None = None) -> Capabilities:
        """What this target can do (for ``cfg``'s backend where the target has several)."""
        ...

    def check_config(self, cfg: PipelineConfig) -> list[Problem]:
        """Config-time checks (recipe supported, limits consistent); no heavy imports."""
        ...

    def available(self) -> tuple[bool, str]:
        """(usable here, reason) - e.g. (False, "tensorrt_llm is not installed")."""
        ...

    def plan(self, cfg: PipelineConfig, checkpoint: Path | None, export_dir: Path | None, out: Path | None) -> dict[str, Any]:
        """What :meth:`build` would do (``dry_run``): the command or options, no side effects."""
        ...

    def preflight(self, cfg: PipelineConfig, checkpoint: Path, out: Path | None = None) -> None:
        """Raise PreflightError with the fix when this machine cannot build."""
        ...

    def build(
        self, cfg: PipelineConfig, checkpoint: Path, out: Path, log: Any = None, *, export_dir: Path | None = None, progress: Any = None
    ) -> dict[str, Any]:
        """Build the engine into ``out/engine`` and return build_info (also written to out/build_info.json)."""
        ...

    def load_runner(self, engine_dir: Path, **kw: Any) -> Any:
        """An :class:`EngineRunner` over the built engine."""
        ...
