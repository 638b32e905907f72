"""Export: validate a local Hugging Face checkpoint, then write a normalised copy.

:func:`export_checkpoint` is the plain function behind the ``export`` stage
(``pipeline/export/stage.py``).  It reads ``config.json``, the safetensors headers and the
tokenizer first, runs every check below, and only then loads the weights (once) and writes::

    <out>/hf/                 config.json, model.safetensors (or shards + index),
                              generation_config.json, tokenizer files, special_tokens_map.json
    <out>/model_info.json     the facts downstream stages rely on (fields: docs/artifacts.md)

Checks (each raises :class:`pipeline.core.errors.InputError` naming the file/field, the values and the fix):

* architecture is one of :data:`SUPPORTED_ARCHITECTURES`; ``auto_map`` (custom modelling code)
  needs ``model.trust_remote_code=true``;
* head counts: ``hidden_size == num_attention_heads * head_dim`` unless ``head_dim`` is given
  explicitly, ``num_attention_heads % num_key_value_heads == 0``;
* ``rope_scaling`` in the legacy ``type`` or the newer ``rope_type`` spelling (or transformers 5
  ``rope_parameters``) is normalised to carry ``rope_type`` with every other field kept;
* weights: safetensors headers must parse and cover the file (truncated/corrupt files are named);
  pickled ``*.bin``/``*.pt`` weights are refused unless ``allow_pickle`` (then loaded with
  ``torch.load(weights_only=True)``);
* ``vocab_size`` == embedding rows == ``lm_head`` rows; the tokenizer may be shorter than the
  embedding, never longer; every special-token id is < ``vocab_size``;
* ``tie_word_embeddings``: tied without ``lm_head.weight`` uses the embedding ("tied"); untied
  without ``lm_head.weight`` is an error (transformers would silently initialise a random head);
  tied with an ``lm_head.weight`` that differs from the embedding is an error;
* ``eos_token_id`` may be a list: the whole list is kept (config, generation_config, tokenizer);
  no pad id anywhere: the first eos id is used and ``pad_token_derived`` is recorded;
* after loading: no tensor the model needs may be missing from the checkpoint.

No function here imports torch or transformers at module import time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..core.artifacts import TOKENIZER_DIRS, TOKENIZER_FILES
from ..core.errors import InputError
from .artifact import ExportArtifact

log = logging.getLogger("pipeline.export.checkpoint")

#: architecture (``config.json`` ``architectures[0]``) -> ``model_type``.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Phi3ForCausalLM": "phi3",
}
DTYPES = ("float16", "bfloat16", "float32")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
EMBED_NAME = "model.embed_tokens.weight"
LM_HEAD_NAME = "lm_head.weight"
#: Largest safetensors shard the export writes (the Hugging Face Hub's usual 5 GB shards; ``save_pretrained``'s
#: ``max_shard_size``): a 70 B bf16 checkpoint is written as 28 shards, each readable on its own.
EXPORT_SHARD_SIZE = "5GB"
# non-persistent buffers that old checkpoints sometimes carry; harmless when "unexpected"
_IGNORABLE_UNEXPECTED = ("rotary_emb.inv_freq",)
_SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}

ProgressFactory = Callable[[str, "float | None"], AbstractContextManager[Callable[[float], None]]]


@dataclass
class CheckpointFacts:
    """What :func:`inspect_checkpoint` learned from config.json and the weight headers (no weights loaded).

    Attributes:
        path: the checkpoint folder.
        config: the raw ``config.json`` dict.
        architecture / model_type: e.g. ``LlamaForCausalLM`` / ``llama``.
        weight_format: ``"safetensors"`` or ``"pickle"``.
        weight_files: weight file names (relative), in load order.
        tensors: tensor name -> (shape, safetensors dtype string); empty for pickle until loaded.
        tensor_file: tensor name -> file holding it (safetensors only).
        tied: ``tie_word_embeddings`` as configured.
        rope_theta: RoPE base (None when config.json does not state it; transformers' default applies).
        rope_scaling: normalised scaling dict (carries ``rope_type``) or None for plain RoPE.
        head_dim_explicit: whether config.json states ``head_dim``.
    """

    path: Path
    config: dict[str, Any]
    architecture: str
    model_type: str
    weight_format: str
    weight_files: list[str]
    tensors: dict[str, tuple[list[int], str]] = field(default_factory=dict)
    tensor_file: dict[str, str] = field(default_factory=dict)
    tied: bool = False
    rope_theta: float | None = None
    rope_scaling: dict[str, Any] | None = None
    head_dim_explicit: bool = False
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- small helpers
def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{path}: {what} not found. Fix: point model.path at a Hugging Face checkpoint folder that has {path.name}."
        ) from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: {what} is not UTF-8 text ({e}). Fix: restore {path.name} from the original checkpoint.") from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}: {what} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}). "
            f"Fix: restore {path.name} from the original checkpoint."
        ) from None
    except OSError as e:
        raise InputError(f"{path}: cannot read {what}: {e.strerror or e}. Fix: check the file's permissions.") from None


def _ids(value: Any) -> list[int]:
    """``None`` | int | list[int] -> list[int]."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def _merge_ids(*lists: list[int]) -> list[int]:
    out: list[int] = []
    for lst in lists:
        for i in lst:
            if i not in out:
                out.append(i)
    return out


def normalise_rope(config: dict[str, Any], where: str = "config.json") -> tuple[float | None, dict[str, Any] | None]:
    """RoPE base and scaling from a raw ``config.json`` dict, in one normalised form.

    Accepts ``rope_scaling`` with the legacy ``type`` key or the newer ``rope_type`` key, and
    transformers 5's ``rope_parameters`` (which also carries ``rope_theta``).  Returns
    ``(rope_theta, scaling)``; ``scaling`` keeps every field of the source, always has
    ``rope_type``, never contains ``rope_theta``, and is None for plain RoPE (``rope_type``
    ``default`` with no other field).  Raises InputError when the spellings disagree.
    """
    theta = config.get("rope_theta")
    merged: dict[str, Any] = {}
    for key in ("rope_parameters", "rope_scaling"):
        d = config.get(key)
        if d is None:
            continue
        if not isinstance(d, dict):
            raise InputError(
                f"{where}: {key}={d!r} is not an object. Fix: write {key} as "
                '{"rope_type": "...", "factor": ...} or remove it for plain RoPE.'
            )
        legacy, new = d.get("type"), d.get("rope_type")
        if legacy is not None and new is not None and legacy != new:
            raise InputError(
                f"{where}: {key} has type={legacy!r} and rope_type={new!r}, which disagree. "
                f"Fix: keep one spelling (rope_type) with the intended scaling type."
            )
        for k, v in d.items():
            if k in merged and merged[k] != v and k not in ("type", "rope_type"):
                raise InputError(
                    f"{where}: rope_parameters.{k}={merged[k]!r} but rope_scaling.{k}={v!r}. "
                    f"Fix: make them agree or keep only one of rope_parameters/rope_scaling."
                )
            merged[k] = v
        if new is None and legacy is not None:
            merged["rope_type"] = legacy
    if "rope_theta" in merged:
        t = merged.pop("rope_theta")
        if theta is not None and float(theta) != float(t):
            raise InputError(f"{where}: rope_theta={theta!r} but rope_parameters.rope_theta={t!r}. Fix: make them agree.")
        theta = t
    if not merged:
        return (float(theta) if theta is not None else None), None
    if merged.get("rope_type") is None:
        raise InputError(
            f"{where}: rope_scaling={merged!r} names no scaling type. "
            f'Fix: add "rope_type" (e.g. "linear", "dynamic", "yarn", "longrope", "llama3").'
        )
    if merged.get("rope_type") == "default":  # plain RoPE; other keys (e.g. partial_rotary_factor) are not scaling
        return (float(theta) if theta is not None else None), None
    return (float(theta) if theta is not None else None), merged


def _check_heads(cfg: dict[str, Any], where: str) -> list[str]:
    """Head-count consistency problems (messages) of a raw config dict."""
    problems: list[str] = []

    def pos_int(name: str) -> int | None:
        v = cfg.get(name)
        if v is None:
            problems.append(f"{name} is missing. Fix: add {name} to {where}.")
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            problems.append(f"{name}={v!r} must be a positive integer. Fix: correct {name} in {where}.")
            return None
        return v

    hidden = pos_int("hidden_size")
    heads = pos_int("num_attention_heads")
    kv = cfg.get("num_key_value_heads")
    if kv is None:
        kv = heads  # transformers' default: multi-head attention
    elif isinstance(kv, bool) or not isinstance(kv, int) or kv <= 0:
        problems.append(f"num_key_value_heads={kv!r} must be a positive integer. Fix: correct it in {where}.")
        kv = None
    for name in ("num_hidden_layers", "vocab_size", "intermediate_size"):
        pos_int(name)
    if heads and kv and heads % kv:
        problems.append(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv} (grouped-query attention "
            f"shares each KV head among heads/kv_heads query heads). Fix: correct one of them in {where}."
        )
    head_dim = cfg.get("head_dim")
    if head_dim is not None:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
            problems.append(f"head_dim={head_dim!r} must be a positive integer. Fix: correct or remove head_dim in {where}.")
    elif hidden and heads and hidden % heads:
        problems.append(
            f"hidden_size={hidden} is not num_attention_heads={heads} x head_dim (it is not divisible by {heads}) and "
            f"head_dim is not given. Fix: correct hidden_size/num_attention_heads, or state head_dim in {where}."
        )
    return problems


# --------------------------------------------------------------------------- path confinement
def confinement_roots(src: Path) -> list[Path]:
    """Folders a checkpoint's files may resolve into: the checkpoint folder itself and, for a Hugging Face hub
    cache snapshot (``.../models--<org>--<name>/snapshots/<rev>``, whose files are links to ``../../blobs/<sha>``),
    that repository's ``blobs`` folder."""
    src = Path(src).resolve()
    roots = [src]
    if src.parent.name == "snapshots" and src.parent.parent.name.startswith(("models--", "datasets--")):
        roots.append(src.parent.parent / "blobs")
    return roots


def _is_inside(p: Path, roots: list[Path]) -> bool:
    return any(p == r or r in p.parents for r in roots)


def confine(src: Path, rel: Any, what: str, *, allow_external: bool = False) -> Path:
    """The path of ``rel`` (a file name taken from a checkpoint file, e.g. a shard in the safetensors index)
    under the checkpoint folder ``src``, refused unless it resolves inside it.

    This is the one confinement rule for names read from user-supplied files: ``rel`` must be a non-empty string,
    relative, and its *resolved* path (links followed) must lie inside :func:`confinement_roots`; with
    ``allow_external`` (``model.allow_external_files``) a resolved path outside is accepted and reported by
    :func:`external_files` so that the cache key covers it. Raises InputError naming ``what``, the value and the fix.
    """
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise InputError(f"{what}={rel!r}: expected a non-empty file name (a string). Fix: restore the file from the original checkpoint.")
    p = Path(rel)
    if p.is_absolute() and not allow_external:
        raise InputError(
            f"{what}={rel!r}: an absolute path; checkpoint files must be named relative to model.path={str(src)!r}. "
            f"Fix: copy the file into the checkpoint folder and name it relatively."
        )
    full = Path(src) / p
    resolved = full.resolve()
    if not allow_external and not _is_inside(resolved, confinement_roots(src)):
        raise InputError(
            f"{what}={rel!r} resolves to {resolved}, outside model.path={str(src)!r}; files from outside the "
            f"checkpoint folder are refused (they could be any file on this machine, and would not be covered by "
            f"the cache key). Fix: copy the file into the checkpoint folder, or, if this is intended, set "
            f"model.allow_external_files=true."
        )
    return full


def check_folder_links(src: Path, *, allow_external: bool = False) -> list[Path]:
    """Refuse symbolic links in the checkpoint folder that resolve outside it (see :func:`confine`).

    Returns the resolved outside targets (empty unless ``allow_external``). Broken links are refused too.
    """
    roots = confinement_roots(src)
    outside: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            if not p.is_symlink():
                continue
            if not p.exists():
                raise InputError(f"{p}: broken symbolic link (to {os.readlink(p)!r}). Fix: restore the file it points to.")
            target = p.resolve()
            if not _is_inside(target, roots):
                if not allow_external:
                    raise InputError(
                        f"{p}: a symbolic link to {target}, outside model.path={str(src)!r}; files from outside "
                        f"the checkpoint folder are refused (a link can point at any file on this machine, e.g. "
                        f"a secret, which would then be exported and shipped). Fix: replace the link by a copy of "
                        f"the file, or, if this is intended, set model.allow_external_files=true."
                    )
                outside.append(target)
    return outside


def external_files(src: Path) -> list[Path]:
    """Files outside the checkpoint folder that export reads (only with ``model.allow_external_files``): the
    targets of out-of-folder shard names in the weight index. Their contents enter the cache key. Links inside the
    folder are already covered: the folder digest hashes what a link points to."""
    out: list[Path] = []
    roots = confinement_roots(src)
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        ip = Path(src) / index
        if not ip.is_file():
            continue
        try:
            wmap = json.loads(ip.read_text(encoding="utf-8")).get("weight_map") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for f in sorted({v for v in wmap.values() if isinstance(v, str)}):
            r = (Path(src) / f).resolve()
            if not _is_inside(r, roots) and r not in out:
                out.append(r)
    return out


# --------------------------------------------------------------------------- config.json field types
_INT, _NUM, _BOOL, _STR = "an integer", "a number", "true or false", "a string"
#: config.json / generation_config.json fields with their expected JSON type (checked where data enters, so a
#: wrong type is an exit 2 naming the file and the field, never a TypeError deep inside transformers).
CONFIG_FIELD_TYPES: dict[str, tuple[str, bool]] = {  # name -> (kind, nullable)
    "vocab_size": (_INT, False),
    "hidden_size": (_INT, False),
    "intermediate_size": (_INT, False),
    "num_hidden_layers": (_INT, False),
    "num_attention_heads": (_INT, False),
    "num_key_value_heads": (_INT, True),
    "head_dim": (_INT, True),
    "max_position_embeddings": (_INT, False),
    "sliding_window": (_INT, True),
    "original_max_position_embeddings": (_INT, True),
    "max_window_layers": (_INT, True),
    "rope_theta": (_NUM, True),
    "rms_norm_eps": (_NUM, False),
    "initializer_range": (_NUM, False),
    "attention_dropout": (_NUM, False),
    "partial_rotary_factor": (_NUM, True),
    "resid_pdrop": (_NUM, False),
    "embd_pdrop": (_NUM, False),
    "tie_word_embeddings": (_BOOL, False),
    "attention_bias": (_BOOL, False),
    "mlp_bias": (_BOOL, False),
    "use_cache": (_BOOL, False),
    "use_sliding_window": (_BOOL, False),
    "hidden_act": (_STR, False),
    "model_type": (_STR, False),
    "torch_dtype": (_STR, True),
    "dtype": (_STR, True),
}
_ID_FIELDS = ("eos_token_id", "bos_token_id", "pad_token_id")
_ROPE_NUMBERS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "rope_theta",
    "partial_rotary_factor",
)
_ROPE_INTS = ("original_max_position_embeddings",)
_ROPE_LISTS = ("short_factor", "long_factor")


