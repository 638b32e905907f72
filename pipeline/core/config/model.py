"""``model`` config group: which Hugging Face checkpoint to start from (export stage)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from .common import Problem, choice, runtime

DTYPES = ("float16", "bfloat16", "float32")
#: what an unset ``model.name`` / ``model.dtype`` becomes: derived from ``model.path`` (see the resolvers below).
NAME_FROM_CHECKPOINT = "${checkpoint_name:${.path}}"
DTYPE_FROM_CHECKPOINT = "${checkpoint_dtype:${.path}}"


def _checkpoint_folder(path: Any) -> Optional[Path]:
    if path is None or str(path).strip() == "":
        return None
    from .common import resolve_path

    return resolve_path(str(path))


def checkpoint_name(path: Any) -> str:
    """A user's model's own name: the checkpoint folder's name (for a Hugging Face hub cache snapshot
    ``models--<org>--<name>/snapshots/<rev>``, ``<name>``); ``"model"`` without a path."""
    folder = _checkpoint_folder(path)
    if folder is None:
        return "model"
    folder = Path(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.split("--")[-1]
    return folder.name or "model"


def checkpoint_dtype(path: Any) -> str:
    """The checkpoint's own dtype: ``config.json`` ``torch_dtype`` (or transformers 5's ``dtype``) when it is one of
    :data:`DTYPES`, else ``float32`` (transformers' default when a config states none). A bf16 checkpoint therefore
    exports as bf16, which holds every value it has; float16 must be asked for (and export refuses a lossy cast)."""
    folder = _checkpoint_folder(path)
    if folder is None:
        return "float32"
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "float32"  # the export stage names the unreadable file
    if not isinstance(cfg, dict):
        return "float32"
    for key in ("torch_dtype", "dtype"):
        v = cfg.get(key)
        if isinstance(v, str) and v.replace("torch.", "") in DTYPES:
            return v.replace("torch.", "")
    return "float32"


def export_dtype_for(model_dtype: Any) -> str:
    """Default ``quant.export_dtype`` (high-precision tensors of the TensorRT-LLM checkpoint) for a ``model.dtype``:
    the same half type for bfloat16/float16 checkpoints (a bf16 model is never narrowed to fp16 behind the user's
    back), float16 for float32 ones (the TensorRT-LLM engines' usual compute type)."""
    return str(model_dtype) if model_dtype in ("bfloat16", "float16") else "float16"


OmegaConf.register_new_resolver("export_dtype_for", export_dtype_for, replace=True)
OmegaConf.register_new_resolver("checkpoint_name", checkpoint_name, replace=True)
OmegaConf.register_new_resolver("checkpoint_dtype", checkpoint_dtype, replace=True)


@dataclass
class ModelConfig:
    name: str = runtime(NAME_FROM_CHECKPOINT, doc="a label: only the package stage, whose key holds it, writes it")
    """Short name used in reports, artifact manifests and the Triton model repository. Unless set: the
    checkpoint folder's name (:func:`checkpoint_name`), so a user's model never carries a preset's name.
    Not in the export stage's key (it changes no exported byte): renaming a model re-packages it and reuses the
    rest; the package stage keys on it (``pipeline.package.stage``)."""
    path: Optional[str] = runtime(None, doc="local HF checkpoint folder; relative paths resolve against the cwd, then the repo root")
    """Local Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files).
    ``None`` for shapes-only presets (planner), which carry ``hf_config`` instead."""
    dtype: str = DTYPE_FROM_CHECKPOINT
    """dtype of the normalised checkpoint written by export: float16 | bfloat16 | float32. Unless set: the
    checkpoint's ``torch_dtype`` (:func:`checkpoint_dtype`). Export refuses a cast that loses values."""
    trust_remote_code: bool = False
    """Never execute code shipped with a checkpoint unless explicitly set (secure default)."""
    allow_pickle: bool = False
    """Allow pickled ``*.bin``/``*.pt`` weights (arbitrary code execution risk). Off by default."""
    allow_external_files: bool = runtime(
        False,
        doc="accept checkpoint files (symbolic links, index shard names) that "
        "resolve outside model.path; their contents enter the cache key",
    )
    """Symbolic links in the checkpoint folder and shard names in the weight index must resolve inside
    ``model.path`` (or, for a Hugging Face hub cache snapshot, its ``blobs`` folder) unless this is set."""
    apply_chat_template: bool = True
    """Render prompts through the tokenizer's chat template (one shared path for calibration,
    evaluation and serving; the template supplies BOS, so no special tokens are added again)."""
    hf_config: Optional[Dict[str, Any]] = None
    """Inline ``config.json`` for shapes-only presets (used by the planner; no weights)."""
    extra_stop_token_ids: List[int] = runtime(default_factory=list)
    """Token ids that end generation besides the model's eos ids (appended to the eos list; evaluate keys on them
    explicitly)."""


#: the longest ``model.name``, in characters and in UTF-8 bytes: it names the release archive ``NAME-VERSION.tar.gz``,
#: run folders and the console table, and a file name holds at most 255 bytes (POSIX ``NAME_MAX`` on ext4, XFS).
MAX_NAME_LEN = 128


def blank_path_problem(path: Any, prefix: str = "model") -> Optional[Problem]:
    """The refusal of an empty or whitespace-only ``model.path`` (``pipeline model.path=``): ``Path("")`` is the
    current folder, so the run looked for ``<cwd>/config.json`` and titled itself "model model". One rule for the field
    checks (:func:`validate`: the run and ``pipeline plan``, exit 2) and the export stage's reading of the folder."""
    if not isinstance(path, str) or path.strip():
        return None
    return Problem(
        f"{prefix}.path",
        path,
        "is empty; it must name a checkpoint folder (an empty path would be read as the current folder).",
        "pass model.path=/path/to/hf_checkpoint, or pick a preset (model=support_llama; for pipeline plan a "
        "shapes-only one such as model=llama31_8b)",
    )


def validate(cfg: ModelConfig, prefix: str = "model") -> list[Problem]:
    problems: list[Problem] = []
    choice(problems, f"{prefix}.dtype", cfg.dtype, DTYPES)
    name = cfg.name
    n_bytes = len(name.encode("utf-8", "replace")) if isinstance(name, str) else 0
    if n_bytes > MAX_NAME_LEN:
        problems.append(
            Problem(
                f"{prefix}.name",
                name[:40] + "...",
                f"is {n_bytes} bytes; it becomes part of file names (the release archive NAME-VERSION.tar.gz), "
                f"so it must be at most {MAX_NAME_LEN} characters and {MAX_NAME_LEN} bytes.",
                f"pass a shorter model.name (<= {MAX_NAME_LEN} bytes), or leave it unset to use the checkpoint folder's name",
            )
        )
    elif not isinstance(name, str) or not name.strip() or name.startswith(("-", ".")):
        problems.append(
            Problem(
                f"{prefix}.name",
                name,
                f"must be a non-empty name of at most {MAX_NAME_LEN} characters that does not start with '-' or '.' "
                f"(it names the release archive NAME-VERSION.tar.gz, which tar would read as an option).",
                "set model.name=support-llama, or leave it unset to use the checkpoint folder's name",
            )
        )
    missing = path_problem(cfg.path, cfg.hf_config, prefix)
    return problems + ([missing] if missing is not None else [])


def path_problem(path: Any, hf_config: Any, prefix: str = "model") -> Optional[Problem]:
    """An empty ``model.path`` (:func:`blank_path_problem`), or none and no ``hf_config`` (no checkpoint at all): the
    field checks' refusal and the export stage's, one text (a run listed both wordings of ``model.path=null``)."""
    blank = blank_path_problem(path, prefix)
    if blank is not None or path is not None or hf_config is not None:
        return blank
    return Problem(
        f"{prefix}.path", None, "no checkpoint given.", "pass model.path=/path/to/hf_checkpoint or pick a preset: model=support_llama"
    )
