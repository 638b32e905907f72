"""Run a whole benchmark: every mode × level × repeat, then metrics, roofline and ratios.

Entry point: :func:`run_benchmark`. The benchmark stage (``pipeline/benchmark/stage.py``) calls it
with the upstream artifacts; tests call it directly with a freshly built engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..core import hostinfo
from ..core.contracts.benchmark import Distribution
from ..core.contracts.export import ModelInfo
from ..errors import InputError, PipelineError
from . import loadgen
from .metrics import aggregate_repeats, level_metrics
from .records import RequestRecord
from .roofline import Bandwidth, measure_host_bandwidth_gbs, memory_bandwidth, onnx_engine_bytes, roofline_for_level
from .workload import BenchRequest, build_requests, dataset_digest

SCHEMA = "pipeline.benchmark/v1"
log = logging.getLogger("pipeline.benchmark")

# What the team aims for on the 2-core CPU host (docs/benchmark.md); reported, never asserted.
TARGETS = {
    "engine_speedup_tpot_c1": (">=", 3.0, "transformers eager fp32 TPOT / engine TPOT at concurrency 1"),
    "triton_overhead_tpot_c1": ("<=", 1.10, "Triton streamed TPOT / in-process engine TPOT at concurrency 1"),
    "engine_throughput_c8_over_c1": (">=", 3.0, "engine output tokens/s at concurrency 8 / at concurrency 1"),
    "triton_throughput_c8_over_c1": (">=", 3.0, "Triton output tokens/s at concurrency 8 / at concurrency 1"),
    "triton_vs_engine_throughput_c8": (">=", 0.9, "Triton output tokens/s / in-process engine output tokens/s, both at concurrency 8"),
    "engine_vs_builder_int4_tpot_c1": (
        "<=",
        1.15,
        "engine TPOT / onnxruntime-genai builder's own int4 engine TPOT (same checkpoint, mode builder_int4) at concurrency 1",
    ),
    "engine_decode_rate_c8_over_c1": (
        ">=",
        3.0,
        "engine aggregate decode rate (concurrency ÷ TPOT) at concurrency 8 / at 1: the batching gain of the decode "
        "steps alone, prefill excluded (a diagnostic next to engine_throughput_c8_over_c1)",
    ),
    "triton_server_tpot_over_engine_c1": (
        "<=",
        1.10,
        "the engine's TPOT inside Triton (its own first/last token timestamps, return_perf_metrics) / in-process engine "
        "TPOT, both at concurrency 1: how much serving slows the engine itself, delivery lag excluded (a diagnostic "
        "next to triton_overhead_tpot_c1; needs benchmark.per_hop)",
    ),
    "engine_roofline_fraction_c1": (
        ">=",
        0.40,
        "engine decode tokens/s at concurrency 1 / memory-bandwidth bound (bytes read per step ÷ measured host bandwidth)",
    ),
    "failed_requests": ("==", 0, "failed requests over every run"),
}
CEILINGS = {
    "engine_roofline_fraction_c1": (
        1.0,
        "above 1: faster than the memory-bandwidth bound allows, so the bound (weights served from the CPU's caches, "
        "not memory) or the timing (a coalesced stream) is wrong",
    ),
}
"""Ratios no correct measurement can exceed: name -> (ceiling, why). A value above it is reported, never judged."""


def beyond_ceiling(name: str, value: Any) -> str | None:
    """Why ``value`` of ratio ``name`` cannot be judged (:data:`CEILINGS`), or None."""
    ceiling, why = CEILINGS.get(name, (None, ""))
    return why if ceiling is not None and isinstance(value, (int, float)) and value > ceiling else None


@dataclasses.dataclass
class BenchInputs:
    """What a benchmark needs (paths are absolute).

    Attributes:
        hf_dir: the export artifact's ``hf/`` (tokenizer; the baseline's weights).
        model_info: the export artifact's ``model_info.json`` (:class:`pipeline.core.contracts.export.ModelInfo`; eos ids for stop tokens).
        engine_dir: the build artifact's ``engine/`` (engine mode); ``None`` skips engine facts.
        model_repository: the package artifact's ``model_repository/`` (triton mode).
        eval_set / corpus: JSONL prompt sources (dataset=eval / synthetic).
        target: build target name (``onnxruntime_genai`` | ``tensorrt_llm``).
        max_input_len / max_seq_len / max_batch_size: engine limits (from build_info).
        describe: extra facts recorded verbatim in the JSON (artifact keys, quant recipe, ...).
        load_runner: ``f() -> EngineRunner`` for targets without the native onnxruntime-genai driver.
    """

    hf_dir: Path
    model_info: ModelInfo
    engine_dir: Path | None = None
    model_repository: Path | None = None
    eval_set: Path | None = None
    corpus: Path | None = None
    target: str = "onnxruntime_genai"
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_batch_size: int | None = None
    describe: dict[str, Any] = dataclasses.field(default_factory=dict)
    load_runner: Callable[[], Any] | None = None


REFERENCE_MODES = ("builder_int4",)
"""Modes that measure a reference engine built here from the export checkpoint, not the pipeline's artifact."""


