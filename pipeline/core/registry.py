"""One small name -> item registry for the pipeline's extension points (stages, build targets, eval metrics, CLI
subcommands).

A miss raises :class:`UnknownName` (a ``KeyError``) whose message names the kind, lists every known name and the
closest one (``difflib``), as lm-evaluation-harness's task and model registries do, so a typo in a config or on the
command line is answered with the fix. A registry is a read-only :class:`collections.abc.Mapping`; items are added
with :meth:`Registry.register`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError):
    """A name no registry entry has; ``str()`` is the whole message (a plain ``KeyError`` would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Mapping[str, T], Generic[T]):
    """``name -> T`` for one ``kind`` of extension point (``"stage"``, ``"target"``, ``"metric"``, ``"subcommand"``)."""

    def __init__(self, kind: str, items: Mapping[str, T] | None = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = dict(items or {})

    def register(self, name: str, item: T, *, replace: bool = False) -> T:
        """Add ``item`` as ``name``; returns it. ``ValueError`` when ``name`` is taken and ``replace`` is False."""
        if name in self._items and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered; pass replace=True to override it")
        self._items[name] = item
        return item

    def closest(self, name: str) -> str | None:
        """The known name closest to ``name`` (``difflib.get_close_matches``, cutoff 0.6), or None."""
        close = difflib.get_close_matches(str(name), list(self._items), n=1)
        return close[0] if close else None

    def miss(self, name: str) -> str:
        """The message for an unknown ``name``: the known names and, when one is close, "did you mean"."""
        close = self.closest(name)
        hint = f"; did you mean {close!r}?" if close else ""
        return f"unknown {self.kind} {name!r}; known {self.kind}s: {sorted(self._items)}{hint}"

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(self.miss(name)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._items)})"


__all__ = ["Registry", "UnknownName"]
