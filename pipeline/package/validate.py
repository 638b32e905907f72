"""Validate a generated Triton model repository before it is released (no server, no GPU needed).

Checks (docs/reference/triton.md §6, from the tensorrtllm_backend templates and issues):

1. every ``config.pbtxt`` parses with Triton's own ``ModelConfig`` protobuf (``tritonclient.grpc.model_config_pb2`` +
   ``google.protobuf.text_format``), ``name`` equals the folder name, a numeric version folder exists and Python
   models have ``<version>/model.py``, and every sibling module a ``model.py`` imports from its own folder
   (``repository.SIBLING_MODULES``: ``tokenization.py``, the onnxruntime_genai model's ``MODEL_HELPERS``) is next to it;
2. no unresolved ``${...}`` is left in any text file (file, line and placeholder named);
3. the ensemble (CPU target: a Python model with the ensemble's interface; its required inputs and ``text_output``
   are checked) has a tensor graph consistent end to end: every ``input_map`` key is an input of the step model,
   every value is an ensemble input or an earlier step's output, data types and dims match, every required step
   input is mapped, every ensemble output is produced exactly once, every ensemble input is consumed;
4. ``max_batch_size``, the served input length and beam width never exceed the engine's (an error names both numbers);
5. decoupled mode is the same on every model that needs it (engine model, BLS, the CPU target's Python ``ensemble``);
6. tokenizer files are present (``tokenizer.json`` + ``tokenizer_config.json``) and pre/postprocessing agree;
7. ``tensorrt_llm`` target: the engine's TensorRT-LLM/TensorRT versions match the serving image (:mod:`.versions`);
8. PyTorch-backend (LLM API) layout: ``tensorrt_llm/config.pbtxt`` and ``1/model.yaml`` against the upstream key sets
   of :mod:`.llmapi_schema` (unknown key or tensor, wrong type, missing required tensor or key).

:func:`validate_repository` returns every :class:`Problem` found; :func:`check_repository` raises
:class:`InputError` (or :class:`PreflightError` for a version mismatch) listing them all.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..core.artifacts import REQUIRED_TOKENIZER_FILES
from ..core.contracts.build import BuildInfo, EngineLimits
from ..errors import InputError, PreflightError
from ..facts import versions as V
from .repository import CONTAINER_REPO, PLACEHOLDER, SIBLING_MODULES

TEXT_SUFFIXES = {".pbtxt", ".yaml", ".yml", ".json", ".py", ".txt", ".jinja"}


@dataclasses.dataclass
class Problem:
    """One problem: where (file[:line] or model), what, and the fix."""

    where: str
    message: str
    fix: str = ""
    kind: str = "input"  # input | version

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" + (f" Fix: {self.fix}" if self.fix else "")


def parse_config(path: Path) -> Any:
    """``ModelConfig`` message of ``path``; raises ``text_format.ParseError`` (with line:column) on bad text."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())


def _dtype_name(v: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(v)


def find_placeholders(root: Path) -> list[Problem]:
    """Every ``${...}`` left in a text file under ``root`` (file, line, placeholder)."""
    out = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.suffix not in TEXT_SUFFIXES or p.name == "model.py":
            continue
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(lines, 1):
            for m in PLACEHOLDER.finditer(line):
                out.append(
                    Problem(
                        f"{p.relative_to(root)}:{i}",
                        f"unresolved placeholder {m.group(0)}",
                        f"give a value for {m.group(1)!r} (build_info.json or the package config)",
                    )
                )
    return out


def sibling_problems(root: Path) -> list[Problem]:
    """Check 1: a served ``<model>/<version>/model.py`` that imports a sibling module (``SIBLING_MODULES``, imported
    from its own folder, never from ``pipeline``) has it next to it; Triton would fail the model at load otherwise."""
    import ast

    siblings = {n.removesuffix(".py") for n in SIBLING_MODULES}
    out = []
    for py in sorted(root.glob("*/*/model.py")):
        try:
            tree = ast.parse(py.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError) as e:
            out.append(Problem(str(py.relative_to(root)), f"does not parse as Python: {e}"))
            continue
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level and n.module}
        for name in sorted(names & siblings):
            if not (py.parent / f"{name}.py").is_file():
                out.append(
                    Problem(
                        str(py.relative_to(root)),
                        f"imports {name} from its own folder, but {name}.py is not next to it.",
                        "regenerate the package (pipeline/package/repository.py copy_model_py copies the sibling modules)",
                    )
                )
    return out


