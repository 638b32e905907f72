"""The ``pipeline`` command.

``pipeline [hydra overrides]`` runs the configured stages (Hydra app; ``--cfg job``, ``-m`` sweeps and
launcher plugins work as in any Hydra app).  Subcommands that are not a pipeline run:

    pipeline plan [overrides]         memory/speed plan and cross-field checks, no GPU needed
    pipeline doctor                   what is installed and which targets can run here
    pipeline serve [overrides]        start Triton on the packaged model repository
    pipeline client ...               gRPC client for the served ensemble
    pipeline benchmark compare A B    compare two benchmark JSON results

Exit codes are listed in :mod:`pipeline.errors`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

SUBCOMMANDS = {
    "plan": "pipeline.planner.cli",
    "doctor": "pipeline.doctor",
    "serve": "pipeline.serving.serve",
    "client": "pipeline.serving.client",
    "benchmark": "pipeline.bench.cli",
}

_state = {"task_started": False, "exit_code": 0}


def _register_redact_resolver() -> None:
    """``${redact:...}`` (pipeline.store.redact_text) for Hydra's sweep folder names (build_configs/pipeline.yaml);
    registered at import so joblib/SLURM job processes that unpickle ``_task`` have it too."""
    from omegaconf import OmegaConf

    from .store import redact_text

    OmegaConf.register_new_resolver("redact", lambda s: redact_text(str(s)), replace=True)


_register_redact_resolver()


def _task(cfg) -> int:  # DictConfig
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .config import to_object
    from .errors import EXIT_INPUT
    from .runner import run_pipeline

    _state["task_started"] = True
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    out_dir = Path(hc.runtime.output_dir)
    from .runner import redact_run_outputs
    from .store import install_log_redaction

    install_log_redaction()
    redact_run_outputs(out_dir)  # Hydra wrote .hydra/*.yaml with the config verbatim
    if hc.mode == RunMode.MULTIRUN:
        from .store import redact_files

        redact_files([Path(hc.sweep.dir) / "multirun.yaml"])
    try:
        obj = to_object(cfg)
    except Exception as e:  # noqa: BLE001 - OmegaConf errors name the key; show them without a traceback
        print(f"configuration error: {e}", file=sys.stderr)
        code = EXIT_INPUT
        _write_error_summary(out_dir, overrides, code, f"configuration error: {e}")
    else:
        code = run_pipeline(obj, overrides=overrides, summary_dir=out_dir).exit_code
    _state["exit_code"] = max(_state["exit_code"], code)
    if hc.mode == RunMode.RUN:
        sys.exit(code)
    return code


def _write_error_summary(out_dir: Path, overrides: list[str], code: int, error: str) -> None:
    """A summary.json for a job that failed before the runner started (multirun comparisons read it)."""
    from .runner import RunSummary
    from .store import redact, write_json_atomic

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out_dir / "summary.json", redact(RunSummary([], code, overrides, 0.0, None, error).to_json()))
    except Exception as e:  # noqa: BLE001 - the exit code still reports the failure
        print(f"could not write {out_dir / 'summary.json'}: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        print("\nConfig groups and overrides: pipeline --cfg job (resolved config), pipeline --hydra-help; README.md.")
        return
    if argv and argv[0] in SUBCOMMANDS:
        mod = importlib.import_module(SUBCOMMANDS[argv[0]])
        sys.exit(mod.main(argv[1:]) or 0)
    # `target_gpu=X` is accepted as an alias of `target.gpu=X` (as in `pipeline plan`)
    argv = [f"target.gpu={a.split('=', 1)[1]}" if a.startswith("target_gpu=") else a for a in argv]
    import hydra

    from .config import CONFIG_DIR, register
    from .errors import EXIT_INPUT

    register()
    sys.argv = [sys.argv[0], *argv]
    app = hydra.main(config_path=str(CONFIG_DIR), config_name="pipeline", version_base="1.3")(_task)
    try:
        app()
    except SystemExit as e:
        if not _state["task_started"] and e.code not in (0, None):
            # Hydra reports composition errors (unknown key, wrong type, unknown preset) and exits 1;
            # they are configuration errors for a CI job.
            sys.exit(EXIT_INPUT)
        raise
    sys.exit(_state["exit_code"])


if __name__ == "__main__":
    main()
