"""Build stage: turn the quantize artifact into an engine for the resolved target.

Inputs: the export artifact (``hf/``, ``model_info.json``) and the quantize artifact (``hf/``,
``trtllm_checkpoint/``, ``quant_state.*``).  Output (docs/artifacts.md): ``engine/``,
``build_info.json``, ``build.log``; result ``headline`` {target, engine_mb} and ``limits``.

The target (``target=auto|onnxruntime_genai|tensorrt_llm``) is resolved once per run
(:func:`pipeline.core.targets.resolve_target`), printed with its reason, recorded in ``build_info.json``
and part of the cache key (``key_extras``), so an auto run on a GPU host never reuses a CPU engine.
"""

from __future__ import annotations

import shlex
from typing import Any

from ..core.contracts.build import BuildArtifact, BuildInfo, BuildPlan, BuildResult
from ..core.stage import Stage, StageContext
from ..core.store import write_json_atomic
from .checks import checks


def _key_extras(cfg: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    from ..core.targets import resolve_target

    name, _ = resolve_target(cfg)
    extras: dict[str, Any] = {"target": name}
    if name == "tensorrt_llm":  # engines are specific to the GPU (SM) and the TensorRT-LLM version
        from ..core.hostinfo import gpus
        from .targets.tensorrt_llm.versions import installed_version

        g = gpus()
        extras["gpu"] = cfg.target.gpu or (f"{g[0]['name']} SM{g[0]['compute_capability']}" if g else None)
        extras["tensorrt_llm"] = installed_version()
    return extras


def _announce(ctx: StageContext) -> tuple[str, str]:
    from ..core.targets import resolve_target

    name, reason = resolve_target(ctx.cfg)
    ctx.console.print(f"[bold]build target:[/] {name}  ({reason})")
    ctx.log.info("build target %s: %s", name, reason)
    return name, reason


def _portable(obj: Any, places: dict[str, str]) -> Any:
    """``obj`` with every string that starts with one of the ``places`` folders (the staging folder of this build, the
    input artifacts) rewritten to start with its placeholder (``<build>/engine``): ``build_info.json`` names no
    temporary or store-specific path, so a rebuild into another store has the same bytes."""
    if isinstance(obj, dict):
        return {k: _portable(v, places) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_portable(v, places) for v in obj]
    if isinstance(obj, str):
        for folder, name in places.items():
            if obj == folder or obj.startswith(folder + "/"):
                return name + obj[len(folder) :]
    return obj


def _run(ctx: StageContext) -> BuildResult:
    from ..core.targets import get_target

    name, reason = _announce(ctx)
    target = get_target(name)
    quant = ctx.inputs["quantize"].path
    export = ctx.inputs["export"].path
    assert ctx.out is not None
    target.preflight(ctx.cfg, quant, ctx.out)
    out = BuildArtifact(ctx.out)
    out.build_log_path.touch()
    with ctx.progress(f"building {name} engine", None):
        info = target.build(ctx.cfg, quant, ctx.out, ctx.log, export_dir=export)
    info["target_reason"] = reason
    measured = {k: info.pop(k) for k in BuildArtifact.MEASUREMENTS if k in info}
    ctx.manifest["measurements"] = measured  # not in the content digest: a rebuild from the same inputs has the same bytes
    places = {str(ctx.out): "<build>", str(quant): "<quantize>", str(export): "<export>"}
    write_json_atomic(out.build_info_path, _portable(info, places))
    engine_mb = round(info["engine_bytes"] / 1e6, 3)
    ctx.console.print(f"  engine: {engine_mb} MB in {BuildInfo.from_json(measured).build_s or 0.0:.1f} s  limits={info['limits']}")
    return BuildResult(
        headline={"target": name, "engine_mb": engine_mb}, limits=info["limits"], target=name, backend=info["backend"], target_reason=reason
    )


def _dry_run(ctx: StageContext) -> dict[str, Any]:
    from ..core.targets import get_target

    name, reason = _announce(ctx)
    target = get_target(name)
    quant = ctx.inputs["quantize"].path if "quantize" in ctx.inputs else None
    export = ctx.inputs["export"].path if "export" in ctx.inputs else None
    plan = BuildPlan.from_json(target.plan(ctx.cfg, quant, export, None))
    if plan.command:
        ctx.console.print("[yellow]dry run:[/] build command:\n  " + shlex.join(str(c) for c in plan.command))
    if plan.llm_api_options:
        import yaml

        ctx.console.print("[yellow]dry run:[/] llm_api_options.yaml:\n" + yaml.safe_dump(plan.llm_api_options, sort_keys=False))
    ok, why = target.available()
    return {"headline": {"target": name, "available": ok}, "command": plan.command, "target_reason": reason, "available": why}


STAGE = Stage(
    name="build",
    checks=checks,
    deps=("export", "quantize"),
    config_groups=("target", "build", "quant", "parallel"),
    libraries=("onnxruntime-genai", "onnx", "tensorrt-llm", "tensorrt", "nvidia-modelopt", "transformers"),
    run=_run,
    version="1",
    key_extras=_key_extras,
    dry_run=_dry_run,
)
