"""Targets declare what they can do, in one registry, and one resolver picks the target (issue 15, item 4).

* every recipe the project knows (``pipeline.core.config.quant.RECIPES``) is buildable or refused *with a declared
  reason* on every target and backend, and the target's config-time check says exactly that;
* the planner plans for the device of the target the build would use (one ``resolve_target``);
* the config's target names are the registry's.
"""

from __future__ import annotations

import pytest

from pipeline.core import hostinfo
from pipeline.core.config import compose
from pipeline.core.config.quant import RECIPES
from pipeline.core.targets import TARGETS, all_capabilities, capabilities, get_target, resolve_target

BACKEND = {
    "onnxruntime_genai": ("onnxruntime_genai", "tensorrt"),
    "tensorrt_llm": ("tensorrt_llm", "tensorrt"),
    "tensorrt_llm_pytorch": ("tensorrt_llm", "pytorch"),
}


def test_registry_covers_every_target_and_backend():
    assert set(all_capabilities()) == set(BACKEND)
    # one table of target names: the config check asks the registry (pipeline.core.targets.name_problems)
    from pipeline.core.config import compose
    from pipeline.core.targets import name_problems

    for name in ("auto", *TARGETS):
        assert name_problems(compose([f"target.name={name}"])) == [], name
    assert [p.field for p in name_problems(compose(["target.name=tensorrt"]))] == ["target.name"]


@pytest.mark.parametrize("cap_name", sorted(BACKEND))
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_buildable_or_refused_with_reason(cap_name, recipe):
    caps = all_capabilities()[cap_name]
    # declared, not the generic fallback: a new recipe must be placed on every target
    assert recipe in caps.recipes or caps.refused_recipes.get(recipe), f"{cap_name} says nothing about recipe {recipe}"
    assert not (recipe in caps.recipes and recipe in caps.refused_recipes)

    target, backend = BACKEND[cap_name]
    cfg = compose([f"target={target}", f"target.backend={backend}", f"quant.recipe={recipe}"])
    assert capabilities(cfg) == caps
    recipe_problems = [p for p in get_target(target).check_config(cfg) if p.field == "quant.recipe"]
    refusal = caps.recipe_refusal(recipe)
    if refusal is None:
        assert recipe_problems == [], f"{cap_name} declares {recipe} buildable but check_config refuses it: {recipe_problems}"
    else:
        assert len(recipe_problems) == 1 and refusal in recipe_problems[0].message


@pytest.mark.parametrize("cap_name", sorted(BACKEND))
def test_kv_cache_dtypes_match_config_check(cap_name):
    from pipeline.core.config.quant import KV_CACHE

    caps = all_capabilities()[cap_name]
    target, backend = BACKEND[cap_name]
    for kv in KV_CACHE:
        cfg = compose([f"target={target}", f"target.backend={backend}", f"quant.kv_cache_dtype={kv}"])
        refused = [p for p in get_target(target).check_config(cfg) if p.field == "quant.kv_cache_dtype"]
        assert bool(refused) == (kv not in caps.kv_cache_dtypes), (cap_name, kv, refused)


