"""``calibration`` config group: the calibration set used by the quantize stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .common import Problem, choice, deprecated_alias, runtime

FORMATS = ("auto", "jsonl", "json", "text", "parquet", "hf")


@dataclass
class CalibrationConfig:
    name: str = "calibration"
    """Label of the calibration preset (support_v2, generic_v1, ...); enters the quantize key with the other fields.
    When ``path`` is not the named preset's file, the label becomes the file's name (``pipeline.core.config.relabel_custom_data``)."""
    path: Optional[str] = runtime(None)
    """Local calibration file (JSONL / JSON / text / parquet). A path: its content digest, not the string, enters the
    quantize key."""
    format: str = "auto"
    """auto (by file suffix: .jsonl/.ndjson, .json, .txt/.text, .parquet/.pq) | jsonl (one object per line with
    ``text`` or chat ``messages``) | json (one array of such objects or strings) | text (one sample per line, or
    blank-line separated with ``paragraphs: true``) | parquet | hf (a datasets name, only when reachable)."""
    hf_dataset: Optional[str] = None
    """Hugging Face dataset name for ``format: hf`` (requires network access to the hub)."""
    hf_split: str = "train"
    """Split of ``hf_dataset`` to read (``format: hf`` only)."""
    text_field: str = "text"
    """Column / JSON key holding the sample text."""
    paragraphs: bool = False
    """For ``format: text``: samples are separated by blank lines instead of one per line."""
    calib_size: int = 512
    """Samples requested (the first ``calib_size`` usable ones after a seeded shuffle; ModelOpt / TensorRT-LLM
    ``quantize.py --calib_size``)."""
    calib_max_seq_length: int = 512
    """Samples are truncated to this many tokens (TensorRT-LLM ``quantize.py --calib_max_seq_length``)."""
    num_samples: Optional[int] = deprecated_alias("calib_size")
    """Deprecated alias of ``calib_size``, removed in the next release."""
    max_seq_len: Optional[int] = deprecated_alias("calib_max_seq_length")
    """Deprecated alias of ``calib_max_seq_length``, removed in the next release."""
    batch_size: Any = "auto"
    """Calibration samples per forward pass: a positive integer, or ``auto`` = the largest batch whose activations fit half
    the calibration device's free memory beside the model (at most 16 on the CPU; on a GPU holding the whole model,
    ModelOpt's ``get_max_batch_size`` probe), recorded in the quant report with the reason
    (pipeline/quantize/placement.py). Samples are sorted by length and each batch is cut to its shortest member (no
    padding token reaches a quantizer), so the batch changes the tokens seen: an integer is part of the key; set one for
    results that do not depend on the host's free memory."""
    seed: int = 1234
    """Seed of the sample shuffle (which ``calib_size`` samples are used) and of torch during calibration."""
    apply_chat_template: bool = False
    """Render chat ``messages`` through the tokenizer's chat template (JSONL ``messages`` only)."""
    min_tokens: int = 4
    """Samples shorter than this (in tokens) are counted and warned about."""
    min_samples: int = 32
    """Fail when fewer usable samples than this remain."""
    threads: int = 1
    """CPU threads torch uses while calibrating and exporting (``torch.set_num_threads``). 1 is the fastest
    on a shared, loaded machine (OpenMP threads spin against each other) and keeps results byte-identical;
    raise it on a dedicated many-core host. Part of the cache key (thread count may change float sums)."""
    device: str = "auto"
    """Where ModelOpt calibrates: auto (CUDA when torch sees a GPU, else the CPU) | cpu | cuda | cuda:N. On CUDA the model
    is loaded in the checkpoint's 16-bit dtype (bfloat16 for a float32 checkpoint), on the CPU in float32
    (pipeline/quantize/placement.py). Part of the cache key (the dtype changes the statistics)."""
    layerwise: str = "auto"
    """auto | true | false: calibrate one decoder layer at a time (ModelOpt ``layerwise``). auto: when the model does not
    fit the device's budget, the layers beyond it are offloaded (host memory from a GPU, disk from the CPU) and onloaded
    one at a time; false refuses such a model (exit 2); true calibrates layer by layer even when it fits."""
    max_device_memory_gb: Optional[float] = runtime(None)
    """Memory the model may take on the calibration device, GB (1e9 bytes); None = 80 % of its free memory now. A model
    larger than this is calibrated layer by layer (``layerwise=auto``). Not part of the cache key: layer-by-layer
    calibration gives the same statistics (tests/quantize/test_scale_memory.py)."""
    max_host_memory_gb: Optional[float] = runtime(None)
    """Host memory the offloaded layers may take, GB (1e9 bytes), when the model does not fit the calibration device;
    None = 80 % of the host's available memory now (``MemAvailable``). Layers beyond both budgets wait on disk (in the
    stage's staging folder). Not part of the cache key, for the same reason as ``max_device_memory_gb``."""


