"""``make gpu-check``: the quantize stage's placements on one device, measured and compared (docs/memory.md).

For each shape (deterministic random Llama weights, :mod:`pipeline.bench.shapes`) it exports once, then quantizes
(int4 AWQ, ``calib_size`` x ``calib_max_seq_length`` tokens) in one ``pipeline`` process per placement, each in its own
store so no placement is a cache hit of another:

* ``whole``: the model loaded whole on the device;
* ``layerwise``: ``calibration.layerwise=true`` (one decoder layer at a time, nothing offloaded);
* ``offload_host`` (CUDA only): ``calibration.max_device_memory_gb`` = a quarter of the model, the other layers in host memory;
* ``offload_disk``: the same budget and (CUDA) ``calibration.max_host_memory_gb`` = a few layers: the rest on disk;
* ``resume``: layer by layer, killed (SIGKILL) once a layer has been checkpointed, then started again with the same key.

Per placement: exit code, wall and quantize seconds, seconds per billion parameters, host peak RSS and GPU peak
(``torch.cuda.max_memory_allocated``) from the run summary, the planner's prediction for the same run. Then the
placements are compared with ``whole`` (and the offloaded/resumed ones with ``layerwise``): identical quant-state
tensors, TensorRT-LLM ranks and HF weights, or else the simulated models' mean KL divergence and same-top-token share
on seeded token sequences (each restored on the device, so the probe self-check runs like with like).

Results go to ``<out>/gpu.json`` + ``gpu.md`` (``gpu-cpu.*`` for ``--device cpu``), rewritten after every step, so a
run cut short by its time limit (``--deadline-s``: steps that would start after it are recorded as skipped) still
leaves what it measured.

    python -m pipeline.bench.gpu_check [--device cuda|cpu] [--shapes llama1b,llama8b] [--out bench/results]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.contracts.bench import GpuShape
from .scale import RUN_ARGS as SCALE_RUN_ARGS
from .scale import _pipeline, quantize_record, stage_records
from .shapes import ROOT, SHAPES, make_shape, parameter_count

#: the scale ladder's int4 AWQ calibration (pipeline/bench/scale.py), at a fixed batch: every placement and shape sees
#: the same tokens, whatever memory is free
RUN_ARGS = [*SCALE_RUN_ARGS, "calibration.batch_size=8"]
#: the issue's agreement bar for placements that are not byte-identical
KLD_MAX, TOP1_MIN = 1e-4, 0.999


def _bf16_bytes(shape: str, device: str) -> int:
    return parameter_count(shape) * (2 if device == "cuda" else 4)


PLACEMENTS = ("offload_host", "layerwise", "whole", "offload_disk", "resume")


def placements(shape: str, device: str) -> dict[str, list[str]]:
    """Placement name -> the overrides that ask for it (order: the most informative first)."""
    layer = _bf16_bytes(shape, device) / SHAPES[shape]["num_hidden_layers"]
    quarter = f"calibration.max_device_memory_gb={_bf16_bytes(shape, device) / 4 / 1e9:.4f}"
    out: dict[str, list[str]] = {}
    if device == "cuda":
        out["offload_host"] = [quarter]
    out["layerwise"] = ["calibration.layerwise=true"]
    out["whole"] = []
    if device == "cuda":
        out["offload_disk"] = [quarter, f"calibration.max_host_memory_gb={3 * layer / 1e9:.4f}"]
    else:
        out["offload_disk"] = [quarter]
    out["resume"] = ["calibration.layerwise=true"]
    return out


class Check:
    """The results document, written after every step."""

    def __init__(self, out: Path, device: str, deadline: float) -> None:
        self.path = out / ("gpu.json" if device == "cuda" else "gpu-cpu.json")
        self.device, self.deadline = device, deadline
        self.doc: dict[str, Any] = {
            "schema": "pipeline.gpu_check/v1",
            "date": _dt.date.today().isoformat(),
            "device": device,
            "host": _host(device),
            "command": " ".join([sys.executable, "-m", "pipeline.bench.gpu_check", *sys.argv[1:]]),
            "shapes": {},
        }

    def time_left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.doc, indent=1, default=str) + "\n", encoding="utf-8")
        self.path.with_suffix(".md").write_text(render_md(self.doc), encoding="utf-8")


def _host(device: str) -> dict[str, Any]:
    import torch

    from ..core import hostinfo

    h: dict[str, Any] = {"cpu": hostinfo.cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__}
    for name in ("transformers", "nvidia-modelopt", "accelerate"):
        h[name] = hostinfo.installed_version(name)
    if device == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        h["gpu"] = {"name": torch.cuda.get_device_name(0), "total_bytes": total, "free_bytes": free}
    return h


def _store_with_export(work: Path, name: str, base: Path) -> Path:
    """A fresh store for one placement holding the shared export artifact (hard links: read only)."""
    store = work / name
    shutil.rmtree(store, ignore_errors=True)
    (store / "export").mkdir(parents=True)
    for art in (base / "export").iterdir():
        if not art.name.startswith("."):
            shutil.copytree(art, store / "export" / art.name, copy_function=os.link)
    return store


def _cmd(shape: str, shape_dir: Path, store: Path, run_dir: Path, device: str, extra: list[str], stages: str) -> list[str]:
    return [
        *_pipeline(),
        f"model.path={shape_dir}",
        f"model.name={shape}",
        f"store_dir={store}",
        f"hydra.run.dir={run_dir}",
        f"stages=[{stages}]",
        f"calibration.device={device}",
        *RUN_ARGS,
        *extra,
    ]


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float]:
    t = time.time()
    with open(log, "w", encoding="utf-8") as f:
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(1.0, timeout), env=dict(os.environ)).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, round(time.time() - t, 1)


def _quantize_row(run_dir: Path, shape: str) -> dict[str, Any]:
    """Time, memory and placement of the quantize stage from a run's summary and artifact."""
    st = next((s for s in stage_records(run_dir) if s.stage == "quantize"), None)
    if st is None:
        return {}
    seconds = round(float(st.seconds or 0), 1)
    row: dict[str, Any] = {
        "status": st.status,
        "seconds": seconds,
        "host_peak_bytes": st.process_peak_rss_bytes,
        "gpu_peak_bytes": max(st.gpu_peak_bytes.values(), default=None),
        "path": st.path,
        "s_per_b_params": round(seconds / (parameter_count(shape) / 1e9), 1),
    }
    if st.path:
        res, measured = quantize_record(Path(st.path))
        row["placement"] = {**res.placement, **measured.placement}
        row["cuda_extension"] = res.cuda_extension
        row["steps_s"] = {k: round(v, 1) for k, v in measured.timings_s.items()}
        row["steps_peak_rss_bytes"] = measured.peak_rss_bytes
    return row


