"""pipeline/core/registry.py: the one registry the extension points share (stages, targets, metrics, subcommands)."""

from __future__ import annotations

import pytest

from pipeline.core.registry import Registry, UnknownName


def test_a_miss_lists_the_known_names_and_the_closest():
    r: Registry[int] = Registry("widget", {"alpha": 1, "beta": 2})
    with pytest.raises(UnknownName) as e:
        r["alpah"]
    assert str(e.value) == "unknown widget 'alpah'; known widgets: ['alpha', 'beta']; did you mean 'alpha'?"
    assert isinstance(e.value, KeyError)
    assert "did you mean" not in r.miss("zzz")


def test_register_refuses_a_taken_name_unless_replace():
    r: Registry[int] = Registry("widget")
    assert r.register("a", 1) == 1 and r["a"] == 1 and list(r) == ["a"] and len(r) == 1 and "a" in r
    with pytest.raises(ValueError, match="already registered"):
        r.register("a", 2)
    assert r.register("a", 2, replace=True) == 2 and r["a"] == 2


def test_every_extension_point_uses_it():
    from pipeline.cli import SUBCOMMANDS
    from pipeline.core.stage import STAGE_MODULES, get_stage
    from pipeline.core.targets import TARGETS
    from pipeline.data.metrics import METRICS, get_metric

    for reg in (TARGETS, SUBCOMMANDS, STAGE_MODULES, METRICS):
        assert isinstance(reg, Registry)
    with pytest.raises(UnknownName, match=r"unknown stage 'evaluat'.*did you mean 'evaluate'"):
        get_stage("evaluat")
    with pytest.raises(UnknownName, match=r"unknown metric 'exact_mach'.*did you mean 'exact_match'"):
        get_metric("exact_mach")
    assert list(STAGE_MODULES) == ["export", "quantize", "build", "evaluate", "package", "benchmark"]


def test_an_unknown_target_suggests_the_closest_name():
    from pipeline.core.targets import get_target
    from pipeline.errors import InputError

    with pytest.raises(InputError, match=r"Fix: pass target=onnxruntime_genai\.$"):
        get_target("onnxruntime-genai")


def test_a_registered_target_is_a_valid_target_name(monkeypatch):
    """``pipeline.register_target``: the config accepts the new name (the check asks the registry), get_target returns
    the object itself; an unregistered name is refused with exit-2 problem naming the closest target."""
    import pipeline
    from pipeline.core import targets
    from pipeline.core.config import compose
    from pipeline.validation import validate

    monkeypatch.setattr(targets, "TARGETS", Registry("target", dict(targets.TARGETS)))
    monkeypatch.setattr(targets, "_CACHE", dict(targets._CACHE))

    class Mine:
        name = "my_npu"

        def check_config(self, cfg):
            return []

    assert pipeline.register_target is targets.register
    problems = validate(compose(["target.name=my_npu", "stages=[export]"]), raise_on_error=False)
    assert [p.field for p in problems] == ["target.name"] and "must be one of ['auto', 'onnxruntime_genai', 'tensorrt_llm']" in str(
        problems[0]
    )
    mine = pipeline.register_target(Mine())
    assert targets.get_target("my_npu") is mine
    assert validate(compose(["target.name=my_npu", "stages=[export]"]), raise_on_error=False) == []
    with pytest.raises(ValueError, match="already registered"):
        pipeline.register_target(Mine())
    p = targets.name_problems(compose(["target.name=onnxruntime_genia"]))
    assert len(p) == 1 and "Fix: pick target=onnxruntime_genai" in str(p[0])


def test_mistyped_names_get_the_closest_one_wherever_they_are_typed(tmp_path):
    """A stage in ``stages``, a metric in an eval set, a subcommand on the command line, a target preset given as
    ``target.name``: each refusal names the closest valid spelling (exit 2)."""
    import json
    import subprocess
    import sys

    from pipeline.core.config import compose, validate
    from pipeline.core.targets import name_problems
    from pipeline.data.evalset import read_eval_set
    from pipeline.errors import InputError

    st = [p for p in validate(compose(["stages=[evaluat]"]), raise_on_error=False) if p.field == "stages"]
    assert st and "did you mean 'evaluate'?" in str(st[0])
    es = tmp_path / "e.jsonl"
    es.write_text(json.dumps({"id": "a", "prompt": "p", "reference": "r", "metric": "exact_mach"}) + "\n")
    with pytest.raises(InputError, match="did you mean 'exact_match'"):
        read_eval_set(es)
    (p,) = name_problems(compose(["target.name=tensorrt_llm_pytorch"]))
    assert "use the preset target=tensorrt_llm_pytorch" in str(p)
    r = subprocess.run([sys.executable, "-m", "pipeline", "plna"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "did you mean 'plan'?" in r.stderr, r.stderr[-2000:]
    # `migrate` is a subcommand too (main() runs it, not a module's main): named when mistyped, with its own --help
    r = subprocess.run([sys.executable, "-m", "pipeline", "migrat"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "did you mean 'migrate'?" in r.stderr, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "pipeline", "migrate", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: pipeline migrate <"), (r.stdout, r.stderr[-2000:])
