"""Serving image tag -> TensorRT-LLM / TensorRT versions of the NGC ``tritonserver:<yy.mm>-trtllm-python-py3`` images.

Source: NVIDIA Triton compatibility matrix (docs ``user-guide/docs/introduction/compatibility.html`` and the 2.53/2.54
archives), as recorded in ``docs/reference/triton.md`` §3.  25.02-25.05 and 26.01-26.04 are not recorded there and
are therefore unknown here (an unknown tag is refused rather than guessed).  26.05: triton-inference-server/server
issue #8805 (2026-05-29, "tritonserver:26.05-trtllm-python-py3 ships TensorRT-LLM 1.2.1"; tensorrtllm_backend PR #853
moved the backend build to ``release/1.2.1``); its TensorRT and Python versions are not recorded (None: not checked).
No ``tritonserver`` image ships TensorRT-LLM 1.3 (1.3.0 exists only as release candidates, same issue).
"""

from __future__ import annotations

import re

# tag: (TensorRT-LLM, TensorRT, Python in the container); None = not recorded by the source
TRTLLM_IMAGES: dict[str, tuple[str, str | None, str | None]] = {
    "24.05": ("0.9.0", "10.0.1.6", "3.10.12"),
    "24.06": ("0.10.0", "10.0.1", "3.10.12"),
    "24.07": ("0.11.0", "10.1.0", "3.10.12"),
    "24.08": ("0.12.0", "10.3.0", "3.10.12"),
    "24.09": ("0.13.0", "10.4.0", "3.10.12"),
    "24.10": ("0.14.0", "10.4.0", "3.10.12"),
    "24.11": ("0.15.0", "10.6.0", "3.10.12"),
    "24.12": ("0.16.0", "10.7.0", "3.12.3"),
    "25.01": ("0.17.0", "10.8.0.43", "3.12.3"),
    "25.06": ("0.20.0", "10.10.0.31", "3.12.3"),
    "25.07": ("0.20.0", "10.10.0.31", "3.12.3"),
    "25.08": ("0.21.0", "10.11.0.33", "3.12.3"),
    "25.09": ("1.0.0", "10.11.0.33", "3.12.3"),
    "25.10": ("1.0.0", "10.11.0.33", "3.12.3"),
    "25.11": ("1.0.3.2510", "10.13.3.9", "3.12.3"),
    "25.12": ("1.1.0", "10.13.3.9", "3.12.3"),
    "26.05": ("1.2.1", None, None),
}
SOURCE = (
    "NVIDIA Triton compatibility matrix (introduction/compatibility.html) and triton-inference-server/server issue #8805 "
    "(26.05), summarised in docs/reference/triton.md §3"
)

_TAG = re.compile(r":(\d{2}\.\d{2})-trtllm-python-py3$")


def image_tag(image: str) -> str | None:
    """``nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3`` -> ``"25.12"`` (None for another naming)."""
    m = _TAG.search(image.strip())
    return m.group(1) if m else None


def image_versions(image: str) -> dict[str, str | None] | None:
    """{tag, tensorrt_llm, tensorrt, python} of a known serving image (tensorrt/python None when not recorded), else None."""
    tag = image_tag(image)
    if tag is None or tag not in TRTLLM_IMAGES:
        return None
    t, trt, py = TRTLLM_IMAGES[tag]
    return {"tag": tag, "tensorrt_llm": t, "tensorrt": trt, "python": py}


def images_for(trtllm_version: str) -> list[str]:
    """Image tags that ship this TensorRT-LLM version (to suggest the fix for a mismatch)."""
    return [tag for tag, (t, _, _) in TRTLLM_IMAGES.items() if same_version(t, trtllm_version)]


def table_text() -> str:
    """The table as one line for messages: ``24.05=0.9.0, ..., 26.05=1.2.1 (source)``."""
    return ", ".join(f"{tag}={t}" for tag, (t, _, _) in TRTLLM_IMAGES.items()) + f" ({SOURCE})"


def same_version(a: str, b: str) -> bool:
    """Versions equal up to trailing ``.0`` components and local/build suffixes (``1.1.0`` == ``1.1``; ``10.13.3.9`` == ``10.13.3.9``)."""

    def norm(v: str) -> list[str]:
        parts = re.split(r"[+]", v.strip())[0].split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return parts

    return norm(a) == norm(b)


def same_prefix(a: str, b: str) -> bool:
    """True when the shorter dotted version is a prefix of the longer (TensorRT ``10.0.1`` vs ``10.0.1.6``)."""
    pa, pb = a.strip().split("+")[0].split("."), b.strip().split("+")[0].split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]