def _predicted(shape_dir: Path, device: str, extra: list[str]) -> dict[str, Any]:
    """The planner's quantize prediction for the same run (host and GPU peak, placement)."""
    try:
        from ..core.config import compose
        from ..planner import plan

        p = plan(compose([f"model.path={shape_dir}", f"calibration.device={device}", *RUN_ARGS, *extra]))
        assert p.stages is not None  # plan() always predicts the stages
        q, pl = p.stages.predicted["quantize"], p.stages.calibration_placement
        return {"host_bytes": q.host_bytes, "gpu_bytes": q.gpu_bytes, "where": q.where, "offload": pl.offload if pl else None}
    except Exception as e:  # the prediction is reported, never a reason to stop measuring
        return {"error": f"{type(e).__name__}: {e}"}


def _resume(cmd: list[str], store: Path, log: Path, chk: Check) -> dict[str, Any]:
    """Start layer-by-layer calibration, SIGKILL it once ModelOpt has checkpointed a layer, start it again."""
    from ..quantize.calibrate import resume_point

    t = time.time()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ), start_new_session=True)
        killed_at = None
        while proc.poll() is None and chk.time_left() > 0:
            for d in (store / "quantize").glob(".resume-*/layerwise"):
                rp = resume_point(d)
                if rp and rp[0] >= 1:
                    killed_at = rp[0]
            if killed_at is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    first = {"killed_after_layers": killed_at, "first_run_s": round(time.time() - t, 1), "first_exit": proc.returncode}
    code, secs = _run(cmd, log.with_suffix(".rerun.log"), chk.time_left())
    return {**first, "exit_code": code, "wall_s": secs}


