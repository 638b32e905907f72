"""What passes between stages: the typed result of a stage run.

Each stage's ``run(ctx)`` returns a frozen :class:`StageResult` subclass defined beside its artifact class in
``pipeline/core/contracts/<stage>.py`` (``ExportResult`` ... ``BenchmarkResult``); the runner records
:meth:`StageResult.to_json` in the artifact's ``manifest.json`` under ``result``, and
:attr:`pipeline.core.store.Artifact.result` parses it back with the stage's class (:data:`STAGE_RESULTS`). The
parsing here is the one place a stored result is read by its JSON keys.

The JSON of a result is exactly the dict its stage returned before results were typed (every field, ``None``
included, except the fields in ``OMIT_NONE``, which are left out when ``None``), so existing manifests and cache
keys are unchanged.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypeVar

from ..artifacts import STAGE_ARTIFACTS

R = TypeVar("R", bound="StageResult")


def json_object(v: Any) -> dict[str, Any]:
    """``v`` when it is a JSON object (dict), else an empty one: a document's optional section."""
    return v if isinstance(v, dict) else {}


D = TypeVar("D")


def from_fields(cls: type[D], d: Mapping[str, Any]) -> D:
    """A flat record dataclass ``cls`` from the keys of ``d`` named like its fields; a key ``d`` lacks keeps the
    field's default, keys ``cls`` does not know are ignored."""
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})  # type: ignore[arg-type]


class Record:
    """Base of a flat record dataclass read from a JSON object: :meth:`from_json` fills the fields from the keys named
    like them (:func:`from_fields`); a value that is not an object reads as an empty one (every field its default)."""

    @classmethod
    def from_json(cls, d: Any) -> Self:
        return from_fields(cls, d if isinstance(d, Mapping) else {})


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageResult:
    """The base of every stage's result.

    Attributes:
        headline: the few numbers the run summary's table and multirun comparisons show (``summary.json``
            ``stages[].headline``), by name.
    """

    headline: dict[str, Any] = dataclasses.field(default_factory=dict)

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()
    """Fields the JSON leaves out when they are ``None`` (absent from the stage's result dict when not produced)."""

    def to_json(self) -> dict[str, Any]:
        """The ``manifest.json`` ``result`` document (a nested record with its own ``to_json`` is written by it)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self.OMIT_NONE:
                continue
            out[f.name] = value.to_json() if hasattr(value, "to_json") else value
        return out

    @classmethod
    def from_json(cls: type[R], d: Mapping[str, Any] | None) -> R:
        """The result recorded in a manifest (``result``); a field the document lacks (a dry run's provisional
        artifact, a result of an older version) keeps its default. Keys the class does not know are ignored."""
        doc = d if isinstance(d, Mapping) else {}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: cls._parse_field(k, v) for k, v in doc.items() if k in known})

    @classmethod
    def _parse_field(cls, name: str, value: Any) -> Any:
        """One field's value from its JSON (a subclass parses its nested records here)."""
        if name == "headline":
            return dict(value) if isinstance(value, Mapping) else {}
        return value


STAGE_RESULTS: dict[str, str] = {stage: ref.removesuffix("Artifact") + "Result" for stage, ref in STAGE_ARTIFACTS.items()}
"""stage name -> ``module:class`` of its result: beside its artifact class in the module
:data:`pipeline.core.artifacts.STAGE_ARTIFACTS` names (``<Name>Artifact`` -> ``<Name>Result``), imported on use too."""


def result_class(stage: str) -> type[StageResult]:
    """The result class of ``stage`` (:data:`STAGE_RESULTS`); KeyError for a stage that has none."""
    mod, cls = STAGE_RESULTS[stage].split(":")
    out: type[StageResult] = getattr(importlib.import_module(mod), cls)
    return out
