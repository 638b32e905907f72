"""The ``trtllm-build`` command line of the engine path (``target.backend=tensorrt``), and running it.

Rule: everything that turns a config into ``trtllm-build`` arguments (and the ``BuildConfig`` fields recorded in
build_info.json) and runs them lives here. Nothing here pretends an engine was built: a build succeeds only when
``trtllm-build`` exits 0 *and* wrote ``rank*.engine`` + ``config.json``; its whole output is kept in the build log.

Facts (TensorRT-LLM 1.2.x ``commands/build.py``, ``plugin/plugin.py``; docs/reference/tensorrt_llm.md): in-flight
batching needs paged KV (``--kv_cache_type paged``), ``--remove_input_padding enable`` and the GPT attention plugin,
which this target always sets; ``--multiple_profiles enable`` cannot be combined with ``--opt_num_tokens``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ....core.artifacts import TOKENIZER_COPY_FILES
from ....core.contracts.build import BuildArtifact
from ....core.contracts.quantize import QuantizeArtifact
from ....errors import InputError, PipelineError
from . import versions

# trtllm-build flag facts (tensorrt_llm/commands/build.py, plugin/plugin.py)
FLAG_CHOICES: dict[str, tuple[str, ...]] = {
    "--kv_cache_type": ("continuous", "paged", "disabled"),
    "--gpt_attention_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "disable"),
    "--gemm_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"),
    "--remove_input_padding": ("enable", "disable"),
    "--context_fmha": ("enable", "disable"),
    "--use_paged_context_fmha": ("enable", "disable"),
    "--use_fused_mlp": ("enable", "disable"),
    "--multiple_profiles": ("enable", "disable"),
    "--speculative_decoding_mode": ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"),
    "--logits_dtype": ("float16", "float32"),
    "--log_level": ("internal_error", "error", "warning", "info", "verbose", "debug", "trace"),
}
INT_FLAGS = (
    "--max_batch_size",
    "--max_input_len",
    "--max_seq_len",
    "--max_beam_width",
    "--max_num_tokens",
    "--opt_num_tokens",
    "--tokens_per_block",
    "--max_draft_len",
    "--workers",
)
PATH_FLAGS = ("--checkpoint_dir", "--output_dir", "--input_timing_cache", "--output_timing_cache")
KNOWN_FLAGS = tuple(FLAG_CHOICES) + INT_FLAGS + PATH_FLAGS
SPEC_MODES = {
    "draft_tokens_external": "draft_tokens_external",
    "medusa": "medusa",
    "eagle": "eagle",
    "lookahead_decoding": "lookahead_decoding",
}


def en(flag: bool) -> str:
    return "enable" if flag else "disable"


def build_args(cfg: Any, checkpoint_dir: Path | str, output_dir: Path | str, timing_cache: Path | str) -> list[str]:
    """The ``trtllm-build`` arguments for this config (without the executable).

    Paged KV, remove_input_padding, context FMHA and the GPT attention plugin are always on (in-flight
    batching requires them, plugin/plugin.py, docs/source/legacy/reference/memory.md).  The timing cache is read and written at the same path.
    """
    b = cfg.build
    a: list[str] = [
        "--checkpoint_dir",
        str(checkpoint_dir),
        "--output_dir",
        str(output_dir),
        "--max_batch_size",
        str(b.max_batch_size),
        "--max_input_len",
        str(b.max_input_len),
        "--max_seq_len",
        str(b.max_seq_len),
        "--max_num_tokens",
        str(b.max_num_tokens),
        "--max_beam_width",
        str(b.max_beam_width),
        "--kv_cache_type",
        "paged",
        "--gpt_attention_plugin",
        "auto",
        "--remove_input_padding",
        "enable",
        "--context_fmha",
        "enable",
        "--tokens_per_block",
        str(b.tokens_per_block),
        "--use_paged_context_fmha",
        en(b.use_paged_context_fmha),
        "--use_fused_mlp",
        en(b.use_fused_mlp),
        "--multiple_profiles",
        en(b.multiple_profiles),
        "--gemm_plugin",
        b.gemm_plugin,
    ]
    if b.opt_num_tokens:
        a += ["--opt_num_tokens", str(b.opt_num_tokens)]
    if b.logits_dtype:
        a += ["--logits_dtype", b.logits_dtype]
    if b.gather_context_logits:
        a += ["--gather_context_logits"]  # a store_true flag (commands/build.py)
    if b.speculative.mode != "none":
        a += ["--speculative_decoding_mode", SPEC_MODES[b.speculative.mode], "--max_draft_len", str(b.speculative.max_draft_len)]
    a += [
        "--input_timing_cache",
        str(timing_cache),
        "--output_timing_cache",
        str(timing_cache),
        "--workers",
        str(b.workers),
        "--log_level",
        "info",
    ]
    return a


def build_config_dict(cfg: Any) -> dict[str, Any]:
    """The TensorRT-LLM ``BuildConfig`` fields (tensorrt_llm/builder.py) this build sets; recorded in build_info.json."""
    b = cfg.build
    return {
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_batch_size": b.max_batch_size,
        "max_beam_width": b.max_beam_width,
        "max_num_tokens": b.max_num_tokens,
        "opt_num_tokens": b.opt_num_tokens,
        "kv_cache_type": "PAGED",
        "max_draft_len": b.speculative.max_draft_len if b.speculative.mode != "none" else 0,
        "speculative_decoding_mode": SPEC_MODES.get(b.speculative.mode, "NONE") if b.speculative.mode != "none" else "NONE",
        "plugin_config": {
            "gpt_attention_plugin": "auto",
            "gemm_plugin": None if b.gemm_plugin == "disable" else b.gemm_plugin,
            "remove_input_padding": True,
            "context_fmha": True,
            "paged_kv_cache": True,
            "tokens_per_block": b.tokens_per_block,
            "use_paged_context_fmha": b.use_paged_context_fmha,
            "use_fused_mlp": b.use_fused_mlp,
            "multiple_profiles": b.multiple_profiles,
        },
        "logits_dtype": b.logits_dtype,
        "gather_context_logits": b.gather_context_logits,
    }


def default_timing_cache(cfg: Any) -> Path:
    """``build.timing_cache`` or ``<store_dir>/_trtllm_timing_cache/<gpu>-trtllm<ver>.cache`` (persists across builds)."""
    from ....core.config import resolve_path

    if cfg.build.timing_cache:
        return Path(resolve_path(cfg.build.timing_cache) or cfg.build.timing_cache)
    from ....core.hostinfo import gpus

    g = gpus()
    gpu = (cfg.target.gpu or (g[0]["name"] if g else "gpu")).lower().replace(" ", "_")
    ver = versions.installed_version() or "none"
    return Path(resolve_path(cfg.store_dir) or cfg.store_dir) / "_trtllm_timing_cache" / f"{gpu}-trtllm{ver}.cache"


def command(cfg: Any, checkpoint: Path | str, out: Path | str) -> list[str]:
    """The exact ``trtllm-build`` command of the engine: ``target.trtllm_build`` + :func:`build_args`."""
    T = QuantizeArtifact.TRTLLM_CHECKPOINT
    ckpt = QuantizeArtifact(Path(checkpoint)).trtllm_checkpoint if not str(checkpoint).endswith(T) else Path(checkpoint)
    return [cfg.target.trtllm_build] + build_args(cfg, ckpt, BuildArtifact(Path(out)).engine_dir, default_timing_cache(cfg))


def draft_command(cfg: Any, out: Path | str) -> list[str]:
    """trtllm-build command of the draft engine (draft-model mode): same limits, no speculative flags, into
    ``out/draft_engine`` (:attr:`BuildArtifact.DRAFT_ENGINE_DIR`)."""
    from ....core.config import resolve_path

    sp = cfg.build.speculative
    ck = sp.draft_trtllm_checkpoint or (str(QuantizeArtifact(Path(sp.draft_model_path)).trtllm_checkpoint) if sp.draft_model_path else None)
    if ck is None:
        raise InputError("build.speculative.draft_model_path is not set. Fix: set it to the draft checkpoint (HF + trtllm_checkpoint/).")
    args = build_args(cfg, Path(resolve_path(ck) or ck), Path(out) / BuildArtifact.DRAFT_ENGINE_DIR, default_timing_cache(cfg))
    i = args.index("--speculative_decoding_mode")
    del args[i : i + 4]  # --speculative_decoding_mode X --max_draft_len N: the draft is a plain model
    return [cfg.target.trtllm_build] + args


def _run_logged(cmd: list[str], logf: Path) -> tuple[int, str]:
    """Run ``cmd`` with its whole output (stdout + stderr) in ``logf`` after a ``$ <cmd>`` line; returns (exit code,
    the log's last 30 lines)."""
    with open(logf, "w", encoding="utf-8") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False)
    return proc.returncode, "".join(logf.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-30:])


