"""Scale: one model in memory at a time (issue "real checkpoints at real scale").

Real components throughout: the streaming safetensors writer against the safetensors library's own reader, the
kernel's peak-RSS counters, ModelOpt calibrating a tiny Llama layer by layer with accelerate offloading its layers to
disk (the path a model larger than its device takes), the planner's per-stage prediction and its refusal through the
CLI, and the benchmark shapes' streaming generator against building the model in memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tiny
import torch

from pipeline.core.config import compose
from pipeline.errors import InputError

CALIB = ["calibration.calib_size=16", "calibration.min_samples=4", "calibration.calib_max_seq_length=48", "calibration.batch_size=8"]


# --------------------------------------------------------------------------- streaming safetensors
def test_streamed_safetensors_read_back_by_the_library(tmp_path):
    from safetensors import safe_open

    from pipeline.core.tensorio import write_streaming

    ts = {
        "a": torch.randn(3, 4),
        "scalar": torch.tensor(2.5),
        "bf16": torch.randn(5).to(torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "fp8": torch.randn(2, 2).to(torch.float8_e4m3fn),
        "empty": torch.zeros(0, 3),
        "ids": torch.arange(7, dtype=torch.int64),
    }
    produced = []

    def produce(name):
        produced.append(name)
        return ts[name]

    p = tmp_path / "x.safetensors"
    write_streaming(p, [(k, v.dtype, tuple(v.shape)) for k, v in ts.items()], produce, {"schema": "s"})
    assert produced == list(ts)  # each tensor asked for once, in header order
    with safe_open(str(p), "pt") as f:
        assert f.metadata() == {"schema": "s"} and list(f.keys()) == sorted(ts)
        for k, v in ts.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and got.shape == v.shape and torch.equal(got.float(), v.float()), k


def test_streamed_safetensors_refuse_a_tensor_that_differs_from_its_header(tmp_path):
    from pipeline.core.tensorio import write_streaming

    with pytest.raises(ValueError, match="header says"):
        write_streaming(tmp_path / "y.safetensors", [("w", torch.float32, (2, 2))], lambda n: torch.zeros(2, 3))
    with pytest.raises(ValueError, match="listed twice"):
        write_streaming(tmp_path / "z.safetensors", [("w", torch.float32, (1,)), ("w", torch.float32, (1,))], lambda n: torch.zeros(1))


# --------------------------------------------------------------------------- peak memory
def test_nested_measurements_keep_the_outer_peak():
    import numpy as np

    from pipeline.core import memory

    if memory.peak_rss_bytes() is None:
        pytest.skip("no /proc/self/status on this platform")
    with memory.measure() as outer:
        with memory.measure() as inner:
            block = np.ones(200_000_000 // 8)  # 200 MB, touched
            del block
        with memory.measure() as after:
            pass
    assert inner.process_peak_rss_bytes - inner.start_rss_bytes > 150_000_000
    assert outer.process_peak_rss_bytes >= inner.process_peak_rss_bytes  # the inner reset did not lose it
    if after.reset:  # the kernel let us reset the counter: the later block does not see the freed 200 MB
        assert after.process_peak_rss_bytes < inner.process_peak_rss_bytes


def test_a_childs_own_peak_is_sampled():
    from pipeline.core.memory import run_sampled

    code, peak = run_sampled([sys.executable, "-c", "import numpy as np, time; a = np.ones(300_000_000 // 8); time.sleep(0.5)"])
    assert code == 0 and peak is not None and peak > 300_000_000


def test_an_interrupted_run_sampled_kills_its_child(tmp_path, monkeypatch):
    """A run stopped by SIGTERM or SIGHUP (a KeyboardInterrupt: pipeline/cli.py) left the onnxruntime-genai model
    builder running after it had exited (trial); the child is killed and reaped before the interrupt goes on."""
    import os
    import time

    from pipeline.core.memory import run_sampled

    pidfile, sleep = tmp_path / "pid", time.sleep

    def interrupt_once_started(seconds: float) -> None:
        if pidfile.is_file() and pidfile.read_text().strip():
            raise KeyboardInterrupt
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", interrupt_once_started)
    with pytest.raises(KeyboardInterrupt):
        run_sampled(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"])
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)  # gone, and reaped (no zombie)


# --------------------------------------------------------------------------- placement
class _Cal:
    def __init__(self, device="auto", layerwise="auto", cap=None):
        self.device, self.layerwise, self.max_device_memory_gb = device, layerwise, cap


def test_placement_whole_model_when_it_fits():
    from pipeline.quantize.placement import plan_placement

    p = plan_placement(_Cal(), 1_000_000, "bfloat16", free=10**9, device="cpu")
    assert (p.device, p.dtype, p.offload, p.layerwise) == ("cpu", "float32", "none", False)
    assert p.model_bytes == 4_000_000 and p.budget_bytes == int(0.8 * 10**9)


def test_placement_onloads_layers_when_the_model_does_not_fit():
    from pipeline.quantize.placement import plan_placement

    gpu = plan_placement(_Cal(), 8_000_000_000, "bfloat16", free=10 * 10**9, device="cuda:0")
    assert (gpu.dtype, gpu.offload, gpu.layerwise) == ("bfloat16", "cpu", True)  # 16 GB of bf16 > 8 GB budget
    assert "onloaded one layer at a time" in gpu.reason
    assert plan_placement(_Cal(), 10**6, "float32", free=10**9, device="cuda:0").dtype == "bfloat16"  # fp32 ckpt: bf16 on GPU
    cpu = plan_placement(_Cal(cap=0.001), 1_000_000, "float32", device="cpu")
    assert (cpu.offload, cpu.layerwise) == ("disk", True)
    with pytest.raises(InputError, match=r"calibration\.layerwise=false.*Fix: calibration\.layerwise=auto"):
        plan_placement(_Cal(layerwise="false", cap=0.001), 1_000_000, "float32", device="cpu")


def test_cuda_on_a_host_without_one_is_refused():
    from pipeline.quantize.placement import resolve_device

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    with pytest.raises(InputError, match=r"calibration\.device='cuda'.*Fix: calibration\.device=auto"):
        resolve_device("cuda")
    assert resolve_device("auto") == "cpu"


def test_a_missing_gpu_is_refused_before_any_stage_runs(tmp_path, tiny_llama):
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    store = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "pipeline.cli",
        f"model.path={tiny_llama}",
        "stages=[quantize]",
        "calibration.device=cuda:0",
        f"store_dir={store}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "build.max_seq_len=256",
        "build.max_input_len=200",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-2000:]
    assert "calibration.device='cuda:0'" in out and "Fix: calibration.device=auto" in out, out[-2000:]
    assert not (store / "export").exists()  # refused before export ran


def test_bad_calibration_device_values_are_refused_at_compose_time():
    from pipeline.core.config.common import ConfigError
    from pipeline.validation import validate

    with pytest.raises(ConfigError) as e:
        validate(compose(["calibration.device=tpu", "calibration.layerwise=sometimes", "calibration.max_device_memory_gb=-1"]))
    msg = str(e.value)
    assert "calibration.device" in msg and "calibration.layerwise" in msg and "calibration.max_device_memory_gb" in msg


# --------------------------------------------------------------------------- layer-by-layer calibration, offloaded


def _quantize(tmp_path_factory, export_dir, repo_root, name, extra):
    from pipeline.quantize.run import quantize

    out = tmp_path_factory.mktemp(name)
    res = quantize(compose([*CALIB, "quant=int4_awq", *extra]), export_dir, Path(repo_root) / "evaluation/data/support_calib_v2.jsonl", out)
    return out, res


def test_offloaded_layerwise_calibration_equals_the_whole_model(tmp_path_factory, export_dir, repo_root):
    from safetensors import safe_open

    from pipeline.core.quant_state import load_simulated_model

    whole, r1 = _quantize(tmp_path_factory, export_dir, repo_root, "whole", [])
    off, r2 = _quantize(tmp_path_factory, export_dir, repo_root, "offloaded", ["calibration.max_device_memory_gb=0.0002"])
    assert r1["placement"]["offload"] == "none" and not r1["placement"]["layerwise"]
    assert r2["placement"]["offload"] == "disk" and r2["placement"]["layerwise"]
    assert not (off / ".offload").exists()  # the offload folder never reaches the artifact
    with safe_open(str(whole / "quant_state.safetensors"), "pt") as a, safe_open(str(off / "quant_state.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for k in a.keys():
            assert torch.equal(a.get_tensor(k), b.get_tensor(k)), k  # same amax, AWQ scales and folded weights
    with (
        safe_open(str(whole / "trtllm_checkpoint/rank0.safetensors"), "pt") as a,
        safe_open(str(off / "trtllm_checkpoint/rank0.safetensors"), "pt") as b,
    ):
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    assert (whole / "hf/model.safetensors").read_bytes() == (off / "hf/model.safetensors").read_bytes()
    load_simulated_model(off, export_dir)  # the probe logits of the offloaded model are reproduced
    # partly offloaded (layer 0 in memory, layer 1 on disk): ModelOpt's streaming HF writer lost the pre-quant scales it
    # folds into a disk-offloaded layer's norms (80 M shape, bench/results/gpu-cpu.json); the HF export is restored
    part, r3 = _quantize(tmp_path_factory, export_dir, repo_root, "partly", ["calibration.max_device_memory_gb=0.001"])
    assert r3["placement"]["offload"] == "disk"
    assert (whole / "hf/model.safetensors").read_bytes() == (part / "hf/model.safetensors").read_bytes()
    assert set(r2["measurements"]["peak_rss_bytes"]) >= {"load", "calibration", "write_state", "export_trtllm", "export_hf"}
    rep = json.loads((off / "quant_report.json").read_text())  # measurements stay out of the digested report
    assert "peak_rss_bytes" not in rep and "timings_s" not in rep and "reason" not in rep["placement"]


def test_quant_auto_needs_the_whole_model(tmp_path_factory, export_dir, repo_root):
    from pipeline.quantize.run import quantize

    cfg = compose([*CALIB, "quant=auto", "calibration.max_device_memory_gb=0.0002"])
    with pytest.raises(InputError, match=r"quant=auto.*Fix:.*calibration\.max_device_memory_gb"):
        quantize(cfg, export_dir, Path(repo_root) / "evaluation/data/support_calib_v2.jsonl", tmp_path_factory.mktemp("auto"))


# --------------------------------------------------------------------------- planner
def test_planner_predicts_every_stage_and_refuses_what_the_host_cannot_hold(tmp_path):
    import transformers as tf

    from pipeline.core.sizing import stage_refusals
    from pipeline.planner import plan

    tf.LlamaConfig(
        num_hidden_layers=80, hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8
    ).save_pretrained(str(tmp_path))
    p = plan(compose([f"model.path={tmp_path}", "quant=int4_awq", "target=onnxruntime_genai", "calibration.device=cpu"]))
    pred = p.stages.predicted
    assert set(pred) == {"export", "quantize", "build", "evaluate"}
    n = p.model.num_parameters
    assert pred["quantize"].host_bytes > 4 * n  # a float32 70 B model on the CPU: more than its weights
    refusals = stage_refusals(pred, ["export", "quantize"], 24 * 10**9)
    assert any(r.startswith("quantize needs about") and "calibration.device=auto" in r for r in refusals)


def _sparse_checkpoint(path: Path, cfg) -> None:
    """A complete checkpoint of ``cfg``'s geometry whose one safetensors file holds real headers and unwritten (sparse,
    zero) data: what the run's input checks read (config, tokenizer files, weight headers that cover the file and
    match config.json), without 280 GB on disk. Skips where the file system allocates the hole."""
    import os
    import struct

    import transformers as tf

    cfg.save_pretrained(str(path))
    tiny.make_tokenizer(path)
    with torch.device("meta"):
        meta = tf.LlamaForCausalLM(cfg)
    header, offset = {}, 0
    for name, p in sorted(meta.named_parameters()):
        n = p.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(p.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with (path / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    if os.stat(path / "model.safetensors").st_blocks * 512 > 1 << 30:
        (path / "model.safetensors").unlink()
        pytest.skip("this file system allocates sparse files")


def test_a_run_the_host_cannot_hold_exits_4_before_any_work(tmp_path):
    """The inputs are checked before the plan (a shapes-only preset is exit 2 on every host), so the checkpoint here is
    complete: 70 B geometry, real weight headers, sparse data."""
    import transformers as tf

    _sparse_checkpoint(
        tmp_path / "big",
        tf.LlamaConfig(num_hidden_layers=80, hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8),
    )
    store = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "pipeline.cli",
        f"model.path={tmp_path / 'big'}",
        "stages=[quantize]",
        "calibration.device=cpu",
        f"store_dir={store}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    assert "quantize needs about" in r.stdout + r.stderr
    assert not (store / "export").exists()  # nothing ran


# --------------------------------------------------------------------------- benchmark shapes
def test_streamed_shape_weights_equal_building_the_model(tmp_path, monkeypatch):
    import transformers as tf
    from safetensors import safe_open

    from pipeline.bench import shapes

    cfg = {**shapes.SHAPES["llama80m"], "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
    monkeypatch.setitem(shapes.SHAPES, "tinyshape", cfg)
    monkeypatch.setattr(shapes, "SHARD_BYTES", 200_000)  # force several shards + an index
    out = shapes.make_shape("tinyshape", tmp_path / "s")
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) > 1
    # the reference: build the model and fill it in sorted order from the same generator
    gen = torch.Generator().manual_seed(shapes.SEED)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg)).float()
    with torch.no_grad():
        for _n, p in sorted(model.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=gen) * shapes.INIT_STD) if p.dim() == 2 else p.fill_(1.0)
    for name, p in model.named_parameters():
        with safe_open(str(out / idx["weight_map"][name]), "pt") as f:
            assert torch.equal(f.get_tensor(name), p.detach()), name
    loaded = tf.AutoModelForCausalLM.from_pretrained(str(out))
    assert loaded.config.num_hidden_layers == 2
