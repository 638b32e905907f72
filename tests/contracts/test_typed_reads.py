"""Typed reads of our own documents (issue 35, "typed contracts").

What passes between stages is typed: ``manifest.json``, ``model_info.json``, ``quant_report.json``,
``build_info.json``, ``eval_report.json``, ``release_manifest.json``, the benchmark results and the run summaries are
read through the frozen dataclasses of ``pipeline/core/contracts/`` (``from_json`` / attribute reads).  A string-keyed
read ``<x>.get("key", ...)`` is allowed:

* in ``pipeline/core/contracts/`` (the one place our own documents are parsed by their JSON keys);
* in a module of :data:`FOREIGN_READERS`: a reader of FOREIGN data (HF ``config.json`` / ``tokenizer_config.json`` /
  ``generation_config.json``, HTTP request bodies, Triton / TensorRT-LLM / ONNX Runtime GenAI files, lm-eval task
  YAML, user data sets, ``os.environ`` ...), each with a one-line reason;
* in a module of :data:`STILL_READING_OWN_DOCUMENTS`, at most as many times as it lists: the modules that still
  read our own documents (or mix them with foreign data) by key, waiting to be converted.

:data:`STILL_READING_OWN_DOCUMENTS` is a ratchet: it only shrinks.  The test fails when a listed module's count
grows or an unlisted module gains a read; when you convert a module, lower its count (or remove it) here.

Static check over the source (ast); counts ``Call`` nodes ``<x>.get(<str constant>, ...)``."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "pipeline"
CONTRACTS = PKG / "core" / "contracts"

FOREIGN_READERS: dict[str, str] = {
    "pipeline.benchmark.reference": "ONNX Runtime GenAI genai_config.json of the engine",
    "pipeline.benchmark.roofline": "ONNX Runtime GenAI genai_config.json of the engine and nvidia-smi rows (hostinfo.gpus)",
    "pipeline.benchmark.triton": "Triton model config fetched from the server",
    "pipeline.benchmark.workload": "user workload rows (prompt / messages JSONL)",
    "pipeline.build.targets.onnxruntime_genai.checks": "HF config.json of the checkpoint",
    "pipeline.build.targets.onnxruntime_genai.quant": "HF config.json of the checkpoint",
    "pipeline.build.targets.tensorrt_llm.builder": "sys.modules (is torch imported)",
    "pipeline.build.targets.tensorrt_llm.runtime": "HF config.json (rope_scaling, sliding window)",
    "pipeline.core.config.common": "dataclasses.Field.metadata of the config classes (Python API)",
    "pipeline.core.config.overrides": "dataclasses.Field.metadata of the config classes (Python API)",
    "pipeline.core.config.schema": "os.environ (PIPELINE_CONFIG_DIR)",
    "pipeline.core.hf_compat": "HF tokenizer_config.json",
    "pipeline.core.hostinfo": "nvidia-smi query rows and sys.modules",
    "pipeline.core.memory": "sys.modules (is torch imported)",
    "pipeline.core.modelio": "HF model.safetensors.index.json",
    "pipeline.core.tokenization": "HF tokenizer.json / tokenizer_config.json / chat_template.json and chat messages",
    "pipeline.data.calibration": "user calibration JSONL rows",
    "pipeline.data.evalset": "user eval-set JSONL rows",
    "pipeline.data.foreign": "lm-eval task YAML and its dataset rows",
    "pipeline.data.metrics": "eval-set rows' metric_args and lm-eval filter arguments",
    "pipeline.doctor": "installed package versions (package metadata) and nvidia-smi GPU records (hostinfo.gpus)",
    "pipeline.evaluate.checks": "eval-set rows and os.environ",
    "pipeline.evaluate.runners": "HF config.json (dtype / torch_dtype)",
    "pipeline.export.checks": "HF config.json and the in-code FAMILY_SUPPORT table",
    "pipeline.export.inspect": "HF config.json and model.safetensors.index.json",
    "pipeline.export.shapes": "HF config.json (num_key_value_heads, head_dim) against the safetensors headers",
    "pipeline.export.write": "HF config.json / generation_config.json and transformers loading info",
    "pipeline.facts.families": "HF config.json and the in-code FAMILY_SUPPORT table",
    "pipeline.facts.geometry": "HF config.json",
    "pipeline.facts.rope": "HF config.json (rope parameters)",
    "pipeline.package.llmapi_schema": "TensorRT-LLM LLM-API options YAML",
    "pipeline.package.llmapi_options": "the model.yaml overrides, in TensorRT-LLM's LLM-API options schema (triton_config)",
    "pipeline.package.trtllm_backend_table": "the in-code table of tensorrtllm_backend config.pbtxt parameters",
    "pipeline.quantize.auto": "ModelOpt auto_quantize search results",
    "pipeline.quantize.calibrate": "os.environ (TORCH_EXTENSIONS_DIR)",
    "pipeline.quantize.hf_ckpt": "HF config.json",
    "pipeline.quantize.modelopt_config": "ModelOpt quantization config dicts",
    "pipeline.quantize.placement": "ModelOpt quantization config dict",
    "pipeline.quantize.preflight": "HF config.json",
    "pipeline.serve.client": "Triton server responses (model config, metadata, repository index)",
    "pipeline.serve.parity": "the ensemble's model config reported by the Triton server (its package id parameter)",
    "pipeline.serve.registry": "the preprocessing model config reported by the Triton server (its parameters)",
    "pipeline.serve.models.genai_requests": "genai_config.json, Triton model parameters and request messages",
    "pipeline.serve.models.llmapi_adapter_model": "Triton model config / parameters and request inputs",
    "pipeline.serve.models.model_common": "Triton model config parameters",
    "pipeline.serve.models.onnxruntime_genai_model": "Triton initialize args, model parameters and genai_config.json",
    "pipeline.serve.models.postprocessing_model": "Triton model parameters",
    "pipeline.serve.models.preprocessing_model": "Triton model parameters",
    "pipeline.serve.models.request_metrics": "Prometheus metric labels",
    "pipeline.serve.models.tensorrt_llm_bls_model": "Triton model config / parameters and request inputs",
    "pipeline.serve.openai_schema": "OpenAI HTTP request bodies and generation_config defaults",
    "pipeline.serve.openai_server": "OpenAI HTTP request bodies",
    "pipeline.serve.server": "os.environ of the server process",
    "pipeline.package.validate": "Triton config.pbtxt models, TensorRT-LLM LLM-API options YAML and engine config.json",
    "pipeline.release.archive": "os.environ (SOURCE_DATE_EPOCH) and its own index of tar members",
    "pipeline.serve.limits": "Triton ensemble config parameters, HTTP request headers and chat messages",
    "pipeline.serve.openai_frontend": "OpenAI request parameters / messages and the Triton ensemble config",
    "pipeline.export.stage": "model preset YAML loaded by OmegaConf and the HF config's rope_scaling",
    "pipeline.planner.stages": "nvidia-smi facts of the local GPUs (hostinfo.local_gpus)",
    "pipeline.build.targets.onnxruntime_genai.builder": "ONNX Runtime GenAI genai_config.json of the engine",
    "pipeline.build.targets.tensorrt_llm.runner": "TensorRT-LLM engine config.json (build_config) and runtime outputs",
    "pipeline.runner": "os.environ (COLUMNS)",
    "pipeline.core.decoding": "HF generation_config.json",
    "pipeline.core.sizing": "nvidia-smi facts of the local GPUs (hostinfo.local_gpus)",
    "pipeline.quantize.trtllm_ckpt": "TensorRT-LLM checkpoint config.json written by ModelOpt and the HF config's rope_scaling",
}
"""Modules whose string-keyed reads are of foreign data, with why."""

STILL_READING_OWN_DOCUMENTS: dict[str, int] = {}
"""The ratchet: modules that still read our own documents by key, with their current count. It only shrinks; it is
empty since every module was converted (issue 35), so any new string-keyed read of our own documents fails."""


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts)


def _string_keyed_gets(src: str) -> int:
    """How many ``<x>.get("<key>", ...)`` calls (first argument a str constant) the source ``src`` has."""
    return sum(
        1
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _counts() -> dict[str, int]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        if p.is_relative_to(CONTRACTS):
            continue
        n = _string_keyed_gets(p.read_text(encoding="utf-8"))
        if n:
            out[_module(p)] = n
    return out


def test_own_documents_are_read_typed():
    """Outside core/contracts a string-keyed ``.get`` is a foreign read (:data:`FOREIGN_READERS`) or one of the
    ratchet's, no more than it lists (:data:`STILL_READING_OWN_DOCUMENTS` only shrinks)."""
    bad = []
    for mod, n in _counts().items():
        if mod in FOREIGN_READERS:
            continue
        allowed = STILL_READING_OWN_DOCUMENTS.get(mod, 0)
        if n > allowed:
            bad.append(
                f"{mod}: {n} string-keyed .get() reads (allowed {allowed}). Fix: read our own documents through the "
                "typed classes of pipeline/core/contracts/ (add a field there when missing); a reader of foreign data "
                "goes in FOREIGN_READERS with its reason"
            )
    assert not bad, "\n".join(bad)


def test_the_lists_are_current():
    """Every listed module exists and still reads by key (a converted module leaves the ratchet; a stale entry would
    let it slide back); the two lists are disjoint and each foreign reader has a reason."""
    counts = _counts()
    modules = {_module(p) for p in PKG.rglob("*.py")}
    assert not set(FOREIGN_READERS) & set(STILL_READING_OWN_DOCUMENTS)
    for mod, why in FOREIGN_READERS.items():
        assert mod in modules, f"FOREIGN_READERS: {mod} does not exist"
        assert why.strip(), f"FOREIGN_READERS: {mod} needs its one-line reason"
    stale = {mod: (n, counts.get(mod, 0)) for mod, n in STILL_READING_OWN_DOCUMENTS.items() if counts.get(mod, 0) < n}
    assert not stale, f"lower the ratchet to the current counts (listed, now): {stale}"


def test_the_scan_sees_reads():
    """The AST scan counts ``x.get("k")`` and ``x.get("k", d)``, not ``x.get(k)`` or ``x.get(1)``."""
    src = 'a.get("k")\nb.get("k", 0)\nc.get(k)\nd.get(1)\n(e or {}).get("k")\n'
    assert _string_keyed_gets(src) == 3
