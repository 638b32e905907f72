"""Cluster launcher configs compose through the real CLI (issue 27, item 5): the SLURM command of docs/export.md
(hydra-submitit-launcher; validated, not run) and the Ray presets of ``build_configs/hydra/launcher/``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from pipeline.core.config import REPO_ROOT


def _hydra_cfg(*overrides: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_ADDRESS": "10.0.0.5:6379"}
    p = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *overrides, "--cfg", "hydra"], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return yaml.safe_load(p.stdout)["hydra"]


def test_slurm_launcher_of_the_docs_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install 'pipeline[slurm]' (hydra-submitit-launcher)")
    docs = (REPO_ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    cmd = docs[docs.index("pipeline -m hydra/launcher=submitit_slurm") :].split("```")[0].replace("\\\n", " ").split()
    overrides = [a for a in cmd[2:] if "=" in a and not a.startswith("quant=")]  # the sweep values: one job's worth
    la = _hydra_cfg(*overrides, "quant=fp8")["launcher"]
    assert la["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (la["partition"], la["gpus_per_node"], la["timeout_min"], la["cpus_per_task"], la["mem_gb"]) == ("gpu", 1, 120, 8, 64)


def test_ray_presets_compose():
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install --no-deps hydra-ray-launcher==1.2.2")
    cpu = _hydra_cfg("hydra/launcher=ray_cluster", "quant=none")["launcher"]
    gpu = _hydra_cfg("hydra/launcher=ray_gpu_cluster", "quant=none")["launcher"]
    assert cpu["_target_"] == gpu["_target_"] == "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    assert cpu["ray"]["remote"] == {"num_cpus": 1, "num_gpus": 0} and gpu["ray"]["remote"] == {"num_cpus": 1, "num_gpus": 1}
    assert gpu["ray"]["init"]["object_store_memory"] is None
