"""The decoding policy: what a checkpoint's ``generation_config.json`` asks of decoding, read once (export) and
applied identically by every runner and server.

A Hugging Face checkpoint may ship decoding defaults in ``generation_config.json`` (Qwen2.5-Instruct:
``repetition_penalty`` 1.05, ``temperature`` 0.7, ``top_p`` 0.8, ``top_k`` 20).  transformers' ``generate`` fills
every field a caller leaves unset from the model's own ``generation_config`` (transformers 5.x
``GenerationMixin._prepare_generation_config``: "user-defined kwargs or generation_config > self.generation_config >
global default values"); onnxruntime-genai's model builder copies only ``do_sample``/``temperature``/``top_k``/
``top_p`` into ``genai_config.json`` (``models/builders/base.py`` ``make_genai_config``, 0.18) and its runtime applies
``repetition_penalty`` only when asked.  Left alone, the evaluate baseline and the engine therefore decode with two
different policies.  This module is the one place that reads the fields and says what each runtime does:

* **penalties** that change greedy output: ``repetition_penalty`` is applied by every runner and server (the HF
  runners, the engine runners, the served ``onnxruntime_genai`` model: the same definition in transformers
  ``RepetitionPenaltyLogitsProcessor`` and onnxruntime-genai ``search.cpp`` ``ApplyRepetitionPenalty``: every distinct
  token of prompt + output, logit / p when positive, logit * p when negative); ``no_repeat_ngram_size`` is refused
  (onnxruntime-genai's ``og.Engine`` has no such option), :data:`REFUSED`.
* **sampling defaults** (``do_sample``, ``temperature``, ``top_k``, ``top_p``): recorded; the release gate always
  evaluates greedy; the OpenAI endpoint uses them for a request that omits the field (as vLLM does).  ``min_p`` > 0 is
  refused (:data:`REFUSED`): no served runtime has min-p sampling, so it could only be dropped silently.
* **ignored**: other logits-changing fields (``num_beams``, ``min_length``, ``suppress_tokens`` ...) are applied by
  no runner and no server (the baseline no longer inherits them either); they are listed in the policy and warned
  about once at export.

The policy is written to the export artifact as ``decoding.json`` (:meth:`pipeline.core.contracts.export.ExportArtifact.decoding`)
and recorded in the eval report and the release manifest (``decoding``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from ..errors import InputError
from .contracts.result import from_fields

SCHEMA = "pipeline.core.decoding/v1"

#: generation_config.json fields that change greedy output and are applied by every runtime (name -> neutral value)
PENALTIES: dict[str, float] = {"repetition_penalty": 1.0}
#: fields that some runtime cannot apply, so the baseline, the engine and the served model would decode differently:
#: refused (name -> (neutral value, what it changes and who cannot apply it))
REFUSED: dict[str, tuple[Any, str]] = {
    "no_repeat_ngram_size": (
        0,
        "changes greedy output and cannot be applied identically by every runtime: onnxruntime-genai's og.Engine "
        "(the served CPU engine) has no n-gram blocking option",
    ),
    "min_p": (
        0,
        "is a sampling default that no served runtime can apply: onnxruntime-genai 0.18's search options have no min-p "
        "and TensorRT-LLM's in-flight-batcher ensemble has no min_p input (tensorrtllm_backend all_models/"
        "inflight_batcher_llm/ensemble/config.pbtxt), so served sampling would silently differ from what the model "
        "asks",
    ),
}
#: sampling defaults (name -> the value meaning "not set": transformers' GenerationConfig defaults)
SAMPLING: dict[str, Any] = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
#: other fields that change what is generated; applied by no runtime (recorded and warned about when non-neutral)
IGNORED: dict[str, Any] = {
    "num_beams": 1,
    "min_length": 0,
    "min_new_tokens": None,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "encoder_repetition_penalty": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "typical_p": 1.0,
    "length_penalty": 1.0,
    "diversity_penalty": 0.0,
    "guidance_scale": None,
}


@dataclasses.dataclass(frozen=True)
class DecodingPolicy:
    """The decoding policy of one checkpoint (``decoding.json``; every field is JSON).

    ``repetition_penalty`` (float > 0; 1.0 = none) is applied by every runner and server, greedy included.
    ``sampling`` holds the model's recommended sampling values that are set (subset of ``do_sample`` bool,
    ``temperature`` float >= 0, ``top_k`` int >= 0, ``top_p`` float in (0, 1]).
    ``ignored`` maps fields no runtime applies to their value.  ``source`` names the file read
    (``generation_config.json``, or ``none`` when the checkpoint has none; never a path: the artifact must not depend
    on where the checkpoint lies).
    """

    repetition_penalty: float = 1.0
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    ignored: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: str = "none"

    @property
    def penalty(self) -> float | None:
        """The repetition penalty to send a runtime, or None when it is neutral (1.0)."""
        return None if self.repetition_penalty == 1.0 else self.repetition_penalty

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **dataclasses.asdict(self), "gate": "greedy"}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DecodingPolicy:
        """The policy of a ``decoding.json`` document (its fields by name, :func:`pipeline.core.contracts.result.from_fields`)."""
        p = from_fields(cls, d)
        return cls(float(p.repetition_penalty), dict(p.sampling or {}), dict(p.ignored or {}), str(p.source))


def _number_problem(name: str, v: Any, lo: float, hi: float, *, lo_open: bool = False, whole: bool = False) -> str | None:
    """What is wrong with ``v`` as the number field ``name`` (a number, a whole one when ``whole``, in the range), or
    None when it is fine."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (whole and not isinstance(v, int)):
        return f"{name}={v!r} is not {'a whole number' if whole else 'a number'}"
    if not math.isfinite(v) or not ((v > lo if lo_open else v >= lo) and v <= hi):
        return f"{name}={v!r} is outside {'(' if lo_open else '['}{lo}, {hi}]"
    return None


