"""Foreign eval-set formats, mapped onto our JSONL lines (``pipeline/data/evalset.py``) before validation.

Two formats are accepted as ``eval.eval_set``:

* a **question/answer JSONL**: every line has ``question`` (or ``input``) and ``answer`` (or ``target``) and neither
  ``prompt`` nor ``messages``.  Mapped: ``question|input -> prompt``, ``answer|target -> reference``; ``id``
  (default ``<slice>-<line number, 4 digits>``), ``metric`` (default ``exact_match``) and ``slice`` (default the
  file's stem) are taken from the line when it has them.  Our own optional fields (``max_new_tokens``, ``stop``,
  ``metric_args``) keep their meaning; other fields are kept as metadata.
* an **lm-evaluation-harness task YAML** (``generate_until`` with ``exact_match``, the task-config keys of
  lm-evaluation-harness 0.4 ``lm_eval/api/task.py`` ``TaskConfig`` and ``docs/task_guide.md``): the documents come
  from a local ``dataset_path: json`` with ``dataset_kwargs.data_files`` (relative paths are resolved against the
  YAML's folder), split ``test_split`` else ``validation_split``; each document becomes one line with
  ``prompt = description + doc_to_text``, ``reference = doc_to_target``, ``metric = exact_match`` with the
  metric's options (``ignore_case``, ``ignore_punctuation``, ``regexes_to_ignore``, ``ignore_numbers``: the
  HF ``evaluate`` exact_match definition lm-eval uses), ``stop = generation_kwargs.until`` (lm-eval's default
  ``["\\n\\n"]`` when ``generation_kwargs`` is absent), ``max_new_tokens = generation_kwargs.max_gen_toks``,
  ``slice = id prefix = task``.  ``doc_to_text`` / ``doc_to_target`` / ``description`` are a document field's name or
  a Jinja template, rendered as lm-eval renders them (``StrictUndefined``, trailing newline kept) but in jinja2's
  ``ImmutableSandboxedEnvironment``: document text is a value, never template code.

Everything in a task YAML that would change the result and is not implemented here is refused naming the key and the
fix (run ``lm_eval`` against ``pipeline serve --openai``): ``!function`` anywhere, ``filter_list``,
``process_results``, ``process_docs``, ``num_fewshot`` > 0, ``output_type`` other than ``generate_until``, a
``dataset_path`` other than ``json`` (a hub data set), sampling in ``generation_kwargs``, another metric, unknown keys.
Keys without effect on a zero-shot ``generate_until`` score (``tag``, ``metadata``, ``training_split``, ...) are
accepted and listed in the format record as ``no_effect``.

:func:`read_foreign` returns ``(lines, format record)``; the record goes into the eval report (``eval_set.format``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import MAX_LINE_BYTES, InputError

QA_PROMPT = ("question", "input")
QA_REFERENCE = ("answer", "target")
_OPENAI = "run lm_eval against `pipeline serve --openai` (docs/serve.md, OpenAI-style clients)"
#: lm-eval's default stop sequences for generate_until when the task has no generation_kwargs ([fewshot_delimiter])
LM_EVAL_DEFAULT_UNTIL = ["\n\n"]
#: task keys read here
_READ = {
    "task",
    "dataset_path",
    "dataset_name",
    "dataset_kwargs",
    "test_split",
    "validation_split",
    "output_type",
    "doc_to_text",
    "doc_to_target",
    "description",
    "metric_list",
    "generation_kwargs",
    "num_fewshot",
}
#: keys with no effect on a zero-shot generate_until exact_match score (accepted, recorded as no_effect)
_NO_EFFECT = {
    "tag",
    "group",
    "task_alias",
    "group_alias",
    "metadata",
    "training_split",
    "fewshot_split",
    "fewshot_delimiter",
    "target_delimiter",
    "fewshot_config",
    "doc_to_choice",
    "should_decontaminate",
    "doc_to_decontamination_query",
    "repeats",
}
#: keys that change the result and are not implemented: key -> why
_REFUSED = {
    "filter_list": "answer filters (regex extraction, take_first, majority vote) are not implemented here",
    "process_results": "a custom scoring function is not implemented here",
    "process_docs": "a document preprocessing function is not implemented here",
    "include": "task includes are not resolved here; inline the included keys",
    "use_prompt": "promptsource prompts are not implemented here",
    "custom_dataset": "a custom dataset loader is not implemented here",
    "class": "a custom task class is not implemented here",
    "gen_prefix": "a generation prefix is not implemented here",
}
_EXACT_MATCH_OPTIONS: dict[str, type] = {"ignore_case": bool, "ignore_punctuation": bool, "ignore_numbers": bool, "regexes_to_ignore": list}


class _Function:
    """A ``!function module.name`` tag (lm-eval's Python hook), kept only to be refused by name."""

    def __init__(self, ref: str) -> None:
        self.ref = ref


def _loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: _Function(str(loader.construct_scalar(node))))
    return Loader


