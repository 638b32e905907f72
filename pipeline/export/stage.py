"""``export`` stage: validate the local Hugging Face checkpoint (``model.path``) and write a normalised copy.

Output (see docs/artifacts.md): ``hf/`` (config.json, model*.safetensors, generation_config.json, tokenizer
files), ``model_info.json`` and ``decoding.json`` (the decoding policy, :mod:`pipeline.core.decoding`).  The checks live in :mod:`pipeline.export.inspect` (headers only) and :mod:`pipeline.export.safety`, the writing in :mod:`pipeline.export.write`.

Cache key: the ``model`` group's cache fields (name, dtype, trust_remote_code, allow_pickle, ...) and the
content digest of the whole checkpoint folder (``external_inputs``); ``model.path`` itself is a runtime field.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.contracts.export import ExportResult
from ..core.stage import Stage, StageContext
from ..errors import InputError
from .checks import checks

if TYPE_CHECKING:
    from ..core.config import PipelineConfig


def _checkpoint(cfg: PipelineConfig) -> dict[str, Path]:
    """The checkpoint folder, after the cheap checks (config.json + weight headers, no torch).

    Runs before the runner hashes the folder for the cache key, so a truncated shard or an
    unsupported architecture fails in milliseconds instead of after hashing gigabytes.
    """
    from ..core.config import resolve_path
    from ..core.config.model import path_problem
    from ..core.decoding import read_policy
    from .inspect import external_files, inspect_checkpoint

    m = cfg.model
    missing = path_problem(m.path, m.hf_config)
    if missing is not None:
        raise InputError(str(missing))
    if m.path is None:  # path_problem refused no path without hf_config: a shapes-only preset
        preset = _preset_of(m.name)
        raise InputError(
            f"model.name={m.name!r} is a shapes-only preset (model.hf_config is set, model.path is null): it has "
            f"no weights, so it cannot be exported, quantized or built. Fix: use `pipeline plan model={preset}` "
            f"for memory/speed planning, or pass model.path=/path/to/hf_checkpoint to run the pipeline."
        )
    path = resolve_path(m.path)
    if path is None or not path.exists():
        raise InputError(
            f"model.path={m.path!r}: not found (resolved to {path}). Fix: point model.path at a local Hugging Face "
            f"checkpoint folder (relative paths resolve against the current folder, then the repository root)."
        )
    inspect_checkpoint(
        path, trust_remote_code=m.trust_remote_code, allow_pickle=m.allow_pickle, allow_external_files=m.allow_external_files
    )
    read_policy(path)  # a decoding field no runtime can apply is refused before any stage runs (pipeline.core.decoding)
    # the key covers what export reads: the folder (links hashed by content) and, only when allowed, the
    # out-of-folder files the weight index names
    extra = {f"outside:{i}": p for i, p in enumerate(external_files(path))} if m.allow_external_files else {}
    return {"checkpoint": path, **extra}


def _preset_of(name: str) -> str:
    """The ``build_configs/model/<preset>.yaml`` whose ``name`` is ``name`` (for messages); ``<preset>`` if none."""
    from omegaconf import DictConfig, OmegaConf

    from ..core.config import CONFIG_DIR

    for f in sorted((CONFIG_DIR / "model").glob("*.yaml")):
        try:
            preset = OmegaConf.load(f)
            if isinstance(preset, DictConfig) and preset.get("name") == name:
                return f.stem
        except Exception:
            continue
    return "<preset>"


def _headline(architecture: str, params: Any, dtype: str) -> dict[str, Any]:
    return {"architecture": architecture, "params": params, "dtype": dtype}


def _run(ctx: StageContext) -> ExportResult:
    from ..core.contracts.export import ExportArtifact
    from ..core.decoding import read_policy
    from ..core.store import write_json_atomic
    from .inspect import inspect_checkpoint
    from .write import export_checkpoint

    m = ctx.cfg.model
    src = ctx.external["checkpoint"]
    assert ctx.out is not None
    facts = inspect_checkpoint(
        src, trust_remote_code=m.trust_remote_code, allow_pickle=m.allow_pickle, allow_external_files=m.allow_external_files
    )
    policy = read_policy(src)  # before the weights are touched: a refused field is exit 2 in milliseconds
    info = export_checkpoint(
        src,
        ctx.out,
        dtype=m.dtype,
        trust_remote_code=m.trust_remote_code,
        allow_pickle=m.allow_pickle,
        progress=ctx.progress,
        facts=facts,
        outputs=ctx.outputs,
    )
    write_json_atomic(ExportArtifact(ctx.out).decoding_path, policy.to_json())
    warnings = info.pop("_warnings", [])
    if policy.ignored:
        warnings.append(
            f"generation_config.json sets {policy.ignored}: no runner or server applies these (decoding.json 'ignored'); "
            f"evaluate and serving decode without them"
        )
    for w in warnings:
        ctx.log.warning("export: %s", w)
    return ExportResult(
        headline=_headline(info["architecture"], info["num_parameters"], info["dtype"]),
        warnings=warnings,
        eos_token_ids=info["eos_token_ids"],
        pad_token_derived=info["pad_token_derived"],
        tie_word_embeddings=info["tie_word_embeddings"],
        rope_type=(info["rope_scaling"] or {}).get("rope_type", "default"),
        decoding={"repetition_penalty": policy.repetition_penalty, "sampling": policy.sampling},
    )


def _dry_run(ctx: StageContext) -> dict[str, Any]:
    from .inspect import inspect_checkpoint

    m = ctx.cfg.model
    facts = inspect_checkpoint(
        ctx.external["checkpoint"],
        trust_remote_code=m.trust_remote_code,
        allow_pickle=m.allow_pickle,
        allow_external_files=m.allow_external_files,
    )
    n = sum(_numel(shape) for shape, _ in facts.tensors.values()) if facts.tensors else None
    return {"headline": _headline(facts.architecture, n, m.dtype), "weight_files": facts.weight_files}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


STAGE = Stage(
    name="export",
    checks=checks,
    deps=(),
    config_groups=("model",),
    libraries=("transformers", "safetensors", "tokenizers", "torch"),
    run=_run,
    # 3: decoding.json (issue 24); 4: tokenizer follows transformers, tokenizer_parity (issue 36);
    # 5: tokenizer_config.json that transformers 4.57 reads too (issue 34); 6: no chat_template in it beside
    # chat_template.jinja (fresh-user trial)
    version="6",
    external_inputs=_checkpoint,
    dry_run=_dry_run,
)
