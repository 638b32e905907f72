"""Metric registry: every metric maps (model output text, eval item) to a score in [0, 1].

Register a metric with :func:`register`; look one up with :func:`get_metric` (an unknown name raises
``KeyError`` listing the known names).  Each metric declares ``higher_is_better`` and whether its
scores are ``binary`` (0/1; binary metrics get Tango's paired score bound, see gate.py).

Metrics (``metric_args`` are optional per-item arguments in the eval set):

- ``exact_match``: output == a reference after stripping surrounding whitespace (and the options
  ``regexes_to_ignore``, ``ignore_case``, ``ignore_punctuation``, ``ignore_numbers`` of lm-eval's exact_match).
- ``normalized_exact_match``: equality after the SQuAD v1.1 answer normalisation (lower-case, remove
  punctuation, remove English articles a/an/the, collapse whitespace; Rajpurkar et al. 2016, official
  ``evaluate-v1.1.py`` ``normalize_answer``), applied after Unicode NFKC so full-width punctuation and
  digits normalise too.
- ``contains``: a reference occurs in the output (case-folded).
- ``regex``: answer extraction: ``metric_args.pattern`` (Python ``re``; group 1 if it has groups,
  else the whole match; ``metric_args.flags`` may contain ``i``, ``m``, ``s``) is searched in the
  output and the extracted answer must equal a reference (stripped).  No match scores 0.
- ``numeric``: the first number in the output (``-1,234.5`` style; thousands separators removed)
  equals a numeric reference within ``math.isclose(abs_tol=metric_args.abs_tol (default 1e-6),
  rel_tol=metric_args.rel_tol (default 0))``.
- ``json_fields``: the first JSON object in the output is parsed; the score is the fraction of the
  reference object's fields (or ``metric_args.fields``) whose values are equal (strings compared
  stripped, numbers with ``math.isclose(rel_tol=1e-9)``).  Unparseable output scores 0.
- ``rouge_l``: ROUGE-L F-measure (Lin 2004) from Google's ``rouge-score`` package, with a tokenizer
  that keeps every CJK character as one token (the package's default tokenizer drops non-ASCII
  text); max over the references.
- ``choice``: multiple choice: the first standalone option label (``metric_args.choices``, default
  A-E) in the output, or an output equal to an option's text (``metric_args.options`` {label: text}),
  must equal the reference label.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import string
import unicodedata
from collections.abc import Callable
from typing import Any, Protocol

from ..core.registry import Registry


class EvalItem(Protocol):
    """What a metric reads of an eval item (:class:`pipeline.data.evalset.EvalItem` has it; a Protocol here so
    that this module does not import the dataset module, which imports it)."""

    @property
    def references(self) -> list[Any]: ...

    @property
    def metric_args(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[str, EvalItem], float]
    """score(output_text, item) -> float in [0, 1]."""
    higher_is_better: bool = True
    binary: bool = True
    """Scores are 0 or 1 (the gate uses Tango's paired score bound; else the bootstrap bound)."""
    check: Callable[[EvalItem], str | None] = lambda item: None
    """Validate an item's reference/metric_args at load time; returns an error message or None."""
    description: str = ""

    def __call__(self, output: str, item: EvalItem) -> float:
        """The score of ``output`` for ``item``.

        Raises:
            InputError: the metric returned something other than a number in [0, 1] (0 or 1 when ``binary``): the
                gate's drop, bound and Tango's paired test are defined on such scores only.
        """
        from ..errors import InputError

        raw = self.fn(output, item)
        try:
            x = float(raw)
        except (TypeError, ValueError):
            x = math.nan
        if not (0.0 <= x <= 1.0) or (self.binary and x not in (0.0, 1.0)):
            want = "0 or 1 (binary=True)" if self.binary else "a number in [0, 1]"
            raise InputError(
                f"metric {self.name!r} returned {raw!r} for item {getattr(item, 'id', '?')!r}; a metric must return {want}. "
                f"Fix: correct the metric function{', or register it with binary=False' if self.binary and 0.0 <= x <= 1.0 else ''}."
            )
        return x


METRICS: Registry[Metric] = Registry("metric")
"""The eval metrics by name (``pipeline.core.registry.Registry``: a miss lists the known names)."""


def register(metric: Metric) -> Metric:
    """Add ``metric`` to the registry.

    The gate computes drops as ``baseline - candidate`` of per-item scores in [0, 1], so a metric must
    score "goodness": one with ``higher_is_better=False`` (an error rate, a distance) is refused with
    ``ValueError``; register ``1 - x`` instead.  Also refused (``ValueError``): a name an eval set cannot spell, an
    ``fn`` not callable as ``fn(output, item)`` or a ``check`` not callable as ``check(item)``.  A score outside [0, 1]
    (or not 0/1 for a ``binary`` metric) is refused when it is computed (:meth:`Metric.__call__`, exit 2).
    """
    import inspect

    if not isinstance(metric.name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", metric.name):
        raise ValueError(f'metric name {metric.name!r}: must be an identifier-like string (eval sets name it in "metric")')
    if not metric.higher_is_better:
        raise ValueError(f"metric {metric.name!r}: the gate needs higher_is_better=True scores in [0, 1]; register 1 - score instead")
    for what, fn, args in (("fn", metric.fn, ("output", "item")), ("check", metric.check, ("item",))):
        try:
            inspect.signature(fn).bind(*args)
        except TypeError as e:
            raise ValueError(f"metric {metric.name!r}: {what} must be callable as {what}({', '.join(args)}) ({e})") from None
    return METRICS.register(metric.name, metric, replace=True)


def get_metric(name: str) -> Metric:
    """The registered metric ``name``; :class:`~pipeline.core.registry.UnknownName` (a ``KeyError``) listing the known
    metrics otherwise."""
    return METRICS[name]


# --------------------------------------------------------------------------- helpers
_PUNCT_CATS = ("P", "S")  # Unicode punctuation and symbols
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 ``normalize_answer`` (lower, drop punctuation/articles, collapse spaces), after NFKC."""
    s = unicodedata.normalize("NFKC", s).lower()
    s = "".join(" " if unicodedata.category(ch)[0] in _PUNCT_CATS else ch for ch in s)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


_NUM_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


def first_number(s: str) -> float | None:
    """The first number in ``s`` (NFKC-normalised; ``1,234.50`` -> 1234.5), or None."""
    m = _NUM_RE.search(unicodedata.normalize("NFKC", s))
    if not m:
        return None
    try:
        return float(m.group(0).replace(",", ""))
    except ValueError:
        return None


def _ref_number(r: Any) -> float | None:
    if isinstance(r, bool):
        return None
    if isinstance(r, (int, float)):
        return float(r)
    if isinstance(r, str):
        try:
            return float(r.replace(",", "").strip())
        except ValueError:
            return None
    return None


def first_json_object(s: str) -> dict | None:
    """The first JSON object embedded in ``s`` (via ``json.JSONDecoder.raw_decode``), or None."""
    dec = json.JSONDecoder()
    i = s.find("{")
    while i != -1:
        try:
            obj, _ = dec.raw_decode(s, i)
            if isinstance(obj, dict):
                return obj
        except json.JSONDecodeError:
            pass
        i = s.find("{", i + 1)
    return None


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.strip() == b.strip()
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _regex(item: EvalItem) -> re.Pattern:
    flags = 0
    for ch in str(item.metric_args.get("flags", "")):
        flags |= {"i": re.I, "m": re.M, "s": re.S}.get(ch, 0)
    return re.compile(item.metric_args["pattern"], flags)


# --------------------------------------------------------------------------- metrics
_EXACT_OPTIONS = ("regexes_to_ignore", "ignore_case", "ignore_punctuation", "ignore_numbers")


def _exact_form(s: str, a: dict[str, Any]) -> str:
    """``s`` stripped, then the HF ``evaluate`` exact_match options lm-evaluation-harness passes through
    (``metrics/exact_match/exact_match.py``, in its order: each of ``regexes_to_ignore`` removed, lower-cased with
    ``ignore_case``, ``string.punctuation`` removed with ``ignore_punctuation``, digits with ``ignore_numbers``)."""
    for rx in a.get("regexes_to_ignore") or ():
        s = re.sub(rx, "", s)
    if a.get("ignore_case"):
        s = s.lower()
    if a.get("ignore_punctuation"):
        s = s.translate(str.maketrans("", "", string.punctuation))
    if a.get("ignore_numbers"):
        s = s.translate(str.maketrans("", "", string.digits))
    return s.strip()


def _exact(out: str, item: EvalItem) -> float:
    a = item.metric_args
    o = _exact_form(out.strip(), a)
    return float(any(o == _exact_form(str(r).strip(), a) for r in item.references))


def _exact_check(item: EvalItem) -> str | None:
    bad = sorted(set(item.metric_args) - set(_EXACT_OPTIONS))
    if bad:
        return f"metric_args {bad} are not exact_match options (use {list(_EXACT_OPTIONS)})"
    rx = item.metric_args.get("regexes_to_ignore")
    if rx is not None:
        if not isinstance(rx, list) or not all(isinstance(r, str) for r in rx):
            return "metric_args.regexes_to_ignore must be a list of regular expressions (strings)"
        for r in rx:
            try:
                re.compile(r)
            except re.error as e:
                return f"metric_args.regexes_to_ignore {r!r} does not compile ({e})"
    flags = [k for k in _EXACT_OPTIONS[1:] if k in item.metric_args and not isinstance(item.metric_args[k], bool)]
    if flags:
        return f"metric_args {flags} must be true or false"
    return _str_refs_check(item)


def _norm_exact(out: str, item: EvalItem) -> float:
    o = normalize_answer(out)
    return float(any(o == normalize_answer(str(r)) for r in item.references))


def _contains(out: str, item: EvalItem) -> float:
    o = out.casefold()
    return float(any(str(r).casefold() in o for r in item.references))


def _regex_fn(out: str, item: EvalItem) -> float:
    m = _regex(item).search(out)
    if not m:
        return 0.0
    ans = (m.group(1) if m.re.groups else m.group(0)) or ""
    return float(any(ans.strip() == str(r).strip() for r in item.references))


def _regex_check(item: EvalItem) -> str | None:
    pat = item.metric_args.get("pattern")
    if not isinstance(pat, str) or not pat:
        return 'regex needs metric_args.pattern, e.g. {"pattern": "answer: (\\\\S+)"}'
    try:
        _regex(item)
    except re.error as e:
        return f"metric_args.pattern {pat!r} does not compile: {e}"
    return None


def _numeric(out: str, item: EvalItem) -> float:
    x = first_number(out)
    if x is None:
        return 0.0
    abs_tol = float(item.metric_args.get("abs_tol", 1e-6))
    rel_tol = float(item.metric_args.get("rel_tol", 0.0))
    return float(any(math.isclose(x, r, rel_tol=rel_tol, abs_tol=abs_tol) for r in map(_ref_number, item.references) if r is not None))


def _numeric_check(item: EvalItem) -> str | None:
    bad = [r for r in item.references if _ref_number(r) is None]
    if bad:
        return f'reference(s) {bad!r} are not numbers; write e.g. "reference": "12.50"'
    for k in ("abs_tol", "rel_tol"):
        v = item.metric_args.get(k, 0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            return f"metric_args.{k}={v!r} must be a number >= 0"
    return None


def _json_fields(out: str, item: EvalItem) -> float:
    obj = first_json_object(out)
    if obj is None:
        return 0.0
    best = 0.0
    for ref in item.references:
        fields = item.metric_args.get("fields") or list(ref)
        hit = sum(1 for f in fields if f in obj and _values_equal(obj[f], ref.get(f)))
        best = max(best, hit / len(fields))
    return best


def _json_check(item: EvalItem) -> str | None:
    if not all(isinstance(r, dict) and r for r in item.references):
        return 'json_fields needs a JSON object reference, e.g. "reference": {"order_id": "ORD-1"}'
    fields = item.metric_args.get("fields")
    if fields is not None and (not isinstance(fields, list) or not fields or any(not all(f in r for r in item.references) for f in fields)):
        return f"metric_args.fields={fields!r} must be a non-empty list of keys present in the reference"
    return None


_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]|[^\W_]+", re.UNICODE)


class _RougeTokenizer:
    """Lower-cased word tokens; every CJK character is its own token (rouge-score drops non-ASCII)."""

    def tokenize(self, text: str) -> list[str]:
        return _WORD.findall(unicodedata.normalize("NFKC", text).lower())


_SCORER: Any = None


def _rouge_l(out: str, item: EvalItem) -> float:
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer  # Google Research's reference implementation (pip: rouge-score)

        _SCORER = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_RougeTokenizer())
    return max(_SCORER.score(str(r), out)["rougeL"].fmeasure for r in item.references)


_DEFAULT_CHOICES = ["A", "B", "C", "D", "E"]


def _choice(out: str, item: EvalItem) -> float:
    choices = [str(c) for c in item.metric_args.get("choices") or _DEFAULT_CHOICES]
    options = {str(k): str(v) for k, v in (item.metric_args.get("options") or {}).items()}
    o = out.strip()
    picked = None
    for label, text in options.items():
        if normalize_answer(o) == normalize_answer(text):
            picked = label
    if picked is None:
        alt = "|".join(re.escape(c) for c in sorted(choices, key=len, reverse=True))
        m = re.search(rf"(?<![^\W_])({alt})(?![^\W_])", o)
        picked = m.group(1) if m else None
    return float(picked is not None and any(picked == str(r).strip() for r in item.references))


def _choice_check(item: EvalItem) -> str | None:
    choices = [str(c) for c in item.metric_args.get("choices") or _DEFAULT_CHOICES]
    bad = [r for r in item.references if str(r).strip() not in choices]
    return f"reference(s) {bad!r} are not among the choices {choices}" if bad else None


def _str_refs_check(item: EvalItem) -> str | None:
    bad = [r for r in item.references if not isinstance(r, (str, int, float)) or isinstance(r, bool)]
    return f"reference(s) {bad!r} must be strings" if bad else None


register(Metric("exact_match", _exact, check=_exact_check, description="output == reference (stripped; lm-eval's exact_match options)"))
register(Metric("normalized_exact_match", _norm_exact, check=_str_refs_check, description="SQuAD-normalised exact match"))
register(Metric("contains", _contains, check=_str_refs_check, description="reference occurs in output (case-folded)"))
register(Metric("regex", _regex_fn, check=_regex_check, description="extracted answer (metric_args.pattern) == reference"))
register(Metric("numeric", _numeric, check=_numeric_check, description="first number in output == reference within tolerance"))
register(Metric("json_fields", _json_fields, binary=False, check=_json_check, description="fraction of reference JSON fields matched"))
register(Metric("rouge_l", _rouge_l, binary=False, check=_str_refs_check, description="ROUGE-L F-measure (rouge-score)"))
register(Metric("choice", _choice, check=_choice_check, description="multiple-choice label match"))
