"""Export, step 1: inspect a local Hugging Face checkpoint without loading its weights.

:func:`inspect_checkpoint` reads ``config.json``, the safetensors headers (never the tensors) and the index files, and
runs every check below; :mod:`pipeline.export.write` then loads the weights once and writes the normalised copy.
Each check raises :class:`pipeline.errors.InputError` naming the file/field, the values and the fix:

* architecture is one of :data:`SUPPORTED_ARCHITECTURES` (the families of :data:`pipeline.facts.families.FAMILY_SUPPORT`);
  ``auto_map`` (custom modelling code) needs ``model.trust_remote_code=true``;
* head counts: ``hidden_size == num_attention_heads * head_dim`` unless ``head_dim`` is given
  explicitly, ``num_attention_heads % num_key_value_heads == 0``;
* ``rope_scaling`` in the legacy ``type`` or the newer ``rope_type`` spelling (or transformers 5
  ``rope_parameters``) is normalised to carry ``rope_type`` with every other field kept;
* ``config.json`` field types and values (ids, rope numbers, activation, dtype);
* weights: safetensors headers must parse and cover the file (truncated/corrupt files are named);
  pickled ``*.bin``/``*.pt`` weights are refused unless ``allow_pickle``; every path stays inside the checkpoint
  (:mod:`pipeline.export.safety`);
* ``vocab_size`` == embedding rows == ``lm_head`` rows, ``num_hidden_layers`` == the decoder layers the weights hold,
  ``num_key_value_heads`` x head_dim == the ``k_proj``/``v_proj`` rows (from the headers).

No function here imports torch or transformers at module import time.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..core.artifacts import REQUIRED_TOKENIZER_FILES, TOKENIZER_FILES
from ..core.tensorio import read_header
from ..errors import InputError
from ..facts.families import FAMILY_SUPPORT
from ..facts.rope import normalise_rope

#: architecture (``config.json`` ``architectures[0]``) -> ``model_type``.
from .safety import _is_inside, check_folder_links, confine, confinement_roots
from .shapes import check_kv_heads, check_layer_count

log = logging.getLogger("pipeline.export.inspect")


#: architecture (``config.json`` ``architectures[0]``) -> ``model_type``: the families this pipeline supports
#: (:data:`pipeline.facts.families.FAMILY_SUPPORT`, the one family table).
SUPPORTED_ARCHITECTURES: dict[str, str] = {f["architecture"]: mt for mt, f in FAMILY_SUPPORT.items()}


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


class SpecialIds(NamedTuple):
    """Special-token ids merged from config.json, generation_config.json and the tokenizer (in that order)."""

    eos_ids: list[int]
    bos_id: int | None
    pad_id: int | None  # None only when the tokenizer was not asked (config time) and no file names one
    pad_derived: bool  # no pad id anywhere: the first eos id is used
    gen_raw: dict[str, Any]  # generation_config.json ({} when absent)


def special_ids(src: Path, cfg: dict[str, Any], tok: Any | None) -> SpecialIds:
    """The special-token ids of the checkpoint at ``src`` (``cfg``: its ``config.json``), merged from config.json,
    generation_config.json and the tokenizer ``tok`` in that order: every eos id, the first bos id and the first pad id
    (else the first eos id, ``pad_derived``), each in ``[0, vocab_size)``.  ``tok`` None (the export's config-time
    checks, before any tokenizer is loaded): the ids the files name are checked, and a missing eos id is left to the
    export, whose tokenizer may give one.

    Raises:
        InputError: generation_config.json is not an object or has wrongly typed fields; no eos id anywhere (``tok``
            given); an id outside ``[0, vocab_size)``, naming the field and the files to correct.
    """
    gen_path = src / "generation_config.json"
    gen = _read_json(gen_path, "generation_config.json") if gen_path.exists() else {}
    if not isinstance(gen, dict):
        raise InputError(f"{gen_path}: expected a JSON object. Fix: restore generation_config.json or delete it.")
    check_config_types(gen, str(gen_path))

    def found(name: str) -> list[int]:
        return _ids(cfg.get(name)) + _ids(gen.get(name)) + (_ids(getattr(tok, name)) if tok is not None else [])

    eos_ids = _merge_ids(found("eos_token_id"))
    if not eos_ids and tok is not None:
        raise InputError(
            f"{src / 'config.json'}: no eos_token_id in config.json, generation_config.json or the tokenizer; "
            f'generation could never stop. Fix: set "eos_token_id" in config.json (an int or a list of stop ids).'
        )
    bos_id = next(iter(found("bos_token_id")), None)
    pad_candidates = found("pad_token_id")
    pad_id = pad_candidates[0] if pad_candidates else next(iter(eos_ids), None)
    vocab = cfg.get("vocab_size")
    for name, id_list in (("eos_token_id", eos_ids), ("bos_token_id", _ids(bos_id)), ("pad_token_id", _ids(pad_id))):
        bad = [i for i in id_list if isinstance(vocab, int) and not 0 <= i < vocab]
        if bad:
            raise InputError(
                f"{src}: {name}={bad} is outside the vocabulary [0, vocab_size={vocab}). "
                f"Fix: correct {name} in config.json/generation_config.json/tokenizer_config.json."
            )
    return SpecialIds(eos_ids, bos_id, pad_id, not pad_candidates, gen)


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
    if cfg.get("max_position_embeddings") is not None:  # 0 passed every check and failed in quantize (a recheck)
        pos_int("max_position_embeddings")
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


def _read_headers(facts: Any, src: Path, files: list[str]) -> None:
    """Record ``files`` as the weight files and every tensor's header (dtype, shape) and file in ``facts``."""
    facts.weight_files = files
    for f in files:
        tensors, _ = read_header(src / f)
        for name, meta in tensors.items():
            facts.tensors[name] = meta
            facts.tensor_file[name] = f


