"""Export stage (placeholder until the full validation lands)."""
from __future__ import annotations
import shutil
from . import Stage, StageContext

def _run(ctx: StageContext) -> dict:
    src = ctx.external["checkpoint"]
    shutil.copytree(src, ctx.out / "hf")
    return {"headline": {"files": len(list(src.iterdir()))}}

STAGE = Stage(name="export", deps=(), config_groups=("model",), libraries=("transformers", "safetensors"), run=_run,
              external_inputs=lambda cfg: {"checkpoint": cfg.model.path})
