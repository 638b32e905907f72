#!/usr/bin/env python3
"""Deterministic generator of the generic, out-of-domain calibration set ``generic_calib_v1.jsonl``.

Source: English prose paragraphs of the docstrings of a fixed list of CPython standard-library modules
(Copyright (c) 2001 Python Software Foundation, distributed under the PSF License Agreement, which allows
redistribution of excerpts with this notice). No network: the text comes from the interpreter that runs this
script. It is general technical English, unrelated to the customer-support tasks of the default model, and
serves as the "generic calibration text" side of the in-domain vs out-of-domain calibration comparison
(``calibration=generic_v1`` vs ``calibration=support_v2``; see docs/quantize.md).

Rules (so the output is reproducible from the same CPython minor version; the committed file records the
version it was made with in every row's ``source``):

* modules in :data:`MODULES` order; inside a module, its own docstring, then public classes/functions in
  ``sorted(dir(module))`` order, then their public methods in sorted order;
* paragraphs = blank-line separated blocks; whitespace collapsed; kept when 120..700 characters, at least
  80 % letters/spaces, ending with a full stop, and not code (no ``>>>``, ``::`` or ``=``, not starting with
  ``:``, ``..``, ``-``, ``*``);
* duplicates dropped; the first :data:`MAX_ROWS` kept.

CLI::

    python evaluation/generate_generic_calib.py --out evaluation/data/generic_calib_v1.jsonl
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
import re
import warnings
from pathlib import Path

MODULES = ("argparse", "collections", "csv", "datetime", "decimal", "email", "fractions", "functools", "heapq",
           "http.client", "itertools", "json", "logging", "math", "os", "pathlib", "pickle", "random", "re",
           "shutil", "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "textwrap", "threading",
           "time", "unittest", "urllib.parse", "uuid", "zipfile", "zlib")
MAX_ROWS = 600
MIN_CHARS, MAX_CHARS = 120, 700


def _docs(mod):
    yield mod.__name__, inspect.getdoc(mod)
    for name in sorted(dir(mod)):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name, None)
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            continue
        if getattr(obj, "__module__", None) not in (mod.__name__, None) and not str(getattr(obj, "__module__", "")).startswith(mod.__name__):
            continue
        yield f"{mod.__name__}.{name}", inspect.getdoc(obj)
        if inspect.isclass(obj):
            for m in sorted(vars(obj)):
                if not m.startswith("_") and callable(getattr(obj, m, None)):
                    yield f"{mod.__name__}.{name}.{m}", inspect.getdoc(getattr(obj, m))


def _ok(p: str) -> bool:
    if not MIN_CHARS <= len(p) <= MAX_CHARS or ">>>" in p or "::" in p or "=" in p or p.startswith((":", "..", "-", "*")):
        return False
    letters = sum(c.isalpha() or c == " " for c in p)
    return letters / len(p) >= 0.8 and p.endswith(".")


def rows() -> list[dict]:
    warnings.simplefilter("ignore", DeprecationWarning)  # typing.io / typing.re aliases in older CPython
    out, seen = [], set()
    ver = f"CPython {platform.python_version()}"
    for modname in MODULES:
        mod = importlib.import_module(modname)
        for where, doc in _docs(mod):
            for block in re.split(r"\n\s*\n", doc or ""):
                p = " ".join(block.split())
                if p in seen or not _ok(p):
                    continue
                seen.add(p)
                out.append({"id": f"generic-{len(out) + 1:04d}", "text": p, "source": f"{ver} docstring of {where}"})
                if len(out) >= MAX_ROWS:
                    return out
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / "generic_calib_v1.jsonl")
    a = ap.parse_args()
    r = rows()
    a.out.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in r), encoding="utf-8")
    print(f"{a.out}: {len(r)} rows")


if __name__ == "__main__":
    main()
