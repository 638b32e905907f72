"""Serving parity: what the packaged repository serves equals what the evaluate stage measured, byte for byte.

After the package stage has written and validated the model repository, :func:`run_parity` starts it on the real
Triton server (CPU target), replays a fixed, seeded sample of the evaluated items through the gRPC ``ensemble``
(non-streamed and streamed), and compares every served answer with the evaluate stage's candidate answer
(``outputs.jsonl`` of the evaluate artifact).  Prompts are rendered by the client from the *package's own*
tokenizer and chat template (``model_repository/preprocessing/1/tokenizer``), as a client of the deployment would.

How a served answer is compared (the same rules the evaluate stage applies, ``pipeline.evaluate.runners``):

* budget: the item's ``max_new_tokens`` after the engine limits (``prepare``), sent as ``max_tokens``;
* stop ids: nothing is sent: the deployment's own defaults (``end_id`` and the engine's eos list) must stop where
  evaluate stopped (every eos id of ``model_info.json``) - a deployment that does not is a parity failure;
* stop strings: the served text is cut at the first stop string, as evaluate cuts its text.

The expected answers and rendered requests are also written to ``parity_expected.jsonl`` in the package artifact,
so the same check runs against a server elsewhere (a TensorRT-LLM package on its GPU host) with
``pipeline client --parity <package artifact> --url HOST:PORT``.

Result (recorded in the release manifest as ``parity``)::

    {"status": "passed" | "failed" | "not run here" | "disabled", "matched": int, "total": int,
     "mode": "grpc ensemble, unary + streamed", "sample": int, "of": int, "seed": int,
     "per_mode": {"unary": int, "stream": int}, "first_mismatch": {id, prompt, evaluated, served, mode} | None,
     "command": str}
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..core.contracts.build import EngineLimits
from ..core.contracts.evaluate import EvalArtifact
from ..core.contracts.package import PACKAGE_ID_PARAMETER, EvaluatedAnswer, PackageArtifact, ParityExpectedMeta, ParityRequest
from ..errors import GateFailed, InputError, PreflightError

EXPECTED_FILE = "parity_expected.jsonl"
MODES = ("unary", "stream")
DEFAULT_SAMPLE = 64
DEFAULT_SEED = 0


def command_for(package_dir: str = "<package artifact or unpacked release folder>", url: str = "<host>:8001") -> str:
    """The one command that runs the parity check against an already running server (no paths of this host: the
    manifest is part of the reproducible release archive)."""
    return f"pipeline client --parity {package_dir} --url {url}"


def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def expected_requests(
    eval_dir: Path,
    repo: Path,
    *,
    max_new_tokens: int,
    extra_stop: Sequence[str],
    apply_chat_template: bool,
    sample: int = DEFAULT_SAMPLE,
    seed: int = DEFAULT_SEED,
) -> tuple[list[dict[str, Any]], int]:
    """The seeded sample of evaluated items as requests with their expected answers.

    Args:
        eval_dir: the evaluate artifact (``eval_report.json``, ``outputs.jsonl``).
        repo: the model repository (its ``preprocessing/1/tokenizer`` renders the prompts).
        max_new_tokens, extra_stop, apply_chat_template: the evaluate config's ``eval.max_new_tokens``, ``eval.stop``,
            ``model.apply_chat_template`` (the budget/stop rules evaluate applied).
        sample: how many items (all when fewer were evaluated); ``seed``: the sampling seed.
    Returns:
        (requests, number of evaluated items).  Each request: ``{id, text_input, max_tokens, stop_strings, expected,
        prompt}`` plus ``messages`` when the chat template applies (replayed as the ensemble's ``messages`` input where
        the deployment has it, so user content stays data as in evaluate's ``encode_prompt``; else ``text_input``).
    Raises:
        InputError: the evaluate artifact lacks what is needed, or the eval set changed since it was evaluated.
    """
    from ..core.store import sha256_file
    from ..core.tokenization import codec_of, render
    from ..data.evalset import load_eval_set, prepare

    rep_p, out_p = EvalArtifact(eval_dir).report_path, EvalArtifact(eval_dir).outputs_path
    if not rep_p.is_file() or not out_p.is_file():
        raise InputError(
            f"{eval_dir}: no eval_report.json/outputs.jsonl; the parity check needs the evaluated answers. "
            f"Fix: re-run the evaluate stage (pipeline force=true stages=[evaluate,package])."
        )
    rep = EvalArtifact(eval_dir).report()
    cand, es = rep.candidate, rep.eval_set
    path = es.path or Path("")
    if not path.is_file() or sha256_file(path) != es.sha256:
        raise InputError(
            f"eval set {path} is missing or changed since it was evaluated (sha256 recorded {es.sha256}). "
            f"Fix: re-run evaluate on the current eval set."
        )
    items = {it.id: it for it in load_eval_set(path, limit=es.limit)}
    rows = {r.id: r for r in map(EvaluatedAnswer.from_json, _read_jsonl(out_p)) if r.runner == cand and not r.skipped}
    if not rows:
        raise InputError(f"{out_p} has no answers of the candidate runner {cand!r}. Fix: re-run the evaluate stage.")
    ids = sorted(rows)
    chosen = sorted(random.Random(seed).sample(ids, min(sample, len(ids)))) if sample < len(ids) else ids
    tok = _tokenizer(package_tokenizer_dir(repo))
    limits = EngineLimits.from_json(rep.limits)
    prepared = prepare(
        [items[i] for i in chosen],
        tok,
        max_input_len=int(limits.max_input_len or 10**9),
        max_seq_len=limits.max_seq_len,
        default_max_new_tokens=max_new_tokens,
        extra_stop=extra_stop,
        apply_chat_template=apply_chat_template,
    )
    out = []
    chat = codec_of(tok).uses_template(apply_chat_template)
    for p in prepared:
        it = p.item
        r = {
            "id": it.id,
            "text_input": render(tok, it.prompt, it.messages, apply_chat_template=apply_chat_template),
            "max_tokens": p.max_new_tokens,
            "stop_strings": p.stop_strings,
            "expected": rows[it.id].text,
            "prompt": it.prompt_text(),
        }
        if chat:  # served as `messages`: the server renders and keeps user content as data, as evaluate's encode_prompt
            r["messages"] = list(it.messages) if it.messages else [{"role": "user", "content": it.prompt}]
        out.append(r)
    return out, len(ids)


_TOK_LOCK = threading.Lock()
TOKENIZER_DIRS = ("preprocessing/1/tokenizer", "tensorrt_llm/1/tokenizer")
"""Where a model repository keeps its tokenizer: the ensemble layouts' preprocessing model, or the LLM-API layout's
``tensorrt_llm`` model (:func:`pipeline.package.repository.generate_repository`)."""


def package_tokenizer_dir(repo: Path) -> Path:
    """The tokenizer folder of the model repository ``repo`` (first of :data:`TOKENIZER_DIRS` that holds one).

    Raises:
        InputError: the repository has no tokenizer folder (not written by the package stage).
    """
    for rel in TOKENIZER_DIRS:
        if (repo / rel).is_dir():
            return repo / rel
    raise InputError(f"{repo}: no tokenizer folder ({' or '.join(TOKENIZER_DIRS)}). Fix: re-run the package stage.")


def _tokenizer(d: Path) -> Any:
    with _TOK_LOCK:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(d), trust_remote_code=False)


def cut_at_stop_strings(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any stop string (the evaluate stage's rule)."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return text[:cut] if cut >= 0 else text


def replay(
    url: str, requests: list[dict[str, Any]], *, modes: Sequence[str] = MODES, concurrency: int = 4, timeout_s: float = 120.0
) -> dict[str, Any]:
    """Send every request to the ``ensemble`` at ``url`` in each mode; compare with ``expected``.

    Returns ``{"matched", "total", "per_mode": {mode: matched}, "first_mismatch"}`` (items in id order).
    """
    from .client import LLMClient

    local = threading.local()
    clients: list[LLMClient] = []
    lock = threading.Lock()

    def one(job: tuple[ParityRequest, str]) -> tuple[str, str, str]:
        r, mode = job
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = LLMClient(url, timeout_s=timeout_s)
            with lock:
                clients.append(c)
        try:  # text_input + max_tokens (+ stream): the deployment's defaults do the rest, as for any client
            how = {"messages": r.messages} if r.messages and "messages" in c.inputs else {"prompt": r.text_input, "chat": False}
            res = c.generate(max_tokens=int(r.max_tokens), stream=(mode == "stream"), **how)
            served = cut_at_stop_strings(res.text, r.stop_strings or [])
        except Exception as e:
            served = f"<request failed: {e}>"
        return r.id, mode, served

    reqs = [ParityRequest.from_json(r) for r in requests]
    jobs = [(r, m) for r in reqs for m in modes]
    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
            results = list(ex.map(one, jobs))
    finally:
        for c in clients:
            c.close()
    by_id = {r.id: r for r in reqs}
    matched, per_mode, first = 0, {m: 0 for m in modes}, None
    for rid, mode, served in results:
        ok = served == by_id[rid].expected
        matched += ok
        per_mode[mode] += ok
        if not ok and first is None:
            first = {"id": rid, "mode": mode, "prompt": by_id[rid].prompt, "evaluated": by_id[rid].expected, "served": served}
    return {"matched": matched, "total": len(results), "per_mode": per_mode, "first_mismatch": first}


def side_by_side(m: dict[str, Any]) -> str:
    return f"item {m['id']} ({m['mode']}):\n  prompt:    {m['prompt']!r}\n  evaluated: {m['evaluated']!r}\n  served:    {m['served']!r}"


def write_expected(path: Path, requests: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
        for r in requests:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_expected(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows = _read_jsonl(path)
    if not rows or "meta" not in rows[0]:
        raise InputError(f"{path}: not a parity file written by the package stage. Fix: re-package.")
    return rows[0]["meta"], rows[1:]


def run_parity(
    package_dir: Path,
    repo: Path,
    eval_dir: Path,
    *,
    target: str,
    cfg: Any,
    log: Any = None,
    serve_venv: str | None = None,
    package_id: str | None = None,
) -> dict[str, Any]:
    """The package stage's parity check (see module docstring).  Returns the manifest's ``parity`` record.
    ``package_id`` (the id stamped into the repository's ensemble config) is recorded in ``parity_expected.jsonl``.

    Raises:
        GateFailed (exit 3): a served answer differs from the evaluated one (the message shows the first side by side).
        PreflightError (exit 4): the serving environment is missing (fix: ``make serve-env`` or ``package.parity=false``).
    """
    pc = cfg.package
    sample, seed = int(getattr(pc, "parity_sample", DEFAULT_SAMPLE)), int(getattr(pc, "parity_seed", DEFAULT_SEED))
    base = {"mode": "grpc ensemble, unary + streamed", "seed": seed, "command": command_for()}
    if not getattr(pc, "parity", True):
        if log is not None:
            log.warning("serving parity check disabled by package.parity=false (recorded in the release manifest)")
        return {**base, "status": "disabled", "disabled_by": "package.parity=false", "matched": None, "total": None}
    requests, n_eval = expected_requests(
        eval_dir,
        repo,
        max_new_tokens=int(cfg.eval.max_new_tokens),
        extra_stop=list(cfg.eval.stop),
        apply_chat_template=bool(getattr(cfg.model, "apply_chat_template", True)),
        sample=sample,
        seed=seed,
    )
    meta: dict[str, Any] = {"sample": len(requests), "of": n_eval, "seed": seed, "modes": list(MODES)}
    if package_id:
        meta["package_id"] = package_id
    write_expected(package_dir / EXPECTED_FILE, requests, meta)
    base.update(sample=len(requests), of=n_eval, expected_file=EXPECTED_FILE)
    if target != "onnxruntime_genai":
        return {
            **base,
            "status": "not run here",
            "matched": None,
            "total": None,
            "reason": f"a {target} package is served by the NGC TensorRT-LLM container on a GPU host; run the command there",
        }
    from .server import TritonServer

    t0 = time.perf_counter()
    srv = TritonServer(repo, serve_venv=serve_venv, ready_timeout_s=float(getattr(pc, "ready_timeout_s", 180.0)))
    try:
        try:
            srv.start()  # stops its own process when interrupted while waiting for readiness
        except PreflightError as e:
            raise PreflightError(
                f"serving parity check: {e} (or disable the check explicitly with package.parity=false, "
                f"which is recorded in the release manifest)"
            ) from None
        res = replay(srv.grpc_url, requests)
    finally:  # also on Ctrl-C: no server may outlive the run
        srv.stop()
        srv.cleanup()
    rec = {**base, **res, "status": "passed" if res["matched"] == res["total"] else "failed"}
    if log is not None:  # the time is logged, not recorded: the manifest is part of the reproducible archive
        log.info("serving parity: %d/%d served == evaluated in %.1f s", res["matched"], res["total"], time.perf_counter() - t0)
    if rec["status"] == "failed":
        raise GateFailed(
            f"serving parity failed: {res['matched']}/{res['total']} served answers equal the evaluated ones "
            f"(grpc ensemble, unary + streamed). First difference, {side_by_side(res['first_mismatch'])}\n"
            f"Fix: the served pre/postprocessing or engine differs from what evaluate ran; see docs/package.md "
            f"(serving parity). package.parity=false disables the check (recorded)."
        )
    return rec


def served_package_id(url: str) -> str | None:
    """The package id (:data:`pipeline.core.contracts.package.PACKAGE_ID_PARAMETER`) of the ``ensemble`` served at ``url``; None
    when the server does not report one (a repository written before the id, or by another tool) or cannot be asked
    (the replay then reports the connection problem)."""
    try:
        import tritonclient.grpc as grpcclient

        from .client import grpc_address

        c = grpcclient.InferenceServerClient(grpc_address(url))
        try:
            cfg = c.get_model_config("ensemble", as_json=True, client_timeout=10)["config"]
        finally:
            c.close()
    except Exception:
        return None
    value = (cfg.get("parameters") or {}).get(PACKAGE_ID_PARAMETER, {}).get("string_value")
    return value if isinstance(value, str) and value else None


def check_against_server(package_dir: Path, url: str) -> dict[str, Any]:
    """``pipeline client --parity``: replay ``parity_expected.jsonl`` of a package against a running server.

    Raises:
        InputError (exit 2): the package has no parity file, or the server reports another package's id
            (:func:`served_package_id`), naming both ids and the fix.
    """
    if not package_dir.exists():
        raise InputError(
            f"--parity {package_dir}: no such file or folder. Fix: pass a package artifact folder or an unpacked release folder."
        )
    if package_dir.is_file():
        fix = (
            "unpack it first (tar -xzf) and pass the folder"
            if package_dir.name.endswith(PackageArtifact.ARCHIVE_SUFFIXES)
            else "pass its folder"
        )
        raise InputError(f"--parity {package_dir}: a file, not a package folder. Fix: {fix}.")
    p = package_dir / EXPECTED_FILE
    if not p.is_file():
        raise InputError(f"{p} is missing. Fix: pass a package artifact folder written by the package stage (with the parity check on).")
    meta, requests = read_expected(p)
    expected = ParityExpectedMeta.from_json(meta)
    ours, served = expected.package_id, served_package_id(url)
    if ours and served and served != ours:
        raise InputError(
            f"the server at {url} serves another package: its ensemble config has {PACKAGE_ID_PARAMETER}="
            f"{served[:16]}, but {p} was written for {ours[:16]}, so its answers are not the ones to expect. Fix: pass "
            f"the package that server was started from, or point --url at the server started from {package_dir}."
        )
    res = replay(url, requests, modes=expected.modes or MODES)
    return {**meta, **res, "status": "passed" if res["matched"] == res["total"] else "failed", "url": url}


__all__ = [
    "EXPECTED_FILE",
    "check_against_server",
    "command_for",
    "cut_at_stop_strings",
    "expected_requests",
    "replay",
    "run_parity",
    "served_package_id",
    "side_by_side",
]
