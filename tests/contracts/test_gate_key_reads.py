"""Cache keys cover what stages read: a real run records every config field each stage reads, and every
read field must be in the stage's key (a cache field of one of its ``config_groups``, or read by its
``key_extras`` / ``external_inputs``, whose values / content digests enter the key) or declared runtime-only
(``Stage.runtime_reads``, or a ``runtime(...)`` field of the stage's own config group).

Old behaviour: evaluate read ``build.max_input_len`` and ``model.extra_stop_token_ids`` outside its key,
so changing them reused a stale report (issue 11, item 8).
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.config import compose
from pipeline.core.config.common import key_fields
from pipeline.runner import run_pipeline

TOP_LEVEL_RUNTIME = {"progress", "store_dir", "force", "verify_cache", "dry_run", "stages"}
"""PipelineConfig's own fields: how the runner schedules work, never stage output."""

_CLASSES: dict[type, type] = {}


def _recording_class(cls: type) -> type:
    if cls not in _CLASSES:

        def __getattribute__(self, name):
            v = object.__getattribute__(self, name)
            fields = type(self).__dataclass_fields__
            if name in fields and not dataclasses.is_dataclass(v):
                try:
                    prefix, reads = object.__getattribute__(self, "_rec")
                except AttributeError:  # a copy made by the code under test (dataclasses.replace): its source's reads were recorded
                    return v
                reads.add(prefix + name)
            return v

        _CLASSES[cls] = type(f"Recording{cls.__name__}", (cls,), {"__getattribute__": __getattribute__})
    return _CLASSES[cls]


def recording(obj, reads: set[str], prefix: str = ""):
    """A copy of the config dataclass tree ``obj`` that adds ``"group.field"`` to ``reads`` on every leaf read."""
    new = object.__new__(_recording_class(type(obj)))
    for f in dataclasses.fields(obj):
        v = object.__getattribute__(obj, f.name)
        object.__setattr__(new, f.name, recording(v, reads, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v) else v)
    object.__setattr__(new, "_rec", (prefix, reads))
    return new


def _leaf_paths(obj, prefix: str, keyed: bool) -> set[str]:
    """Dotted leaf paths of a config dataclass: cache fields (``keyed``) or runtime fields (not ``keyed``)."""
    out = set()
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        cache = f.metadata.get("cache", True)
        if dataclasses.is_dataclass(v):
            out |= _leaf_paths(v, f"{prefix}{f.name}.", keyed)
        elif cache == keyed:
            out.add(prefix + f.name)
    return out


def record_stage_reads(monkeypatch) -> dict[str, dict[str, set[str]]]:
    """Patch every stage's ``run`` / ``key_extras`` / ``external_inputs`` to record the fields they read."""
    import importlib

    from pipeline.core.config import STAGES

    log: dict[str, dict[str, set[str]]] = {}
    for name in STAGES:
        mod = importlib.import_module(f"pipeline.{name}.stage")
        st = mod.STAGE
        rec = log.setdefault(name, {"run": set(), "key": set(), "external": set()})

        def run(ctx, _orig=st.run, _r=rec["run"]):
            ctx.cfg = recording(ctx.cfg, _r)
            return _orig(ctx)

        def extras(cfg, inputs, _orig=st.key_extras, _r=rec["key"]):
            return _orig(recording(cfg, _r), inputs)

        def external(cfg, _orig=st.external_inputs, _r=rec["external"]):
            return _orig(recording(cfg, _r))

        monkeypatch.setattr(mod, "STAGE", dataclasses.replace(st, run=run, key_extras=extras, external_inputs=external))
    return log


