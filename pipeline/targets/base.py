"""The small interface every build target implements, and the engine-runner interface that the
evaluate and benchmark stages use to drive a built engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

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


class Target(Protocol):
    """A build target (``onnxruntime_genai``, ``tensorrt_llm``)."""

    name: str
    supported_recipes: tuple[str, ...]
    supported_kv_cache: tuple[str, ...]

    def check_config(self, cfg: "PipelineConfig") -> list["Problem"]:
        """Config-time checks (recipe supported, limits consistent); no heavy imports."""
        ...

    def available(self) -> tuple[bool, str]:
        """(usable here, reason) - e.g. (False, "tensorrt_llm is not installed")."""
        ...

    def preflight(self, cfg: "PipelineConfig", checkpoint: Path) -> None:
        """Raise PreflightError with the fix when this machine cannot build."""
        ...

    def build(self, cfg: "PipelineConfig", checkpoint: Path, out: Path, log: Any) -> dict[str, Any]:
        """Build the engine into ``out/engine`` and return build_info (also written to out/build_info.json)."""
        ...

    def load_runner(self, engine_dir: Path, **kw: Any) -> EngineRunner: ...