def inspect_checkpoint(
    path: str | Path, *, trust_remote_code: bool = False, allow_pickle: bool = False, allow_external_files: bool = False
) -> CheckpointFacts:
    """Every check that needs only ``config.json`` and the weight-file headers (no torch, no transformers):
    :func:`inspect_config`, then the weight files and their tensors' shapes.

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
    facts = inspect_config(path, trust_remote_code=trust_remote_code, allow_external_files=allow_external_files)
    _find_weights(facts, allow_pickle=allow_pickle, allow_external_files=allow_external_files)
    if facts.weight_format == "safetensors":
        check_tensor_shapes(facts)
    return facts


def inspect_config(path: str | Path, *, trust_remote_code: bool = False, allow_external_files: bool = False) -> CheckpointFacts:
    """The checks of :func:`inspect_checkpoint` that need only the folder and ``config.json`` (field types, the
    architecture, head counts, RoPE fields that must agree), and the facts they give, without the weights.  The
    export's config-time checks (:mod:`pipeline.export.checks`) run these, so ``pipeline plan`` refuses what the
    export would; a folder with ``config.json`` and no weights can still be planned.

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
    arch, model_type = architecture(cfg, cfg_path)
    problems = _check_heads(cfg, "config.json")
    if problems:
        raise InputError(f"{cfg_path}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))
    theta, scaling = normalise_rope(cfg, str(cfg_path))
    special_ids(src, cfg, None)  # the ids config.json and generation_config.json name (the tokenizer's: at export)
    return CheckpointFacts(
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


def check_tokenizer_files(src: Path, trust_remote_code: bool = False) -> None:
    """The tokenizer files every stage reads are in ``src``: :data:`~pipeline.core.artifacts.REQUIRED_TOKENIZER_FILES`
    (the fast tokenizer ``tokenizer.json`` that :class:`~pipeline.core.tokenization.TextCodec` and the export's own
    tokenizer check read, and its config; a SentencePiece ``tokenizer.model`` alone is never enough), each JSON file
    valid JSON, and no ``auto_map`` in ``tokenizer_config.json`` unless ``trust_remote_code``.  The export stage's
    rule, run before it loads the tokenizer and by its config-time checks (:mod:`pipeline.export.checks`), so
    ``pipeline plan`` refuses what the run refuses.

    Raises:
        InputError: a file is missing (names the ones found), not JSON, or asks to run code; with the fix.
    """
    if all((src / f).is_file() for f in REQUIRED_TOKENIZER_FILES):
        for name in (f for f in TOKENIZER_FILES if f.endswith(".json") and (src / f).exists()):
            doc = _read_json(src / name, name)
            if name == "tokenizer_config.json" and isinstance(doc, dict) and doc.get("auto_map") and not trust_remote_code:
                raise InputError(
                    f"{src / name}: auto_map={doc['auto_map']!r} asks to run tokenizer code shipped with the "
                    f"checkpoint and model.trust_remote_code is false. Fix: use a standard tokenizer "
                    f"(tokenizer.json), or, only if you trust its source, set model.trust_remote_code=true."
                )
        return
    present = [f for f in TOKENIZER_FILES if (src / f).exists()]
    slow = "tokenizer.model" in present  # a SentencePiece model: transformers converts it and saves tokenizer.json
    raise InputError(
        f"{src}: tokenizer files missing (found {present or 'none'}; need {' and '.join(REQUIRED_TOKENIZER_FILES)}). "
        f"Fix: copy the tokenizer files of the model (tokenizer.json, tokenizer_config.json, special_tokens_map.json, "
        f"chat_template.jinja) into the checkpoint folder"
        + ("; or save them there with transformers: AutoTokenizer.from_pretrained(path).save_pretrained(path)." if slow else ".")
    )


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


def architecture(cfg: dict[str, Any], cfg_path: Path) -> tuple[str, str]:
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
            f"Supported architectures: {_supported()}. Fix: use a checkpoint of a supported family, or convert the "
            "model to one of them (docs/models.md lists what works on which target)."
        )
    model_type = SUPPORTED_ARCHITECTURES[arch]
    if cfg.get("model_type") not in (None, model_type):
        raise InputError(
            f"{cfg_path}: architectures[0]={arch!r} but model_type={cfg.get('model_type')!r} (expected "
            f"{model_type!r}). Fix: correct model_type in config.json."
        )
    return arch, model_type


def _index_shards(
    index_path: Path, what: str, src: Path, allow_external_files: bool, missing_fix: str, check_missing: bool = True
) -> tuple[dict[str, str], list[str]]:
    """``(weight_map, shard files)`` of a weight index; every shard confined to ``src`` and (``check_missing``) present."""
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
    if missing and check_missing:
        raise InputError(f"{index_path}: lists shard(s) {missing} that are not in {src}. Fix: {missing_fix}.")
    return wmap, files


#: ``model-00001-of-00003.safetensors``: the shard names ``save_pretrained`` writes (transformers/utils/hub.py).
_SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<i>\d+)-of-(?P<n>\d+)\.safetensors$")