def run_trtllm_build(cfg: Any, checkpoint: Path, out: Path, lg: Any) -> dict[str, Any]:
    """Run ``trtllm-build`` (and the draft engine's, draft-model mode) with its output in ``out/build.log``; copy the
    tokenizer next to the engine. Returns the build_info fields ``command``, ``timing_cache``, ``ranks`` (``draft``).

    Raises: PipelineError with the log tail when trtllm-build fails or writes no engine.
    """
    engine, logf, hf = BuildArtifact(out).engine_dir, BuildArtifact(out).build_log_path, Path(checkpoint) / "hf"
    fields: dict[str, Any] = {}
    cmd = command(cfg, checkpoint, out)
    tc = default_timing_cache(cfg)
    tc.parent.mkdir(parents=True, exist_ok=True)
    lg.info("running: %s", shlex.join(cmd))
    rc, tail = _run_logged(cmd, logf)
    if rc != 0:
        raise PipelineError(f"trtllm-build failed (exit {rc}); full log {logf}; last lines:\n{tail}")
    ranks = sorted(engine.glob("rank*.engine"))
    if not ranks or not (engine / "config.json").is_file():
        raise PipelineError(f"trtllm-build exited 0 but wrote no engine (rank*.engine + config.json) into {engine}; log {logf}:\n{tail}")
    if cfg.build.speculative.mode == "draft_tokens_external":
        fields["draft"] = _build_draft(cfg, out, lg)
    for f in TOKENIZER_COPY_FILES:
        if (hf / f).is_file():  # trtllm-build does not copy the tokenizer (builder.py Engine.save)
            shutil.copy2(hf / f, engine / f)
    fields.update(command=cmd, timing_cache=str(tc), ranks=[r.name for r in ranks])
    return fields