def _same_bytes(a: Path, b: Path) -> dict[str, Any]:
    import torch
    from safetensors import safe_open

    out: dict[str, Any] = {}
    from ..core.contracts.quantize import QuantizeArtifact as Q

    with safe_open(str(a / Q.QUANT_STATE_TENSORS), "pt") as x, safe_open(str(b / Q.QUANT_STATE_TENSORS), "pt") as y:
        keys = sorted(x.keys())
        out["quant_state"] = keys == sorted(y.keys()) and all(torch.equal(x.get_tensor(k), y.get_tensor(k)) for k in keys)
    ra, rb = a / Q.TRTLLM_CHECKPOINT / "rank0.safetensors", b / Q.TRTLLM_CHECKPOINT / "rank0.safetensors"
    out["trtllm_rank0"] = ra.is_file() and rb.is_file() and _file_equal(ra, rb)
    ha, hb = sorted((a / Q.HF_DIR).glob("*.safetensors")), sorted((b / Q.HF_DIR).glob("*.safetensors"))
    out["hf_weights"] = [p.name for p in ha] == [p.name for p in hb] and all(_file_equal(p, q) for p, q in zip(ha, hb))
    out["identical"] = all(out.values())
    return out


def _file_equal(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as x, open(b, "rb") as y:
        while True:
            u, v = x.read(1 << 24), y.read(1 << 24)
            if u != v:
                return False
            if not u:
                return True


def _logprobs(quant: Path, export: Path, device: str, ids: Any) -> Any:
    """Log-probabilities of the simulated model (restored on ``device``; the probe self-check runs) on ``ids``, on the CPU."""
    import torch

    from ..core.quant_state import load_simulated_model

    model = load_simulated_model(quant, export, device=device)
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids.to(device)).logits.float(), dim=-1).cpu()
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return lp


def agreement(a: Path, b: Path, export: Path, device: str, vocab: int, seqs: int = 4, tokens: int = 64) -> dict[str, Any]:
    """Mean KL(a || b) per token and the share of positions whose top token agrees, on seeded random token sequences."""
    import torch

    ids = torch.randint(4, vocab, (seqs, tokens), generator=torch.Generator().manual_seed(0))
    pa = _logprobs(a, export, device, ids)
    pb = _logprobs(b, export, device, ids)
    kld = float((pa.exp() * (pa - pb)).sum(-1).mean())
    top1 = float((pa.argmax(-1) == pb.argmax(-1)).float().mean())
    return {"kld": kld, "same_top1": top1, "met": kld <= KLD_MAX and top1 >= TOP1_MIN, "positions": seqs * tokens}


def _prepare(chk: Check, shape: str, work: Path, device: str) -> tuple[Path, Path] | str:
    """Generate ``shape`` and export it once (its store is ``<work>/<shape>/base``); when the export failed, why the
    shape's placements are skipped."""
    doc = chk.doc["shapes"].setdefault(
        shape, {"parameters": parameter_count(shape), "weights_bytes": _bf16_bytes(shape, device), "runs": {}}
    )
    shape_dir, base = work / "models" / shape, work / shape / "base"
    if "export" in doc:
        code = doc["export"]["exit_code"]
    else:
        t = time.time()
        make_shape(shape, shape_dir, draw_device="cuda" if device == "cuda" else "cpu")
        doc["generate_s"] = round(time.time() - t, 1)
        (work / shape).mkdir(parents=True, exist_ok=True)
        cmd = _cmd(shape, shape_dir, base, work / shape / "run-export", device, [], "export")
        code, secs = _run(cmd, work / shape / "export.log", chk.time_left())
        doc["export"] = {"exit_code": code, "wall_s": secs, **({"note": "cut by --deadline-s"} if code == 124 else {})}
        chk.save()
    if code == 0:
        return shape_dir, base
    return "out of time (--deadline-s) during the export" if code == 124 else "the export failed"