def _levels(bcfg: Any, mode: str) -> list[tuple[str, float]]:
    if mode == "baseline":
        conc = list(bcfg.baseline_concurrency)
    elif mode in REFERENCE_MODES:
        conc = list(getattr(bcfg, "reference_concurrency", None) or [1])
    else:
        conc = list(bcfg.concurrency)
    lv: list[tuple[str, float]] = [("concurrency", int(c)) for c in conc]
    if mode not in ("baseline", *REFERENCE_MODES):
        lv += [("request_rate", float(r)) for r in bcfg.request_rates]
    return lv


def _level_seed(base: int, repeat: int, idx: int) -> int:
    return int(base) + 1000 * repeat + idx


def _compact(rec: RequestRecord) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": rec.request_id,
        "isl": rec.input_len,
        "requested": rec.requested_output_len,
        "osl": rec.output_len,
        "reported": rec.reported_output_len,
        "finish": rec.finish_reason,
    }
    if rec.ok:
        d.update(ttft_ms=rec.ttft * 1e3, e2e_ms=rec.e2e * 1e3, tpot_ms=None if rec.tpot is None else rec.tpot * 1e3)
    if rec.error:
        d["error"] = rec.error
    return d


def _make_backend(mode: str, bcfg: Any, inp: BenchInputs, stop_ids: list[int]) -> tuple[Any, Callable[[], None]]:
    """(backend, closer) for ``mode``; raises PreflightError/InputError with the fix."""
    b: Any  # one of the .backends / .triton backend classes (start, close, generate)
    if mode == "engine":
        if inp.engine_dir is not None and (inp.engine_dir / "genai_config.json").exists():
            from .backends import OrtEngineBackend

            b = OrtEngineBackend(inp.engine_dir, ignore_eos=bcfg.ignore_eos, stop_token_ids=stop_ids)
        elif inp.load_runner is not None:
            from .backends import RunnerBackend

            b = RunnerBackend(inp.load_runner(), ignore_eos=bcfg.ignore_eos, stop_token_ids=stop_ids)
        else:
            raise InputError(
                f"benchmark.modes has 'engine' but no runnable engine was found at {inp.engine_dir}. Fix: run the build stage first."
            )
        b.start()
        return b, b.close
    if mode == "builder_int4":
        import shutil
        import tempfile

        from .backends import OrtEngineBackend
        from .reference import build_builder_int4

        tmp = Path(tempfile.mkdtemp(prefix="bench-builder-int4-"))
        try:
            engine_dir = build_builder_int4(inp.hf_dir, tmp, max_batch_size=inp.max_batch_size, max_seq_len=inp.max_seq_len)
            b = OrtEngineBackend(engine_dir, ignore_eos=bcfg.ignore_eos, stop_token_ids=stop_ids)
            b.start()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

        def close_ref() -> None:
            b.close()
            shutil.rmtree(tmp, ignore_errors=True)

        return b, close_ref
    if mode == "baseline":
        from .backends import TransformersBackend

        b = TransformersBackend(inp.hf_dir, ignore_eos=bcfg.ignore_eos, stop_token_ids=stop_ids)
        b.start()
        return b, b.close
    if mode == "triton":
        from .triton import TritonBackend

        if inp.model_repository is None or not inp.model_repository.is_dir():
            raise InputError(
                f"benchmark.modes has 'triton' but no model repository was found at {inp.model_repository}. Fix: run the package stage first, or drop triton from benchmark.modes."
            )
        b = TritonBackend(inp.model_repository, bcfg=bcfg, ready_timeout_s=float(getattr(bcfg, "server_ready_timeout_s", 180.0)))
        b.start()
        return b, b.close
    raise InputError(f"benchmark.modes: unknown mode {mode!r}; use engine, triton or baseline.")


