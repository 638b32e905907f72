"""The ``onnxruntime_genai`` target: a real engine built with onnxruntime-genai's model builder.

Build (``python -m onnxruntime_genai.models.builder``, run as a subprocess so its log lands in
``build.log``):

* recipe ``none``: the export checkpoint, fp32 weights on the CPU EP (fp16 on the CUDA EP; the
  builder's valid CPU precisions are fp32/int4/int8);
* ``int4_awq`` / ``int4_wo`` / ``int8_wo``: ModelOpt's simulated-quant model from the quantize
  artifact (``pipeline.core.quant_state.load_simulated_model``) is converted *exactly* to a GPTQ-format
  checkpoint (:mod:`pipeline.build.targets.onnxruntime_genai.quant`: same integers, same scales, AWQ pre_quant_scale
  folded or applied as an ONNX Mul) and built as MatMulNBits (4 or 8 bit) - never re-quantized.

Engine limits go into ``engine/genai_config.json`` (``search.max_length = build.max_seq_len``) and,
for the limits the runtime config has no key for on a non-paged CPU model, ``engine/engine_limits.json``
(``max_batch_size``, ``max_input_len``, ``max_seq_len``), which :class:`OrtEngineRunner` enforces.

Runtime: :class:`OrtEngineRunner` drives onnxruntime-genai's continuous-batching ``og.Engine``
(requests submitted as they free up slots, tokens streamed as events, cancellation at stop ids);
if the installed package has no ``Engine`` it falls back to sequential ``og.Generator`` and says so.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ....core.config.common import Problem, problems_where
from ....core.contracts.build import BuildArtifact, EngineLimits
from ....core.genai import run_logged, set_runtime_limits
from ....core.targets.base import Capabilities, GenerationRequest, GenerationResult, Target, TokenCallback
from ....errors import InputError, PipelineError, PreflightError

log = logging.getLogger("pipeline.build.targets.onnxruntime_genai.builder")

SUPPORTED_RECIPES = ("none", "int4_awq", "int4_rtn", "int4_wo", "int8_wo")
"""Recipes whose weights this target deploys unchanged: float, and integer weight-only (MatMulNBits 4/8 bit)."""
_NO_ACT_QUANT = "it needs activation quantization kernels (FP8 or INT8 activations) onnxruntime-genai's MatMulNBits does not have"
CAPABILITIES = Capabilities(
    name="onnxruntime_genai",
    device="cpu",
    recipes=SUPPORTED_RECIPES,
    refused_recipes={
        "fp8": _NO_ACT_QUANT,
        "int8_sq": _NO_ACT_QUANT,
        "w4a8_awq": _NO_ACT_QUANT,
        "auto": "it mixes per-layer weight formats (int4/int8/float), and this target's converter writes one weight format per model",
    },
    kv_cache_dtypes=("none",),
    beam_search=False,  # OrtEngineRunner is greedy; check_config refuses build.max_beam_width != 1
    logits=True,  # next_token_logits / og_teacher_forced_logits (pipeline.evaluate.runners)
    sliding_window=True,  # the model builder reads config.json sliding_window (families.py refuses the broken batch>1 case)
    streaming=True,  # og.Engine token events -> on_token
    max_batch_size=None,
)
"""What this target can do (pipeline.core.targets.capabilities)."""
LIMITS_FILE = BuildArtifact.ENGINE_LIMITS
BUILDER = "onnxruntime_genai.models.builder"


def _dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file())


def _quant_problems(cfg: Any) -> list[Problem]:
    """:meth:`OnnxRuntimeGenAITarget.check_config`: recipe, KV cache and the modules kept in high precision."""
    q = cfg.quant
    fix = f"use quant=<one of {list(SUPPORTED_RECIPES)}> with target=onnxruntime_genai, or target=tensorrt_llm on an NVIDIA GPU"
    if q.recipe == "auto":
        fix += " (to measure quant=auto on CPU: stages=[export,quantize,evaluate] eval.runners=[baseline,simulated])"
    refusal = CAPABILITIES.recipe_refusal(q.recipe)
    return problems_where(
        (
            refusal is not None,
            "quant.recipe",
            q.recipe,
            f"target onnxruntime_genai cannot execute this recipe on {cfg.target.execution_provider} ({refusal}); "
            f"it supports {list(SUPPORTED_RECIPES)}.",
            fix,
        ),
        (
            q.kv_cache_dtype not in CAPABILITIES.kv_cache_dtypes,
            "quant.kv_cache_dtype",
            q.kv_cache_dtype,
            "target onnxruntime_genai deploys an unquantized KV cache only.",
            "set quant.kv_cache_dtype=none",
        ),
        (
            q.recipe != "none" and q.sensitive_preset != "none",
            "quant.sensitive_preset",
            q.sensitive_preset,
            "target onnxruntime_genai reads quantized checkpoints whose decoder projections are all quantized.",
            "set quant.sensitive_preset=none",
        ),
        (
            q.recipe != "none" and any(m not in ("lm_head",) for m in q.exclude_modules),
            "quant.exclude_modules",
            list(q.exclude_modules),
            "target onnxruntime_genai can keep only lm_head in high precision.",
            "set quant.exclude_modules=[lm_head]",
        ),
    )


def _build_problems(cfg: Any) -> list[Problem]:
    """:meth:`OnnxRuntimeGenAITarget.check_config`: one device, no speculative decoding, limits, beam width,
    MatMulNBits accuracy level."""
    b = cfg.build
    # build.max_input_len < build.max_seq_len holds for every target: pipeline/build/checks.py checks it once
    return problems_where(
        *(
            (
                getattr(cfg.parallel, f) != 1,
                f"parallel.{f}",
                getattr(cfg.parallel, f),
                "target onnxruntime_genai runs on one device.",
                f"set parallel.{f}=1",
            )
            for f in ("tp_size", "pp_size")
        ),
        (
            b.speculative.mode != "none",
            "build.speculative.mode",
            b.speculative.mode,
            "speculative decoding is not wired for target onnxruntime_genai.",
            "set build.speculative.mode=none",
        ),
        (
            b.max_beam_width != 1,
            "build.max_beam_width",
            b.max_beam_width,
            "the engine runner is greedy (beam width 1).",
            "set build.max_beam_width=1",
        ),
        (
            cfg.target.accuracy_level not in (0, 1, 2, 3, 4),
            "target.accuracy_level",
            cfg.target.accuracy_level,
            "must be 0-4 (MatMulNBits accuracy_level).",
            "use 1 (fp32 activations, the quantized checkpoint's exact numerics) or 4 (int8 activations, faster)",
        ),
    )


class _BuilderSource(NamedTuple):
    """What the onnxruntime-genai model builder reads: a folder, the precision and its extra options."""

    path: Path
    precision: str  # builder -p: fp32 | fp16 | int8 | int4
    conv: dict[str, Any]  # :func:`pipeline.build.targets.onnxruntime_genai.quant.convert`'s result ({} for recipe none)
    extra_options: list[str]


def _builder_source(cfg: Any, checkpoint: Path, export_dir: Path | None, work: Path, model: Any, lg: Any) -> _BuilderSource:
    """Recipe none: the checkpoint's ``hf/`` in fp32 (cpu) / fp16. Quantized: ModelOpt's simulated-quant model written
    as a GPTQ-format checkpoint (:func:`pipeline.build.targets.onnxruntime_genai.quant.convert`; integers and scales unchanged).

    Raises: InputError (no export artifact for a quantized recipe; weights that cannot be deployed exactly).
    """
    rec, ep = cfg.quant.recipe, cfg.target.execution_provider
    hf = checkpoint / "hf" if (checkpoint / "hf").is_dir() else checkpoint
    extra = ["hf_token=false", "hf_remote=false"]
    if rec == "none":
        return _BuilderSource(hf, "fp32" if ep == "cpu" else "fp16", {}, extra)
    if export_dir is None:
        raise InputError("build: a quantized recipe needs the export artifact (hf/) to rebuild ModelOpt's simulated-quant model.")
    from .quant import ConversionError, convert

    restored = model is None
    if model is None:
        from ....core.quant_state import load_simulated_model

        lg.info("restoring ModelOpt's simulated-quant model from %s", checkpoint)
        model = load_simulated_model(checkpoint, Path(export_dir), device="cpu")
    hf_src = Path(export_dir) / "hf" if (Path(export_dir) / "hf").is_dir() else Path(export_dir)
    try:
        conv = convert(model, hf_src, work / "gptq_checkpoint", consume=restored)  # a model of our own: freed layer by layer
    except ConversionError as e:
        raise InputError(f"quant.recipe={rec}: the quantized weights cannot be deployed exactly on onnxruntime_genai: {e}") from e
    extra.append(f"accuracy_level={cfg.target.accuracy_level}")
    if any(f"/attn/{n}/" in node for node, _ in conv["prescale_muls"] for n in ("q_proj", "k_proj", "v_proj")):
        extra.append("fuse_qkv=false")  # a Mul in front of q/k/v needs their separate MatMuls (quant.resmooth=false)
    # the embedding stays the float table ModelOpt looks up; the LM head is quantized exactly when ModelOpt did
    extra.append("shared_embeddings=false")
    extra.append(
        "nodes_to_exclude=" + ",".join((["/lm_head/MatMul"] if not conv["lm_head_quantized"] else []) + ["/model/embed_tokens/Gather"])
    )
    return _BuilderSource(work / "gptq_checkpoint", "int8" if conv["bits"] == 8 else "int4", conv, extra)


def _finish_graph(onnx_path: Path, logf: Path, conv: dict[str, Any], rec: str, lg: Any) -> tuple[str | None, int, dict[str, Any] | None]:
    """After the builder: fix its LM-head input, insert the pre-quant-scale ``Mul`` nodes, and (quantized recipes)
    check that the graph deploys the converted checkpoint. Returns (graph fix note, Mul nodes inserted, graph check).

    Raises: PipelineError when the graph does not deploy the quantized checkpoint as reported.
    """
    from .quant import ConversionError, check_deployed_graph, fix_lm_head_input, insert_prescale_muls

    graph_fix = fix_lm_head_input(onnx_path)
    if graph_fix:
        lg.warning("fixed the builder's graph: %s", graph_fix)
        with open(logf, "a", encoding="utf-8") as fh:
            fh.write(f"pipeline: fixed the builder's graph: {graph_fix}\n")
    muls = conv["prescale_muls"] if rec != "none" else []  # recipe none: no conversion ({})
    n_mul = insert_prescale_muls(onnx_path, muls) if muls else 0
    graph = None
    if rec != "none":
        try:
            graph = check_deployed_graph(onnx_path, conv["lm_head_quantized"])
        except ConversionError as e:
            raise PipelineError(f"build: the engine graph does not deploy the quantized checkpoint as reported: {e}") from e
    return graph_fix, n_mul, graph


def _versions_and_host(ep: str) -> dict[str, Any]:
    """build_info's ``versions`` (libraries that shape the engine) and ``host`` sections."""
    from ....core.hostinfo import cpu_model, gpus, library_versions

    return {
        "versions": library_versions(("onnxruntime-genai", "onnxruntime", "onnx", "torch", "transformers", "nvidia-modelopt")),
        "host": {
            "kind": "cpu" if ep == "cpu" else "gpu",
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "gpus": gpus() if ep == "cuda" else [],
        },
    }


