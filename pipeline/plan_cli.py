"""``pipeline plan [--json] [--gpus LIST|all] [--config-dir DIR --config-name NAME] [hydra overrides ...]``: the
preflight plan, no GPU needed.

Composes the config exactly as a run would (same presets, same user YAML, same overrides), runs every field and
cross-field check (:func:`pipeline.validation.validate`, as the run does; a config they refuse gets no plan, only
the problems, exit 2), and prints the memory/speed plan.  ``target_gpu=X`` is accepted as an alias of
``target.gpu=X``.

Exit codes (pipeline.errors): 0 plan ok (warnings allowed), 2 configuration problems (all listed; no device to plan
for, e.g. ``target=tensorrt_llm`` with no GPU named or visible, is one of them: plan status ``unplanned``), 4 the plan
cannot work on the target, or a stage that will run does not fit this host's memory (refused, with the numbers; for a
shapes-only preset, which runs nowhere, the host figures are warnings).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from .errors import EXIT_INPUT, EXIT_OK, EXIT_PREFLIGHT, InputError, PipelineError

_ALIASES = {"target_gpu": "target.gpu", "gpu": "target.gpu"}


def _rewrite(overrides: list[str]) -> list[str]:
    out = []
    for o in overrides:
        key, sep, val = o.partition("=")
        out.append(f"{_ALIASES[key]}={val}" if sep and key in _ALIASES else o)
    return out


def _compose(overrides: list[str], config_dir: str | None = None, config_name: str | None = None) -> Any:
    """The config a run with these arguments composes; a user YAML (``--config-dir/--config-name``) is read by the
    run's own code (:func:`pipeline.cli.user_config_compose_args`: the same limits, checks and messages)."""
    import shutil
    import tempfile
    from pathlib import Path

    from .cli import user_config_compose_args
    from .core.config import compose
    from .core.config.hydra_settings import refuse_hydra_settings

    refuse_hydra_settings(
        overrides,
        "`pipeline plan`",
        "drop it: the plan is printed and no run folder is written (pipeline plan --json > plan.json saves it)",
    )
    if config_dir is None and config_name is None:
        return compose(overrides)
    tmp_root = Path(tempfile.mkdtemp(prefix="pipeline-plan-config-"))
    try:
        cdir, cname, over = user_config_compose_args(config_dir, config_name, overrides, tmp_root)
        return compose(over, config_name=cname, config_dir=cdir)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


def _gpu_table(cfg: Any, names: list[str], console: Any) -> tuple[list[dict[str, Any]], int]:
    from rich.table import Table

    from .planner.base import GpuMemory, fmt_bytes
    from .planner.plan import plan

    rows, worst = [], EXIT_OK
    refusals: list[tuple[str, str]] = []
    t = Table(
        title=f"plan across GPUs: {cfg.model.name} quant={cfg.quant.recipe} kv={cfg.quant.kv_cache_dtype} "
        f"tp={cfg.parallel.tp_size} pp={cfg.parallel.pp_size} max_seq_len={cfg.build.max_seq_len} max_batch_size={cfg.build.max_batch_size}"
    )
    for col in ("gpu", "status", "weights/rank", "KV pool", "seqs @max_seq_len", "tok/s/seq max", "tok/s aggregate max"):
        t.add_column(col)
    for n in names:
        c = dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, gpu=n))
        p = plan(c)  # main validated cfg; only target.gpu differs
        m, cap = p.memory, p.capacity
        b1, full = (p.decode.batch1, p.decode.full) if p.decode else (None, None)
        rows.append({"gpu": n, "plan": p.to_json()})
        refusals += [(n, why) for why in p.refusals]
        t.add_row(
            n,
            p.status,
            fmt_bytes(m.weights_bytes if m else None),
            fmt_bytes(m.kv_pool_bytes if isinstance(m, GpuMemory) else None),
            str(cap.max_sequences_at_max_seq_len if cap else "-"),
            f"{b1.tok_s_per_seq_max:.1f}" if b1 else "-",
            f"{full.tok_s_aggregate_max:.0f}" if full else "-",
        )
    console.print(t)
    for n, why in refusals:  # why each refused GPU is refused (the table has no room for it; --json carries it too)
        console.print(f"  {n}: refused: {why}", markup=False, highlight=False)
    return rows, worst


def _unplanned_problem(p: Any, cfg: Any) -> Any:
    """The reason an ``unplanned`` plan has no device to plan for (``target.gpu`` neither named nor visible), as the
    :class:`~pipeline.core.config.Problem` a CI job reads in ``problems`` (the plan's notes say it in words)."""
    from .core.config import Problem
    from .facts.gpus import CATALOGUE

    return Problem("target.gpu", cfg.target.gpu, f"{p.target.why}.", f"name one: target.gpu=<{'|'.join(sorted(CATALOGUE))}>")


