"""`make gpu-check DEVICE=cpu` on the tiny shape: the placements exit 0 and give the whole model's bytes.

Real runs of the pipeline CLI (export, then int4 AWQ quantize whole and offloaded to disk, layer by layer, each in
its own store), the results document and its comparisons. The killed-and-resumed placement is covered by
tests/quantize/test_resume.py (a tiny model finishes before a kill could land).
"""

from __future__ import annotations

import json

import pytest

from pipeline.bench import gpu_check


def test_gpu_check_on_the_cpu_runs_every_placement_and_they_agree(tmp_path):
    code = gpu_check.main(
        [
            "--device",
            "cpu",
            "--shapes",
            "llamatiny",
            "--only",
            "whole,offload_disk",
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "w"),
        ]
    )
    doc = json.loads((tmp_path / "out" / "gpu-cpu.json").read_text())
    runs = doc["shapes"]["llamatiny"]["runs"]
    assert code == 0, {k: v.get("log_tail") for k, v in runs.items()}
    assert set(runs) == {"whole", "offload_disk"}
    assert runs["offload_disk"]["quantize"]["placement"]["offload"] == "disk"
    assert runs["offload_disk"]["predicted"]["offload"] == "disk"  # the plan decides as the stage does
    assert runs["whole"]["quantize"]["placement"]["offload"] == "none" and runs["offload_disk"]["quantize"]["placement"]["layerwise"]
    cmp = doc["shapes"]["llamatiny"]["compare"]
    assert cmp["offload_disk vs whole"]["identical"], cmp
    md = (tmp_path / "out" / "gpu-cpu.md").read_text()
    assert "| offload_disk | 0 |" in md


def test_gpu_check_refuses_an_unknown_shape(tmp_path, capsys):
    assert gpu_check.main(["--device", "cpu", "--shapes", "nosuch", "--out", str(tmp_path)]) == 2
    assert "unknown shape" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--steps", "bogus"], "unknown step(s) ['bogus:']"),
        (["--shapes", "llamatiny", "--only", "wholee"], "unknown placement(s) ['wholee']"),
        (["--shapes", "llamatiny", "--deadline-s", "-5"], "must be > 0"),
        (["--shapes", ""], "--shapes '': empty"),
    ],
)
def test_gpu_check_refuses_bad_arguments_before_any_work(tmp_path, capsys, args, said):
    """Fresh-user trial: `--steps bogus` was a traceback (exit 1), `--only wholee` ran nothing with exit 0, a negative
    deadline said 'the export failed', an empty --shapes fell back to the defaults."""
    assert gpu_check.main(["--device", "cpu", *args, "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()
