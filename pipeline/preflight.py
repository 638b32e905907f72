"""What a run checks before its first stage: every external input (checkpoint, calibration set, eval set) of the
stages it will run, and the artifact store (:mod:`pipeline.runner` calls these before any stage runs, so a doomed
request fails in milliseconds with exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

from .core.config import PipelineConfig, Problem, resolve_path
from .core.stage import Stage, get_stage
from .core.store import ArtifactStore
from .errors import InputError

#: the config field behind each external input name of the stages (``Stage.external_inputs``), for error messages
_INPUT_FIELDS = {
    "calibration": "calibration.path",
    "corpus": "calibration.path",
    "eval_set": "eval.eval_set",
    "reference_checkpoint": "model.path",
    "draft_model": "eval.draft_model_path",
}


#: external inputs that are one file (a folder there is refused with the others, before any stage runs)
_FILE_FIELDS = {"calibration.path", "eval.eval_set"}


def _missing_inputs(stage: Stage, cfg: PipelineConfig) -> tuple[dict[str, Path], dict[str, Problem]]:
    """``stage``'s external inputs: ``(resolved {name: existing path}, missing {"<field>=<value>": Problem})``."""
    out: dict[str, Path] = {}
    missing: dict[str, Problem] = {}
    for name, p in stage.external_inputs(cfg).items():
        rp = resolve_path(str(p))
        if rp is None or not rp.exists():
            field = _INPUT_FIELDS.get(name)
            missing[f"{field}={p}" if field else f"input {name!r} ({p})"] = Problem(
                field or f"input {name!r}",
                str(p),
                f"not found (looked for {rp}; the {stage.name} stage reads it).",
                f"{'set ' + field + ' to' if field else 'point the config at'} an existing path (relative paths are "
                "resolved against the directory you run pipeline from, then the repository).",
            )
        elif rp.is_dir() and _INPUT_FIELDS.get(name) in _FILE_FIELDS:
            field = _INPUT_FIELDS[name]
            missing[f"{field}={p}"] = Problem(
                field,
                str(p),
                f"is a directory ({rp}); the {stage.name} stage reads one file.",
                f"set {field} to the data file itself (e.g. a .jsonl file, one JSON object per line).",
            )
        else:
            out[name] = rp
    return out, missing


def resolve_externals(stage: Stage, cfg: PipelineConfig) -> tuple[dict[str, Path], dict[str, str]]:
    """``stage``'s external inputs: ``(resolved {name: existing path}, missing {"<field>=<value>": message})``, each
    message naming the config field, the value, where it was looked for and the fix."""
    out, missing = _missing_inputs(stage, cfg)
    return out, {what: f"{what}: {p.message} Fix: {p.fix}" for what, p in missing.items()}


class _Refusal(Problem):
    """A stage's own refusal of an input (its message names the field, the value and the fix), printed as it is."""

    def __str__(self) -> str:
        return self.message


def input_problems(order: list[str], cfg: PipelineConfig, said: list[Problem] | None = None) -> list[Problem]:
    """The inputs of the stages in ``order`` that are missing (or a folder where a file goes), each once, and a
    stage's own refusal of an input while listing them (the export stage's of a checkpoint folder that is not there),
    as :class:`Problem` s: what a run that already has configuration problems (``said``) reports with them, so that
    nothing found before work starts waits for a second run. The eval set's refusal is left out: the evaluate stage's
    checks report each of its problems; so is a missing input whose field a refusal already names
    (``model.path=...: not found``), and one that ``said`` already holds (same field and value, or its text)."""
    from .data.evalset import EvalSetError

    found: dict[str, Problem] = {}
    for name in order:
        try:
            _, missing = _missing_inputs(get_stage(name), cfg)
        except EvalSetError:
            continue
        except InputError as e:
            missing = {str(e): _Refusal("input", None, str(e))}
        for what, p in missing.items():
            named = any(isinstance(r, _Refusal) and r.message.startswith(f"{p.field}=") for r in found.values())
            if not named:
                found.setdefault(what, p)
    said = said or []
    return [p for p in found.values() if not any(q.field == p.field and q.value == p.value or str(q).endswith(str(p)) for q in said)]