class _Workloads(NamedTuple):
    """The requests of a benchmark: warm-up, and one seeded workload per (repeat, level kind, level)."""

    warmup: list[BenchRequest]
    levels: list[tuple[str, float]]  # every (kind, level) of every mode, in first-seen order
    by_level: dict[tuple[int, str, float], tuple[int, list[BenchRequest]]]  # (repeat, kind, level) -> (seed, requests)


@dataclasses.dataclass
class _Sweep:
    """What the sweep has measured so far (filled by :func:`_start_backends` and :func:`_measure_level`)."""

    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    mode_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    facts_by_mode: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: mode -> (backend, close, engine facts, batch limit)
    backends: dict[str, tuple[Any, Callable[[], None], Any, Any]] = dataclasses.field(default_factory=dict)
    engine_max_batch_size: int | None = None  # the engine mode's batch limit, once it runs
    #: (run index, engine facts, metrics, concurrency, batch limit, measured batch): roofline computed after the sweep
    pending_roofline: list[tuple[int, Any, dict[str, Any], int, Any, Any]] = dataclasses.field(default_factory=list)


def run_benchmark(bcfg: Any, inp: BenchInputs, *, progress: Callable[[float], None] | None = None, console: Any = None) -> dict[str, Any]:
    """Run the benchmark described by ``bcfg`` (a :class:`~pipeline.core.config.benchmark.BenchmarkConfig`).

    Returns the ``pipeline.benchmark/v1`` document (see docs/benchmark.md for every field).
    Failed requests are counted, never raised; a backend that cannot start raises
    :class:`PreflightError` / :class:`InputError` with the fix.
    """
    from transformers import AutoTokenizer

    from ..core.tokenization import stop_token_ids

    unknown = [t for t in (getattr(bcfg, "targets", None) or []) if t not in TARGETS]
    if unknown:
        raise InputError(f"benchmark.targets={unknown}: unknown ratio(s); known: {list(TARGETS)}")
    t_begin = time.time()
    load_start = _loadavg()
    tok = AutoTokenizer.from_pretrained(str(inp.hf_dir), trust_remote_code=False)
    stop_ids = stop_token_ids(inp.model_info.eos_token_ids)
    wl = _build_workloads(bcfg, inp, tok)
    engine_facts = _engine_facts(inp)
    bw = memory_bandwidth()
    sweep = _Sweep()
    try:
        # every backend is started and warmed up first; then each level is measured mode after mode, so the ratios
        # between modes compare measurements taken minutes apart at most, not a whole mode's sweep apart
        _start_backends(bcfg, inp, stop_ids, wl.warmup, engine_facts, sweep)
        for rep in range(int(bcfg.repeats)):
            for kind, level in wl.levels:
                for mode in bcfg.modes:
                    if (kind, level) not in _levels(bcfg, mode):
                        continue
                    _measure_level(bcfg, sweep, mode, rep, kind, level, wl.by_level[(rep, kind, level)], console)
                    if progress:
                        progress(1)
    finally:
        for _, close, _, _ in sweep.backends.values():
            try:
                close()
            except Exception as e:
                log.warning("closing a benchmark backend failed: %s", e)
    _apply_roofline(bw, sweep)
    return _document(bcfg, inp, wl, sweep, bw, engine_facts, load_start, t_begin)


