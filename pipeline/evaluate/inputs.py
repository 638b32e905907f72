"""The evaluate stage's inputs, resolved (:func:`setup`): the eval set read and tokenized under the engine's limits
(:func:`engine_limits`), the stop and pad ids, the device, and the runners to run with the candidate the gate judges
(:func:`resolve_runners`: ``eval.candidate=auto`` picks ``engine`` where :func:`engine_usable`, else ``simulated``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.contracts.build import BuildArtifact, BuildResult, EngineLimits, target_of
from ..core.contracts.export import ExportArtifact, ModelInfo
from ..core.stage import StageContext
from ..errors import InputError


def engine_limits(build_art: Any, cfg: Any) -> dict[str, Any]:
    """Engine limits (max_input_len, max_seq_len, max_batch_size) of the build artifact (``BuildArtifact.limits``),
    else the build config's."""
    if build_art is None:
        return {k: getattr(cfg.build, k) for k in BuildArtifact.LIMIT_KEYS}
    return BuildArtifact(build_art.path).limits(build_art.result_as(BuildResult), cfg.build)


def target_name(cfg: Any, build_art: Any) -> str:
    return target_of(build_art, cfg.target.name)


def engine_usable(cfg: Any, build_art: Any) -> tuple[bool, str]:
    """Can the ``engine`` runner run this recipe here? (usable, reason)."""
    if build_art is None or not BuildArtifact(build_art.path).engine_dir.is_dir():
        return False, "the build artifact has no engine/ folder"
    name = target_name(cfg, build_art)
    from ..core.targets import get_target
    from ..errors import InputError

    try:
        tgt = get_target(name)
    except InputError as e:
        return False, f"build target {name!r} is not available ({e})"
    refusal = tgt.capabilities(cfg).recipe_refusal(cfg.quant.recipe)
    if refusal is not None:
        return False, f"target {name!r} cannot run recipe {cfg.quant.recipe!r}: {refusal}"
    ok, why = tgt.available()
    if not ok:
        return False, f"target {name!r} is not usable here: {why}"
    return True, f"target {name!r} runs recipe {cfg.quant.recipe!r}"


def resolve_runners(cfg: Any, build_art: Any) -> tuple[list[str], str, dict[str, str]]:
    """(runners in run order, candidate, notes) after resolving ``eval.candidate=auto``.

    ``auto`` picks ``engine`` when the engine runner is usable, else ``simulated``; with ``auto`` an
    unusable ``engine`` runner is dropped from ``eval.runners`` (and the reason is noted) instead of failing.
    """
    e = cfg.eval
    notes: dict[str, str] = {}
    runners = list(dict.fromkeys(e.runners))
    cand = e.candidate
    if cand == "auto":
        ok, why = engine_usable(cfg, build_art)
        cand = "engine" if ok else "simulated"
        notes["candidate"] = f"auto -> {cand}: {why}"
        if not ok and "engine" in runners:
            runners.remove("engine")
            notes["engine"] = f"not run: {why}"
    if cand not in runners:
        runners.append(cand)
    order = [r for r in ("baseline", cand) if r in runners] + [r for r in runners if r not in ("baseline", cand)]
    return order, cand, notes


def _pad_id(info: ModelInfo, tokenizer: Any, stop_ids: list[int]) -> int:
    for v in (info.pad_token_id, getattr(tokenizer, "pad_token_id", None)):
        if isinstance(v, int):
            return v
    if stop_ids:
        return stop_ids[0]
    raise InputError(
        "the export has no pad_token_id and no eos_token_ids. Fix: set eos_token_id in the checkpoint's generation_config.json."
    )


@dataclasses.dataclass
class Setup:
    """The evaluate stage's inputs, resolved: eval items tokenized under the engine's limits, the runners to run."""

    eval_path: Any
    items: list[Any]
    build_art: Any
    tokenizer: Any
    stop_ids: list[int]
    pad_id: int
    limits: dict[str, Any]
    prepared: list[Any]  # pipeline.data.evalset.Prepared, one per item
    runners: list[str]
    cand: str
    notes: dict[str, str]
    n_run: int  # items not skipped
    device: str = "cpu"  # the resolved eval.device (cpu | cuda:N) of the baseline and simulated runners
    eval_format: dict[str, Any] = dataclasses.field(default_factory=lambda: {"format": "jsonl"})  # EvalSet.format
    warnings: list[str] = dataclasses.field(default_factory=list)  # eval_report.json "warnings" (also logged)


