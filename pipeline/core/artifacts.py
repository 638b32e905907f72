"""What every stage artifact shares: the tokenizer files that travel with a model, the JSON reader, the registry.

Each stage's own artifact class (its folder's file names and readers) is in ``pipeline/<stage>/artifact.py``.

Every stage writes into ``artifacts/<stage>/<key>/`` (:mod:`pipeline.core.store`); downstream stages, the packager and
the benchmark read the files below through these classes instead of spelling the names. docs/artifacts.md
describes the same files (tests/contracts/test_artifacts_facts.py checks that it names every one of ``FILES``).

Each class wraps the artifact's folder (``path``) and declares each of its file names once, as an upper-case ``str``
class constant (a folder's as a :class:`FolderName`); ``FILES`` is derived from them. Readers that find a file corrupt
raise :class:`~pipeline.errors.InputError` naming the file and the fix.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, ClassVar, Union, overload

from ..errors import InputError
from .tokenization import read_json

PathArg = Union[str, "os.PathLike[str]"]
"""What a stage artifact class takes as its folder: a str or any ``os.PathLike`` (a ``Path``)."""


class FolderName(str):
    """A stage artifact's name constant that names a folder (listed in ``FILES`` with a trailing ``/``); otherwise
    the plain ``str`` of its name."""

    __slots__ = ()


class PathOf(property):
    """A read-only path property of a stage artifact class: its folder joined with one of the class's names
    (``engine_dir = PathOf(ENGINE_DIR)``), with an optional docstring."""

    def __init__(self, name: str, doc: str | None = None) -> None:
        super().__init__(lambda artifact: artifact.path / name, doc=doc)

    @overload
    def __get__(self, obj: None, owner: type | None = None, /) -> PathOf: ...
    @overload
    def __get__(self, obj: StageArtifact, owner: type | None = None, /) -> Path: ...
    def __get__(self, obj: StageArtifact | None, owner: type | None = None, /) -> PathOf | Path:
        got: PathOf | Path = super().__get__(obj, owner)
        return got


@dataclasses.dataclass(frozen=True, init=False)
class StageArtifact:
    """The base of every stage's artifact class (``pipeline/<stage>/artifact.py``): its folder ``path``, given as a
    str or any ``os.PathLike`` and kept as a :class:`~pathlib.Path` (the one place it is converted).  Frozen; equal
    when the class and the path are."""

    path: Path

    FILES: ClassVar[tuple[str, ...]] = ()
    """The artifact's names, in the order its class declares them: every upper-case ``str`` constant of the class (each
    name once; a folder's, a :class:`FolderName`, ending in ``/``), set for each subclass by :meth:`__init_subclass__`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.FILES = tuple(f"{v}/" if isinstance(v, FolderName) else v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str))

    def __init__(self, path: PathArg) -> None:
        if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
            name = type(self).__name__
            raise TypeError(
                f"{name}(path): expected the artifact folder as a str or os.PathLike, got {type(path).__name__} "
                f"({path!r}). Fix: pass the folder, e.g. {name}('artifacts/<stage>/<key>') or {name}(Path(...))."
            )
        object.__setattr__(self, "path", Path(os.fspath(path)))

    def require_folder(self, stage: str) -> None:
        """For a reader: ``path`` must be an existing folder (a reader of a folder that is not there returned an
        empty record, as if the stage had recorded nothing).

        Raises:
            InputError: ``path`` is not a folder (names it, and where ``stage``'s artifacts are).
        """
        if not self.path.is_dir():
            a = "an" if stage[:1] in "aeiou" else "a"
            what = f"is a file, not {a}" if self.path.exists() else f"does not exist: not {a}"
            raise InputError(
                f"{type(self).__name__}({str(self.path)!r}): the folder {what} {stage} artifact. Fix: pass a folder "
                f"under <store_dir>/{stage}/ (a run's summary.json lists each stage's artifact path)."
            )


def _read_json(p: Path, fix: str) -> dict[str, Any]:
    """The JSON object in ``p``; ``{}`` when the file does not exist.

    Raises:
        InputError: ``p`` exists but is not a JSON object (names the file and ``fix``).
    """
    doc = read_json(p, fix, InputError)
    if not isinstance(doc, dict):
        raise InputError(f"{p}: expected a JSON object, found {type(doc).__name__}. Fix: {fix}.")
    return doc


_KIND_NAMES: dict[type, str] = {str: "a string", int: "an integer", float: "a number", dict: "an object", list: "a list"}