def _build_workloads(bcfg: Any, inp: BenchInputs, tok: Any) -> _Workloads:
    """Warm-up requests and the workload of each (repeat, level); the workload of a (repeat, level) is the same for
    every mode, so modes compare like for like."""
    n = int(bcfg.num_requests)
    warm_reqs = (
        build_requests(
            bcfg,
            tok,
            int(bcfg.warmup_requests),
            seed=int(bcfg.seed) + 10**6,
            eval_set=inp.eval_set,
            corpus=inp.corpus,
            max_input_len=inp.max_input_len,
            max_seq_len=inp.max_seq_len,
            prefix="warmup",
        )
        if bcfg.warmup_requests
        else []
    )
    workloads: dict[tuple[int, str, float], tuple[int, list[BenchRequest]]] = {}
    all_levels: list[tuple[str, float]] = []
    for m in bcfg.modes:
        for lv in _levels(bcfg, m):
            if lv not in all_levels:
                all_levels.append(lv)
    for rep in range(int(bcfg.repeats)):
        for i, lv in enumerate(all_levels):
            seed = _level_seed(bcfg.seed, rep, i)
            workloads[(rep, *lv)] = (
                seed,
                build_requests(
                    bcfg,
                    tok,
                    n,
                    seed=seed,
                    eval_set=inp.eval_set,
                    corpus=inp.corpus,
                    max_input_len=inp.max_input_len,
                    max_seq_len=inp.max_seq_len,
                    prefix=f"r{rep}-{lv[0][0]}{lv[1]:g}",
                ),
            )
    return _Workloads(warm_reqs, all_levels, workloads)


def _engine_facts(inp: BenchInputs) -> dict[str, Any] | None:
    """Weight/KV sizes of the build's onnxruntime-genai engine for the roofline (None: no such engine, or unreadable)."""
    if inp.engine_dir is None or not (inp.engine_dir / "genai_config.json").exists():
        return None
    try:
        return onnx_engine_bytes(inp.engine_dir)
    except Exception as e:
        log.warning("could not read engine weight sizes for the roofline: %s", e)
        return None


def _start_backends(
    bcfg: Any, inp: BenchInputs, stop_ids: list[int], warm_reqs: list[BenchRequest], engine_facts: Any, sweep: _Sweep
) -> None:
    """Start and warm up every mode's backend (registered in ``sweep.backends`` as soon as it runs, so the caller
    closes it on any error). Raises PipelineError when every warm-up request of a mode fails."""
    for mode in bcfg.modes:
        t_mode = time.time()
        backend, close = _make_backend(mode, bcfg, inp, stop_ids)
        facts = engine_facts
        if mode in REFERENCE_MODES:
            try:
                facts = onnx_engine_bytes(backend.engine_dir)
            except Exception as e:
                log.warning("could not read the %s engine's weight sizes: %s", mode, e)
                facts = None
        if facts and mode != "baseline":
            sweep.facts_by_mode[mode] = facts
        sweep.backends[mode] = (backend, close, facts, None)
        warm_ok, warm_errors = asyncio.run(loadgen.warmup(backend, warm_reqs, float(bcfg.max_duration_s)))
        if warm_reqs and warm_ok == 0:
            raise PipelineError(f"benchmark {mode}: every warm-up request failed ({'; '.join(warm_errors)[:500]}); nothing to measure.")
        mbs = getattr(backend, "max_batch_size", None) or inp.max_batch_size
        if mode == "triton" and sweep.engine_max_batch_size:
            # the served engine batches no more than the in-process engine measured (same engine folder)
            mbs = min(mbs or 10**9, sweep.engine_max_batch_size)
        if mode == "engine":
            sweep.engine_max_batch_size = mbs
        sweep.backends[mode] = (backend, close, facts, mbs)
        sweep.mode_info[mode] = {
            "warmup_requests": len(warm_reqs),
            "warmup_ok": warm_ok,
            "max_batch_size": mbs,
            "backend": type(backend).__name__,
            **getattr(backend, "describe", lambda: {})(),
            "seconds": round(time.time() - t_mode, 2),
        }


