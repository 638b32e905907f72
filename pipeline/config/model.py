"""``model`` config group: which Hugging Face checkpoint to start from (export stage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .common import Problem, choice, runtime

DTYPES = ("float16", "bfloat16", "float32")


@dataclass
class ModelConfig:
    name: str = "model"
    """Short name used in reports, artifact manifests and the Triton model repository."""
    path: Optional[str] = runtime(None, doc="local HF checkpoint folder; relative paths resolve against the cwd, then the repo root")
    """Local Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files).
    ``None`` for shapes-only presets (planner), which carry ``hf_config`` instead."""
    dtype: str = "float16"
    """dtype of the normalised checkpoint written by export: float16 | bfloat16 | float32."""
    trust_remote_code: bool = False
    """Never execute code shipped with a checkpoint unless explicitly set (secure default)."""
    allow_pickle: bool = False
    """Allow pickled ``*.bin``/``*.pt`` weights (arbitrary code execution risk). Off by default."""
    allow_external_files: bool = runtime(False, doc="accept checkpoint files (symbolic links, index shard names) that "
                                                    "resolve outside model.path; their contents enter the cache key")
    """Symbolic links in the checkpoint folder and shard names in the weight index must resolve inside
    ``model.path`` (or, for a Hugging Face hub cache snapshot, its ``blobs`` folder) unless this is set."""
    apply_chat_template: bool = True
    """Render prompts through the tokenizer's chat template (one shared path for calibration,
    evaluation and serving; the template supplies BOS, so no special tokens are added again)."""
    hf_config: Optional[Dict[str, Any]] = None
    """Inline ``config.json`` for shapes-only presets (used by the planner; no weights)."""
    extra_stop_token_ids: List[int] = runtime(default_factory=list, doc="extra stop ids appended to the eos list")


def validate(cfg: ModelConfig, prefix: str = "model") -> list[Problem]:
    problems: list[Problem] = []
    choice(problems, f"{prefix}.dtype", cfg.dtype, DTYPES)
    if cfg.path is None and cfg.hf_config is None:
        problems.append(Problem(f"{prefix}.path", None, "no checkpoint given.", "pass model.path=/path/to/hf_checkpoint or pick a preset: model=support_llama"))
    return problems