def _build_draft(cfg: Any, out: Path, lg: Any) -> dict[str, Any]:
    """:func:`run_trtllm_build` of the draft engine (:func:`draft_command`), its output in ``out/draft_build.log``."""
    cmd = draft_command(cfg, out)
    ck = Path(cmd[cmd.index("--checkpoint_dir") + 1])
    if not (ck / "config.json").is_file():
        raise InputError(
            f"{ck}: no TensorRT-LLM checkpoint of the draft (config.json + rank*.safetensors). Fix: quantize/convert the "
            "draft (e.g. `pipeline model.path=<draft> stages=[export,quantize]`) and point build.speculative.draft_trtllm_checkpoint at it."
        )
    logf = out / BuildArtifact.DRAFT_BUILD_LOG
    lg.info("running (draft): %s", shlex.join(cmd))
    rc, tail = _run_logged(cmd, logf)
    eng = out / BuildArtifact.DRAFT_ENGINE_DIR
    if rc != 0 or not sorted(eng.glob("rank*.engine")) or not (eng / "config.json").is_file():
        raise PipelineError(f"trtllm-build of the draft engine failed (exit {rc}) or wrote no engine into {eng}; log {logf}:\n{tail}")
    return {
        "command": cmd,
        "engine": BuildArtifact.DRAFT_ENGINE_DIR,
        "checkpoint": str(ck),
        "draft_model_path": cfg.build.speculative.draft_model_path,
    }