def _tensor_table(cfg: Any, which: str) -> dict[str, Any]:
    return {t.name: t for t in getattr(cfg, which)}


def _check_ensemble(configs: dict[str, Any], problems: list[Problem]) -> None:
    ens = configs.get("ensemble")
    if ens is None:
        return
    if ens.backend == "python":  # CPU target: one Python model with the ensemble's interface (docs/package.md "Serving path")
        ins, outs = _tensor_table(ens, "input"), _tensor_table(ens, "output")
        for name in ("text_input", "max_tokens"):
            if name not in ins or ins[name].optional:
                problems.append(Problem("ensemble/config.pbtxt", f"required input {name!r} is missing or optional."))
        if "text_output" not in outs:
            problems.append(Problem("ensemble/config.pbtxt", "output 'text_output' is missing."))
        return
    if ens.platform != "ensemble" or ens.WhichOneof("scheduling_choice") != "ensemble_scheduling":
        problems.append(Problem("ensemble/config.pbtxt", "is not an ensemble (platform 'ensemble' + ensemble_scheduling)."))
        return
    ens_in = _tensor_table(ens, "input")
    ens_out = _tensor_table(ens, "output")
    # available tensors: name -> (data_type, dims)
    avail: dict[str, tuple[int, list[int]]] = {n: (t.data_type, list(t.dims)) for n, t in ens_in.items()}
    consumed: set[str] = set()
    produced: dict[str, str] = {}
    for i, step in enumerate(ens.ensemble_scheduling.step, 1):
        where = f"ensemble step {i} ({step.model_name})"
        m = configs.get(step.model_name)
        if m is None:
            problems.append(Problem(where, f"model {step.model_name!r} is not in the repository."))
            continue
        m_in, m_out = _tensor_table(m, "input"), _tensor_table(m, "output")
        for key, val in step.input_map.items():
            if key not in m_in:
                problems.append(Problem(where, f"input_map key {key!r} is not an input of {step.model_name!r}."))
                continue
            if val not in avail:
                problems.append(
                    Problem(where, f"input_map value {val!r} (for {key!r}) is neither an ensemble input nor an earlier step's output.")
                )
                continue
            consumed.add(val)
            dt, dims = avail[val]
            t = m_in[key]
            if dt != t.data_type:
                problems.append(
                    Problem(where, f"{val!r} is {_dtype_name(dt)} but {step.model_name}.{key} expects {_dtype_name(t.data_type)}.")
                )
            if list(dims) != list(t.dims) and not (val.startswith("_")):
                problems.append(Problem(where, f"{val!r} has dims {list(dims)} but {step.model_name}.{key} expects {list(t.dims)}."))
        for name, t in m_in.items():
            if not t.optional and name not in step.input_map:
                problems.append(Problem(where, f"required input {step.model_name}.{name} is not mapped."))
        for key, val in step.output_map.items():
            if key not in m_out:
                problems.append(Problem(where, f"output_map key {key!r} is not an output of {step.model_name!r}."))
                continue
            if val in produced:
                problems.append(
                    Problem(where, f"tensor {val!r} is already produced by {produced[val]} (an output_map name may appear once).")
                )
            produced[val] = step.model_name
            o = m_out[key]
            avail[val] = (o.data_type, list(o.dims))
            if val in ens_out:
                e = ens_out[val]
                if e.data_type != o.data_type:
                    problems.append(
                        Problem(
                            where,
                            f"ensemble output {val!r} is {_dtype_name(e.data_type)} but {step.model_name}.{key} "
                            f"is {_dtype_name(o.data_type)}.",
                        )
                    )
                if list(e.dims) != list(o.dims):
                    problems.append(
                        Problem(where, f"ensemble output {val!r} has dims {list(e.dims)} but {step.model_name}.{key} has {list(o.dims)}.")
                    )
    for name in ens_out:
        if name not in produced:
            problems.append(Problem("ensemble/config.pbtxt", f"ensemble output {name!r} is produced by no step."))
    for name in ens_in:
        if name not in consumed:
            problems.append(Problem("ensemble/config.pbtxt", f"ensemble input {name!r} is consumed by no step."))


def _param(cfg: Any, key: str) -> str | None:
    p = cfg.parameters.get(key)
    return None if p is None else p.string_value