def _type_ok(v: Any, kind: str) -> bool:
    import math

    if kind == _BOOL:
        return isinstance(v, bool)
    if kind == _STR:
        return isinstance(v, str)
    if isinstance(v, bool):
        return False
    if kind == _INT:
        return isinstance(v, int)
    return isinstance(v, (int, float)) and math.isfinite(v)


def check_config_types(cfg: dict[str, Any], where: str) -> None:
    """Every known field of a ``config.json``/``generation_config.json`` dict has the right JSON type.

    Covers :data:`CONFIG_FIELD_TYPES`, the special-token id fields (an integer >= 0, a list of them, or null),
    ``architectures`` (a list of strings) and the numeric fields of ``rope_scaling``/``rope_parameters``.
    Raises InputError naming ``where``, the field (dotted for nested ones), its value and the fix; all problems
    are reported together.
    """
    problems: list[str] = []

    def bad(name: str, v: Any, kind: str) -> None:
        problems.append(f'{name}={v!r} ({type(v).__name__}) must be {kind}. Fix: correct "{name.split(".")[0]}" in {Path(where).name}.')

    for name, (kind, nullable) in CONFIG_FIELD_TYPES.items():
        if name not in cfg or (cfg[name] is None and nullable):
            continue
        if not _type_ok(cfg[name], kind):
            bad(name, cfg[name], kind + (" or null" if nullable else ""))
    for name in _ID_FIELDS:
        v = cfg.get(name)
        items = v if isinstance(v, list) else [v]
        if v is not None and (not items or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in items)):
            bad(name, v, "a token id (an integer >= 0), a list of them, or null")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        bad("architectures", archs, "a list of strings")
    for key in ("rope_scaling", "rope_parameters"):
        d = cfg.get(key)
        if not isinstance(d, dict):
            continue  # null, or not an object: normalise_rope names it
        for k, v in d.items():
            if k in _ROPE_NUMBERS and v is not None and not _type_ok(v, _NUM):
                bad(f"{key}.{k}", v, _NUM)
            elif k in _ROPE_INTS and v is not None and not _type_ok(v, _INT):
                bad(f"{key}.{k}", v, _INT)
            elif k in _ROPE_LISTS and v is not None and not (isinstance(v, list) and all(_type_ok(x, _NUM) for x in v)):
                bad(f"{key}.{k}", v, "a list of numbers")
            elif k in ("type", "rope_type") and v is not None and not isinstance(v, str):
                bad(f"{key}.{k}", v, _STR)
    problems += _config_value_problems(cfg, where)
    if problems:
        raise InputError(f"{where}: {len(problems)} field(s) with the wrong type or value:\n" + "\n".join(f"  - {p}" for p in problems))