def uncovered(stage_name: str, cfg, reads: dict[str, set[str]]) -> set[str]:
    """Fields ``stage_name`` read in ``run`` that its key does not cover and that are not declared runtime."""
    from pipeline.core.stage import get_stage

    st = get_stage(stage_name)
    covered = set(reads["key"]) | set(reads["external"]) | set(st.runtime_reads) | TOP_LEVEL_RUNTIME
    for g in st.config_groups:
        covered |= _leaf_paths(getattr(cfg, g), f"{g}.", keyed=True)
        covered |= _leaf_paths(getattr(cfg, g), f"{g}.", keyed=False)  # runtime(...) fields of its own group
    # A deprecated alias (pipeline.core.config.common.deprecated_alias) holds a copy of its new field once the config is
    # resolved; dataclasses.replace reads it along with every other field: count it as a read of the new field.
    aliases = _alias_targets(cfg)
    run_reads = {aliases.get(r, r) for r in reads["run"]}
    return {r for r in run_reads if r not in covered and not any(r.startswith(c + ".") for c in covered)}


def _alias_targets(obj) -> dict[str, str]:
    """{dotted alias path: dotted path of the field it is an alias of} for the config tree ``obj`` (same-group and
    cross-group aliases, e.g. ``quant.tp_size`` -> ``parallel.tp_size``)."""
    from pipeline.core.config import alias_paths

    return alias_paths(obj)


def test_recorder_sees_nested_reads():
    cfg = compose([])
    reads: set[str] = set()
    r = recording(cfg, reads)
    _ = r.eval.gate.max_drop, r.build.max_input_len, r.model
    assert reads == {"eval.gate.max_drop", "build.max_input_len"}
    assert dataclasses.is_dataclass(r.eval) and key_fields(r.eval)["gate"]["max_drop"] is None


def test_evaluate_key_covers_every_field_it_reads(tmp_path, tiny_llama, monkeypatch):
    """A real export -> quantize -> build -> evaluate run on a tiny checkpoint: no stage of it reads a field
    outside its key, unless the field is declared runtime-only."""
    log = record_stage_reads(monkeypatch)
    rows = tmp_path / "eval.jsonl"
    rows.write_text(
        '{"id": "a", "prompt": "Where is order ORD-1?", "reference": "ORD-1", "metric": "exact_match", "slice": "s"}\n'
        '{"id": "b", "prompt": "Refund 2 dollars.", "reference": "2", "metric": "numeric", "slice": "s"}\n',
        encoding="utf-8",
    )
    overrides = [
        f"model.path={tiny_llama}",
        "model.dtype=float32",
        "quant=int4_wo",
        "calibration.calib_size=16",
        "calibration.min_samples=8",
        f"eval.eval_set={rows}",
        "eval.max_new_tokens=4",
        "build.max_input_len=96",
        "build.max_seq_len=128",
        "model.extra_stop_token_ids=[5]",
        "eval.gate.mode=exploratory",
        "eval.gate.max_kld=100",
        "eval.gate.min_top1=0",
    ]
    cfg = compose(["stages=[evaluate]", f"store_dir={tmp_path / 'store'}", "progress=false", *overrides])
    summary = run_pipeline(cfg, overrides=overrides, console=Console(file=io.StringIO(), width=160))
    assert summary.exit_code == 0, summary.error
    ran = {s.stage for s in summary.stages if s.status == "ran"}
    assert {"export", "quantize", "build", "evaluate"} <= ran
    ev = log["evaluate"]["run"]
    assert {"model.extra_stop_token_ids", "build.max_input_len"} <= ev  # the recorder saw the reads of issue 11
    problems = {name: uncovered(name, cfg, log[name]) for name in ran}
    assert not any(problems.values()), f"config fields read outside the stage's key and not declared runtime: {problems}"


@pytest.mark.parametrize("override", ["build.max_input_len=97", "model.extra_stop_token_ids=[6]", "model.apply_chat_template=false"])
def test_evaluate_key_changes_with_fields_it_reads(override):
    """The fields of issue 11 change evaluate's key (without running anything)."""
    from pipeline.core.stage import get_stage
    from pipeline.core.store import Artifact
    from pipeline.runner import compute_key

    st = get_stage("evaluate")
    inputs = {d: Artifact(d, f"k-{d}", Path("/nonexistent"), {}) for d in ("export", "quantize", "build")}
    k0, _ = compute_key(st, compose([]), inputs, {})
    k1, _ = compute_key(st, compose([override]), inputs, {})
    assert k0 != k1