def _measure_level(
    bcfg: Any,
    sweep: _Sweep,
    mode: str,
    rep: int,
    kind: str,
    level: float,
    workload: tuple[int, list[BenchRequest]],
    console: Any,
) -> None:
    """Run one (mode, repeat, level): closed loop at ``level`` concurrency or open loop at ``level`` requests/s;
    append the run to ``sweep.runs`` (roofline filled in later by :func:`_apply_roofline`)."""
    t_level = time.time()
    backend, _, facts, mbs = sweep.backends[mode]
    seed, reqs = workload
    c0 = backend.counters() if hasattr(backend, "counters") else None
    if kind == "concurrency":
        lr = asyncio.run(loadgen.closed_loop(backend, reqs, int(level), float(bcfg.max_duration_s)))
    else:
        lr = asyncio.run(loadgen.open_loop(backend, reqs, float(level), seed, float(bcfg.max_duration_s)))
    met = level_metrics(lr.records)
    batch = None  # mean sequences decoded per engine step (engine mode)
    if c0 is not None:
        c1 = backend.counters()
        steps = c1["steps"] - c0["steps"]
        batch = (c1["token_events"] - c0["token_events"]) / steps if steps else None
        met["engine_steps"] = {
            "steps": steps,
            "mean_batch": batch,
            "mean_admitted": (c1["active_sum"] - c0["active_sum"]) / steps if steps else None,
            "definition": "Engine.run calls that produced tokens; mean sequences decoded per call (batch); "
            "mean requests admitted to the engine per call (batch + waiting)",
        }
    conc = int(level) if kind == "concurrency" else None
    sweep.pending_roofline.append((len(sweep.runs), facts if mode != "baseline" else None, met, conc if conc else 1, mbs, batch))
    sweep.runs.append(
        {
            "mode": mode,
            "kind": kind,
            "concurrency": conc,
            "request_rate": level if kind == "request_rate" else None,
            "repeat": rep,
            "seed": seed,
            "dataset_digest": dataset_digest(reqs),
            "timed_out": lr.timed_out,
            "wall_s": lr.t_end - lr.t_start,
            "loadavg_1m": _loadavg(),
            "metrics": met,
            "roofline": None,
            "requests": [_compact(r) for r in lr.records],
        }
    )
    sweep.mode_info[mode]["seconds"] = round(sweep.mode_info[mode]["seconds"] + time.time() - t_level, 2)
    if console is not None:
        ttft, tpot = Distribution.from_json(met["time_to_first_token"]), Distribution.from_json(met["time_per_output_token"])
        console.print(
            f"  {mode:<8} {'c' if kind == 'concurrency' else 'rate'}={level:g} r{rep}: "
            f"TTFT p50 {math.nan if ttft.p50 is None else ttft.p50:.1f} ms  "
            f"TPOT {math.nan if tpot.avg is None else tpot.avg:.2f} ms  "
            f"{met['output_token_throughput']['avg']:.0f} tok/s  err {met['requests']['errors']}  "
            f"load {sweep.runs[-1]['loadavg_1m']}",
            soft_wrap=True,
        )


def _apply_roofline(bw: Bandwidth, sweep: _Sweep) -> None:
    """Fill each run's ``roofline`` (:func:`roofline_for_level`).

    On a shared host a copy benchmark taken while other jobs run understates the memory system: measure again at
    the end and take the higher figure as the host's bandwidth (both are recorded)."""
    bw.gbs_start = bw.gbs
    if not hostinfo.gpus():
        bw.gbs_end = measure_host_bandwidth_gbs()
        bw.gbs = max(bw.gbs, bw.gbs_end)
    for i, facts, met, conc, mbs, batch in sweep.pending_roofline:
        if facts:
            sweep.runs[i]["roofline"] = roofline_for_level(facts, bw.gbs, met, conc, mbs, measured_batch=batch)


