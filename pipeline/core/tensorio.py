"""Write a safetensors file one tensor at a time, so a model's state is never gathered into one dict in memory.

The safetensors format (https://github.com/huggingface/safetensors, README "Format"): an 8-byte little-endian
unsigned header length N, N bytes of UTF-8 JSON (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}}``, offsets relative to the end of the header, padded with spaces to a multiple of 8),
then the tensors' little-endian bytes back to back in header order. The header needs only names, dtypes and shapes,
so it is written first and each tensor's bytes follow as the caller produces them; :func:`write_streaming` checks
every produced tensor against what the header promised. Files are read back with ``safetensors.safe_open``
(tests/quantize/test_scale_memory.py checks the round trip against the library's own reader).

Peak memory: one tensor (the one being written) beyond what the caller holds.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    import torch

#: torch dtype name -> (safetensors dtype code, bytes per element) (safetensors' ``Dtype`` enum).
ST_DTYPES: dict[str, tuple[str, int]] = {
    "float64": ("F64", 8),
    "float32": ("F32", 4),
    "float16": ("F16", 2),
    "bfloat16": ("BF16", 2),
    "float8_e4m3fn": ("F8_E4M3", 1),
    "float8_e5m2": ("F8_E5M2", 1),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}


def _dtype_name(t: Any) -> str:
    return str(t).removeprefix("torch.")


def write_streaming(
    path: Path,
    specs: Iterable[tuple[str, Any, tuple[int, ...]]],
    produce: Callable[[str], torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> int:
    """Write ``path`` as a safetensors file whose tensors come from ``produce(name)``, one at a time.

    Args:
        specs: ``(name, torch dtype, shape)`` of every tensor, in file order (names unique).
        produce: returns the tensor for ``name`` (any device; moved to CPU and made contiguous here). Called once
            per name, in ``specs`` order; the tensor may be freed once the call returns.
        metadata: the ``__metadata__`` string map.
    Returns:
        Bytes written.
    Raises:
        ValueError: an unsupported dtype, a duplicate name, or a produced tensor whose dtype/shape differs from its spec.
    """
    specs = list(specs)
    header: dict[str, Any] = {}
    offset = 0
    for name, dtype, shape in specs:
        if name in header:
            raise ValueError(f"{path}: tensor {name!r} listed twice")
        code, size = ST_DTYPES.get(_dtype_name(dtype), (None, 0))
        if code is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype}, which safetensors cannot store")
        n = size
        for d in shape:
            n *= int(d)
        header[name] = {"dtype": code, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    path = Path(path)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, dtype, shape in specs:
            t = produce(name)
            if _dtype_name(t.dtype) != _dtype_name(dtype) or tuple(t.shape) != tuple(int(d) for d in shape):
                raise ValueError(f"{path}: tensor {name!r} is {t.dtype} {tuple(t.shape)}, but the header says {dtype} {tuple(shape)}")
            t = t.detach().to("cpu").contiguous()
            if t.numel():
                f.write(_tensor_bytes(t))
            del t
    return len(raw) + 8 + offset


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (a CPU contiguous tensor viewed as uint8; little-endian hosts)."""
    import torch

    flat = t.reshape(-1)
    return (flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)).numpy().data


def read_header(path: Path) -> tuple[dict[str, tuple[list[int], str]], dict[str, str]]:
    """Tensor name -> (shape, dtype) and the metadata of one safetensors file, via ``safe_open``.

    ``safe_open`` validates the header and that the data section covers the file exactly, so
    truncated or padded files fail here.  Raises InputError naming the file.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            tensors = {}
            for name in f.keys():
                sl = f.get_slice(name)
                tensors[name] = (list(sl.get_shape()), str(sl.get_dtype()))
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        size = path.stat().st_size if path.exists() else None
        raise InputError(
            f"{path}: unreadable safetensors file ({e}; {size} bytes on disk). It is truncated or corrupt "
            f"(an interrupted download or copy). Fix: download or copy {path.name} again and compare its "
            f"sha256 with the source."
        ) from None
    return tensors, meta
