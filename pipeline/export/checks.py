"""The export stage's config checks (run by :func:`pipeline.validation.validate`): is the checkpoint at
``model.path`` of a family this pipeline supports, for the target and the recipe asked for.

The facts are :data:`pipeline.facts.families.FAMILY_SUPPORT`; this module turns them into config-time refusals
(exit 2) from the checkpoint's ``config.json``, before any stage runs.  Never imports torch.
"""

from __future__ import annotations

from typing import Any

from ..core.config import resolve_path
from ..errors import InputError
from ..facts.families import FAMILY_SUPPORT
from .inspect import check_tokenizer_files, holds_weights, inspect_checkpoint, inspect_config


def checks(cfg: Any) -> list[Any]:
    """Config-time refusals for the checkpoint at ``model.path`` (called from ``pipeline.validation.validate``).

    * whatever the export stage's config checks refuse (:func:`~pipeline.export.inspect.inspect_config`: config.json
      field types such as ``rope_scaling.beta_fast: "x"``, an architecture this pipeline has no support for, head
      counts, RoPE fields that disagree; :func:`~pipeline.export.inspect.check_tokenizer_files`: a missing or invalid
      tokenizer file; the weight files' headers when the folder holds any, :func:`~pipeline.export.inspect.inspect_checkpoint`:
      shards, pickles, tensor shapes against config.json), with the export's message;
    * what the export stage's decoding policy refuses in ``generation_config.json``
      (:func:`~pipeline.core.decoding.policy_problems`: ``min_p`` > 0, ``no_repeat_ngram_size``, ``top_p`` outside
      (0, 1] ...), one problem per field, so a plan and a run refuse it before any stage with the other problems;
    * a target the family cannot be built for (Phi-3 on ``tensorrt_llm``), with the reason and the alternative.

    Shapes-only presets (no ``model.path``) and a folder without ``config.json`` are skipped (the field and inputs
    checks name a checkpoint that is not there); a ``config.json`` that is not valid JSON is the export's refusal too.
    """
    from ..core.config.common import Problem, file_problems
    from ..core.decoding import policy_problems

    m = cfg.model
    src = resolve_path(str(m.path)) if getattr(m, "path", None) else None
    if src is None or not (src / "config.json").is_file():
        return []  # no checkpoint (a shapes-only preset), or one not there: the field and inputs checks name it
    # the export stage's decoding rule (generation_config.json: min_p, no_repeat_ngram_size, top_p out of range ...)
    problems = file_problems("model.path", m.path, policy_problems(src), "generation_config.json problems")
    try:  # the export stage's own rules (one rule, one wording), so a plan refuses what the run's export would (trials)
        if holds_weights(src):  # the weight headers too (vocab_size vs the embedding rows, shards, pickles): milliseconds
            facts = inspect_checkpoint(
                src, trust_remote_code=m.trust_remote_code, allow_pickle=m.allow_pickle, allow_external_files=m.allow_external_files
            )
        else:  # a folder of config.json and tokenizer files, for planning
            facts = inspect_config(src, trust_remote_code=m.trust_remote_code, allow_external_files=m.allow_external_files)
        mt = facts.model_type
        check_tokenizer_files(src, m.trust_remote_code)
    except InputError as e:
        why, _, fix = str(e).partition(" Fix: ")
        return [Problem("model.path", cfg.model.path, why, fix), *problems]
    fam = FAMILY_SUPPORT[mt]
    from ..core.targets import needs_build, resolve_target

    target: str | None = None
    if needs_build(cfg):
        try:
            target = resolve_target(cfg).name
        except Exception:
            return problems  # the target's own checks report an unresolvable target
        why = fam["targets"].get(target)
        if why:
            problems.append(
                Problem(
                    "target.name",
                    target,
                    f"{fam['architecture']}: {why.split(' Fix: ')[0]}",
                    why.split(" Fix: ", 1)[1] if " Fix: " in why else "use another target",
                )
            )
    recipe = getattr(cfg.quant, "recipe", None)
    recipe_why = fam.get("recipes", {}).get(recipe)
    if recipe_why is None and recipe != "none" and target is not None:
        recipe_why = fam.get("quantized_on", {}).get(target)
    if recipe_why:
        problems.append(
            Problem(
                "quant.recipe",
                cfg.quant.recipe,
                f"{fam['architecture']}: {recipe_why.split(' Fix: ')[0]}",
                recipe_why.split(" Fix: ", 1)[1] if " Fix: " in recipe_why else "use another recipe",
            )
        )
    return problems