def _document(
    bcfg: Any,
    inp: BenchInputs,
    wl: _Workloads,
    sweep: _Sweep,
    bw: Bandwidth,
    engine_facts: dict[str, Any] | None,
    load_start: float | None,
    t_begin: float,
) -> dict[str, Any]:
    """The ``pipeline.benchmark/v1`` document (docs/benchmark.md), with summary, ratios and headline."""
    runs = sweep.runs
    summary = summarize(runs)
    source = inp.eval_set if bcfg.dataset == "eval" else (inp.corpus or inp.eval_set)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "name": bcfg.name,
        "config": _cfg_dict(bcfg),
        "seeds": {
            "base": int(bcfg.seed),
            "warmup": int(bcfg.seed) + 10**6,
            "levels": {f"r{rep}/{k}={lv:g}": s for (rep, k, lv), (s, _) in wl.by_level.items()},
        },
        "dataset": {
            "kind": bcfg.dataset,
            "source": str(source),
            "source_sha256": _sha(source),
            "digest": _digest_all(wl.by_level),
            "requests_per_level": int(bcfg.num_requests),
        },
        "model": {
            "hf_dir": str(inp.hf_dir),
            "engine_dir": str(inp.engine_dir) if inp.engine_dir else None,
            "model_repository": str(inp.model_repository) if inp.model_repository else None,
            "target": inp.target,
            "limits": {"max_input_len": inp.max_input_len, "max_seq_len": inp.max_seq_len, "max_batch_size": inp.max_batch_size},
            **inp.describe,
        },
        "host": {**hostinfo.host(), "loadavg_1m_start": load_start, "loadavg_1m_end": _loadavg(), "sched_autogroup": _autogroup()},
        "versions": hostinfo.library_versions(["onnxruntime-genai", "onnxruntime", "torch", "transformers", "tritonclient"]),
        "modes": sweep.mode_info,
        "roofline": {
            "bandwidth_gbs": bw.gbs,
            "bandwidth_source": bw.source,
            "bandwidth_gbs_start": bw.gbs_start,
            "bandwidth_gbs_end": bw.gbs_end,
            **(engine_facts or {}),
            "per_mode": sweep.facts_by_mode,
            "formula": "bound_tokens_per_s(b) = b * BW / (W + b * KV(L)); fraction = (b / TPOT) / bound",
        },
        "runs": runs,
        "summary": summary,
        "ratios": ratios(summary, runs, judged=list(getattr(bcfg, "targets", None) or [])),
        "seconds": round(time.time() - t_begin, 2),
    }
    doc["headline"] = headline(doc)
    return doc