def _find_weights(facts: CheckpointFacts, *, allow_pickle: bool, allow_external_files: bool) -> None:
    """Fill ``facts``' weight files and (safetensors) tensor headers with exactly the files transformers'
    ``from_pretrained`` loads, else refuse.

    transformers 5 (``modeling_utils._get_resolved_checkpoint_files``, local folder, ``use_safetensors=True``) takes
    ``model.safetensors`` if it exists, else ``model.safetensors.index.json`` and its shards, and refuses a folder with
    neither (other ``*.safetensors`` names are never read). So: both ``model.safetensors`` and an index is ambiguous (a
    stale file would win silently) and refused; shards without their index are refused naming the missing shards;
    no safetensors at all falls back to pickled weights (:func:`_pickle_weights`).
    """
    src = facts.path
    index_path = src / "model.safetensors.index.json"
    single = src / "model.safetensors"
    if index_path.exists() and single.exists():
        # an index whose only shard is model.safetensors itself names the file transformers loads: not ambiguous
        _, files = _index_shards(index_path, "safetensors index", src, allow_external_files, "", check_missing=False)
        if {(src / f).resolve() for f in files} != {single.resolve()}:
            raise InputError(
                f"{src}: holds both model.safetensors and model.safetensors.index.json; transformers' from_pretrained "
                f"loads model.safetensors and ignores the index and its shards, so which weights are meant is ambiguous. "
                f"Fix: delete the stale one: model.safetensors if the indexed shards are the weights, or "
                f"model.safetensors.index.json and its shards if model.safetensors is."
            )
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
        tensors, _ = read_header(single)
        facts.tensors = tensors
        facts.tensor_file = {n: "model.safetensors" for n in tensors}
    else:
        others = sorted(p.name for p in src.glob("*.safetensors"))
        if others:
            raise InputError(_unindexed_shards(src, others))
        facts.weight_format = "pickle"
        facts.weight_files = _pickle_weights(src, allow_pickle, allow_external_files)


def _unindexed_shards(src: Path, names: list[str]) -> str:
    """The refusal for ``*.safetensors`` files without ``model.safetensors`` or an index: names the shards missing
    from their ``-NNNNN-of-MMMMM`` series, if any, and the fix."""
    missing: list[str] = []
    for m in filter(None, (_SHARD_NAME.match(n) for n in names)):
        width, n = len(m["i"]), int(m["n"])
        missing += [f"{m['stem']}-{i:0{width}d}-of-{m['n']}.safetensors" for i in range(1, n + 1)]
    missing = sorted(set(missing) - set(names))
    gap = f" Shard(s) missing from the series: {missing}." if missing else ""
    return (
        f"{src}: weights {names} but no model.safetensors and no model.safetensors.index.json; transformers' "
        f"from_pretrained reads only those two names, so it cannot load these files.{gap} Fix: restore "
        f"model.safetensors.index.json{' and the missing shard(s)' if missing else ''} from the source checkpoint "
        f"(or re-save the model with save_pretrained)."
    )


def _is_pickle_weight(p: Path) -> bool:
    """A pickled weight file (not a trainer's state: training_args, optimizer, scheduler, rng_state)."""
    return p.is_file() and p.suffix in PICKLE_SUFFIXES and not p.name.startswith(("training_args", "optimizer", "scheduler", "rng_state"))


def holds_weights(src: Path) -> bool:
    """Whether the folder ``src`` holds any weight file the export reads (``*.safetensors``, a weight index, pickled
    weights): the export's config-time checks then check the weights' headers too (:mod:`pipeline.export.checks`)."""
    return any(p.suffix == ".safetensors" or p.name.endswith(".index.json") or _is_pickle_weight(p) for p in src.iterdir())


def _pickle_weights(src: Path, allow_pickle: bool, allow_external_files: bool) -> list[str]:
    """Pickled weight files in load order; InputError when there are none, or unless ``allow_pickle``."""
    pickles = sorted(p.name for p in src.iterdir() if _is_pickle_weight(p))
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
    """vocab_size vs embedding rows vs lm_head rows, hidden size of both, the tie rule, then the decoder layers
    (:func:`check_layer_count`) and the KV head count (:func:`check_kv_heads`) against the weights.

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
    check_layer_count(facts)
    check_kv_heads(facts)
