"""The release gate's allowed drop comes from the recipe table for every recipe, ``quant=auto`` included
(issue 15: pipeline/evaluate/gate.py carried its own 0.05 for recipes without a table entry)."""

from __future__ import annotations

import pytest

from pipeline.core.config.eval import GateConfig
from pipeline.errors import InputError
from pipeline.evaluate import gate as G
from pipeline.facts.recipes import RECIPES


def test_every_recipe_owns_its_default_allowance():
    """Old behaviour: ``auto`` had no ``max_drop`` in the table, so the gate's hard-coded 0.05 applied."""
    assert {name for name, r in RECIPES.items() if r.max_drop is None} == set()
    assert GateConfig().max_drop_by_recipe["auto"] == RECIPES["auto"].max_drop
    assert G.allowances(GateConfig(), "auto") == (RECIPES["auto"].max_drop, 2.0 * RECIPES["auto"].max_drop)


@pytest.mark.parametrize("recipe", [n for n, r in RECIPES.items() if r.max_drop != 0.05])
def test_a_recipe_missing_from_a_user_table_falls_back_to_the_recipe_table(recipe):
    """A ``max_drop_by_recipe`` that omits the recipe: the recipe's own default, not a gate constant (was 0.05)."""
    overall, _ = G.allowances(GateConfig(max_drop_by_recipe={}), recipe)
    assert overall == RECIPES[recipe].max_drop


def test_unknown_recipe_without_allowance_is_refused():
    with pytest.raises(InputError, match=r"eval\.gate\.max_drop_by_recipe.*'nvfp4'.*Fix: set eval\.gate\.max_drop"):
        G.allowances(GateConfig(max_drop_by_recipe={}), "nvfp4")
    assert G.allowances(GateConfig(max_drop=0.03), "nvfp4")[0] == 0.03