class DocumentFields:
    """Typed reads of one JSON document's fields: a refusal names the file, the field, its value, what was expected
    and the fix (the artifact readers' ``from_json`` use it; a document is written by the pipeline, so a wrong field
    means the file was edited or corrupted, and the fix is to re-run the stage that writes it).

    Args:
        source: the file the document was read from (named in every message).
        fix: what to do, e.g. ``"re-run the export stage (force=true stages=[export])"``.
    """

    def __init__(self, source: Path | str, fix: str) -> None:
        self.source, self.fix = source, fix

    def error(self, name: str, value: Any, expected: str) -> InputError:
        """The refusal of field ``name`` (dotted: ``limits.max_seq_len``) holding ``value``, not ``expected``."""
        return InputError(f"{self.source}: {name}={value!r} is not {expected}. Fix: {self.fix}.")

    def get(self, name: str, value: Any, kind: type | tuple[type, ...], *, minimum: float | None = None) -> Any:
        """``value`` when it is None or of ``kind`` (a bool is never an int or a number) and, for numbers, not below
        ``minimum``; an ``int`` read as ``float`` when ``kind`` is ``(int, float)``.

        Raises:
            InputError: ``value`` has another type, or is below ``minimum`` (:meth:`error`).
        """
        if value is None:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = _KIND_NAMES.get(kinds[-1], kinds[-1].__name__)
        if minimum == 0:
            expected = "a non-negative " + expected.split(" ", 1)[1]
        elif minimum == 1 and kinds == (int,):
            expected = "a positive integer"
        elif minimum is not None:
            expected = f"{expected} >= {minimum:g}"
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise self.error(name, value, expected)
        number: Any = value  # isinstance() over a runtime tuple narrows to object
        if minimum is not None and number < minimum:
            raise self.error(name, value, expected)
        return float(number) if float in kinds and not isinstance(value, float) else value


TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
"""The files a Hugging Face tokenizer is saved as (transformers ``PreTrainedTokenizerBase.save_pretrained``: the
fast tokenizer's ``tokenizer.json``, its config and special tokens, the chat template as ``chat_template.jinja`` or
the older ``chat_template.json``; a slow SentencePiece ``tokenizer.model`` or BPE ``vocab.json`` + ``merges.txt``).
Every folder a tokenizer is loaded from gets the ones present, byte for byte: export ``hf/``, quantize ``hf/``, the
engine folders of both targets and the served models' tokenizer folders (the export's ``tokenizer_config.json`` in the
spelling transformers 4.57 reads too: :mod:`pipeline.core.hf_compat`)."""
REQUIRED_TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json")
"""The subset :class:`pipeline.core.tokenization.TextCodec` needs (a fast tokenizer and its config)."""
TOKENIZER_DIRS: tuple[str, ...] = ("additional_chat_templates",)
"""Folders of a saved tokenizer (transformers 4.52+: named chat templates, one ``<name>.jinja`` each)."""
GENERATION_CONFIG = "generation_config.json"
"""The model's generation defaults (eos / pad / bos token ids) read next to the tokenizer."""
TOKENIZER_COPY_FILES: tuple[str, ...] = TOKENIZER_FILES + (GENERATION_CONFIG,)
"""What travels with the tokenizer into a folder a model is run from: :data:`TOKENIZER_FILES` and
``generation_config.json`` (export writes its own normalised ``generation_config.json`` instead of copying it)."""


STAGE_ARTIFACTS: dict[str, str] = {
    "export": "pipeline.core.contracts.export:ExportArtifact",
    "quantize": "pipeline.core.contracts.quantize:QuantizeArtifact",
    "build": "pipeline.core.contracts.build:BuildArtifact",
    "evaluate": "pipeline.core.contracts.evaluate:EvalArtifact",
    "package": "pipeline.core.contracts.package:PackageArtifact",
    "benchmark": "pipeline.core.contracts.benchmark:BenchmarkArtifact",
}
"""stage name -> ``module:class`` of its artifact (imported on use: this layer imports no stage package)."""


def artifact_classes() -> dict[str, type]:
    """stage name -> its artifact class (:data:`STAGE_ARTIFACTS`, imported)."""
    import importlib

    out: dict[str, type] = {}
    for stage, ref in STAGE_ARTIFACTS.items():
        mod, cls = ref.split(":")
        out[stage] = getattr(importlib.import_module(mod), cls)
    return out