def run_step(chk: Check, shape: str, name: str, work: Path, device: str, keep: bool = True) -> None:
    """One placement of ``shape`` in its own store (results into ``chk.doc['shapes'][shape]['runs'][name]``); without
    ``keep`` the store is deleted once measured (a 7 B shape's quantize artifact is ~20 GB: two do not fit 64 GB of disk
    beside the checkpoint and its export)."""
    ready = _prepare(chk, shape, work, device)
    runs = chk.doc["shapes"][shape]["runs"]
    if isinstance(ready, str):
        runs[name] = {"skipped": ready}
        return
    if chk.time_left() < 20:
        runs[name] = {"skipped": "out of time (--deadline-s)"}
        return
    shape_dir, base = ready
    extra = placements(shape, device)[name]
    store = _store_with_export(work / shape, name, base)
    run_dir = work / shape / f"run-{name}"
    cmd = _cmd(shape, shape_dir, store, run_dir, device, extra, "export,quantize")
    if name == "resume":
        row = _resume(cmd, store, work / shape / f"{name}.log", chk)
    else:
        code, secs = _run(cmd, work / shape / f"{name}.log", chk.time_left())
        row = {"exit_code": code, "wall_s": secs}
    row.update(overrides=extra, quantize=_quantize_row(run_dir, shape), predicted=_predicted(shape_dir, device, extra))
    if row["exit_code"] != 0:
        row["log_tail"] = (work / shape / f"{name}.log").read_text(encoding="utf-8", errors="replace")[-1500:]
    runs[name] = row
    if not keep:
        shutil.rmtree(store, ignore_errors=True)
        row["store_deleted"] = True
    chk.save()


def prune(work: Path, shape: str) -> None:
    """Delete the placements' stores of ``shape`` (their measurements and comparisons are in the results)."""
    for d in (work / shape).iterdir() if (work / shape).is_dir() else []:
        if d.is_dir() and d.name in PLACEMENTS:
            shutil.rmtree(d, ignore_errors=True)


def compare(chk: Check, shape: str, work: Path, device: str) -> None:
    """Bytes, then (when they differ) KLD / same top token, of each placement against ``whole`` and ``layerwise``."""
    doc, base = chk.doc["shapes"][shape], work / shape / "base"
    paths = {n: Path(r.quantize.path) for n, r in GpuShape.from_json(doc).runs.items() if r.exit_code == 0 and r.quantize.path}
    export = next((p for p in (base / "export").iterdir() if not p.name.startswith(".")), None) if (base / "export").is_dir() else None
    pairs = [("whole", n) for n in paths if n != "whole"] + [("layerwise", n) for n in paths if n not in ("whole", "layerwise")]
    doc["compare"] = {}
    for ref, other in pairs:
        if ref not in paths or export is None:
            continue
        if chk.time_left() < 10:
            doc["compare"][f"{other} vs {ref}"] = {"skipped": "out of time"}
            continue
        c = _same_bytes(paths[ref], paths[other])
        if not c["identical"]:
            dev = "cuda:0" if device == "cuda" else "cpu"
            try:
                c["agreement"] = agreement(paths[ref], paths[other], export, dev, int(SHAPES[shape]["vocab_size"]))
            except Exception as e:  # a failed restore is a result too (the self-check names the fault)
                c["agreement"] = {"error": f"{type(e).__name__}: {e}"[:1500]}
        doc["compare"][f"{other} vs {ref}"] = c
        chk.save()