#: ``torch_dtype`` / ``dtype`` names a checkpoint may state (torch's floating dtypes, ``torch.`` prefix allowed).
CHECKPOINT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _config_value_problems(cfg: dict[str, Any], where: str) -> list[str]:
    """``torch_dtype`` / ``dtype`` of ``config.json`` must be one of :data:`CHECKPOINT_DTYPES` (no loader reads
    another); one line per problem, naming the field, the value and the fix.  (``hidden_act`` needs transformers'
    table: :func:`check_activation`.)"""
    problems: list[str] = []
    for key in ("torch_dtype", "dtype"):
        v = cfg.get(key)
        if isinstance(v, str) and v.removeprefix("torch.") not in CHECKPOINT_DTYPES:
            problems.append(f'{key}={v!r} is not a dtype (one of {list(CHECKPOINT_DTYPES)}). Fix: correct "{key}" in {Path(where).name}.')
    return problems


def check_activation(cfg: dict[str, Any], where: str) -> None:
    """``hidden_act`` must be a key of transformers' ``ACT2FN`` (transformers/activations.py), else InputError
    naming the file, the field, the value and the valid names (before transformers' own bare ``KeyError``)."""
    act = cfg.get("hidden_act")
    if not isinstance(act, str):
        return
    from transformers.activations import ACT2FN

    if act not in ACT2FN:
        raise InputError(
            f"{where}: hidden_act={act!r} is not an activation transformers knows (one of {sorted(ACT2FN)}). Fix: "
            f'correct "hidden_act" in {Path(where).name} (LLaMA-family checkpoints use "silu").'
        )


# --------------------------------------------------------------------------- weights (headers only)
def _read_headers(facts: Any, src: Path, files: list[str]) -> None:
    """Record ``files`` as the weight files and every tensor's header (dtype, shape) and file in ``facts``."""
    facts.weight_files = files
    for f in files:
        tensors, _ = _safetensors_header(src / f)
        for name, meta in tensors.items():
            facts.tensors[name] = meta
            facts.tensor_file[name] = f


