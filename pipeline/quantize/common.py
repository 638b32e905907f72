"""Shared pieces of the quantize package: the logger, the KV-cache and decoder tables, ModelOpt's stdout
chatter filter and the file helpers (hard links, the export artifact's ``hf/`` folder)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.contracts.export import ExportArtifact
from ..facts.recipes import KV_CACHE_FORMATS, unused_quant_fields

if TYPE_CHECKING:
    import torch

log = logging.getLogger("pipeline.quantize")


# The recipe table (ModelOpt config, TensorRT-LLM quant_algo, minimum SM) is pipeline/facts/recipes.py.
#: quant.kv_cache_dtype -> (TensorRT-LLM kv_cache_quant_algo, ModelOpt quantizer entries for the K/V bmm quantizers).
KV_CACHE: dict[str, tuple[str | None, list[dict[str, Any]]]] = {
    k: (f.kv_cache_quant_algo, list(f.quantizers)) for k, f in KV_CACHE_FORMATS.items()
}


def unused_fields(qcfg: Any) -> frozenset[str]:
    """The ``quant`` fields ``qcfg.recipe`` does not read and the quantize key leaves out
    (:func:`pipeline.facts.recipes.unused_quant_fields`; ``quant.auto`` is read only for ``quant=auto``)."""
    return unused_quant_fields(qcfg.recipe, qcfg.auto.formats if qcfg.recipe == "auto" else ())


def _hf_dir(export_dir: Path) -> Path:
    return ExportArtifact.hf_dir_of(export_dir)


def _linear_modules(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    import torch

    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


class _quiet:
    """Send ModelOpt's ``print`` chatter (stdout) to the debug log instead of the user's terminal."""

    def __init__(self, what: str) -> None:
        import io

        self.what, self.buf = what, io.StringIO()

    def __enter__(self) -> _quiet:
        import contextlib

        self._cm = contextlib.redirect_stdout(self.buf)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)
        text = self.buf.getvalue().strip()
        if text:
            log.debug("%s: %s", self.what, text)


def _version(dist: str) -> str | None:
    from ..core.hostinfo import installed_version

    return installed_version(dist)


def _link_file(src: Path, dst: Path) -> None:
    import os
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link (else copy) every regular file of ``src`` into ``dst`` (no symlinks: artifacts are self-contained)."""
    for p in sorted(src.rglob("*")):
        if p.is_file() and not p.is_symlink():
            _link_file(p, dst / p.relative_to(src))