def _refuse(p: Path, key: str, value: Any, why: str, fix: str | None = None) -> InputError:
    return InputError(f"eval set {p} (lm-evaluation-harness task): {key}={value!r}: {why}. Fix: {fix or 'remove ' + key} (or {_OPENAI}).")


def is_task_yaml(p: Path, text: str) -> bool:
    """True when ``p`` is a YAML file (by suffix) or its first lines look like an lm-eval task (``task:``, ``doc_to_*``)."""
    keys = ("task:", "doc_to_text:", "doc_to_target:", "dataset_path:", "metric_list:")
    return p.suffix.lower() in (".yaml", ".yml") or any(line.startswith(keys) for line in text.splitlines()[:50])


def qa_mapping(objs: list[Any]) -> dict[str, str] | None:
    """``{"prompt": "question|input", "reference": "answer|target"}`` (the keys used) when every object is a
    question/answer line (a prompt key and a reference key, no ``prompt``/``messages``), else None."""
    if not objs or not all(isinstance(o, dict) for o in objs):
        return None
    used: dict[str, list[str]] = {"prompt": [], "reference": []}
    for o in objs:
        if "prompt" in o or "messages" in o or "reference" in o:
            return None
        pk = next((k for k in QA_PROMPT if k in o), None)
        rk = next((k for k in QA_REFERENCE if k in o), None)
        if pk is None or rk is None:
            return None
        for role, k in (("prompt", pk), ("reference", rk)):
            if k not in used[role]:
                used[role].append(k)
    return {role: "|".join(keys) for role, keys in used.items()}


def map_qa(p: Path, rows: list[tuple[int, dict[str, Any]]]) -> tuple[list[tuple[int, dict[str, Any]]], dict[str, Any]]:
    """Question/answer lines ``(line number, object)`` as our lines, and the format record."""
    mapping = qa_mapping([o for _, o in rows])
    assert mapping is not None, "callers map only question/answer lines"
    slice_default = p.stem
    out = []
    for n, o in rows:
        pk = next(k for k in QA_PROMPT if k in o)
        rk = next(k for k in QA_REFERENCE if k in o)
        sl = o.get("slice", slice_default)
        line = {k: v for k, v in o.items() if k not in (pk, rk)}
        line.update(
            prompt=o[pk],
            reference=o[rk],
            id=o.get("id", f"{sl}-{n:04d}"),
            metric=o.get("metric", "exact_match"),
            slice=sl,
        )
        out.append((n, line))
    record = {
        "format": "question_answer_jsonl",
        "mapping": {
            **mapping,
            "id": "id, else <slice>-<line>",
            "metric": "metric, else exact_match",
            "slice": f"slice, else {slice_default!r}",
        },
    }
    return out, record


