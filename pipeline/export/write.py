"""Export, step 2: load the inspected checkpoint once and write the normalised copy.

:func:`export_checkpoint` is the plain function behind the ``export`` stage (``pipeline/export/stage.py``): it runs
:func:`pipeline.export.inspect.inspect_checkpoint`, the tokenizer and special-token checks, then loads the weights
(once) and writes::

    <out>/hf/                 config.json, model.safetensors (or shards + index),
                              generation_config.json, tokenizer files, special_tokens_map.json
    <out>/model_info.json     the facts downstream stages rely on (fields: docs/artifacts.md)

Checks here (each raises :class:`pipeline.errors.InputError` naming the file/field, the values and the fix):

* the tokenizer may be shorter than the embedding, never longer; every special-token id is < ``vocab_size``;
* ``tie_word_embeddings``: tied without ``lm_head.weight`` uses the embedding ("tied"); untied
  without ``lm_head.weight`` is an error (transformers would silently initialise a random head);
  tied with an ``lm_head.weight`` that differs from the embedding is an error;
* ``eos_token_id`` may be a list: the whole list is kept (config, generation_config, tokenizer);
  no pad id anywhere: the first eos id is used and ``pad_token_derived`` is recorded;
* the requested dtype can hold every weight (:func:`check_weights_castable`);
* after loading: no tensor the model needs may be missing from the checkpoint; the written files are re-read and
  compared;
* the written tokenizer tokenizes as transformers' ``AutoTokenizer`` (:mod:`pipeline.export.tokenizer`).

Pickled weights (``model.allow_pickle=true``) are read with ``torch.load(weights_only=True)``.  No function here imports
torch or transformers at module import time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..core.artifacts import TOKENIZER_DIRS, TOKENIZER_FILES
from ..core.contracts.export import ExportArtifact
from ..core.hf_compat import rewrite_tokenizer_config, write_older_config_spellings
from ..core.modelio import loadable_view, transformers_config
from ..core.tensorio import read_header
from ..errors import InputError

#: architecture (``config.json`` ``architectures[0]``) -> ``model_type``.
from .inspect import (
    _IGNORABLE_UNEXPECTED,
    DTYPES,
    EMBED_NAME,
    EXPORT_SHARD_SIZE,
    LM_HEAD_NAME,
    MAX_UNUSED_EMBEDDING_ROWS,
    CheckpointFacts,
    ProgressFactory,
    SpecialIds,
    check_activation,
    check_tensor_shapes,
    check_tokenizer_files,
    inspect_checkpoint,
    special_ids,
)
from .tokenizer import check_tokenizer

log = logging.getLogger("pipeline.export.write")


def load_tokenizer(src: Path, config: dict[str, Any], trust_remote_code: bool) -> tuple[Any, SpecialIds]:
    """The export's step 2, which ``pipeline plan`` runs too (:func:`pipeline.validation.transformers_problems`), so
    the plan refuses what the export would: the tokenizer of ``src`` loaded by transformers after its files are
    checked (``len(tokenizer)`` against ``config["vocab_size"]``, the embedding's rows), and the special-token ids
    with the tokenizer's own (:func:`~pipeline.export.inspect.special_ids`).

    Raises:
        InputError: a tokenizer file is missing or invalid, transformers cannot read config.json or the tokenizer,
            the tokenizer does not fit the embedding, or a special-token id is missing or outside the vocabulary.
    """
    vocab = config.get("vocab_size")
    tok = _load_tokenizer(src, vocab if isinstance(vocab, int) else None, trust_remote_code)
    return tok, special_ids(src, config, tok)


def _load_tokenizer(src: Path, vocab_rows: int | None, trust_remote_code: bool) -> Any:
    """Load the tokenizer after checking its files; ``len(tokenizer)`` must not exceed the embedding rows (when
    known)."""
    check_tokenizer_files(src, trust_remote_code)
    from transformers import AutoTokenizer

    transformers_config(src, trust_remote_code)  # the tokenizer loads config.json too: its errors are config.json's (a trial)
    try:
        tok = AutoTokenizer.from_pretrained(str(src), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise InputError(
            f"{src}: the tokenizer files (tokenizer.json/tokenizer.model, tokenizer_config.json) could not be "
            f"loaded: {type(e).__name__}: {e}. Fix: restore them from the original model."
        ) from None
    n = len(tok)
    if vocab_rows is None:
        return tok
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
    outputs: Sequence[Path] = (),
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
        outputs: the run's own output folders (``StageContext.outputs``: the store, the run folder); inside ``src``
            they are not its files (``model_info.json`` ``files``: :func:`pipeline.core.store.input_files`).
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
        advance(1)

        # 2. tokenizer, special-token ids
        tok, ids = load_tokenizer(src, facts.config, trust_remote_code)
        if ids.pad_derived:
            facts.warnings.append(f"no pad token id in the checkpoint: using the first eos id {ids.pad_id} (pad_token_derived=true)")
        tok_plan = check_tokenizer(src, tok)
        facts.warnings.extend(tok_plan.warnings)
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
        tok_plan.write(hf_dir)
        tok_plan.record["tokenizer_config_both_read"] = rewrite_tokenizer_config(hf_dir)  # the serving image's 4.57 too
        advance(1)

        # 6. verify what was written (headers + config round trip), then model_info.json
        _verify_written(hf_dir, model, dtype, facts.rope_scaling, hf_cfg)
        info = {**_model_info(src, facts, model, hf_cfg, tok, ids, dtype, rope_theta, outputs), "tokenizer_parity": tok_plan.record}
        from ..core.store import write_json_atomic

        write_json_atomic(ExportArtifact(out).model_info_path, info)
        advance(1)
    del model
    return {**info, "_warnings": list(facts.warnings)}


def _hf_config(src: Path, facts: CheckpointFacts, ids: SpecialIds, trust_remote_code: bool) -> tuple[Any, float | None]:
    """The transformers config with the merged special ids, and the RoPE base (export step 3).

    When config.json does not say ``tie_word_embeddings`` and the architecture's default differs from what the
    weight headers suggested, ``facts.tied`` follows the default and the head's shapes are checked again.

    Raises:
        InputError: transformers cannot parse config.json.
    """
    check_activation(facts.config, str(src / "config.json"))
    hf_cfg = transformers_config(src, trust_remote_code)
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
    ids: SpecialIds,
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
    write_older_config_spellings(hf_dir / "config.json", dtype, rope_theta, rope_scaling)  # transformers 4.x reads them
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
    src: Path,
    facts: CheckpointFacts,
    model: Any,
    hf_cfg: Any,
    tok: Any,
    ids: SpecialIds,
    dtype: str,
    rope_theta: float | None,
    outputs: Sequence[Path] = (),
) -> dict[str, Any]:
    """The ``model_info.json`` document (docs/artifacts.md), with the sha256 of every source file: the files the
    cache key hashes (:func:`pipeline.core.store.input_files`, less ``outputs``, ``.git/`` and ``.cache/``)."""
    from ..core.store import input_files

    files = {rel: meta["sha256"] for rel, meta in input_files(src, outputs).items()}
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
            with loadable_view(src) as load_dir:
                loaded: Any = AutoModelForCausalLM.from_pretrained(
                    str(load_dir),
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


def _verify_written(hf_dir: Path, model: Any, dtype: str, rope_scaling: dict[str, Any] | None, hf_cfg: Any = None) -> None:
    """Re-read what was written: every safetensors header, tensor count, dtype and the RoPE scaling.

    Raises RuntimeError (a bug, not bad input) when the written checkpoint does not match the model.
    """
    want = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}[dtype]
    names: dict[str, tuple[list[int], str]] = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors, _ = read_header(f)
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