def parse_batch_size(setting: Any) -> Optional[int]:
    """``calibration.batch_size`` -> the integer given, or None for ``auto``.

    Raises:
        ValueError: anything else (a bool, a float with a fraction, a number below 1, another word).
    """
    if isinstance(setting, str) and setting.strip().lower() == "auto":
        return None
    if isinstance(setting, bool) or isinstance(setting, float) and not setting.is_integer():
        raise ValueError("is not a batch size")
    try:
        n = int(setting.strip()) if isinstance(setting, str) else int(setting)
    except (TypeError, ValueError):
        raise ValueError("is not a batch size") from None
    if n < 1:
        raise ValueError("must be >= 1")
    return n


def validate(cfg: CalibrationConfig, prefix: str = "calibration") -> list[Problem]:
    problems: list[Problem] = []
    choice(problems, f"{prefix}.format", cfg.format, FORMATS)
    try:
        parse_batch_size(cfg.batch_size)
    except ValueError as e:
        problems.append(Problem(f"{prefix}.batch_size", cfg.batch_size, f"{e}.", f"set {prefix}.batch_size to a positive integer, or auto"))
    for f in ("calib_size", "calib_max_seq_length", "min_samples", "threads"):
        v = getattr(cfg, f)
        if v < 1:
            problems.append(Problem(f"{prefix}.{f}", v, "must be >= 1.", f"set {prefix}.{f} to a positive integer"))
    d = str(cfg.device).strip().lower()
    if not (d in ("auto", "cpu", "cuda") or (d.startswith("cuda:") and d[5:].isdigit())):
        problems.append(Problem(f"{prefix}.device", cfg.device, "is not a calibration device.", "use auto, cpu, cuda or cuda:N"))
    choice(problems, f"{prefix}.layerwise", str(cfg.layerwise).lower(), ("auto", "true", "false"))
    if cfg.max_device_memory_gb is not None and not cfg.max_device_memory_gb > 0:
        problems.append(
            Problem(
                f"{prefix}.max_device_memory_gb", cfg.max_device_memory_gb, "must be > 0.", "set a positive size in GB, or leave it unset"
            )
        )
    if cfg.max_host_memory_gb is not None and not cfg.max_host_memory_gb > 0:
        problems.append(
            Problem(f"{prefix}.max_host_memory_gb", cfg.max_host_memory_gb, "must be > 0.", "set a positive size in GB, or leave it unset")
        )
    if 1 <= cfg.calib_max_seq_length < cfg.min_tokens:  # every sample is cut below min_tokens: all of them "short"
        problems.append(
            Problem(
                f"{prefix}.calib_max_seq_length",
                cfg.calib_max_seq_length,
                f"is below {prefix}.min_tokens={cfg.min_tokens}: every calibration sample would be truncated to fewer tokens "
                "than a sample needs to carry signal.",
                f"raise {prefix}.calib_max_seq_length to at least {cfg.min_tokens} (512 by default), or lower {prefix}.min_tokens",
            )
        )
    if cfg.min_samples > cfg.calib_size:
        problems.append(
            Problem(
                f"{prefix}.min_samples", cfg.min_samples, f"exceeds calib_size={cfg.calib_size}.", "lower min_samples or raise calib_size"
            )
        )
    if cfg.format == "hf" and not cfg.hf_dataset:
        problems.append(
            Problem(
                f"{prefix}.hf_dataset", None, "format=hf needs a dataset name.", "set calibration.hf_dataset=<name> or use a local file"
            )
        )
    if cfg.format != "hf" and not cfg.path:
        problems.append(
            Problem(
                f"{prefix}.path", None, "no calibration file given.", "set calibration.path=/path/to/file.jsonl or calibration=support_v2"
            )
        )
    return problems