def _quantized_weights(conv: dict[str, Any], n_mul: int, graph: dict[str, Any] | None) -> dict[str, Any]:
    """build_info's ``quantized_weights`` section."""
    return {
        "source": "ModelOpt simulated-quant model (quant_state) -> GPTQ-format checkpoint, integers and scales unchanged",
        "bits": conv["bits"],
        "group_size": conv["group_size"],
        "quantized_linears": conv["quantized_linears"],
        "pre_quant_scale": {**conv["folded"], "onnx_mul_inserted": n_mul},
        "lm_head_quantized": conv["lm_head_quantized"],
        "untied_embeddings": conv["untied_embeddings"],
        "graph": graph,
    }


class OnnxRuntimeGenAITarget:
    name = "onnxruntime_genai"

    def capabilities(self, cfg: Any = None) -> Capabilities:
        return CAPABILITIES

    # ------------------------------------------------------------------ config time
    def check_config(self, cfg: Any) -> list[Problem]:
        """Recipe/kv-cache/limits checks for this target, then what it needs from the model
        (:mod:`.checks`: head size, sliding window); no heavy imports."""
        from .checks import model_problems

        return _quant_problems(cfg) + _build_problems(cfg) + model_problems(cfg)

    def available(self) -> tuple[bool, str]:
        from ....core.hostinfo import installed_version

        v = installed_version("onnxruntime-genai")
        if v is None:
            return False, "onnxruntime-genai is not installed (pip install onnxruntime-genai onnx onnx-ir onnxscript)"
        return True, f"onnxruntime-genai {v}"

    def preflight(self, cfg: Any, checkpoint: Path, out: Path | None = None) -> None:
        ok, why = self.available()
        if not ok:
            raise PreflightError(f"target onnxruntime_genai: {why}")
        if cfg.target.execution_provider == "cuda":
            import onnxruntime_genai as og

            if not og.is_cuda_available():
                raise PreflightError(
                    "target.execution_provider=cuda but this onnxruntime-genai build has no CUDA EP. "
                    "Fix: target.execution_provider=cpu, or pip install onnxruntime-genai-cuda on a GPU host."
                )
        if not (Path(checkpoint) / "hf" / "config.json").is_file() and not (Path(checkpoint) / "config.json").is_file():
            raise InputError(f"{checkpoint}: no hf/config.json; pass the quantize (or export) artifact.")

    # ------------------------------------------------------------------ build
    def command(self, cfg: Any, src: Path, engine: Path, cache: Path, precision: str, extra: list[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            BUILDER,
            "-i",
            str(src),
            "-o",
            str(engine),
            "-p",
            precision,
            "-e",
            cfg.target.execution_provider,
            "-c",
            str(cache),
            "--extra_options",
            *extra,
        ]

    def plan(self, cfg: Any, checkpoint: Path | None, export_dir: Path | None, out: Path | None) -> dict[str, Any]:
        """What :meth:`build` would run (for dry runs); no heavy imports."""
        ep = cfg.target.execution_provider
        rec = cfg.quant.recipe
        if rec == "none":
            precision = "fp32" if ep == "cpu" else "fp16"
            src = Path(checkpoint or "<quantize artifact>") / "hf"
        else:
            precision = "int8" if rec == "int8_wo" else "int4"
            src = Path("<work>/gptq_checkpoint (converted from ModelOpt's simulated-quant model)")
        extra = ["hf_token=false", "hf_remote=false"] + (
            [] if rec == "none" else [f"accuracy_level={cfg.target.accuracy_level}", "shared_embeddings=false"]
        )
        cmd = self.command(cfg, src, Path(out or "<out>") / "engine", Path("<work>/cache"), precision, extra)
        return {"command": cmd, "precision": precision}

    def build(
        self,
        cfg: Any,
        checkpoint: Path,
        out: Path,
        log: Any = None,
        *,
        export_dir: Path | None = None,
        progress: Any = None,
        model: Any = None,
    ) -> dict[str, Any]:
        """Build the engine into ``out/engine``; write ``out/build_info.json`` and ``out/build.log``.

        Args:
            checkpoint: the quantize artifact folder (``hf/``, ``quant_state.*``) - or an export artifact for recipe none.
            export_dir: the export artifact folder (``hf/``, ``model_info.json``); needed for quantized recipes.
            model: an already restored ModelOpt simulated-quant model (skips ``load_simulated_model``; tests).
        Returns: build_info (dict).
        Raises: InputError (unsupported checkpoint), PipelineError (builder failed; log tail included).
        """
        lg = log or globals()["log"]
        t0 = time.time()
        checkpoint = Path(checkpoint)
        out = Path(out)
        engine = BuildArtifact(out).engine_dir
        work = out / ".work"
        work.mkdir(parents=True, exist_ok=True)
        logf = BuildArtifact(out).build_log_path
        ep = cfg.target.execution_provider
        rec = cfg.quant.recipe
        if rec not in SUPPORTED_RECIPES:
            raise InputError(f"quant.recipe={rec!r}: target onnxruntime_genai supports {list(SUPPORTED_RECIPES)}.")
        src = _builder_source(cfg, checkpoint, export_dir, work, model, lg)
        del model  # the simulated-quant model is written out: free it before the builder runs beside this process
        gc.collect()
        precision, conv, extra = src.precision, src.conv, src.extra_options
        cmd = self.command(cfg, src.path, engine, work / "cache", precision, extra)
        lg.info("building: %s", " ".join(cmd))
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        from ....facts.families import builder_input  # windowed layers, RoPE defaults the builder needs

        builder_src, changes = builder_input(src.path, work / "builder_input", int(cfg.build.max_seq_len))
        cmd[cmd.index("-i") + 1] = str(builder_src)
        if changes:
            lg.info("builder config: %s (builder input %s)", "; ".join(changes), builder_src)
        builder_peak = run_logged(cmd, logf, "onnxruntime-genai model builder", env=env)
        graph_fix, n_mul, graph = _finish_graph(engine / "model.onnx", logf, conv, rec, lg)
        limits = self.write_limits(cfg, engine)
        shutil.rmtree(work, ignore_errors=True)
        import onnxruntime_genai as og  # noqa: F401 - version check only

        info = {
            "schema": "pipeline.build_info/v1",
            "target": self.name,
            "backend": "onnxruntime_genai",
            "execution_provider": ep,
            "precision": precision,
            "recipe": rec,
            **_versions_and_host(ep),
            "knobs": {
                "max_batch_size": cfg.build.max_batch_size,
                "max_input_len": cfg.build.max_input_len,
                "max_seq_len": cfg.build.max_seq_len,
                "accuracy_level": cfg.target.accuracy_level if rec != "none" else None,
                "extra_options": extra,
            },
            "limits": limits,
            "quantized_weights": None if rec == "none" else _quantized_weights(conv, n_mul, graph),
            "command": cmd,
            "graph_fixes": [graph_fix] if graph_fix else [],
            # what the builder was handed instead of the checkpoint's config.json (windowed layers, RoPE): recorded
            # so a release says what it ships (a trial found it only in the run's log)
            **({"builder_config_changes": changes} if changes else {}),  # one string per change
            "engine_bytes": _dir_bytes(engine),
            "builder_peak_rss_bytes": builder_peak,
            "build_s": round(time.time() - t0, 3),
        }
        return info

    def write_limits(self, cfg: Any, engine: Path) -> dict[str, int]:
        """Put the build limits into the engine's runtime config; return them.

        ``genai_config.json``: ``search.max_length = max_seq_len`` (the runtime refuses a prompt that
        leaves no room before it) and ``engine.static_batching.max_batch_size = max_batch_size`` (og.Engine's
        batch on a non-paged model; onnxruntime-genai 0.18 uses 4 without it). ``engine_limits.json``: ``max_batch_size``, ``max_input_len``,
        ``max_seq_len`` (genai_config has no key for them on a non-paged model; the runner enforces them).
        """
        b = cfg.build
        gc_path = engine / "genai_config.json"
        gc = json.loads(gc_path.read_text(encoding="utf-8"))
        ctx = int(gc.get("model", {}).get("context_length") or 0)
        if ctx and b.max_seq_len > ctx and not cfg.allow_unsafe_lengths:
            raise InputError(
                f"build.max_seq_len={b.max_seq_len} exceeds the model's context_length {ctx} (max_position_embeddings). "
                f"Fix: set build.max_seq_len<={ctx} (or allow_unsafe_lengths=true)."
            )
        set_runtime_limits(engine, max_batch_size=b.max_batch_size, max_seq_len=b.max_seq_len)
        limits = {"max_batch_size": int(b.max_batch_size), "max_input_len": int(b.max_input_len), "max_seq_len": int(b.max_seq_len)}
        (engine / LIMITS_FILE).write_text(json.dumps({"schema": "pipeline.engine_limits/v1", **limits}, indent=2) + "\n", encoding="utf-8")
        return limits

    def load_runner(self, engine_dir: Path, **kw: Any) -> OrtEngineRunner:
        return OrtEngineRunner(engine_dir, **kw)


class OrtEngineRunner:
    """Greedy generation on a built onnxruntime-genai engine (implements ``base.EngineRunner``).

    Args:
        engine_dir: ``<build artifact>/engine`` (genai_config.json, model.onnx, engine_limits.json).
        max_batch_size: cap on concurrently scheduled requests (default: the engine's limit).
        use_engine: ``False`` forces the sequential ``og.Generator`` path (a fallback).
    Attributes:
        mode: ``"engine"`` (continuous batching, ``og.Engine``) or ``"generator"`` (sequential).
    """

    def __init__(self, engine_dir: Path, max_batch_size: int | None = None, use_engine: bool = True, **_: Any):
        import onnxruntime_genai as og

        self._og = og
        self.engine_dir = Path(engine_dir)
        lim_path = self.engine_dir / LIMITS_FILE
        gc = json.loads((self.engine_dir / "genai_config.json").read_text(encoding="utf-8"))
        lim = EngineLimits.from_json(json.loads(lim_path.read_text(encoding="utf-8")) if lim_path.is_file() else {})
        self.max_seq_len = int(lim.max_seq_len or gc["search"]["max_length"])
        # windowed layers: onnxruntime-genai needs each request's KV capacity (max_length) >= the window
        sw = gc.get("model", {}).get("decoder", {}).get("sliding_window") or {}
        self.min_length = min(self.max_seq_len, int(sw.get("window_size") or 0)) if sw.get("layers") else 0
        self.max_input_len = int(lim.max_input_len or self.max_seq_len - 1)
        self.max_batch_size = int(min(max_batch_size or 10**9, lim.max_batch_size or 8))
        self.model = og.Model(str(self.engine_dir))
        self.mode = "engine" if (use_engine and hasattr(og, "Engine")) else "generator"
        if self.mode == "generator":
            log.warning(
                "onnxruntime-genai %s has no og.Engine (continuous batching); falling back to sequential og.Generator",
                getattr(og, "__version__", "?"),
            )
        self._engine = og.Engine(self.model) if self.mode == "engine" else None

    # -------------------------------------------------------------- helpers
    def _check(self, r: GenerationRequest) -> str | None:
        n = len(r.input_ids)
        if n == 0:
            return "empty prompt"
        if n > self.max_input_len:
            return (
                f"prompt has {n} tokens > engine max_input_len {self.max_input_len}; not truncated. "
                f"Rebuild with a larger build.max_input_len or shorten the prompt."
            )
        if n >= self.max_seq_len:
            return f"prompt has {n} tokens, leaving no room below engine max_seq_len {self.max_seq_len}"
        return None

    @staticmethod
    def _finish(
        ids: list[int], stops: Iterable[int], reason: str, times: list[float], rid: str, error: str | None = None
    ) -> GenerationResult:
        from ....core.tokenization import cut_at_stop

        cut, hit = cut_at_stop(ids, stops)
        if hit:
            reason = "eos"
            times = times[: len(cut)]
        return GenerationResult(request_id=rid, output_ids=cut, finish_reason=reason, token_times_s=times, error=error)

    # -------------------------------------------------------------- API
    def generate(self, requests: Sequence[GenerationRequest], on_token: TokenCallback | None = None) -> list[GenerationResult]:
        """Run all requests (continuous batching up to ``max_batch_size``); results in request order.

        Over-long prompts get ``finish_reason="error"`` and never reach the engine; an engine-side
        failure of one request is reported on that request only.
        """
        results: list[GenerationResult | None] = [None] * len(requests)
        todo = []
        for i, r in enumerate(requests):
            err = self._check(r)
            if err:
                results[i] = GenerationResult(r.request_id, [], "error", [], err)
            else:
                todo.append(i)
        if self.mode == "engine":
            self._run_engine(requests, todo, results, on_token)
        else:
            for i in todo:
                results[i] = self._run_generator(requests[i], on_token)
        return [r for r in results if r is not None]

    def _run_engine(self, requests: Sequence[GenerationRequest], todo: list[int], results: list, on_token: TokenCallback | None) -> None:
        og = self._og
        eng = self._engine
        if eng is None:  # engine mode sets it in __init__; only close() clears it
            raise RuntimeError("OrtEngineRunner.generate() after close()")
        buf = eng.create_event_buffer(max(16, 4 * self.max_batch_size))
        tok_flag, fin_flag, fail_flag = (
            og.EngineEventFlags.TOKEN.value,
            og.EngineEventFlags.TURN_FINISHED.value,
            og.EngineEventFlags.FAILED.value,
        )
        reasons = {
            og.FinishReason.EOS: "eos",
            og.FinishReason.MAX_GENERATED_TOKENS: "length",
            og.FinishReason.MAX_SESSION_TOKENS: "length",
            og.FinishReason.STOP_STRING: "stop",
            og.FinishReason.CANCELLED: "eos",
            og.FinishReason.FAILED: "error",
        }
        queue = list(todo)
        active: dict[int, dict[str, Any]] = {}  # id(Request) -> state

        def admit() -> None:
            self._admit(eng, requests, queue, active, results)

        admit()
        while active or queue:
            if not eng.has_pending_requests():
                admit()
                if not eng.has_pending_requests():
                    break
            for ev in eng.run(buf):
                st = active.get(id(ev.request))
                if st is None:
                    continue
                flags = ev.flags.value
                r = requests[st["i"]]
                if flags & tok_flag and not st["cancelled"]:
                    t = time.perf_counter() - st["t0"]
                    tokid = int(ev.token)
                    st["ids"].append(tokid)
                    st["times"].append(t)
                    if on_token is not None and tokid not in st["stops"]:
                        on_token(r.request_id, tokid, t)
                    if tokid in st["stops"] and not (flags & fin_flag):
                        st["cancelled"] = st["req"].cancel_turn(st["turn"]) or True
                if flags & (fin_flag | fail_flag):
                    if flags & fail_flag or ev.finish_reason == og.FinishReason.FAILED:
                        results[st["i"]] = GenerationResult(r.request_id, [], "error", [], f"engine error: {ev.error_code.name}")
                    else:
                        reason = reasons.get(ev.finish_reason, "length")
                        results[st["i"]] = self._finish(st["ids"], st["stops"], reason, st["times"], r.request_id)
                    st["req"].close()
                    del active[id(ev.request)]
            admit()
        for st in active.values():  # the engine went idle without finishing them: report, never drop
            r = requests[st["i"]]
            results[st["i"]] = GenerationResult(r.request_id, st["ids"], "error", st["times"], "engine stopped before the request finished")

    def _admit(
        self, eng: Any, requests: Sequence[GenerationRequest], queue: list[int], active: dict[int, dict[str, Any]], results: list
    ) -> None:
        """:meth:`_run_engine`: start turns for queued requests while fewer than ``max_batch_size`` are active (greedy;
        ``ignore_eos`` forces the full length); a request the engine refuses gets an error result."""
        import numpy as np

        og = self._og
        while queue and len(active) < self.max_batch_size:
            i = queue.pop(0)
            r = requests[i]
            req = eng.create_request()
            opts = og.TurnOptions(req)
            opts.set_do_sample(False)
            opts.set_max_generated_tokens(int(r.max_new_tokens))
            if r.repetition_penalty is not None:
                opts.set_repetition_penalty(float(r.repetition_penalty))
            if r.ignore_eos:
                opts.set_min_generated_tokens(int(r.max_new_tokens))
            t_sub = time.perf_counter()
            try:
                turn = req.begin_turn(np.asarray(r.input_ids, dtype=np.int32), opts)
            except Exception as e:
                results[i] = GenerationResult(r.request_id, [], "error", [], f"engine refused the request: {e}")
                req.close()
                continue
            active[id(req)] = {
                "i": i,
                "req": req,
                "turn": turn,
                "ids": [],
                "times": [],
                "t0": t_sub,
                "stops": set(int(s) for s in ([] if r.ignore_eos else r.stop_token_ids)),
                "cancelled": False,
            }

    def _run_generator(self, r: GenerationRequest, on_token: TokenCallback | None) -> GenerationResult:
        import numpy as np

        og = self._og
        t0 = time.perf_counter()
        try:
            gp = og.GeneratorParams(self.model)
            limit = min(self.max_seq_len, max(self.min_length, len(r.input_ids) + int(r.max_new_tokens)))
            gp.set_search_options(do_sample=False, max_length=limit, repetition_penalty=float(r.repetition_penalty or 1.0))
            g = og.Generator(self.model, gp)
            g.append_tokens(np.asarray([r.input_ids], dtype=np.int32))
        except Exception as e:
            return GenerationResult(r.request_id, [], "error", [], f"generator refused the request: {e}")
        stops = set() if r.ignore_eos else set(int(s) for s in r.stop_token_ids)
        ids: list[int] = []
        times: list[float] = []
        while not g.is_done() and len(ids) < r.max_new_tokens:
            g.generate_next_token()
            tokid = int(g.get_next_tokens()[0])
            t = time.perf_counter() - t0
            ids.append(tokid)
            times.append(t)
            if tokid in stops:
                break
            if on_token is not None:
                on_token(r.request_id, tokid, t)
        return self._finish(ids, stops, "length", times, r.request_id)

    def next_token_logits(self, input_ids: Sequence[int], continuation: Sequence[int]) -> list[int]:
        """Teacher-forced greedy choices: the engine's argmax after ``input_ids + continuation[:k]`` for each k.

        Used to measure next-token agreement against a reference model on the same token stream.
        Returns ``len(continuation)`` token ids.
        """
        import numpy as np

        og = self._og
        gp = og.GeneratorParams(self.model)
        gp.set_search_options(
            do_sample=False, max_length=min(self.max_seq_len, max(self.min_length, len(input_ids) + len(continuation) + 1))
        )
        g = og.Generator(self.model, gp)
        g.append_tokens(np.asarray([list(input_ids)], dtype=np.int32))
        out = []
        for t in continuation:
            out.append(int(np.argmax(g.get_logits()[0, -1])))
            g.append_tokens(np.asarray([[int(t)]], dtype=np.int32))
        return out

    def close(self) -> None:
        self._engine = None
        self.model = None

    def __enter__(self) -> OrtEngineRunner:
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


TARGET: Target = OnnxRuntimeGenAITarget()