def _render(env: Any, p: Path, key: str, spec: Any, doc: dict[str, Any], n: int) -> Any:
    """lm-eval's rule: a document field's name gives the field's value; any other string is a Jinja template."""
    if isinstance(spec, str) and spec in doc:
        return doc[spec]
    try:
        return env.from_string(spec).render(**doc)
    except Exception as e:  # StrictUndefined (a field the document lacks), a syntax error, the sandbox refusing
        raise InputError(
            f"eval set {p} (lm-evaluation-harness task): {key} cannot be rendered for document {n}: {type(e).__name__}: "
            f"{e}. Fix: correct {key} (a field name or a Jinja template over the document's fields)."
        ) from None


def _documents(p: Path, task: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Path], str]:
    """The documents of the task's evaluation split, the data files read and the split's name."""
    dp = task.get("dataset_path")
    if dp != "json":
        raise _refuse(
            p,
            "dataset_path",
            dp,
            "only local JSON Lines data (dataset_path: json with dataset_kwargs.data_files) is read here",
            "convert the documents to a local JSONL file and set dataset_path: json, dataset_kwargs: {data_files: <file>}",
        )
    if task.get("dataset_name") not in (None, "default"):
        raise _refuse(p, "dataset_name", task["dataset_name"], "a JSON dataset has no configurations")
    kw = task.get("dataset_kwargs") or {}
    if not isinstance(kw, dict) or set(kw) - {"data_files"} or "data_files" not in kw:
        raise _refuse(
            p, "dataset_kwargs", kw, "only dataset_kwargs.data_files is read here", "set dataset_kwargs: {data_files: <file.jsonl>}"
        )
    files = kw["data_files"]
    splits: dict[str, Any] = files if isinstance(files, dict) else {"train": files}  # datasets' name for unnamed files
    split = task.get("test_split") or task.get("validation_split")
    if split is None:
        raise _refuse(p, "test_split", None, "the task names no evaluation split", f"set test_split to one of {sorted(splits)}")
    if split not in splits:
        key = "test_split" if task.get("test_split") else "validation_split"
        raise _refuse(
            p, key, split, f"not a split of dataset_kwargs.data_files (splits: {sorted(splits)})", f"set {key} to one of {sorted(splits)}"
        )
    names = splits[split] if isinstance(splits[split], list) else [splits[split]]
    paths, docs = [], []
    for name in names:
        f = Path(str(name)).expanduser()
        f = f if f.is_absolute() else p.parent / f
        if not f.is_file():
            raise _refuse(
                p,
                "dataset_kwargs.data_files",
                str(name),
                f"no such file ({f}; relative paths are resolved against the YAML's folder)",
                "point data_files at an existing JSONL file",
            )
        paths.append(f)
        for n, raw in enumerate(f.read_text(encoding="utf-8-sig").split("\n"), start=1):  # JSON may hold U+2028
            if not raw.strip():
                continue
            if len(raw.encode("utf-8")) > MAX_LINE_BYTES:
                raise InputError(f"{f}:{n}: a document over {MAX_LINE_BYTES} bytes. Fix: shorten it (one document per line).")
            try:
                doc = json.loads(raw)
            except json.JSONDecodeError as e:
                raise InputError(f"{f}:{n}: invalid JSON ({e.msg} at column {e.colno}). Fix: one JSON object per line.") from None
            if not isinstance(doc, dict):
                raise InputError(f"{f}:{n}: expected a JSON object (a document), got {type(doc).__name__}. Fix: one object per line.")
            docs.append(doc)
    return docs, paths, str(split)