def render_md(doc: dict[str, Any]) -> str:
    gb = 1e9

    def g(b: Any) -> str:
        return "-" if not b else f"{b / gb:.2f} GB"

    def dash(v: Any) -> Any:
        return "-" if v is None else v

    lines = [
        f"# gpu-check ({doc['device']}, {doc['date']})",
        "",
        f"Host: {json.dumps(doc['host'], default=str)}",
        "",
        f"Command: `{doc['command']}`",
        "",
    ]
    for shape, s in ((k, GpuShape.from_json(v)) for k, v in doc["shapes"].items()):
        lines += [
            f"## {shape}: {s.parameters / 1e9:.2f} B parameters, {g(s.weights_bytes)} of weights in the compute dtype",
            "",
            "| placement | exit | wall s | quantize s | s / B params | host peak | GPU peak | planned host | planned GPU | offload (planned) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in s.runs.items():
            if r.skipped is not None:
                lines.append(f"| {name} | skipped: {r.skipped} | | | | | | | | |")
                continue
            q, p = r.quantize, r.predicted
            extra = ""
            if name == "resume":
                k = r.killed_after_layers
                extra = (
                    f" (killed after {k} layer(s), resumed at layer {q.resumed_at_layer})"
                    if k
                    else " (not killed: it finished before a layer checkpoint was seen)"
                )
            lines.append(
                f"| {name} | {r.exit_code} | {r.wall_s} | {dash(q.seconds)} | {dash(q.s_per_b_params)} | {g(q.host_peak_bytes)} | "
                f"{g(q.gpu_peak_bytes)} | {g(p.host_bytes)} | {g(p.gpu_bytes)} | {dash(q.offload)} ({dash(p.offload)}){extra} |"
            )
        if s.compare:
            lines += ["", "| comparison | identical bytes | KLD | same top token |", "|---|---|---|---|"]
            for k, c in s.compare.items():
                kld = dash(c.error) if c.kld is None else f"{c.kld:.2e}"
                top = "-" if c.same_top1 is None else f"{c.same_top1:.2%}"
                lines.append(f"| {k} | {c.skipped if c.identical is None else c.identical} | {kld} | {top} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--shapes", default=None, help="comma-separated shapes (default: llama1b,llama8b on cuda, llama80m,llama400m on cpu)")
    ap.add_argument("--only", default=None, help="comma-separated placements to run (default: all)")
    ap.add_argument(
        "--steps", default=None, help="comma-separated shape:placement steps, in this order (default: every placement of each shape)"
    )
    ap.add_argument("--merge", action="store_true", help="keep the other shapes of an existing results file")
    ap.add_argument(
        "--measure-only",
        default="",
        help="comma-separated shapes whose placements are measured, not compared: each store is deleted once measured (disk)",
    )
    ap.add_argument("--prune", action="store_true", help="delete each shape's placement stores once it is compared")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / "models" / "gpu-check")
    ap.add_argument("--deadline-s", type=float, default=520.0, help="start no step after this many seconds")
    a = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu-check: torch sees no CUDA device here. Fix: --device cpu (make gpu-check DEVICE=cpu).", file=sys.stderr)
            return 4
    if a.deadline_s <= 0:
        print(f"gpu-check: --deadline-s {a.deadline_s}: must be > 0 (seconds after which no step starts).", file=sys.stderr)
        return 2
    if a.shapes is not None and not a.shapes.strip():
        print("gpu-check: --shapes '': empty. Fix: name at least one shape, or leave --shapes out for the defaults.", file=sys.stderr)
        return 2
    shapes = (a.shapes or ("llama1b,llama8b" if a.device == "cuda" else "llama80m,llama400m")).split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        print(f"gpu-check: unknown shape(s) {unknown}. Fix: --shapes from {sorted(SHAPES)}.", file=sys.stderr)
        return 2
    only = a.only.split(",") if a.only else None
    known = list(placements(shapes[0], a.device))
    if only and [n for n in only if n not in known]:
        print(
            f"gpu-check: --only {a.only}: unknown placement(s) {[n for n in only if n not in known]}. Fix: from {known}.", file=sys.stderr
        )
        return 2
    raw = a.steps.split(",") if a.steps else [f"{sh}:{n}" for sh in shapes for n in placements(sh, a.device) if not only or n in only]
    steps = [(x.split(":", 1)[0], x.split(":", 1)[1] if ":" in x else "") for x in raw]
    bad = [f"{sh}:{n}" for sh, n in steps if sh not in SHAPES or n not in placements(sh, a.device)]
    if bad:
        print(
            f"gpu-check: unknown step(s) {bad}. Fix: shape:placement with placements {list(placements(shapes[0], a.device))}.",
            file=sys.stderr,
        )
        return 2
    chk = Check(a.out, a.device, time.time() + a.deadline_s)
    if a.merge and chk.path.is_file():
        chk.doc["shapes"] = GpuShape.section(json.loads(chk.path.read_text(encoding="utf-8")))
        for sh in {sh for sh, _ in steps}:
            chk.doc["shapes"].pop(sh, None)
    a.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(a.work / "torch_extensions"))
    measure_only = set(filter(None, a.measure_only.split(",")))
    with contextlib.suppress(KeyboardInterrupt):
        for i, (sh, n) in enumerate(steps):
            run_step(chk, sh, n, a.work, a.device, keep=sh not in measure_only)
            if sh not in measure_only and sh in chk.doc["shapes"] and all(x != sh for x, _ in steps[i + 1 :]):
                compare(chk, sh, a.work, a.device)  # the shape's last step: compare, then free its disk
                if a.prune:
                    prune(a.work, sh)
    chk.save()
    print(chk.path.with_suffix(".md").read_text(encoding="utf-8"))
    failed = [
        f"{s}/{n}"
        for s, d in chk.doc["shapes"].items()
        for n, r in GpuShape.from_json(d).runs.items()
        if r.skipped is None and r.exit_code != 0
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