def all_externals(order: list[str], cfg: PipelineConfig) -> dict[str, dict[str, Path]]:
    """:func:`resolve_externals` of every stage in ``order``. Every missing input is reported in one InputError,
    once even when several stages read it (the calibration set: quantize, and evaluate's held-out text); its
    ``stage`` attribute is the first stage with a missing input (the one the run summary marks failed)."""
    out: dict[str, dict[str, Path]] = {}
    missing: dict[str, str] = {}
    first: str | None = None
    for name in order:
        out[name], gone = resolve_externals(get_stage(name), cfg)
        if gone and first is None:
            first = name
        for what, msg in gone.items():
            missing.setdefault(what, msg)  # the first stage's message wins
    if missing:
        msgs = list(missing.values())
        err = InputError(msgs[0] if len(msgs) == 1 else f"{len(msgs)} missing inputs:\n" + "\n".join(f"  - {m}" for m in msgs))
        err.stage = first  # type: ignore[attr-defined]
        raise err
    return out


#: the fix of a store_dir the run cannot create or write
_STORE_FIX = "point store_dir at a writable folder (it is created if missing)"


def store_dir_problem(store_dir: str) -> Problem | None:
    """Why ``store_dir`` cannot hold the artifact store (a :class:`Problem`, exit 2), or None; the one check of
    :func:`open_store` (the run) and of ``pipeline plan`` / ``pipeline.plan`` (:func:`pipeline.validation.validate`),
    so both refuse a path that is a file, a symbolic link to a missing path (the target named), a read-only mount or a
    path under ``/proc`` with one message.  It leaves nothing behind: it makes a temporary folder in ``store_dir``
    itself, or, for a store not created yet, in the nearest existing folder above it, and removes it (a plan never
    creates the store; a trial: plan exit 0, run exit 2)."""
    import tempfile

    if not str(store_dir).strip():
        return Problem("store_dir", store_dir, "empty.", "set store_dir to a folder, e.g. store_dir=artifacts (the default)")
    root = probe_in = Path(str(store_dir))
    try:
        root = probe_in = resolve_path(str(store_dir)) or root
        while not probe_in.is_dir():  # the nearest existing folder: "/" at the latest
            if os.path.lexists(probe_in):
                where = "" if probe_in == root else f" ({probe_in}, on the way to {root})"
                if probe_in.is_symlink() and not probe_in.exists():  # a dangling link: lexists, yet no file is there
                    target = probe_in.parent / os.readlink(probe_in)  # an absolute target replaces the parent
                    return Problem(
                        "store_dir",
                        store_dir,
                        f"is a symbolic link to a missing path, {target}{where}; the artifact store is a folder.",
                        f"create the folder it points to (mkdir -p {target}), point store_dir at another folder, or remove the link {probe_in}",
                    )
                return Problem(
                    "store_dir",
                    store_dir,
                    f"is a file, not a folder{where}; the artifact store is a folder.",
                    f"point store_dir at a folder (it is created if missing), or move {probe_in} out of the way",
                )
            probe_in = probe_in.parent
        os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=probe_in))
    except (OSError, ValueError) as e:  # ValueError: an embedded NUL byte
        why = getattr(e, "strerror", None) or e
        what = f"cannot write in {root}" if probe_in == root else f"cannot create {root}: no folder can be made in {probe_in}"
        return Problem("store_dir", store_dir, f"{what} ({why}).", _STORE_FIX)
    return None


def open_store(store_dir: str, verify: bool = False) -> ArtifactStore:
    """The artifact store at ``store_dir``, created if needed; InputError (exit 2) when unusable
    (:func:`store_dir_problem`)."""
    problem = store_dir_problem(store_dir)
    if problem is not None:
        raise InputError(str(problem))
    root = resolve_path(str(store_dir)) or Path(store_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:  # what changed since the check (a race) or a file the folder refuses (a full disk)
        raise InputError(str(Problem("store_dir", store_dir, f"cannot create or write {root} ({e.strerror or e}).", _STORE_FIX))) from e
    # ModelOpt's CUDA extension is compiled on first use into TORCH_EXTENSIONS_DIR (~50 s on a fresh GPU machine):
    # kept beside the store, so a CI job that caches the store keeps it (pipeline.quantize.calibrate.cuda_extension)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(root / ".cache" / "torch_extensions"))
    return ArtifactStore(root, verify=verify)