def _metric(p: Path, task: dict[str, Any]) -> dict[str, Any]:
    ml = task.get("metric_list")
    if not (isinstance(ml, list) and len(ml) == 1 and isinstance(ml[0], dict) and ml[0].get("metric") == "exact_match"):
        raise _refuse(p, "metric_list", ml, "only one metric, exact_match, is implemented here", "use metric_list: [{metric: exact_match}]")
    m = ml[0]
    args: dict[str, Any] = {}
    for k, v in m.items():
        if k == "metric":
            continue
        if k == "aggregation" and v == "mean" or k == "higher_is_better" and v is True:
            continue
        want = _EXACT_MATCH_OPTIONS.get(k)
        if want is None:
            raise _refuse(
                p,
                f"metric_list[0].{k}",
                v,
                "not an exact_match option implemented here (ignore_case, ignore_punctuation, ignore_numbers, regexes_to_ignore; aggregation mean; higher_is_better true)",
            )
        if not isinstance(v, want) or (isinstance(v, list) and not all(isinstance(r, str) for r in v)):
            raise _refuse(p, f"metric_list[0].{k}", v, f"must be a {want.__name__}", f"set {k} to a {want.__name__}")
        args[k] = v
    return args


def _generation(p: Path, task: dict[str, Any]) -> tuple[list[str], int | None]:
    """(stop strings, max new tokens or None) from ``generation_kwargs`` (lm-eval's defaults when absent)."""
    if "generation_kwargs" not in task or task["generation_kwargs"] is None:
        return list(LM_EVAL_DEFAULT_UNTIL), None
    g = task["generation_kwargs"]
    if not isinstance(g, dict):
        raise _refuse(p, "generation_kwargs", g, "must be a mapping")
    until: Any = list(LM_EVAL_DEFAULT_UNTIL)
    max_new = None
    for k, v in g.items():
        if k == "until":
            until = [v] if isinstance(v, str) else v
            if not isinstance(until, list) or not all(isinstance(s, str) and s for s in until):
                raise _refuse(p, "generation_kwargs.until", v, "must be a list of non-empty strings")
        elif k == "max_gen_toks":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _refuse(p, "generation_kwargs.max_gen_toks", v, "must be an integer >= 1")
            max_new = v
        elif k == "do_sample" and v is False or k == "temperature" and v in (0, 0.0):
            continue  # greedy, which is what the gate evaluates
        elif k in ("do_sample", "temperature", "top_p", "top_k"):
            raise _refuse(
                p,
                f"generation_kwargs.{k}",
                v,
                "the release gate evaluates greedy decoding",
                f"remove {k} (or set do_sample: false / temperature: 0)",
            )
        else:
            raise _refuse(
                p,
                f"generation_kwargs.{k}",
                v,
                "not a generation option implemented here (until, max_gen_toks, do_sample: false, temperature: 0)",
            )
    return list(until), max_new


def find_path(obj: Any, hit: Callable[[Any], bool], top: str, path: str = "") -> str | None:
    """Where in ``obj`` (parsed JSON/YAML: dicts and lists, depth first) the first value ``hit`` accepts is, as
    ``a.b[2]``; ``top`` when it is ``obj`` itself; None when there is none."""
    if hit(obj):
        return path or top
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        found = find_path(v, hit, top, f"{path}[{k}]" if isinstance(k, int) else (f"{path}.{k}" if path else str(k)))
        if found:
            return found
    return None


def _find_function(obj: Any) -> str | None:
    return find_path(obj, lambda v: isinstance(v, _Function), "(top level)")


def read_task_yaml(p: Path, text: str) -> tuple[list[tuple[int, dict[str, Any]]], dict[str, Any], list[Path]]:
    """An lm-eval task YAML as our lines ``(document number, object)``, the format record and the data files read.

    Raises:
        InputError: YAML that does not parse, a refused key (module docstring), a missing data file, a document that is
            not a JSON object, a template that does not render; the message names the key (or file:line) and the fix.
    """
    import yaml
    from jinja2 import StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        task = yaml.load(text, Loader=_loader())
    except yaml.YAMLError as e:
        raise InputError(f"eval set {p}: not valid YAML ({e}). Fix: correct the task YAML (or give a JSONL eval set).") from None
    if not isinstance(task, dict):
        raise InputError(f"eval set {p}: a YAML task must be a mapping of keys (task, doc_to_text, ...). Fix: see docs/evaluate.md.")
    name = _check_task_keys(p, task)
    args = _metric(p, task)
    until, max_new = _generation(p, task)
    docs, files, split = _documents(p, task)
    env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
    desc = task.get("description") or ""
    if not isinstance(desc, str):
        raise _refuse(p, "description", desc, "must be a string (a Jinja template)")
    lines = _task_lines(env, p, task, docs, name, desc, args, until, max_new)
    record = {
        "format": "lm_eval_task",
        "task": name,
        "split": split,
        "data_files": [str(f) for f in files],
        "mapping": {
            "prompt": ("description + " if desc else "") + "doc_to_text",
            "reference": "doc_to_target",
            "id": f"{name}-<document>",
            "slice": name,
        },
        "metric": {"name": "exact_match", **args},
        "generation": {"until": until, "max_gen_toks": max_new},
        "no_effect": sorted(k for k in task if k in _NO_EFFECT),
    }
    return lines, record, files


