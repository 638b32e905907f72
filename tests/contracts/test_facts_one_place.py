"""One fact, one place (issue 15, items 1 and 7): the tokenizer file names live in one list (pipeline/core/artifacts.py)
and ``tp_size``/``pp_size`` in one config group (``parallel``, TensorRT-LLM's ``Mapping`` names) with the old
``quant.*`` spellings kept one release as cross-group deprecated aliases.

Old behaviour: six modules kept their own tokenizer lists and they disagreed (the packaged tokenizer folder dropped
``chat_template.json``, so a checkpoint carrying its chat template only there was served without it);
``parallel.tp_size`` did not exist.
"""

from __future__ import annotations

import ast
import json
import logging
import shutil
from pathlib import Path

import pytest

from pipeline.core import artifacts as A
from pipeline.core.config import ConfigError, alias_paths, compose, deprecations
from pipeline.core.stage import get_stage
from pipeline.runner import compute_key
from pipeline.validation import validate

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipeline"
SUPPORT_LLAMA = ROOT / "models" / "support-llama"


def _literal_lists_of(names: set[str], owner: Path, at_least: int = 2, allowed: tuple[Path, ...] = ()) -> list[str]:
    """``file:line`` of every tuple/list/set literal or dict-literal key set in pipeline/ (outside ``owner`` and
    ``allowed``) naming ``at_least`` of ``names``."""
    hits = []
    for py in sorted(PACKAGE.rglob("*.py")):
        if py == owner or py in allowed:
            continue
        for node in ast.walk(ast.parse(py.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                elts = list(node.elts)
            elif isinstance(node, ast.Dict):
                elts = [k for k in node.keys if k is not None]
            else:
                continue
            found = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
            if len(found) >= at_least:
                hits.append(f"{py.relative_to(ROOT)}:{node.lineno} {sorted(found)}")
    return hits


def test_tokenizer_file_names_are_listed_only_in_artifacts():
    hits = _literal_lists_of(set(A.TOKENIZER_COPY_FILES), PACKAGE / "core" / "artifacts.py")
    assert not hits, (
        "tokenizer file lists outside pipeline/core/artifacts.py (import TOKENIZER_FILES / TOKENIZER_COPY_FILES):\n" + "\n".join(hits)
    )


def test_every_tokenizer_copier_uses_the_one_list():
    from pipeline.bench import shapes
    from pipeline.build.targets.onnxruntime_genai import quant as ort_quant
    from pipeline.package import validate as pkg_validate

    assert ort_quant.TOKENIZER_FILES is A.TOKENIZER_COPY_FILES
    assert shapes.TOKENIZER_COPY_FILES is A.TOKENIZER_COPY_FILES
    assert pkg_validate.REQUIRED_TOKENIZER_FILES is A.REQUIRED_TOKENIZER_FILES
    assert set(A.REQUIRED_TOKENIZER_FILES) <= set(A.TOKENIZER_FILES) and A.GENERATION_CONFIG in A.TOKENIZER_COPY_FILES


def test_packaged_tokenizer_keeps_a_chat_template_stored_as_chat_template_json(tmp_path):
    """A checkpoint saved with the older layout keeps its chat template in chat_template.json; the served tokenizer
    folder must carry it, so the served prompt is rendered like the evaluated one."""
    from pipeline.core.tokenization import TextCodec
    from pipeline.package.repository import copy_tokenizer

    src = tmp_path / "src"
    src.mkdir()
    shutil.copy2(SUPPORT_LLAMA / "tokenizer.json", src / "tokenizer.json")
    config = json.loads((SUPPORT_LLAMA / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = config.pop("chat_template")
    (src / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (src / "chat_template.json").write_text(json.dumps({"chat_template": template}), encoding="utf-8")
    assert TextCodec.from_dir(src).chat_template == template
    copied = copy_tokenizer([src], tmp_path / "served")
    assert "chat_template.json" in copied
    assert TextCodec.from_dir(tmp_path / "served").chat_template == template


# ----------------------------------------------------------------------------- the recipe table
def test_recipe_names_are_listed_only_in_the_recipe_table():
    """Old behaviour: recipe names in config/quant.py, quantize.py, planner/gpus.py (+ nvfp4, not a recipe),
    targets/tensorrt_llm.py (its own quant_algo map), config/eval.py (three gate tables) and the planner.
    A target's capability declaration (which recipes it runs) is that target's fact."""
    from pipeline.facts import recipes

    allowed = (PACKAGE / "build" / "targets" / "onnxruntime_genai" / "builder.py",)
    hits = _literal_lists_of(set(recipes.RECIPES), PACKAGE / "facts" / "recipes.py", at_least=3, allowed=allowed)
    assert not hits, "recipe lists outside pipeline/facts/recipes.py (read pipeline.facts.recipes.RECIPES):\n" + "\n".join(hits)


def test_every_view_of_a_recipe_fact_is_the_table():
    from pipeline.build.targets.tensorrt_llm import builder as T
    from pipeline.core.config import quant as quant_cfg
    from pipeline.facts import gpus, recipes
    from pipeline.quantize import common as quantize

    assert quant_cfg.RECIPES == tuple(recipes.RECIPES) and quant_cfg.KV_CACHE == tuple(recipes.KV_CACHE_FORMATS)
    assert quant_cfg.AUTO_FORMATS is recipes.AUTO_FORMATS
    assert {k: v[0] for k, v in quantize.KV_CACHE.items()} == {k: f.kv_cache_quant_algo for k, f in recipes.KV_CACHE_FORMATS.items()}
    assert T.RECIPE_QUANT_ALGO == {r.name: r.quant_algo for r in recipes.RECIPES.values()}
    assert gpus.RECIPE_MIN_SM is recipes.RECIPE_MIN_SM and gpus.KV_MIN_SM is recipes.KV_MIN_SM
    assert set(gpus.lookup("b200").quant_formats) <= set(recipes.RECIPES)  # no format that is not a recipe
    gate = compose([]).eval.gate
    assert gate.max_drop_by_recipe == {r.name: r.max_drop for r in recipes.RECIPES.values() if r.max_drop is not None}
    assert gate.max_kld_by_recipe == {r.name: r.max_kld for r in recipes.RECIPES.values() if r.max_kld is not None}
    assert gate.min_top1_by_recipe == {r.name: r.min_top1 for r in recipes.RECIPES.values() if r.min_top1 is not None}
    for old, new in recipes.DEPRECATED_RECIPES.items():  # an alias keeps every fact of the recipe it stands for
        a, b = recipes.RECIPES[old], recipes.RECIPES[new]
        assert (a.modelopt_cfg, a.quant_algo, a.min_sm, a.max_drop, a.max_kld, a.min_top1) == (
            b.modelopt_cfg,
            b.quant_algo,
            b.min_sm,
            b.max_drop,
            b.max_kld,
            b.min_top1,
        )


# ----------------------------------------------------------------------------- the parallel group
def test_parallel_group_holds_tp_and_pp():
    cfg = compose(["parallel.tp_size=2", "parallel.pp_size=2"])
    assert (cfg.parallel.tp_size, cfg.parallel.pp_size) == (2, 2)
    assert cfg.quant.tp_size is None and cfg.quant.pp_size is None  # the deprecated spellings stay unset
    assert {"quant.tp_size": "parallel.tp_size", "quant.pp_size": "parallel.pp_size"}.items() <= alias_paths(cfg).items()


def test_cross_group_alias_is_honoured_with_a_warning_and_gives_the_same_keys(caplog):
    with caplog.at_level(logging.WARNING, logger="pipeline.core.config"):
        old = compose(["quant=int8_wo", "quant.tp_size=4", "quant.pp_size=2"])
    new = compose(["quant=int8_wo", "parallel.tp_size=4", "parallel.pp_size=2"])
    assert (old.parallel.tp_size, old.parallel.pp_size) == (4, 2)
    assert any("quant.tp_size" in r.getMessage() and "parallel.tp_size" in r.getMessage() for r in caplog.records)
    assert [d.split(" ")[0] for d in deprecations(old)] == ["quant.tp_size", "quant.pp_size"]
    for stage in ("quantize", "build", "package"):
        st = get_stage(stage)
        assert compute_key(st, old, {}, {})[0] == compute_key(st, new, {}, {})[0], stage
    # the parallel sizes enter the keys of the stages that write or consume ranks
    one = compose(["quant=int8_wo"])
    assert compute_key(get_stage("quantize"), one, {}, {})[0] != compute_key(get_stage("quantize"), new, {}, {})[0]


def test_cross_group_alias_conflict_names_both_spellings():
    with pytest.raises(ConfigError) as e:
        compose(["quant.tp_size=2", "parallel.tp_size=4"])
    assert "quant.tp_size=2" in str(e.value) and "parallel.tp_size" in str(e.value)
    assert compose(["quant.tp_size=2", "parallel.tp_size=2"]).parallel.tp_size == 2


def test_problems_name_the_parallel_fields():
    p = validate(compose(["parallel.tp_size=0"]), raise_on_error=False)
    assert any(x.field == "parallel.tp_size" and x.value == 0 and "must be >= 1" in x.message for x in p), [str(x) for x in p]
    cpu = validate(compose(["target=onnxruntime_genai", "quant.pp_size=2"]), raise_on_error=False)
    # the field that is set, with its own value (was: parallel.tp_size='1x2')
    assert [str(x) for x in cpu if "one device" in x.message] == [
        "parallel.pp_size=2: target onnxruntime_genai runs on one device. Fix: set parallel.pp_size=1"
    ]
    assert not any(x.field.startswith("quant.") and "_size" in x.field and "group" not in x.field for x in cpu)