_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "repetition_penalty": (0.0, 100.0, True, False),
    "temperature": (0.0, 100.0, False, False),
    "top_p": (0.0, 1.0, True, False),
    "top_k": (0, 1 << 31, False, True),
}
"""field -> (low, high, low bound open, whole number) of the numeric fields read (transformers ``GenerationConfig``:
``repetition_penalty`` > 0, ``temperature`` >= 0, ``top_p`` in (0, 1], ``top_k`` a non-negative int)."""


def field_problems(gen: dict[str, Any]) -> list[str]:
    """What is wrong with the parsed ``generation_config.json`` object ``gen``, one ``"<problem>. Fix: ..."`` text per
    field: a refused field (:data:`REFUSED`) with a non-neutral value, a numeric field that is not a number (a whole
    one for ``top_k``) or out of range (:data:`_RANGES`).  The one rule: :func:`policy_from_dict` (the export stage)
    and :func:`policy_problems` (its config-time check, ``pipeline plan``) both use it."""
    problems: list[str] = []
    for name, (neutral, why) in REFUSED.items():
        v = gen.get(name)
        if v is not None and v != neutral:
            problems.append(
                f"{name}={v!r} {why}. Fix: remove {name} from generation_config.json (or set it to {neutral}) in a copy of "
                f"the checkpoint; evaluate and serving then decode without it."
            )
    for name, (lo, hi, lo_open, whole) in _RANGES.items():
        bad = None if gen.get(name) is None else _number_problem(name, gen[name], lo, hi, lo_open=lo_open, whole=whole)
        if bad:
            problems.append(f"{bad}. Fix: correct {name} in generation_config.json or delete the field.")
    return problems


def policy_from_dict(gen: dict[str, Any], where: str = "generation_config.json") -> DecodingPolicy:
    """The policy of a parsed ``generation_config.json`` object.

    Raises:
        InputError: :func:`field_problems` found any; every problem of the file in one error.
    """
    problems = field_problems(gen)
    if problems:
        raise InputError(
            f"{where}: {problems[0]}" if len(problems) == 1 else f"{where}: {len(problems)} problems:\n  - " + "\n  - ".join(problems)
        )
    rp = gen.get("repetition_penalty")
    penalty = 1.0 if rp is None else float(rp)
    sampling: dict[str, Any] = {}
    if isinstance(gen.get("do_sample"), bool):
        sampling["do_sample"] = gen["do_sample"]
    for name in ("temperature", "top_p", "top_k"):
        if gen.get(name) is not None:
            sampling[name] = int(gen[name]) if name == "top_k" else float(gen[name])
    ignored = {k: gen[k] for k, neutral in IGNORED.items() if gen.get(k) is not None and gen[k] != neutral}
    return DecodingPolicy(repetition_penalty=penalty, sampling=sampling, ignored=ignored, source="generation_config.json")


def _read_generation_config(checkpoint: Path) -> dict[str, Any] | None:
    """The parsed ``generation_config.json`` of the checkpoint folder ``checkpoint``; None when absent.

    Raises:
        InputError: the file is not a JSON object.
    """
    path = Path(checkpoint) / "generation_config.json"
    if not path.is_file():
        return None
    try:
        gen = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{path}: not readable JSON ({e}). Fix: restore generation_config.json or delete it.") from None
    if not isinstance(gen, dict):
        raise InputError(f"{path}: expected a JSON object. Fix: restore generation_config.json or delete it.")
    return gen


def read_policy(checkpoint: Path) -> DecodingPolicy:
    """The policy of the checkpoint folder ``checkpoint`` (its ``generation_config.json``; neutral when absent).

    Raises:
        InputError: the file is not a JSON object, or :func:`policy_from_dict` refuses it.
    """
    gen = _read_generation_config(checkpoint)
    if gen is None:
        return DecodingPolicy()
    return policy_from_dict(gen, str(Path(checkpoint) / "generation_config.json"))


def policy_problems(checkpoint: Path) -> list[str]:
    """Everything :func:`read_policy` refuses in the checkpoint folder ``checkpoint``, one
    ``"<path>: <problem>. Fix: ..."`` text each (none when it would read the policy): the export stage's config-time
    check (:func:`pipeline.export.checks.checks`), so ``pipeline plan`` and a run refuse before any stage what the
    export stage would."""
    try:
        gen = _read_generation_config(checkpoint)
    except InputError as e:
        return [str(e)]
    where = Path(checkpoint) / "generation_config.json"
    return [f"{where}: {p}" for p in field_problems(gen or {})]


def neutral_generation_config(**fields: Any) -> Any:
    """A transformers ``GenerationConfig`` holding only transformers' global defaults and ``fields``.

    Set as a model's ``generation_config`` before ``generate``: transformers fills every field a caller leaves unset
    from the model's ``generation_config`` (loaded from the checkpoint's ``generation_config.json``), so replacing it
    is what keeps the checkpoint's penalties and sampling values out of a run that did not ask for them.
    """
    from transformers import GenerationConfig

    return GenerationConfig(**fields)