def _safetensors_header(path: Path) -> tuple[dict[str, tuple[list[int], str]], dict[str, str]]:
    """Tensor name -> (shape, dtype) and the metadata of one safetensors file, via ``safe_open``.

    ``safe_open`` validates the header and that the data section covers the file exactly, so
    truncated or padded files fail here.  Raises InputError naming the file.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            tensors = {}
            for name in f.keys():
                sl = f.get_slice(name)
                tensors[name] = (list(sl.get_shape()), str(sl.get_dtype()))
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        size = path.stat().st_size if path.exists() else None
        raise InputError(
            f"{path}: unreadable safetensors file ({e}; {size} bytes on disk). It is truncated or corrupt "
            f"(an interrupted download or copy). Fix: download or copy {path.name} again and compare its "
            f"sha256 with the source."
        ) from None
    return tensors, meta


def inspect_checkpoint(
    path: str | Path, *, trust_remote_code: bool = False, allow_pickle: bool = False, allow_external_files: bool = False
) -> CheckpointFacts:
    """Every check that needs only ``config.json`` and the weight-file headers (no torch, no transformers).

    Args:
        path: local checkpoint folder.
        trust_remote_code: allow a config with ``auto_map`` (custom modelling code).
        allow_pickle: allow pickled ``*.bin``/``*.pt``/``*.pth`` weights when no safetensors exist.
        allow_external_files: accept links and index shard names that resolve outside the folder (:func:`confine`).
    Returns:
        :class:`CheckpointFacts`.  For pickled weights, tensor shapes are checked later, after loading.
    Raises:
        InputError naming the file/field, the value and the fix.
    """
    src = Path(path)
    if not src.is_dir():
        raise InputError(
            f"model.path={str(path)!r}: not a folder. Fix: point model.path at a local Hugging Face checkpoint "
            f"folder (config.json, *.safetensors, tokenizer files)."
        )
    check_folder_links(src, allow_external=allow_external_files)
    cfg_path = src / "config.json"
    cfg = _read_config(cfg_path, trust_remote_code)
    arch, model_type = _architecture(cfg, cfg_path)
    problems = _check_heads(cfg, "config.json")
    if problems:
        raise InputError(f"{cfg_path}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))
    theta, scaling = normalise_rope(cfg, str(cfg_path))
    facts = CheckpointFacts(
        path=src,
        config=cfg,
        architecture=arch,
        model_type=model_type,
        weight_format="safetensors",
        weight_files=[],
        tied=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=theta,
        rope_scaling=scaling,
        head_dim_explicit=cfg.get("head_dim") is not None,
    )
    _find_weights(facts, allow_pickle=allow_pickle, allow_external_files=allow_external_files)
    if facts.weight_format == "safetensors":
        check_tensor_shapes(facts)
    return facts


def _supported() -> str:
    return ", ".join(f"{a} ({t})" for a, t in SUPPORTED_ARCHITECTURES.items())


def _read_config(cfg_path: Path, trust_remote_code: bool) -> dict[str, Any]:
    """config.json as a dict with checked field types; InputError for ``auto_map`` without trust_remote_code."""
    cfg = _read_json(cfg_path, "config.json")
    if not isinstance(cfg, dict):
        raise InputError(f"{cfg_path}: expected a JSON object, found {type(cfg).__name__}. Fix: restore config.json.")
    check_config_types(cfg, str(cfg_path))
    if cfg.get("auto_map") and not trust_remote_code:
        raise InputError(
            f"{cfg_path}: auto_map={cfg['auto_map']!r} asks to run Python code shipped with the checkpoint, and "
            f"model.trust_remote_code is false (the secure default: that code would run with your permissions). "
            f"Fix: use a checkpoint of a supported architecture in standard transformers format ({_supported()}), "
            f"or, only if you trust its source, set model.trust_remote_code=true."
        )
    return cfg


def _architecture(cfg: dict[str, Any], cfg_path: Path) -> tuple[str, str]:
    """``(architecture, model_type)`` from ``architectures[0]`` (else ``model_type``); InputError when unsupported or
    when the two disagree."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch is None:
        by_type = {t: a for a, t in SUPPORTED_ARCHITECTURES.items()}
        model_type = cfg.get("model_type")
        arch = by_type.get(model_type) if isinstance(model_type, str) else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise InputError(
            f"{cfg_path}: architectures={archs!r} (model_type={cfg.get('model_type')!r}) is not supported. "
            f"Supported architectures: {_supported()}. Fix: export a checkpoint of a supported architecture."
        )
    model_type = SUPPORTED_ARCHITECTURES[arch]
    if cfg.get("model_type") not in (None, model_type):
        raise InputError(
            f"{cfg_path}: architectures[0]={arch!r} but model_type={cfg.get('model_type')!r} (expected "
            f"{model_type!r}). Fix: correct model_type in config.json."
        )
    return arch, model_type


def _index_shards(index_path: Path, what: str, src: Path, allow_external_files: bool, missing_fix: str) -> tuple[dict[str, str], list[str]]:
    """``(weight_map, shard files)`` of a weight index; every shard confined to ``src`` and present."""
    index = _read_json(index_path, what)
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise InputError(f"{index_path}: no weight_map. Fix: restore {index_path.name} from the source checkpoint.")
    if not isinstance(index.get("metadata"), dict):  # transformers' sharded loader reads index["metadata"]
        raise InputError(
            f"{index_path}: metadata={index.get('metadata')!r} must be a JSON object (transformers reads it to load the "
            f'shards). Fix: restore {index_path.name} from the source checkpoint, or add "metadata": {{"total_size": '
            f"<bytes of all shards>}}."
        )
    for tname, f in wmap.items():
        confine(src, f, f"{index_path}: weight_map[{tname!r}]", allow_external=allow_external_files)
    files = sorted(set(wmap.values()))
    missing = [f for f in files if not (src / f).is_file()]
    if missing:
        raise InputError(f"{index_path}: lists shard(s) {missing} that are not in {src}. Fix: {missing_fix}.")
    return wmap, files


def _find_weights(facts: CheckpointFacts, *, allow_pickle: bool, allow_external_files: bool) -> None:
    """Fill ``facts``' weight files and (safetensors) tensor headers: an index + shards, ``model.safetensors``,
    other ``*.safetensors``, else pickled weights (:func:`_pickle_weights`)."""
    src = facts.path
    index_path = src / "model.safetensors.index.json"
    single = src / "model.safetensors"
    if index_path.exists():
        wmap, files = _index_shards(index_path, "safetensors index", src, allow_external_files, "download the missing shards")
        _read_headers(facts, src, files)
        absent = [n for n, f in wmap.items() if facts.tensor_file.get(n) != f]
        if absent:
            raise InputError(
                f"{index_path}: {len(absent)} tensor(s) are not in the shard the index names, e.g. {absent[:3]}. "
                f"Fix: restore the index and shards from one consistent source."
            )
    elif single.exists():
        facts.weight_files = ["model.safetensors"]
        tensors, _ = _safetensors_header(single)
        facts.tensors = tensors
        facts.tensor_file = {n: "model.safetensors" for n in tensors}
    else:
        others = sorted(p.name for p in src.glob("*.safetensors"))
        if others:
            _read_headers(facts, src, others)
        else:
            facts.weight_format = "pickle"
            facts.weight_files = _pickle_weights(src, allow_pickle, allow_external_files)


def _pickle_weights(src: Path, allow_pickle: bool, allow_external_files: bool) -> list[str]:
    """Pickled weight files in load order; InputError when there are none, or unless ``allow_pickle``."""
    pickles = sorted(
        p.name
        for p in src.iterdir()
        if p.is_file() and p.suffix in PICKLE_SUFFIXES and not p.name.startswith(("training_args", "optimizer", "scheduler", "rng_state"))
    )
    if not pickles:
        raise InputError(
            f"{src}: no weights found (model.safetensors, model-*.safetensors + index, or pickled "
            f"pytorch_model*.bin). Fix: point model.path at a complete checkpoint folder."
        )
    if not allow_pickle:
        raise InputError(
            f"{src}: the weights are pickled ({', '.join(pickles)}); loading a pickle can run arbitrary "
            f"code, so it is refused by default. Fix: convert the checkpoint to safetensors "
            f"(model.save_pretrained(dir, safe_serialization=True)), or, only for a file you trust, set "
            f"model.allow_pickle=true (it is then loaded with torch.load(weights_only=True))."
        )
    bin_index = src / "pytorch_model.bin.index.json"
    if bin_index.exists():
        _, pickles = _index_shards(bin_index, "pickle weight index", src, allow_external_files, "download them")
    return pickles


def _is_integer_dtype(dt: str) -> bool:
    """safetensors (``I8``, ``U8``, ``BOOL`` ...) or torch (``torch.int8`` ...) integer / boolean dtype names."""
    d = str(dt)
    return d in ("I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL") or d.startswith(("torch.int", "torch.uint", "torch.bool"))


#: embedding rows beyond the tokenizer that are still padding: checkpoints pad the vocabulary to a multiple of 64..256
#: or reserve tokens (Qwen2.5: 152064 rows for 151665 tokens; Phi-3: 32064 for 32011); far more means the wrong tokenizer.
MAX_UNUSED_EMBEDDING_ROWS = 4096


