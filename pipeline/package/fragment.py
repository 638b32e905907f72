"""A pre-rendered ``config.pbtxt`` fragment for :func:`pipeline.package.repository.fill` (its own module: the
repository writer and the backend-parameter renderer both use it, and neither imports the other for it)."""

from __future__ import annotations


class Fragment(str):
    """A multi-line config.pbtxt fragment: inserted verbatim by ``repository.fill`` (no string-literal escaping)."""