def validate_repository(
    repo: Path,
    *,
    limits: dict[str, Any],
    target: str,
    build_info: BuildInfo | None = None,
    serving_image: str | None = None,
    streaming: bool = True,
) -> list[Problem]:
    """All problems of the repository at ``repo`` (empty list = releasable). See the module docstring."""
    problems: list[Problem] = []
    repo = Path(repo)
    problems.extend(find_placeholders(repo))
    configs = _model_configs(repo, problems)
    problems += sibling_problems(repo)
    _check_ensemble(configs, problems)
    problems += _batch_limit_problems(configs, limits)
    engine_model = "onnxruntime_genai" if target == "onnxruntime_genai" else "tensorrt_llm"
    eng = configs.get(engine_model)
    if eng is None:
        problems.append(Problem(engine_model, "the engine model is missing from the repository."))
    else:
        problems += _engine_model_problems(configs, eng, engine_model, limits, streaming)
        problems += _engine_file_problems(repo, eng, engine_model, target)
    problems += _tokenizer_problems(repo, configs)
    if target == "tensorrt_llm" and (repo / "tensorrt_llm" / "1" / "engine").is_dir():
        problems += _trtllm_version_problems(repo, build_info, serving_image)
    if eng is not None and (repo / "tensorrt_llm" / "1" / "model.yaml").is_file():
        problems += llmapi_problems(repo, eng)
    return problems