def check_tensor_shapes(facts: CheckpointFacts) -> None:
    """vocab_size vs embedding rows vs lm_head rows, hidden size of both, and the tie rule.

    Raises InputError; sets ``facts.tied`` (unchanged) and appends warnings.
    """
    cfg, src = facts.config, facts.path
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    ints = sorted(n for n, (_, dt) in facts.tensors.items() if n.endswith((".weight", ".bias")) and _is_integer_dtype(dt))
    if ints:
        n0 = ints[0]
        raise InputError(
            f"{src / facts.tensor_file.get(n0, '')}: {len(ints)} weight tensor(s) are stored as integers, e.g. {n0} "
            f"({facts.tensors[n0][1]}); loading would cast the integers to floats and the model would produce garbage. "
            f"Fix: use the checkpoint's floating-point weights (an already-quantized checkpoint is not an export input: "
            f"export its unquantized original and let the quantize stage quantize it)."
        )
    emb = facts.tensors.get(EMBED_NAME)
    if emb is None:
        raise InputError(
            f"{src}: the weights have no {EMBED_NAME} (found e.g. {sorted(facts.tensors)[:4]}). "
            f"Fix: export a standard transformers {facts.architecture} checkpoint."
        )
    where_emb = facts.tensor_file.get(EMBED_NAME, "the weights")
    if len(emb[0]) != 2 or emb[0][1] != hidden:
        raise InputError(
            f"{src / where_emb}: {EMBED_NAME} has shape {emb[0]}, expected [vocab_size, hidden_size={hidden}]. "
            f"Fix: correct hidden_size in config.json or use matching weights."
        )
    if emb[0][0] != vocab:
        raise InputError(
            f"{src / 'config.json'}: vocab_size={vocab} but {EMBED_NAME} in {where_emb} has {emb[0][0]} rows. "
            f"Fix: set vocab_size={emb[0][0]} in config.json (or use the weights that match the config)."
        )
    head = facts.tensors.get(LM_HEAD_NAME)
    if head is not None:
        where_head = facts.tensor_file.get(LM_HEAD_NAME, "the weights")
        if head[0] != [vocab, hidden]:
            raise InputError(
                f"{src / where_head}: {LM_HEAD_NAME} has shape {head[0]} but vocab_size={vocab}, hidden_size={hidden} "
                f"(expected [{vocab}, {hidden}]). Fix: correct vocab_size in config.json or use matching weights."
            )
    elif not facts.tied:
        raise InputError(
            f"{src / 'config.json'}: tie_word_embeddings={cfg.get('tie_word_embeddings', False)!r} (untied) but the "
            f"weights have no {LM_HEAD_NAME}; the output projection would be random. The export never ties "
            f"silently. Fix: if the model really shares the embedding as its output head, set "
            f'"tie_word_embeddings": true in config.json; otherwise supply the checkpoint\'s {LM_HEAD_NAME}.'
        )


# --------------------------------------------------------------------------- tokenizer
def _load_tokenizer(src: Path, vocab_rows: int, trust_remote_code: bool) -> Any:
    """Load the tokenizer after checking its files; ``len(tokenizer)`` must not exceed the embedding rows."""
    has_model = (src / "tokenizer.json").is_file() or (src / "tokenizer.model").is_file()
    if not has_model or not (src / "tokenizer_config.json").is_file():
        present = [f for f in TOKENIZER_FILES if (src / f).exists()]
        raise InputError(
            f"{src}: tokenizer files missing (found {present or 'none'}; need tokenizer.json or tokenizer.model, "
            f"and tokenizer_config.json). Fix: copy the tokenizer files of the model (tokenizer.json, "
            f"tokenizer_config.json, special_tokens_map.json, chat_template.jinja) into the checkpoint folder."
        )
    for name in (f for f in TOKENIZER_FILES if f.endswith(".json")):
        if (src / name).exists():
            doc = _read_json(src / name, name)
            if name == "tokenizer_config.json" and isinstance(doc, dict) and doc.get("auto_map") and not trust_remote_code:
                raise InputError(
                    f"{src / name}: auto_map={doc['auto_map']!r} asks to run tokenizer code shipped with the "
                    f"checkpoint and model.trust_remote_code is false. Fix: use a standard tokenizer "
                    f"(tokenizer.json), or, only if you trust its source, set model.trust_remote_code=true."
                )
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise InputError(
            f"{src}: the tokenizer files (tokenizer.json/tokenizer.model, tokenizer_config.json) could not be "
            f"loaded: {type(e).__name__}: {e}. Fix: restore them from the original model."
        ) from None
    n = len(tok)
    if n > vocab_rows:
        raise InputError(
            f"{src}: the tokenizer has {n} tokens (tokenizer.json incl. added tokens) but the embedding "
            f"({EMBED_NAME}, vocab_size) has only {vocab_rows} rows; ids >= {vocab_rows} would index past the "
            f"embedding. Fix: use the tokenizer the model was trained with, or resize the embeddings "
            f"(model.resize_token_embeddings(len(tokenizer))) and re-save the checkpoint."
        )
    if vocab_rows > 2 * n and vocab_rows - n > MAX_UNUSED_EMBEDDING_ROWS:
        raise InputError(
            f"{src}: the embedding ({EMBED_NAME}, vocab_size) has {vocab_rows} rows but the tokenizer only {n} tokens: "
            f"{vocab_rows - n} rows no token can reach (padding is at most a few thousand), so this is not the tokenizer "
            f"the model was trained with. Fix: copy the model's own tokenizer files into the checkpoint folder."
        )
    return tok


# --------------------------------------------------------------------------- export
@contextlib.contextmanager
def _no_progress(description: str, total: float | None) -> Iterator[Callable[[float], None]]:
    def advance(n: float = 1) -> None:
        return None

    yield advance


