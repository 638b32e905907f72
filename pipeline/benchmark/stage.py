"""Benchmark stage: measure the built engine in-process, the packaged Triton deployment over gRPC
streaming, and the transformers baseline (TTFT, TPOT, ITL, latency percentiles, throughput, roofline).

Writes ``benchmark.json`` (schema ``pipeline.benchmark/v1``), ``benchmark.md`` and plots into the
artifact, and copies them to ``benchmark.results_dir`` as ``<stem>.json`` / ``.md`` / ``-*.png`` (:func:`results_stem`:
``<benchmark.name>``, or ``<model.name>-<benchmark.name>`` for a model other than the one the preset is for)
(``make bench`` commits the JSON and Markdown of the standard run). Never cached: a measurement must
run every time. See docs/benchmark.md.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..core.contracts.benchmark import BenchmarkResult
from ..core.stage import Stage, StageContext
from ..errors import InputError, PipelineError


def _inputs(ctx: StageContext):
    from ..core.contracts.build import BuildArtifact, BuildResult, target_of
    from ..core.contracts.export import ExportArtifact
    from ..core.contracts.package import PackageArtifact
    from .core import BenchInputs

    cfg = ctx.cfg
    exp, bld = ExportArtifact(ctx.inputs["export"].path), ctx.inputs["build"]
    pkg = ctx.upstream("package")
    limits = BuildArtifact(bld.path).engine_limits(bld.result_as(BuildResult), cfg.build)
    target = target_of(bld, cfg.target.name)
    engine_dir = BuildArtifact(bld.path).engine_dir
    repo = PackageArtifact(pkg.path).model_repository if pkg is not None else None

    def load_runner() -> Any:
        from ..core.targets import get_target

        return get_target(target).load_runner(engine_dir)

    return BenchInputs(
        hf_dir=exp.hf_dir,
        model_info=exp.model_info(),
        engine_dir=engine_dir if engine_dir.is_dir() else None,
        model_repository=repo,
        eval_set=ctx.external_path("eval_set"),
        corpus=ctx.external_path("corpus"),
        target=target,
        max_input_len=limits.max_input_len,
        max_seq_len=limits.max_seq_len,
        max_batch_size=limits.max_batch_size,
        describe={
            "model_name": cfg.model.name,
            "quant_recipe": cfg.quant.recipe,
            "kv_cache": cfg.quant.kv_cache_dtype,
            "build_preset": cfg.build.name,
            "artifacts": {n: {"key": a.key, "digest": a.digest} for n, a in ctx.inputs.items()},
            # the package settings the served numbers depend on (stream_interval, stream_coalescing, instance_count ...),
            # as the package artifact recorded them, so `pipeline benchmark compare` names them when they differ
            "package": (pkg.doc.config_group("package") if pkg is not None else None),
        },
        load_runner=load_runner,
    )


def _count_levels(b: Any) -> int:
    n = 0
    for m in b.modes:
        n += len(b.baseline_concurrency) if m == "baseline" else len(b.concurrency) + len(b.request_rates)
    return n * int(b.repeats)


def results_stem(cfg: Any) -> str:
    """The name of the result files in ``benchmark.results_dir``: ``<benchmark.name>`` when the run measures the model
    the preset is for, a checkpoint folder inside this repository (the embedded default model, or a model named as the
    preset: ``make bench``'s ``bench/models/llama80m``), else ``<model.name>-<benchmark.name>``, so a user's own model
    never overwrites the committed results of the repository's models (fresh-user trial; a recheck: a folder of the
    user's named ``default`` did)."""
    from ..core.config import CONFIG_DIR, REPO_ROOT, resolve_path

    b, name = cfg.benchmark, str(cfg.model.name or "model")
    try:
        default = yaml.safe_load((CONFIG_DIR / "model" / f"{DEFAULT_MODEL_PRESET}.yaml").read_text(encoding="utf-8"))["path"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        default = None
    path = resolve_path(str(cfg.model.path)) if cfg.model.path else None
    ours = path is not None and path.resolve().is_relative_to(Path(REPO_ROOT).resolve())
    if ours and (name == b.name or (default and path == resolve_path(str(default)))):
        return str(b.name)
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', name).strip('.-') or 'model'}-{b.name}"


#: the model preset of the embedded default model (build_configs/pipeline.yaml ``defaults``)
DEFAULT_MODEL_PRESET = "support_llama"


def _check_results_dir(b: Any, stem: str | None = None) -> None:
    """Before any measurement: ``benchmark.results_dir`` can be created and written, and ``benchmark.name`` is a plain
    file name (it names the result files there).

    Raises:
        InputError: naming the field, the value and the fix (instead of an OSError after the whole run).
    """
    import os

    from ..core.config import resolve_path

    if not b.name or os.sep in b.name or b.name in (".", "..") or "\0" in b.name:
        raise InputError(
            f"benchmark.name={b.name!r}: names the result files, so it must be a plain file name. Fix: e.g. benchmark.name=llama80m."
        )
    results_dir = resolve_path(b.results_dir)
    if results_dir is None:
        return
    probe = results_dir / f".{stem or b.name}.write-test"
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise InputError(
            f"benchmark.results_dir={b.results_dir!r}: cannot write there ({e.strerror or e}: {e.filename or results_dir}). "
            f"Fix: point it at a writable folder, or benchmark.results_dir=null (results stay in the benchmark artifact)."
        ) from None


def run(ctx: StageContext) -> BenchmarkResult:
    from ..core.config import resolve_path
    from .core import run_benchmark
    from .report import write_outputs

    b = ctx.cfg.benchmark
    stem = results_stem(ctx.cfg)
    _check_results_dir(b, stem)
    inp = _inputs(ctx)
    assert ctx.out is not None
    with ctx.progress("benchmark", _count_levels(b)) as advance:
        doc = run_benchmark(b, inp, progress=advance, console=ctx.console)
    paths = write_outputs(doc, ctx.out)
    results_dir = resolve_path(b.results_dir)
    published: list[str] = []
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        for kind, src in paths.items():
            name = f"{stem}.{kind}" if kind in ("json", "md") else f"{stem}-{kind}"
            shutil.copyfile(src, results_dir / name)
            published.append(str(results_dir / name))
        ctx.console.print(f"benchmark results: {results_dir / (stem + '.md')}")
    errors = doc["ratios"]["failed_requests"]["value"]
    if errors and b.fail_on_errors:
        raise PipelineError(
            f"benchmark: {errors} request(s) failed (see {published[0] if published else paths['json']}, runs[].requests[].error). "
            "A deployment that drops requests is not measured correctly; set benchmark.fail_on_errors=false to keep such a result."
        )
    return BenchmarkResult(headline=doc["headline"], ratios={k: v["value"] for k, v in doc["ratios"].items()}, results=published)


def dry_run(ctx: StageContext) -> dict[str, Any]:
    b = ctx.cfg.benchmark
    return {"headline": {"modes": ",".join(b.modes), "levels": _count_levels(b), "requests_per_level": b.num_requests}}


def _external(cfg: Any) -> dict[str, Path]:
    out: dict[str, Path] = {}
    if cfg.eval.eval_set:
        out["eval_set"] = Path(cfg.eval.eval_set)
    if cfg.benchmark.dataset == "synthetic" and cfg.calibration.path and str(cfg.calibration.path).endswith(".jsonl"):
        out["corpus"] = Path(cfg.calibration.path)
    return out


STAGE = Stage(
    name="benchmark",
    deps=("export", "build", "package"),
    config_groups=("benchmark",),
    libraries=("onnxruntime-genai", "onnxruntime", "transformers", "torch", "tritonclient", "numpy", "matplotlib"),
    run=run,
    version="1",
    external_inputs=_external,
    dry_run=dry_run,
    cacheable=False,
)


def load_result(path: str | Path) -> dict[str, Any]:
    """A ``benchmark.json`` (artifact or results_dir copy), schema-checked (see ``pipeline.benchmark.report.load``)."""
    from .report import load

    return load(path)


__all__ = ["STAGE", "load_result"]
