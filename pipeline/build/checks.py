"""The build stage's config checks (run by :func:`pipeline.validation.validate` when the build stage will run).

* ``build.max_input_len < build.max_seq_len``; ``max_seq_len (+ speculative.max_draft_len) <=
  max_position_embeddings x rope factor`` unless ``allow_unsafe_lengths=true`` (then recorded in the plan);
* ``build.max_num_tokens >= build.max_input_len`` unless ``build.enable_chunked_context``; chunked
  context needs ``build.use_paged_context_fmha`` (TensorRT-LLM plugin/plugin.py);
* a RoPE scaling the resolved target does not honour, or would crash on (:func:`pipeline.facts.rope.rope_refusal`);
  ``allow_unsafe_lengths`` does not lift it; when it is about ``build.max_seq_len`` (dynamic scaling past
  ``max_position_embeddings``) and names the length limits, the length refusal above is left out (one problem);
* the resolved target's own ``check_config`` (recipe, KV cache format, limits, and the model's needs on that
  target: :mod:`pipeline.core.targets`).

(``tokens_per_block`` being a power of two is checked by the ``build`` config group itself.)  Never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.config.common import Problem

if TYPE_CHECKING:
    from ..facts.rope import RopeRefusal


def checks(cfg: Any) -> list[Problem]:
    """Every build-stage problem of ``cfg`` (a composed ``PipelineConfig``); never raises for bad values."""
    from ..core.sizing import shape_or_none
    from ..core.targets import TARGETS
    from ..core.targets import config_problems as target_problems

    problems = _length_problems(cfg.build)
    shape = shape_or_none(cfg)
    known = cfg.target.name == "auto" or cfg.target.name in TARGETS  # else the target.name field check reports it
    rope = _rope_refusal(cfg, shape) if known else None
    if shape is not None and not (rope and rope.names_length):  # one cause, one problem: the RoPE refusal names the lengths
        problems.extend(_position_problems(cfg, shape))
    if known:
        problems.extend(target_problems(cfg))
        problems.extend([Problem("model.path", cfg.model.path, rope.why, rope.fix)] if rope else [])
    return problems


def _rope_refusal(cfg: Any, shape: Any) -> RopeRefusal | None:
    """The checkpoint's RoPE scaling on the resolved target (:func:`pipeline.facts.rope.rope_refusal`), with the most
    ``build.max_seq_len`` may be for the model's positions (:func:`_room`; none with ``allow_unsafe_lengths``)."""
    from ..core.modelio import read_model_config
    from ..core.targets import capabilities, needs_build
    from ..errors import InputError
    from ..facts.rope import rope_refusal

    mc = read_model_config(getattr(cfg.model, "path", None))
    if mc is None or not needs_build(cfg):
        return None
    try:
        target = capabilities(cfg).name
    except InputError:
        return None  # the target's own checks name an unresolvable target
    unsafe = bool(getattr(cfg, "allow_unsafe_lengths", False))
    room = _room(cfg.build, shape) if shape is not None and not unsafe else None
    return rope_refusal(mc, target, cfg.build.max_seq_len, room, cfg.build.max_input_len)


def _room(b: Any, shape: Any) -> int:
    """The most ``build.max_seq_len`` may be: the model's positions less the speculative draft tokens."""
    return int(shape.max_seq_len_limit) - max(0, b.speculative.max_draft_len)


def _length_problems(b: Any) -> list[Problem]:
    problems: list[Problem] = []
    if b.max_input_len >= b.max_seq_len:
        problems.append(
            Problem(
                "build.max_input_len",
                b.max_input_len,
                f"must be below build.max_seq_len={b.max_seq_len} (max_seq_len = prompt + generated tokens).",
                f"set build.max_seq_len > {b.max_input_len} or build.max_input_len < {b.max_seq_len}",
            )
        )
    if b.max_num_tokens < b.max_input_len and not b.enable_chunked_context:
        problems.append(
            Problem(
                "build.max_num_tokens",
                b.max_num_tokens,
                f"is below build.max_input_len={b.max_input_len}: a full prompt cannot be processed in one step.",
                f"set build.max_num_tokens >= {b.max_input_len}, or build.enable_chunked_context=true",
            )
        )
    if b.enable_chunked_context and not b.use_paged_context_fmha:
        problems.append(Problem("build.enable_chunked_context", True, "needs paged context FMHA.", "set build.use_paged_context_fmha=true"))
    return problems


def _position_problems(cfg: Any, shape: Any) -> list[Problem]:
    from ..facts.rope import max_seq_len_at_most

    problems: list[Problem] = []
    b = cfg.build
    if b is not None:
        limit, room = shape.max_seq_len_limit, _room(b, shape)
        total = b.max_seq_len + max(0, b.speculative.max_draft_len)
        if total > limit and not getattr(cfg, "allow_unsafe_lengths", False):
            extra = f" + speculative.max_draft_len={b.speculative.max_draft_len}" if b.speculative.max_draft_len else ""
            how = (
                f"max_position_embeddings={shape.max_positions} x rope factor {shape.rope_factor:g}"
                if limit != shape.max_positions
                else f"max_position_embeddings={shape.max_positions}"
            )
            problems.append(
                Problem(
                    "build.max_seq_len",
                    b.max_seq_len,
                    f"{extra and extra.lstrip() + f' = {total} '}exceeds the model's {limit} positions ({how}).",
                    f"set {max_seq_len_at_most(room, b.max_input_len)}, or allow_unsafe_lengths=true to accept it (recorded in the plan)",
                )
            )
    return problems