def _fake_gpu(monkeypatch):
    """This host has no GPU: stand in the nvidia-smi facts of one (the planner's and the resolver's only GPU source)."""
    fake = [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_mib": 81559.0, "driver": "580"}]
    monkeypatch.setattr(hostinfo.gpus, "__wrapped__", None, raising=False)
    monkeypatch.setattr(hostinfo, "gpus", lambda: fake)


def test_planner_and_build_agree_when_a_gpu_is_visible_without_tensorrt_llm(monkeypatch):
    """Old behaviour: the planner said "gpu" whenever a GPU was visible while the build resolved auto to the CPU
    engine (TensorRT-LLM not installed): a plan for a GPU the run never used."""
    from pipeline.core.sizing import plan_device
    from pipeline.core.targets import tensorrt_llm_installed

    if tensorrt_llm_installed():
        pytest.skip("tensorrt_llm is installed here")
    _fake_gpu(monkeypatch)
    cfg = compose(["model=llama31_8b"])
    name, reason = resolve_target(cfg)
    assert name == "onnxruntime_genai" and "tensorrt_llm is not installed" in reason
    kind, gpu, _why = plan_device(cfg)
    assert (kind, gpu) == ("cpu", None)


def test_named_gpu_resolves_auto_to_tensorrt_llm_for_plan_and_build():
    from pipeline.core.sizing import plan_device

    cfg = compose(["model=llama31_8b", "target.gpu=h100_sxm"])
    assert resolve_target(cfg).name == "tensorrt_llm"
    kind, gpu, _why = plan_device(cfg)
    assert kind == "gpu" and gpu is not None and gpu.sm == 90


def test_cpu_plan_notes_every_recipe_the_cpu_target_refuses():
    """The planner asks the registry: int8_sq (refused by onnxruntime_genai) gets the note that fp8 got
    (old behaviour: a hard-coded fp8/w4a8 list, so int8_sq and auto were planned for the CPU without a word)."""
    from pipeline.planner import plan

    for recipe in ("int8_sq", "fp8", "int4_awq"):
        p = plan(compose(["model=llama31_8b", "target=onnxruntime_genai", f"quant={recipe}"]))
        noted = [n for n in p.notes if n.startswith(f"quant.recipe={recipe}: target onnxruntime_genai cannot run it")]
        assert bool(noted) == (recipe != "int4_awq"), (recipe, p.notes)


def test_docs_capabilities_table_is_the_registry():
    from pathlib import Path

    from pipeline.core.targets import capabilities_table

    text = (Path(__file__).resolve().parents[2] / "docs" / "build.md").read_text(encoding="utf-8")
    start = text.index("<!-- capabilities table:")
    table = text[text.index("\n", start) + 1 : text.index("<!-- end capabilities table -->")].strip()
    assert table == capabilities_table(), "docs/build.md: regenerate the table with pipeline.core.targets.capabilities_table()"


def test_minimum_compute_capability_is_one_table():
    """The planner said quant=none needs SM 8.0, the TensorRT-LLM target 7.5: all now read pipeline/facts/recipes.py
    (fp16 engines from Turing, SM 7.5; bfloat16 needs SM 8.0, checked on the dtype)."""
    from pipeline.build.targets.tensorrt_llm import builder as T
    from pipeline.build.targets.tensorrt_llm import preflight as trt_preflight
    from pipeline.facts import gpus, recipes

    assert gpus.RECIPE_MIN_SM is recipes.RECIPE_MIN_SM and gpus.KV_MIN_SM is recipes.KV_MIN_SM
    assert {r: divmod(sm, 10) for r, sm in recipes.RECIPE_MIN_SM.items()} == trt_preflight.RECIPE_MIN_SM
    assert trt_preflight.RECIPE_MIN_SM["none"] == (7, 5) and recipes.BF16_MIN_SM == 80
    assert set(trt_preflight.RECIPE_MIN_SM) == set(T.RECIPE_QUANT_ALGO) == set(recipes.RECIPES)


def test_pytorch_backend_refuses_runtime_fields_without_an_llmapi_equivalent_at_config_time():
    """The config checks see ``package.runtime`` as an OmegaConf node, not the dataclass: a runtime field the LLM-API
    layout cannot express (``gpu_weights_percent``, ``normalize_log_probs`` changed from its default) is one exit-2
    problem naming the field; a mapped field (``kv_cache_free_gpu_mem_fraction``) and the engine backend pass."""
    from pipeline.validation import validate

    base = ["target=tensorrt_llm", "target.gpu=h100_sxm", "stages=[export,quantize,build]"]
    bad = ["package.runtime.gpu_weights_percent=0.5", "package.runtime.normalize_log_probs=false"]
    problems = validate(compose([*base, "target.backend=pytorch", *bad]), raise_on_error=False)
    named = {p.field: p for p in problems if "no equivalent in the PyTorch-backend" in p.message}
    assert set(named) == {"package.runtime.gpu_weights_percent", "package.runtime.normalize_log_probs"}, problems
    assert "target.backend=tensorrt" in str(named["package.runtime.gpu_weights_percent"])
    mapped = ["target.backend=pytorch", "package.runtime.kv_cache_free_gpu_mem_fraction=0.8"]
    assert not [p for p in validate(compose([*base, *mapped]), raise_on_error=False) if p.field.startswith("package.runtime")]
    engine = validate(compose([*base, "target.backend=tensorrt", *bad]), raise_on_error=False)
    assert not [p for p in engine if "no equivalent in the PyTorch-backend" in p.message]
