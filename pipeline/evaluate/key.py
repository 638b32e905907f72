"""What the evaluate stage's cache key covers beyond its own ``eval`` group: the external inputs whose content is
digested (:func:`external_inputs`: the eval set and its data files, the reference checkpoint, the draft model, the
calibration set of the fidelity hold-out), the other groups' fields it reads (:func:`key_extras`), the ``eval`` fields
as the run resolves them (:func:`key_config`), the fields it reads that never change its report (:data:`RUNTIME_READS`),
and the part of the key its answers depend on (:func:`generation_key`)."""

from __future__ import annotations

from typing import Any

from ..core.config.common import key_fields


def external_inputs(cfg: Any) -> dict[str, Any]:
    from ..core.config import resolve_path
    from ..data.evalset import read_eval_set

    # Parse the eval set now: the runner resolves every stage's external inputs before the first stage
    # runs, so a malformed eval set fails in milliseconds, not after quantization and the build.
    path = resolve_path(cfg.eval.eval_set)
    ext: dict[str, Any] = {"eval_set": cfg.eval.eval_set}
    if path is not None and path.is_file():
        # a task YAML's documents are part of the eval set: each data file's content digest enters this key too
        for k, f in enumerate(read_eval_set(path, limit=cfg.eval.limit).data_files):
            ext[f"eval_data_{k}"] = str(f)
    if cfg.model.path is not None and "baseline" in cfg.eval.runners:
        # the baseline's independent reference: the user's checkpoint (its content digest enters this key; the
        # runner memoises digests per process, so the export stage's digest of the same folder is reused)
        ext["reference_checkpoint"] = cfg.model.path
    if cfg.eval.draft_model_path:
        ext["draft_model"] = cfg.eval.draft_model_path
    if _heldout_wanted(cfg):
        ext["calibration"] = cfg.calibration.path
    return ext


def _heldout_wanted(cfg: Any) -> bool:
    return bool(cfg.eval.fidelity and cfg.eval.fidelity_heldout and cfg.calibration.path)


def key_extras(cfg: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Every field outside the ``eval`` group that evaluate reads (tests/contracts/test_gate_key_reads.py records the reads
    of a real run and fails on any field that is neither here, in ``eval``'s cache fields, nor in ``RUNTIME_READS``)."""
    from ..core.targets import resolve_target

    m, b = cfg.model, cfg.build
    return {
        "recipe": cfg.quant.recipe,
        "gate": "v2",
        "model": {
            "extra_stop_token_ids": list(m.extra_stop_token_ids or []),
            "apply_chat_template": m.apply_chat_template,
            "allow_pickle": m.allow_pickle,
        },
        # the build artifact's limits win when there is one; these are the fallback (baseline + simulated runs)
        "build": {"max_input_len": b.max_input_len, "max_seq_len": b.max_seq_len, "max_batch_size": b.max_batch_size},
        # the target the run resolves to (target=auto and its explicit name share a key, as the build stage's do)
        "target": resolve_target(cfg).name,
        # the calibration hold-out (fidelity) depends on the calibration set's order and size
        "calibration": key_fields(cfg.calibration) if _heldout_wanted(cfg) else None,
    }


def key_config(cfg: Any) -> dict[str, Any]:
    """The ``eval`` group's cache fields as the run resolves them: ``reference_dtype=auto`` as the dtype it stands for
    on this host (float32 on the CPU: the key of a CPU run is the one it had before ``auto``), and ``device: cuda`` when
    the runners run on CUDA (absent on the CPU, for the same reason; ``eval.device`` itself is a runtime field)."""
    from ..core.config import resolve_path
    from .runners import device_kind, reference_dtype

    ev = key_fields(cfg.eval)
    kind = device_kind(cfg.eval.device)
    if cfg.eval.reference_dtype == "auto":
        ev["reference_dtype"] = reference_dtype(resolve_path(cfg.model.path) if cfg.model.path else None, "auto", kind)
    if kind != "cpu":
        ev["device"] = kind
    return {"eval": ev}


def generation_key(doc: dict[str, Any]) -> dict[str, Any]:
    """The key document less the ``eval.gate`` group: what the answers and the fidelity measurements depend on (a run
    whose key differs only in ``eval.gate`` reuses them, :func:`pipeline.evaluate.running.stored_runs`)."""
    config = dict(doc["config"])
    config["eval"] = {k: v for k, v in config["eval"].items() if k != "gate"}
    return {**doc, "config": config}


# Fields evaluate reads that never change its report: paths whose content is digested as an external input,
# and how the work is scheduled.
RUNTIME_READS = (
    "model.path",
    "eval.eval_set",
    "eval.draft_model_path",
    "eval.batch_size",
    "eval.torch_threads",
    "eval.device",
    "calibration.path",
    "calibration.max_device_memory_gb",
    "calibration.max_host_memory_gb",
)