def _check_task_keys(p: Path, task: dict[str, Any]) -> str:
    """:func:`read_task_yaml`'s refusals of the keys that would change the score and are not implemented (InputError);
    returns the task's name."""
    fn = _find_function(task)
    if fn:
        raise _refuse(
            p,
            fn,
            f"!function {_find_function_ref(task, fn)}",
            "Python hooks (!function) are not run here",
            f"replace {fn} by a field name or a Jinja template",
        )
    for k, v in task.items():
        if k in _REFUSED:
            raise _refuse(p, k, v, _REFUSED[k])
        if k not in _READ and k not in _NO_EFFECT:
            raise _refuse(p, k, v, "not a task key implemented here")
    if task.get("output_type", "generate_until") != "generate_until":
        raise _refuse(
            p,
            "output_type",
            task["output_type"],
            "only generate_until tasks are implemented here (loglikelihood and multiple_choice score log probabilities)",
        )
    nf = task.get("num_fewshot", 0)
    if nf not in (0, None):
        raise _refuse(
            p,
            "num_fewshot",
            nf,
            "few-shot prompts are not implemented here",
            "set num_fewshot: 0 (or write the shots into doc_to_text / description)",
        )
    if task.get("repeats", 1) not in (1, None):
        raise _refuse(p, "repeats", task["repeats"], "repeated sampling is not implemented here (the gate decodes greedily once)")
    name = task.get("task")
    if not isinstance(name, str) or not name.strip():
        raise _refuse(p, "task", name, "every task needs a name (it becomes the slice and the id prefix)", "add task: <name>")
    for key in ("doc_to_text", "doc_to_target"):
        if not isinstance(task.get(key), str):
            raise _refuse(p, key, task.get(key), "must be a document field's name or a Jinja template", f"set {key}: '{{{{question}}}}'")

    return name


def _task_lines(
    env: Any, p: Path, task: dict[str, Any], docs: list[Any], name: str, desc: str, args: dict[str, Any], until: Any, max_new: Any
) -> list[tuple[int, dict[str, Any]]]:
    """One of our eval-set lines per task document (:func:`read_task_yaml`), templates rendered in ``env``."""
    lines = []
    for n, doc in enumerate(docs, start=1):
        prompt = (_render(env, p, "description", desc, doc, n) if desc else "") + str(
            _render(env, p, "doc_to_text", task["doc_to_text"], doc, n)
        )
        ref = _render(env, p, "doc_to_target", task["doc_to_target"], doc, n)
        line: dict[str, Any] = {
            "id": f"{name}-{n:04d}",
            "prompt": prompt,
            "reference": ref,
            "metric": "exact_match",
            "slice": name,
            "stop": until,
        }
        if args:
            line["metric_args"] = dict(args)
        if max_new is not None:
            line["max_new_tokens"] = max_new
        lines.append((n, line))
    return lines


def _find_function_ref(task: dict[str, Any], path: str) -> str:
    obj: Any = task
    for part in path.replace("[", ".").replace("]", "").split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj.ref if isinstance(obj, _Function) else "?"