def _warn_flattened_messages(ctx: StageContext, items: list[Any], tokenizer: Any, apply_chat_template: bool) -> list[str]:
    """The warning (logged: the run's console shows it; returned for ``eval_report.json`` ``warnings``) when items
    given as chat ``messages`` are encoded without a chat template: their contents are joined by newlines and the
    roles dropped (``TextCodec.encode_prompt``), where transformers' ``apply_chat_template`` would refuse a tokenizer
    without one.  With no template every ``messages`` item counts; with ``model.apply_chat_template=false`` (asked
    for) only conversations (several turns or a non-user role) do.  Returns [] when nothing is flattened."""
    from ..core.tokenization import codec_of, flattened_chats_warning

    if codec_of(tokenizer).uses_template(apply_chat_template):
        return []
    if apply_chat_template:  # the checkpoint has no chat template
        chats = [it.id for it in items if it.messages]
        if not chats:
            return []
        w = flattened_chats_warning(len(chats), len(items), "eval items", chats, "write those items as prompt")
    else:
        convs = [it.id for it in items if it.messages and (len(it.messages) > 1 or any(m["role"] != "user" for m in it.messages))]
        if not convs:
            return []
        w = (
            f"{len(convs)} eval item(s) with a conversation (e.g. {', '.join(map(str, convs[:3]))}) are encoded without "
            "a chat template (model.apply_chat_template=false): their message contents are joined by newlines and the "
            "roles dropped. Fix: model.apply_chat_template=true, or give those items a plain prompt."
        )
    ctx.log.warning("evaluate: %s", w)
    return [w]


def setup(ctx: StageContext) -> Setup:
    """Load the eval set and the export's tokenizer, tokenize every item under the engine's limits, pick the runners."""
    from ..core.tokenization import stop_token_ids
    from ..data.evalset import prepare, read_eval_set
    from .runners import load_tokenizer

    cfg, e = ctx.cfg, ctx.cfg.eval
    eval_path = ctx.external["eval_set"]
    es = read_eval_set(eval_path, limit=e.limit)
    items = es.items
    if es.format["format"] != "jsonl":
        ctx.log.info("eval set %s read as %s, mapping %s", eval_path, es.format["format"], es.format["mapping"])
    export_dir = ctx.inputs["export"].path
    build_art = ctx.upstream("build")
    info = ExportArtifact(export_dir).model_info()
    tokenizer = load_tokenizer(ExportArtifact(export_dir).hf_dir)
    stop_ids = stop_token_ids(info.eos_token_ids, list(getattr(cfg.model, "extra_stop_token_ids", []) or []))
    pad_id = _pad_id(info, tokenizer, stop_ids)
    limits = engine_limits(build_art, cfg)
    prepared = prepare(
        items,
        tokenizer,
        max_input_len=int(limits["max_input_len"]),
        max_seq_len=EngineLimits.from_json(limits).max_seq_len,
        default_max_new_tokens=e.max_new_tokens,
        extra_stop=e.stop,
        apply_chat_template=bool(getattr(cfg.model, "apply_chat_template", True)),
    )
    warnings = _warn_flattened_messages(ctx, items, tokenizer, bool(getattr(cfg.model, "apply_chat_template", True)))
    runners, cand, notes = resolve_runners(cfg, build_art)
    for k, v in notes.items():
        ctx.log.info("%s: %s", k, v)
    n_run = sum(1 for p in prepared if not p.skipped)
    from ..core.hostinfo import resolve_torch_device

    device = resolve_torch_device(e.device, "eval.device")
    return Setup(
        eval_path, items, build_art, tokenizer, stop_ids, pad_id, limits, prepared, runners, cand, notes, n_run, device, es.format, warnings
    )