def llmapi_problems(repo: Path, eng: Any) -> list[Problem]:
    """Check 8: the LLM-API model's ``config.pbtxt`` (parsed ``eng``) and ``1/model.yaml`` against :mod:`.llmapi_schema`."""
    import yaml

    from . import llmapi_schema as S

    fix = "regenerate the package (pipeline/package/llmapi_options.py writes these files from the upstream key sets)"
    out = [Problem("tensorrt_llm/config.pbtxt", m, fix) for m in S.check_model_config(eng, where="config.pbtxt")]
    my = repo / "tensorrt_llm" / "1" / "model.yaml"
    try:
        doc = yaml.safe_load(my.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        return out + [Problem("tensorrt_llm/1/model.yaml", f"does not parse as YAML: {e}", fix)]
    out += [Problem("tensorrt_llm/1/model.yaml", m, fix) for m in S.check_model_yaml(doc, where="model.yaml")]
    tc = doc.get("triton_config") if isinstance(doc, dict) else None
    if isinstance(tc, dict) and "decoupled" in tc and bool(tc["decoupled"]) != eng.model_transaction_policy.decoupled:
        out.append(
            Problem(
                "tensorrt_llm/1/model.yaml",
                f"triton_config.decoupled={tc['decoupled']} differs from config.pbtxt decoupled={eng.model_transaction_policy.decoupled} "
                "(NVIDIA's model.py cannot override a value config.pbtxt sets).",
                fix,
            )
        )
    return out


def _model_configs(repo: Path, problems: list[Problem]) -> dict[str, Any]:
    """Parse every model folder's ``config.pbtxt`` (``{folder: ModelConfig}``), appending folder-level problems:
    no config, unparsable config, name differing from the folder, no version folder, python model without model.py."""
    from google.protobuf import text_format

    configs: dict[str, Any] = {}
    for d in sorted(p for p in repo.iterdir() if p.is_dir()):
        cfgp = d / "config.pbtxt"
        if not cfgp.is_file():
            problems.append(
                Problem(
                    str(d.relative_to(repo)),
                    "folder at the repository root without config.pbtxt (Triton polls it as a model).",
                    "keep only model folders at the root (tensorrtllm_backend issue #83)",
                )
            )
            continue
        try:
            cfg = parse_config(cfgp)
        except text_format.ParseError as e:
            problems.append(Problem(f"{d.name}/config.pbtxt", f"does not parse as a Triton ModelConfig: {e}"))
            continue
        configs[d.name] = cfg
        if cfg.name != d.name:
            problems.append(Problem(f"{d.name}/config.pbtxt", f"name {cfg.name!r} differs from its folder {d.name!r}."))
        versions = [v for v in d.iterdir() if v.is_dir() and v.name.isdigit()]
        if not versions:
            problems.append(Problem(d.name, "has no numeric version folder (e.g. 1/)."))
        if (
            cfg.backend == "python"
            and not any((v / "model.py").is_file() for v in versions)
            and not any((v / "model.yaml").is_file() for v in versions)
        ):
            problems.append(Problem(d.name, "python backend model without <version>/model.py."))
    return configs


def _batch_limit_problems(configs: dict[str, Any], limits: dict[str, Any]) -> list[Problem]:
    """Served ``max_batch_size`` never above the engine's."""
    problems: list[Problem] = []
    eng_bs = int(EngineLimits.from_json(limits).max_batch_size or 0)
    for name, cfg in configs.items():
        if eng_bs and cfg.max_batch_size > eng_bs:
            problems.append(
                Problem(
                    f"{name}/config.pbtxt",
                    f"max_batch_size {cfg.max_batch_size} exceeds the engine's max_batch_size {eng_bs}.",
                    f"set package.max_batch_size <= {eng_bs} (or leave it null to use the engine's)",
                )
            )
    return problems


def _engine_model_problems(configs: dict[str, Any], eng: Any, engine_model: str, limits: dict[str, Any], streaming: bool) -> list[Problem]:
    """The engine model's parameters within the engine's limits; one decoupled mode for every model, decoupled when
    streaming."""
    problems: list[Problem] = []
    for key, lim in (("max_input_len", "max_input_len"), ("max_beam_width", "max_beam_width")):
        v, lim_v = _param(eng, key), limits.get(lim)
        if v not in (None, "") and lim_v is not None and v.lstrip("-").isdigit() and int(v) > int(lim_v):
            problems.append(
                Problem(
                    f"{engine_model}/config.pbtxt",
                    f"{key} {int(v)} exceeds the engine's {lim} {int(lim_v)}.",
                    f"set package.{key} <= {int(lim_v)} (or null for the engine's)",
                )
            )
    dec = {
        n: c.model_transaction_policy.decoupled
        for n, c in configs.items()
        if n in (engine_model, "tensorrt_llm_bls") or (n == "ensemble" and c.backend == "python")
    }
    if len(set(dec.values())) > 1:
        problems.append(
            Problem(
                "model_transaction_policy",
                f"decoupled differs between models: {dec}.",
                "use the same package.decoupled for every model",
            )
        )
    if streaming and not all(dec.values()):
        problems.append(
            Problem(
                "model_transaction_policy",
                f"streaming is enabled but decoupled is {dec}.",
                "set package.decoupled=true (streaming needs decoupled mode, tensorrtllm_backend issues #177, #626)",
            )
        )
    return problems


def _engine_file_problems(repo: Path, eng: Any, engine_model: str, target: str) -> list[Problem]:
    """The engine files the engine model points at exist (onnxruntime-genai: genai_config.json + .onnx;
    TensorRT-LLM: config.json + rank<N>.engine under gpt_model_path)."""
    problems: list[Problem] = []
    vdir = repo / engine_model / "1"
    if target == "onnxruntime_genai":
        ed = _param(eng, "engine_dir") or "engine"
        ep = Path(ed) if Path(ed).is_absolute() else vdir / ed
        for f in ("genai_config.json",):
            if not (ep / f).is_file():
                problems.append(
                    Problem(f"{engine_model}/1/{ed}", f"{f} is missing.", "package a build artifact with engine/genai_config.json")
                )
        if not list(ep.glob("*.onnx")):
            problems.append(Problem(f"{engine_model}/1/{ed}", "no .onnx model file."))
    elif _param(eng, "gpt_model_path") is not None:
        gp = _param(eng, "gpt_model_path") or ""
        local = repo / gp[len(CONTAINER_REPO) + 1 :] if gp.startswith(CONTAINER_REPO + "/") else Path(gp)
        if not (local / "config.json").is_file() or not list(local.glob("rank*.engine")):
            problems.append(
                Problem(
                    f"{engine_model}/config.pbtxt",
                    f"gpt_model_path {gp} (= {local} here) lacks config.json + rank<N>.engine.",
                    "package a TensorRT-LLM build artifact",
                )
            )
    return problems


def _tokenizer_problems(repo: Path, configs: dict[str, Any]) -> list[Problem]:
    """Pre- and postprocessing tokenizer folders hold the required files and the same tokenizer."""
    problems: list[Problem] = []
    tok_dirs = {}
    for name in ("preprocessing", "postprocessing"):
        c = configs.get(name)
        if c is None:
            continue
        td = _param(c, "tokenizer_dir") or ""
        p = Path(td) if Path(td).is_absolute() else repo / name / "1" / td
        tok_dirs[name] = p
        for f in REQUIRED_TOKENIZER_FILES:
            if not (p / f).is_file():
                problems.append(
                    Problem(f"{name}/config.pbtxt", f"tokenizer_dir {td!r}: {f} is missing.", "export a checkpoint with a fast tokenizer")
                )
    if len(tok_dirs) == 2:
        a, b = (tok_dirs["preprocessing"] / "tokenizer.json"), (tok_dirs["postprocessing"] / "tokenizer.json")
        if a.is_file() and b.is_file() and a.read_bytes() != b.read_bytes():
            problems.append(Problem("tokenizer_dir", "pre- and postprocessing use different tokenizers.", "package one tokenizer"))
    return problems


def _trtllm_version_problems(repo: Path, build_info: BuildInfo | None, serving_image: str | None) -> list[Problem]:
    """:func:`version_problems` for a packaged TensorRT-LLM engine; the engine's own ``config.json`` ``version``
    (written by trtllm-build) stands in when ``build_info`` records no TensorRT-LLM version."""
    bi = build_info or BuildInfo()
    eng_cfg = repo / "tensorrt_llm" / "1" / "engine" / "config.json"
    if not bi.tensorrt_llm_version and eng_cfg.is_file():
        import json

        try:
            v = json.loads(eng_cfg.read_text(encoding="utf-8")).get("version")
        except ValueError:
            v = None
        if v:
            bi = dataclasses.replace(bi, versions={**bi.versions, "tensorrt_llm": str(v)})
    return version_problems(bi, serving_image)


def version_problems(build_info: BuildInfo, serving_image: str | None) -> list[Problem]:
    """Engine TensorRT-LLM/TensorRT versions (``build_info.json`` ``versions``) vs the serving image's (NVIDIA compatibility matrix, docs/reference/triton.md §3)."""
    if not serving_image:
        return [
            Problem(
                "package.serving_image",
                "no serving image given for a TensorRT-LLM engine.",
                "set package.serving_image (or target.serving_image) to nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3",
                "version",
            )
        ]
    img = V.image_versions(serving_image)
    if img is None:
        return [
            Problem(
                "package.serving_image",
                f"{serving_image!r} is not a known trtllm image (tag=TensorRT-LLM: {V.table_text()}).",
                "use one of the known tags, or add the tag to pipeline/facts/versions.py with its source",
                "version",
            )
        ]
    out: list[Problem] = []
    eng_t = build_info.tensorrt_llm_version
    eng_trt = build_info.tensorrt_version
    if not eng_t:
        out.append(
            Problem(
                "build_info.json",
                "the engine's TensorRT-LLM version is not recorded (versions.tensorrt_llm).",
                "rebuild with the build stage",
                "version",
            )
        )
    elif not V.same_version(str(eng_t), str(img["tensorrt_llm"])):
        out.append(
            Problem(
                "package.serving_image",
                f"engine built with TensorRT-LLM {eng_t}, but {serving_image} ships TensorRT-LLM "
                f"{img['tensorrt_llm']} (engines only load in the same version; tensorrtllm_backend #190/#531).",
                f"serve with an image that ships {eng_t} ({V.images_for(str(eng_t)) or 'none known'}) or rebuild inside {serving_image}",
                "version",
            )
        )
    if eng_trt and img["tensorrt"] and not V.same_prefix(str(eng_trt), img["tensorrt"]):
        out.append(
            Problem(
                "package.serving_image",
                f"engine built with TensorRT {eng_trt}, but {serving_image} ships TensorRT {img['tensorrt']}.",
                "rebuild inside the serving image",
                "version",
            )
        )
    return out


def check_repository(repo: Path, **kw: Any) -> None:
    """Raise with every problem of :func:`validate_repository` (PreflightError when only versions are wrong)."""
    problems = validate_repository(repo, **kw)
    if not problems:
        return
    text = f"model repository {repo} failed validation ({len(problems)} problem(s)):\n" + "\n".join(f"  - {p}" for p in problems)
    if all(p.kind == "version" for p in problems):
        raise PreflightError(text)
    raise InputError(text)


def ensemble_interface(repo: Path) -> dict[str, dict[str, tuple[str, list[int], bool]]]:
    """{"inputs": {name: (TYPE_*, dims, optional)}, "outputs": {name: (TYPE_*, dims, False)}} of the repository's ensemble."""
    cfg = parse_config(Path(repo) / "ensemble" / "config.pbtxt")
    return {
        "inputs": {t.name: (_dtype_name(t.data_type), list(t.dims), t.optional) for t in cfg.input},
        "outputs": {t.name: (_dtype_name(t.data_type), list(t.dims), False) for t in cfg.output},
    }