def _autogroup() -> bool | None:
    """Linux ``kernel.sched_autogroup_enabled``: when on, every session (the Triton server is started in its own)
    gets an equal CPU share under contention, so on a loaded host the server process can out-run an in-process
    engine that shares the benchmark's session with other work (docs/benchmark.md)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return None


def _loadavg() -> float | None:
    """1-minute load average (other work on a shared host changes every figure; recorded, not corrected)."""
    try:
        import os

        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _cfg_dict(bcfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(bcfg) and not isinstance(bcfg, type):
        return dataclasses.asdict(bcfg)
    try:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(bcfg, resolve=True)  # type: ignore[return-value]
    except Exception:
        return dict(bcfg)


def _sha(p: Path | None) -> str | None:
    if p is None or not Path(p).is_file():
        return None
    from ..core.store import sha256_file

    return sha256_file(p)


def _digest_all(workloads: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for k in sorted(workloads, key=str):
        h.update(str(k).encode())
        h.update(dataset_digest(workloads[k][1]).encode())
    return h.hexdigest()


def level_key(r: dict[str, Any]) -> str:
    """``"engine/concurrency=1"``: how runs and summaries are matched across documents."""
    lv = r["concurrency"] if r["kind"] == "concurrency" else r["request_rate"]
    return f"{r['mode']}/{r['kind']}={lv:g}"


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (mode, level): repeat-0 metrics + the spread of headline metrics over repeats."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(level_key(r), []).append(r)
    out = []
    for key, rs in groups.items():
        r0 = rs[0]
        out.append(
            {
                "key": key,
                "mode": r0["mode"],
                "kind": r0["kind"],
                "concurrency": r0["concurrency"],
                "request_rate": r0["request_rate"],
                "repeats": len(rs),
                "spread": aggregate_repeats([r["metrics"] for r in rs]),
                "errors": sum(r["metrics"]["requests"]["errors"] for r in rs),
                "roofline_fraction": [r["roofline"]["fraction"] for r in rs if r["roofline"]],
            }
        )
    return out


def _mean(summary: Sequence[dict[str, Any]], key: str, path: str) -> float | None:
    for s in summary:
        if s["key"] == key:
            v = s["spread"].get(path)
            return v["mean"] if v else None
    return None


def _roofline_fraction(summary: Sequence[dict[str, Any]], key: str) -> float | None:
    for s in summary:
        if s["key"] == key and s["roofline_fraction"]:
            f = s["roofline_fraction"]
            return sum(f) / len(f)
    return None


def ratios(summary: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], judged: Sequence[str] | None = None) -> dict[str, Any]:
    """The headline ratios of docs/benchmark.md with their targets (``None`` when a run is missing).

    ``judged``: the ratios this benchmark holds to their targets (``benchmark.targets``; empty = all); the others
    are reported with ``met: None`` and ``judged: False``. A value above its :data:`CEILINGS` entry is ``met: None``
    with ``why`` (judged or not): a roofline fraction of 1.4 is a wrong bound or timing, not a met target."""
    tp = "time_per_output_token.avg"
    thr = "output_token_throughput.avg"

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    vals = {
        "engine_speedup_tpot_c1": div(_mean(summary, "baseline/concurrency=1", tp), _mean(summary, "engine/concurrency=1", tp)),
        "triton_overhead_tpot_c1": div(_mean(summary, "triton/concurrency=1", tp), _mean(summary, "engine/concurrency=1", tp)),
        "engine_throughput_c8_over_c1": div(_mean(summary, "engine/concurrency=8", thr), _mean(summary, "engine/concurrency=1", thr)),
        "triton_throughput_c8_over_c1": div(_mean(summary, "triton/concurrency=8", thr), _mean(summary, "triton/concurrency=1", thr)),
        "triton_vs_engine_throughput_c8": div(_mean(summary, "triton/concurrency=8", thr), _mean(summary, "engine/concurrency=8", thr)),
        "engine_vs_builder_int4_tpot_c1": div(_mean(summary, "engine/concurrency=1", tp), _mean(summary, "builder_int4/concurrency=1", tp)),
        "engine_decode_rate_c8_over_c1": div(
            div(8.0, _mean(summary, "engine/concurrency=8", tp)), div(1.0, _mean(summary, "engine/concurrency=1", tp))
        ),
        "triton_server_tpot_over_engine_c1": div(
            _mean(summary, "triton/concurrency=1", "serving_path.server_time_per_output_token.avg"),
            _mean(summary, "engine/concurrency=1", tp),
        ),
        "engine_roofline_fraction_c1": _roofline_fraction(summary, "engine/concurrency=1"),
        "failed_requests": sum(r["metrics"]["requests"]["errors"] for r in runs),
    }
    out = {}
    for k, v in vals.items():
        op, target, what = TARGETS[k]
        met = None
        is_judged = not judged or k in judged
        why = beyond_ceiling(k, v)
        if v is not None and is_judged and why is None:
            met = bool(v >= target) if op == ">=" else bool(v <= target) if op == "<=" else bool(v == target)
        out[k] = {"value": v, "target": f"{op} {target}", "met": met, "judged": is_judged, "definition": what, "why": why}
    return out


def headline(doc: dict[str, Any]) -> dict[str, Any]:
    """Manifest headline: the first mode's concurrency-1 TPOT/TTFT (ms) and best output tokens/s."""
    out: dict[str, Any] = {}
    summ = doc["summary"]
    for mode in ("triton", "engine", "baseline"):
        k = f"{mode}/concurrency=1"
        if any(s["key"] == k for s in summ):
            out["mode"] = mode
            out["tpot_ms"] = _mean(summ, k, "time_per_output_token.avg")
            out["ttft_ms"] = _mean(summ, k, "time_to_first_token.avg")
            out["tok_s"] = max(
                (_mean(summ, s["key"], "output_token_throughput.avg") or 0.0 for s in summ if s["mode"] == mode), default=None
            )
            break
    out["errors"] = doc["ratios"]["failed_requests"]["value"]
    return out