def export_checkpoint(
    src: str | Path,
    out: str | Path,
    *,
    dtype: str = "float16",
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    progress: ProgressFactory | None = None,
    facts: CheckpointFacts | None = None,
) -> dict[str, Any]:
    """Validate the checkpoint at ``src`` and write ``out/hf/`` and ``out/model_info.json``.

    Args:
        src: local Hugging Face checkpoint folder.
        out: output folder (created; ``hf/`` must not exist yet).
        dtype: weight dtype of the normalised checkpoint: ``float16`` | ``bfloat16`` | ``float32``.
        trust_remote_code: allow ``auto_map`` custom code (off by default).
        allow_pickle: allow pickled weights, loaded with ``torch.load(weights_only=True)``.
        progress: ``progress(description, total)`` context manager yielding ``advance(n)``
            (``StageContext.progress``); the six export steps are reported.
        facts: a result of :func:`inspect_checkpoint` for ``src`` (re-inspected when None).
    Returns:
        The ``model_info`` dict (also written to ``out/model_info.json``), plus a ``warnings`` list
        under the key ``_warnings`` (not written).
    Raises:
        InputError for any bad input (see module docstring); nothing is written to ``out/hf``
        before every check that needs no weights has passed.
    """
    if dtype not in DTYPES:
        raise InputError(f"model.dtype={dtype!r} is not a known export dtype. Fix: set model.dtype to one of {list(DTYPES)}.")
    src, out = Path(src), Path(out)
    progress = progress or _no_progress
    with progress("export", 6) as advance:
        # 1. config.json + weight headers (cheap, no torch)
        if facts is None:
            facts = inspect_checkpoint(src, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
        vocab = int(facts.config["vocab_size"])
        advance(1)

        # 2. tokenizer, special-token ids
        tok = _load_tokenizer(src, vocab, trust_remote_code)
        ids = _special_ids(src, facts, tok, vocab)
        advance(1)

        # 3. transformers config (defaults filled in), cross-checked against the raw file
        import torch

        hf_cfg, rope_theta = _hf_config(src, facts, ids, trust_remote_code)
        advance(1)

        # 4. weights: finite and representable in the target dtype (checked before anything is written), then
        # loaded once, after every header-level check passed
        if facts.weight_format == "safetensors":
            check_weights_castable(facts, dtype)
        with _quiet_transformers_bars():
            model = _load_model(facts, hf_cfg, getattr(torch, dtype), trust_remote_code)
        advance(1)

        # 5. write hf/
        hf_dir = ExportArtifact(out).hf_dir
        _write_hf(src, hf_dir, model, tok, hf_cfg, ids, dtype, rope_theta, facts.rope_scaling)
        advance(1)

        # 6. verify what was written (headers + config round trip), then model_info.json
        _verify_written(hf_dir, model, dtype, facts.rope_scaling, hf_cfg)
        info = _model_info(src, facts, model, hf_cfg, tok, ids, dtype, rope_theta)
        from ..core.store import write_json_atomic

        write_json_atomic(ExportArtifact(out).model_info_path, info)
        advance(1)
    del model
    return {**info, "_warnings": list(facts.warnings)}


class _SpecialIds(NamedTuple):
    """Special-token ids merged from config.json, generation_config.json and the tokenizer (in that order)."""

    eos_ids: list[int]
    bos_id: int | None
    pad_id: int
    pad_derived: bool  # no pad id anywhere: the first eos id is used
    gen_raw: dict[str, Any]  # generation_config.json ({} when absent)


def _special_ids(src: Path, facts: CheckpointFacts, tok: Any, vocab: int) -> _SpecialIds:
    """Merge and check the special-token ids (export step 2).

    Raises:
        InputError: generation_config.json is not an object or has wrongly typed fields; no eos id anywhere; an id
            outside ``[0, vocab_size)``.
    """
    cfg_raw = facts.config
    gen_path = src / "generation_config.json"
    gen_raw = _read_json(gen_path, "generation_config.json") if gen_path.exists() else {}
    if not isinstance(gen_raw, dict):
        raise InputError(f"{gen_path}: expected a JSON object. Fix: restore generation_config.json or delete it.")
    check_config_types(gen_raw, str(gen_path))
    eos_ids = _merge_ids(_ids(cfg_raw.get("eos_token_id")), _ids(gen_raw.get("eos_token_id")), _ids(tok.eos_token_id))
    if not eos_ids:
        raise InputError(
            f"{src / 'config.json'}: no eos_token_id in config.json, generation_config.json or the tokenizer; "
            f'generation could never stop. Fix: set "eos_token_id" in config.json (an int or a list of stop ids).'
        )
    bos_id = next(iter(_ids(cfg_raw.get("bos_token_id")) + _ids(gen_raw.get("bos_token_id")) + _ids(tok.bos_token_id)), None)
    pad_candidates = _ids(cfg_raw.get("pad_token_id")) + _ids(gen_raw.get("pad_token_id")) + _ids(tok.pad_token_id)
    pad_derived = not pad_candidates
    pad_id = eos_ids[0] if pad_derived else pad_candidates[0]
    for name, id_list in (("eos_token_id", eos_ids), ("bos_token_id", _ids(bos_id)), ("pad_token_id", [pad_id])):
        bad = [i for i in id_list if not 0 <= i < vocab]
        if bad:
            raise InputError(
                f"{src}: {name}={bad} is outside the vocabulary [0, vocab_size={vocab}). "
                f"Fix: correct {name} in config.json/generation_config.json/tokenizer_config.json."
            )
    if pad_derived:
        facts.warnings.append(f"no pad token id in the checkpoint: using the first eos id {pad_id} (pad_token_derived=true)")
    return _SpecialIds(eos_ids, bos_id, pad_id, pad_derived, gen_raw)


def _hf_config(src: Path, facts: CheckpointFacts, ids: _SpecialIds, trust_remote_code: bool) -> tuple[Any, float | None]:
    """The transformers config with the merged special ids, and the RoPE base (export step 3).

    When config.json does not say ``tie_word_embeddings`` and the architecture's default differs from what the
    weight headers suggested, ``facts.tied`` follows the default and the head's shapes are checked again.

    Raises:
        InputError: transformers cannot parse config.json.
    """
    from transformers import AutoConfig

    check_activation(facts.config, str(src / "config.json"))
    try:
        hf_cfg = AutoConfig.from_pretrained(str(src), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise InputError(
            f"{src / 'config.json'}: transformers cannot parse it: {type(e).__name__}: {e}. Fix: correct the field named above."
        ) from None
    rope_params = getattr(hf_cfg, "rope_parameters", None)
    rope_theta = facts.rope_theta
    if rope_theta is None:
        rope_theta = (rope_params or {}).get("rope_theta") if isinstance(rope_params, dict) else None
        rope_theta = rope_theta if rope_theta is not None else getattr(hf_cfg, "rope_theta", None)
    hf_cfg.pad_token_id = ids.pad_id
    hf_cfg.eos_token_id = ids.eos_ids if len(ids.eos_ids) > 1 else ids.eos_ids[0]
    if ids.bos_id is not None:
        hf_cfg.bos_token_id = ids.bos_id
    if "tie_word_embeddings" not in facts.config and bool(getattr(hf_cfg, "tie_word_embeddings", False)) != facts.tied:
        facts.tied = bool(hf_cfg.tie_word_embeddings)  # the architecture's default applies; re-check the head
        if facts.weight_format == "safetensors":
            check_tensor_shapes(facts)
    return hf_cfg, rope_theta


def _write_hf(
    src: Path,
    hf_dir: Path,
    model: Any,
    tok: Any,
    hf_cfg: Any,
    ids: _SpecialIds,
    dtype: str,
    rope_theta: float | None,
    rope_scaling: dict[str, Any] | None,
) -> None:
    """Write ``hf/`` (export step 5): safetensors weights, config and generation config with the merged ids, the
    tokenizer files; a ``special_tokens_map.json`` from the tokenizer when the source has none."""
    from transformers import GenerationConfig

    hf_dir.mkdir(parents=True, exist_ok=False)
    gen = (
        GenerationConfig.from_dict({k: v for k, v in ids.gen_raw.items() if k != "transformers_version"})
        if ids.gen_raw
        else GenerationConfig.from_model_config(hf_cfg)
    )
    gen.eos_token_id = ids.eos_ids if len(ids.eos_ids) > 1 else ids.eos_ids[0]
    gen.pad_token_id = ids.pad_id
    if ids.bos_id is not None:
        gen.bos_token_id = ids.bos_id
    model.generation_config = gen
    with _quiet_transformers_bars():
        model.save_pretrained(str(hf_dir), safe_serialization=True, max_shard_size=EXPORT_SHARD_SIZE)
    _finish_config(hf_dir / "config.json", dtype, rope_theta, rope_scaling)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, hf_dir / name)
    for name in TOKENIZER_DIRS:
        if (src / name).is_dir():
            shutil.copytree(src / name, hf_dir / name)
    if not (hf_dir / "special_tokens_map.json").exists():
        stm = {k: v for k, v in dict(tok.special_tokens_map).items() if isinstance(v, (str, list))}
        if "pad_token" not in stm:
            stm["pad_token"] = tok.convert_ids_to_tokens(ids.pad_id)
        (hf_dir / "special_tokens_map.json").write_text(json.dumps(stm, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _model_info(
    src: Path, facts: CheckpointFacts, model: Any, hf_cfg: Any, tok: Any, ids: _SpecialIds, dtype: str, rope_theta: float | None
) -> dict[str, Any]:
    """The ``model_info.json`` document (docs/artifacts.md), with the sha256 of every source file."""
    from ..core.store import tree_files

    files = {rel: meta["sha256"] for rel, meta in tree_files(src, follow_symlinks=True).items()}
    head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    return {
        "architecture": facts.architecture,
        "model_type": facts.model_type,
        "num_parameters": int(model.num_parameters()),
        "num_hidden_layers": int(hf_cfg.num_hidden_layers),
        "hidden_size": int(hf_cfg.hidden_size),
        "intermediate_size": int(hf_cfg.intermediate_size),
        "num_attention_heads": int(hf_cfg.num_attention_heads),
        "num_key_value_heads": int(getattr(hf_cfg, "num_key_value_heads", None) or hf_cfg.num_attention_heads),
        "head_dim": int(head_dim),
        "vocab_size": int(facts.config["vocab_size"]),
        "tokenizer_vocab_size": len(tok),
        "max_position_embeddings": int(hf_cfg.max_position_embeddings),
        "rope_theta": float(rope_theta) if rope_theta is not None else None,
        "rope_scaling": facts.rope_scaling,
        "tie_word_embeddings": "tied" if facts.tied else "untied",
        "bos_token_id": ids.bos_id,
        "eos_token_ids": ids.eos_ids,
        "pad_token_id": ids.pad_id,
        "pad_token_derived": ids.pad_derived,
        "dtype": dtype,
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "weight_format": facts.weight_format,
        "files": files,
    }


def cast_losses(tensors: Iterator[tuple[str, Any]], dtype: str) -> list[tuple[str, int, int, int, int, float]]:
    """Per floating-point tensor: values that are NaN/inf already, that overflow to inf in ``dtype``, and non-zero
    values that flush to zero in ``dtype`` (the cast torch performs when export loads the weights in ``dtype``).

    A flushed value counts as *significant* when its magnitude exceeds ``finfo(dtype).eps * max|x|`` of its tensor:
    below that, losing it changes the tensor less than rounding its largest entries already does (a bf16 LLM has
    thousands of |x| < 6e-8 values that fp16 flushes harmlessly); above it, the tensor's scale itself does not fit.

    Args:
        tensors: ``(name, torch.Tensor)`` pairs in the checkpoint's own dtype.
        dtype: target ``float16`` | ``bfloat16`` | ``float32``.
    Returns:
        ``[(name, nonfinite, overflow, flush_significant, flush_negligible, max_abs), ...]`` for tensors with any loss.
    """
    import torch

    target = getattr(torch, dtype)
    eps = torch.finfo(target).eps
    out = []
    for name, t in tensors:
        if not t.is_floating_point():
            continue
        finite = torch.isfinite(t)
        nonfinite = int((~finite).sum())
        max_abs = float(t[finite].abs().max()) if bool(finite.any()) else float("nan")
        overflow = flush_sig = flush_neg = 0
        if t.dtype != target:
            y = t.to(target)
            overflow = int((torch.isinf(y) & finite).sum())
            flushed = (y == 0) & (t != 0)
            if bool(flushed.any()):
                sig = flushed & (t.abs().float() > eps * max_abs)
                flush_sig = int(sig.sum())
                flush_neg = int(flushed.sum()) - flush_sig
            del y
        if nonfinite or overflow or flush_sig or flush_neg:
            out.append((name, nonfinite, overflow, flush_sig, flush_neg, max_abs))
    return out


def check_weights_castable(facts: CheckpointFacts, dtype: str, state_dict: dict[str, Any] | None = None) -> None:
    """Refuse, before anything is written, weights that are not finite or that ``dtype`` cannot hold.

    Reads every tensor once (memory-mapped safetensors, one tensor at a time; or the loaded pickle state dict).
    Raises InputError naming the tensors, the counts (NaN/inf, overflow to inf, significant flush to zero, see
    :func:`cast_losses`), the largest magnitude and the fix (a dtype that holds the values: the checkpoint's own
    ``torch_dtype`` or float32). Negligible flushes are recorded as a warning with their count.
    """

    def _iter() -> Iterator[tuple[str, Any]]:
        if state_dict is not None:
            yield from state_dict.items()
            return
        from safetensors import safe_open

        for f in facts.weight_files:
            with safe_open(str(facts.path / f), framework="pt") as sf:
                for name in sf.keys():
                    yield name, sf.get_tensor(name)

    losses = cast_losses(_iter(), dtype)
    nonfinite = [x for x in losses if x[1]]
    if nonfinite:
        shown = "; ".join(f"{n}: {c} NaN/inf value(s)" for n, c, *_ in nonfinite[:5])
        raise InputError(
            f"{facts.path}: {len(nonfinite)} tensor(s) hold NaN or infinite values ({shown}); an engine built from "
            f"them produces garbage. Fix: use a checkpoint whose weights are finite (re-download it, or check "
            f"the training run that wrote it)."
        )
    lossy = [x for x in losses if x[2] or x[3]]
    if lossy:
        src_dtypes = sorted({facts.tensors.get(n, ([], "?"))[1] for n, *_ in lossy})
        shown = "; ".join(f"{n}: {o} value(s) overflow to inf, {fl} flush to zero (max |x| = {m:.4g})" for n, _, o, fl, _n, m in lossy[:5])
        raise InputError(
            f"model.dtype={dtype!r}: casting the checkpoint ({'/'.join(src_dtypes)}) to {dtype} loses values in "
            f"{len(lossy)} tensor(s): {shown}. Fix: export in a dtype that holds them: model.dtype="
            f"{'bfloat16' if dtype == 'float16' else 'float32'} (or leave model.dtype unset: it follows the "
            f"checkpoint's torch_dtype), or float32."
        )
    neg = sum(x[4] for x in losses)
    if neg:
        facts.warnings.append(
            f"{neg} value(s) below {dtype}'s smallest subnormal flush to zero in {len(losses)} tensor(s), "
            f"each smaller than eps x max|x| of its tensor (negligible)"
        )


@contextlib.contextmanager
def _quiet_transformers_bars() -> Iterator[None]:
    """transformers' own tqdm bars off while we load/save (the stage shows one export bar instead)."""
    from transformers.utils import logging as tlog

    was = tlog.is_progress_bar_enabled()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            tlog.enable_progress_bar()


def _load_model(facts: CheckpointFacts, hf_cfg: Any, torch_dtype: Any, trust_remote_code: bool) -> Any:
    """Load the weights once into an ``AutoModelForCausalLM``; refuse missing tensors."""
    from transformers import AutoModelForCausalLM

    src = facts.path
    if facts.weight_format == "pickle":
        sd = _read_pickled_weights(facts)
        check_tensor_shapes(facts)
        _check_tied_head(facts, sd)
        check_weights_castable(facts, str(torch_dtype).replace("torch.", ""), sd)
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch_dtype, trust_remote_code=trust_remote_code)
        try:
            res = model.load_state_dict(sd, strict=False)
        except RuntimeError as e:
            raise InputError(
                f"{src}: the pickled weights do not fit a {facts.architecture} with this config.json: {str(e)[:500]}. "
                f"Fix: use the config.json that belongs to these weights."
            ) from None
        missing, unexpected = list(res.missing_keys), list(res.unexpected_keys)
        if facts.tied:
            model.tie_weights()
        del sd
    else:
        _check_tied_head(facts, None)
        try:
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                str(src),
                config=hf_cfg,
                dtype=torch_dtype,
                trust_remote_code=trust_remote_code,
                use_safetensors=True,
                output_loading_info=True,
            )
        except Exception as e:
            raise InputError(
                f"{src}: loading the weights failed: {type(e).__name__}: {str(e)[:500]}. Fix: use the config.json "
                f"that belongs to these weights."
            ) from None
        model, info = loaded
        missing, unexpected = list(info.get("missing_keys", [])), list(info.get("unexpected_keys", []))
        mismatched = list(info.get("mismatched_keys", []))
        if mismatched:
            raise InputError(
                f"{src}: tensors with shapes that do not match config.json: {mismatched[:5]}. "
                f"Fix: use the config.json that belongs to these weights."
            )
    if facts.tied:
        missing = [k for k in missing if k != LM_HEAD_NAME]
    if missing:
        raise InputError(
            f"{src}: {len(missing)} tensor(s) the {facts.architecture} needs are not in the checkpoint, e.g. "
            f"{sorted(missing)[:5]}; transformers would initialise them randomly. Fix: use a complete checkpoint "
            f"(all shards) whose config.json matches the weights."
        )
    unexpected = [k for k in unexpected if not k.endswith(_IGNORABLE_UNEXPECTED)]
    if unexpected:
        facts.warnings.append(
            f"{len(unexpected)} tensor(s) in the checkpoint are not used by {facts.architecture}: {sorted(unexpected)[:5]}"
        )
    model.eval()
    return model


def _read_pickled_weights(facts: CheckpointFacts) -> dict[str, Any]:
    """Every tensor of the pickled weight files (``torch.load(weights_only=True)``, memory-mapped when the file
    allows), recording shapes and files in ``facts``; InputError for a file that is not a plain state dict."""
    import torch

    sd: dict[str, Any] = {}
    for f in facts.weight_files:
        p = facts.path / f
        try:
            try:
                part = torch.load(str(p), map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # legacy (non-zip) serialisation cannot be memory-mapped
                part = torch.load(str(p), map_location="cpu", weights_only=True)
        except Exception as e:
            raise InputError(
                f"{p}: cannot load pickled weights with torch.load(weights_only=True): {type(e).__name__}: "
                f"{str(e)[:300]}. Fix: the file is corrupt or holds more than tensors; convert the "
                f"checkpoint to safetensors."
            ) from None
        if not isinstance(part, dict):
            raise InputError(f"{p}: holds a {type(part).__name__}, not a state dict. Fix: save model.state_dict().")
        for k, v in part.items():
            if isinstance(v, torch.Tensor):
                sd[k] = v
                facts.tensors[k] = (list(v.shape), str(v.dtype))
                facts.tensor_file[k] = f
    return sd


def _check_tied_head(facts: CheckpointFacts, state_dict: dict[str, Any] | None) -> None:
    """Tied config but an ``lm_head.weight`` that differs from the embedding: refuse (the head would be dropped)."""
    if not facts.tied or LM_HEAD_NAME not in facts.tensors:
        return
    import torch

    if state_dict is not None:
        emb, head = state_dict[EMBED_NAME], state_dict[LM_HEAD_NAME]
    else:
        from safetensors import safe_open

        def get(name: str) -> Any:
            with safe_open(str(facts.path / facts.tensor_file[name]), framework="pt") as f:
                return f.get_tensor(name)

        emb, head = get(EMBED_NAME), get(LM_HEAD_NAME)
    if not torch.equal(emb, head):
        raise InputError(
            f"{facts.path / 'config.json'}: tie_word_embeddings=true but {LM_HEAD_NAME} differs from {EMBED_NAME}; "
            f'tying would silently drop the trained head. Fix: set "tie_word_embeddings": false in config.json '
            f"if the head is trained separately, or remove {LM_HEAD_NAME} if it is meant to be shared."
        )
    facts.warnings.append(f"tie_word_embeddings=true and {LM_HEAD_NAME} equals the embedding: written once (tied)")


def _finish_config(path: Path, dtype: str, rope_theta: float | None, rope_scaling: dict[str, Any] | None) -> None:
    """Add the spellings older readers need to the ``config.json`` transformers wrote.

    transformers >= 5 writes RoPE as ``rope_parameters`` and the dtype as ``dtype``; TensorRT-LLM
    converters and transformers 4.x read ``rope_theta``/``rope_scaling`` and ``torch_dtype``.  Both
    spellings are written with the same values (``rope_parameters`` as transformers wrote it), so no
    reader drops the scaling; :func:`_verify_written` checks that transformers reads it back unchanged.
    """
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["dtype"] = dtype
    cfg["torch_dtype"] = dtype
    if rope_theta is not None:
        cfg["rope_theta"] = rope_theta
    cfg["rope_scaling"] = dict(rope_scaling) if rope_scaling else None
    from ..core.store import write_json_atomic

    write_json_atomic(path, cfg)


def _verify_written(hf_dir: Path, model: Any, dtype: str, rope_scaling: dict[str, Any] | None, hf_cfg: Any = None) -> None:
    """Re-read what was written: every safetensors header, tensor count, dtype and the RoPE scaling.

    Raises RuntimeError (a bug, not bad input) when the written checkpoint does not match the model.
    """
    want = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}[dtype]
    names: dict[str, tuple[list[int], str]] = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors, _ = _safetensors_header(f)
        names.update(tensors)
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    absent = [k for k in expected if k not in names and k != LM_HEAD_NAME]
    if absent:
        raise RuntimeError(f"{hf_dir}: written checkpoint lacks {absent[:5]}")
    wrong = [k for k, (_, dt) in names.items() if dt != want]
    if wrong:
        raise RuntimeError(f"{hf_dir}: tensors {wrong[:5]} were written as {names[wrong[0]][1]}, expected {want}")
    cfg = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    if rope_scaling and (cfg.get("rope_scaling") or {}).get("rope_type") != rope_scaling.get("rope_type"):
        raise RuntimeError(f"{hf_dir / 'config.json'}: rope_scaling was not preserved")
    if hf_cfg is not None and isinstance(getattr(hf_cfg, "rope_parameters", None), dict):
        from transformers import AutoConfig

        back = AutoConfig.from_pretrained(str(hf_dir)).rope_parameters
        if back != hf_cfg.rope_parameters:
            raise RuntimeError(f"{hf_dir / 'config.json'}: RoPE parameters read back as {back}, expected {hf_cfg.rope_parameters}")