def _problems_of(e: PipelineError) -> list[dict[str, Any]]:
    """``e`` (an exit-2 refusal of the planner after the checks passed) as the ``problems`` of ``pipeline plan --json``
    (each ``{field, value, message, fix}``): a :class:`~pipeline.core.config.ConfigError`'s own problems; any other
    refusal as one problem of the field its message starts with (``calibration.path='x': ...``), else of field
    ``input`` (value null), split at ``Fix:``."""
    import re

    from .core.config import ConfigError

    if isinstance(e, ConfigError):
        return [{k: getattr(p, k) for k in ("field", "value", "message", "fix")} for p in e.problems]
    why, _, fix = str(e).partition(" Fix: ")
    named = re.match(r"([A-Za-z_][\w.]*)=(\S+?):? ", why)
    field, value = (named.group(1), named.group(2).strip("'\"")) if named else ("input", None)
    return [{"field": field, "value": value, "message": why, "fix": fix}]


def _error(code: int, msg: str) -> None:
    """An error line as the ``pipeline`` command prints it: ``error (exit N): ...`` on stderr, unwrapped (a CI log
    greps it whole; the plan itself goes to stdout)."""
    print(f"error (exit {code}): {msg}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pipeline plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the plan and problems as JSON (schema pipeline.plan/v1)")
    ap.add_argument("--gpus", default=None, help="compare GPUs: comma-separated catalogue names, or 'all'")
    ap.add_argument("--config-dir", "-cd", default=None, help="a folder of your YAML (and presets), as for a run")
    ap.add_argument("--config-name", "-cn", default=None, help="your YAML's name without .yaml, as for a run (docs/models.md)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for a run (model=llama31_8b target.gpu=h100_sxm quant=fp8 ...)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    args = _parser().parse_args(argv)
    console = Console(stderr=args.json)
    overrides = _rewrite(args.overrides)
    try:
        cfg = _compose(overrides, args.config_dir, args.config_name)
    except InputError as e:  # ConfigError included: the override, the valid names and the fix
        if args.json:
            print(json.dumps({"exit_code": EXIT_INPUT, "error": str(e)}))
        else:
            _error(EXIT_INPUT, str(e))
        return EXIT_INPUT

    from .core.config import ConfigError, Problem
    from .planner import host_check
    from .planner.plan import plan
    from .planner.render import render
    from .validation import validate, with_run_order

    problems = validate(cfg, raise_on_error=False, read_with_transformers=True)  # export's reading of config.json too
    # --gpus plans each GPU for tensorrt_llm; a CPU target's plan no GPU changes (a trial saw nine identical "ok" rows)
    if args.gpus and cfg.target.name == "onnxruntime_genai":
        problems.append(
            Problem(
                "target.name",
                cfg.target.name,
                "--gpus compares NVIDIA GPUs for tensorrt_llm; this target runs on the CPU.",
                "drop target=onnxruntime_genai (or drop --gpus)",
            )
        )
    out: dict[str, Any] = {"overrides": overrides, "problems": [dataclasses.asdict(p) for p in problems]}
    if problems:  # refused as plan() and the run refuse it (exit 2, validate's message): no plan of a config that cannot run
        err = ConfigError(problems)
        if args.json:
            print(json.dumps({**out, "error": str(err), "exit_code": EXIT_INPUT}, indent=2, default=str))
        else:
            _error(EXIT_INPUT, str(err))
        return EXIT_INPUT
    code = EXIT_OK
    try:
        if args.gpus:
            from .facts.gpus import CATALOGUE, lookup

            names = list(CATALOGUE) if args.gpus == "all" else [lookup(n).key for n in args.gpus.split(",") if n.strip()]
            out["comparison"], _ = _gpu_table(cfg, names, console)
        else:
            p = plan(cfg)  # validated above
            host_check(p, cfg, list(with_run_order(cfg).stages))
            out["plan"] = p.to_json()
            if not args.json:
                render(p, console)
            if p.status == "refused":
                code = EXIT_PREFLIGHT
            elif p.status == "unplanned":  # no device to plan for: a configuration problem (exit 2), listed as one
                code = EXIT_INPUT
                problem = _unplanned_problem(p, cfg)
                out["problems"].append(dataclasses.asdict(problem))
                if not args.json:
                    _error(code, str(problem))
    except KeyError as e:  # an unknown --gpus name (facts.gpus.lookup): a problem of --gpus
        out["error"] = str(e.args[0])
        code = EXIT_INPUT
        named = ("--gpus", args.gpus, "name GPUs from the list") if args.gpus else ("input", None, "")
        out["problems"].append(dict(zip(("field", "value", "message", "fix"), (*named[:2], str(e.args[0]), named[2]))))
        if not args.json:
            _error(code, str(e.args[0]))
    except PipelineError as e:
        out["error"] = str(e)
        code = e.exit_code
        if code == EXIT_INPUT and not out["problems"]:  # a refusal is a problem too: ``problems`` is never empty on exit 2
            out["problems"] = _problems_of(e)
        if not args.json:
            _error(code, str(e))
    out["exit_code"] = code
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
