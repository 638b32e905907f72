"""One fact, one place: artifact file names (pipeline/core/artifacts.py), the one model_info.json reader and the one
"installed version of X" helper (issue 15, items 1-2 and the versions part of item 1)."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from pipeline.core import artifacts as A
from pipeline.core import hostinfo
from pipeline.core.contracts.build import BuildArtifact
from pipeline.core.contracts.export import ExportArtifact, ModelInfo
from pipeline.core.contracts.quantize import QuantizeArtifact
from pipeline.errors import InputError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "artifacts.md"


@pytest.mark.parametrize("stage", sorted(A.STAGE_ARTIFACTS))
def test_docs_name_every_artifact_file(stage):
    cls = A.artifact_classes()[stage]
    text = DOCS.read_text(encoding="utf-8")
    missing = [f for f in cls.FILES if not re.search(r"(?<![\w./-])" + re.escape(f), text)]
    assert not missing, f"docs/artifacts.md does not name {stage} files {missing}"
    # FILES is complete: every name constant of the class is listed
    names = {v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)}
    listed = {f.rstrip("/") for f in cls.FILES}
    assert names <= listed, names - listed


def test_producers_use_the_same_names():
    from pipeline.build.targets.onnxruntime_genai import builder as onnxruntime_genai

    quantize = pytest.importorskip("pipeline.quantize.state")
    assert quantize.QUANT_STATE_TENSORS == QuantizeArtifact.QUANT_STATE_TENSORS
    assert quantize.QUANT_STATE_JSON == QuantizeArtifact.QUANT_STATE_JSON
    assert onnxruntime_genai.LIMITS_FILE == BuildArtifact.ENGINE_LIMITS


def _export(tmp_path, config=None, gen=None, info=None):
    hf = tmp_path / "hf"
    hf.mkdir()
    if config is not None:
        (hf / "config.json").write_text(json.dumps(config))
    if gen is not None:
        (hf / "generation_config.json").write_text(json.dumps(gen))
    if info is not None:
        (tmp_path / "model_info.json").write_text(info if isinstance(info, str) else json.dumps(info))
    return tmp_path


def test_one_model_info_reader_for_evaluate_package_and_benchmark(tmp_path):
    """Old behaviour: evaluate's reader omitted pad/bos when absent and had no architecture; package's had both;
    a corrupt model_info.json raised a bare ValueError in evaluate and InputError in package."""
    from pipeline.package import stage as package

    exp = _export(
        tmp_path, config={"architectures": ["LlamaForCausalLM"], "eos_token_id": 2, "bos_token_id": 1}, gen={"eos_token_id": [2, 7]}
    )
    info = ExportArtifact(exp).model_info()
    assert info == ModelInfo(eos_token_ids=(2, 7), pad_token_id=None, bos_token_id=1, architecture="LlamaForCausalLM")
    assert package.model_info(exp) == info
    import pipeline.evaluate.stage as ev

    assert not hasattr(ev, "model_info")  # the evaluate stage reads through pipeline.core.artifacts


def test_model_info_json_wins_and_corrupt_file_names_the_fix(tmp_path):
    exp = _export(tmp_path, config={"eos_token_id": 2}, info={"eos_token_ids": [5], "architecture": "X"})
    assert ExportArtifact(exp).model_info().eos_token_ids == (5,)
    (exp / "model_info.json").write_text("{not json")
    with pytest.raises(InputError) as e:
        ExportArtifact(exp).model_info()
    assert "model_info.json" in str(e.value) and "export" in str(e.value)


def test_build_limits_fall_back_to_result_then_config(tmp_path):
    b = BuildArtifact(tmp_path)
    cfg = types.SimpleNamespace(max_input_len=100, max_seq_len=200, max_batch_size=4)
    assert b.limits({"limits": {"max_seq_len": 150}}, cfg) == {"max_seq_len": 150, "max_input_len": 100, "max_batch_size": 4}
    b.build_info_path.write_text(json.dumps({"limits": {"max_seq_len": 120, "max_input_len": 60, "max_batch_size": 2}}))
    assert b.limits({"limits": {"max_seq_len": 150}}, cfg) == {"max_seq_len": 120, "max_input_len": 60, "max_batch_size": 2}


# --------------------------------------------------------------------------- installed versions
def test_one_installed_version_helper(monkeypatch):
    """doctor, quantize, the targets and manifests all answer through hostinfo.installed_version."""
    from pipeline import doctor
    from pipeline.build.targets.onnxruntime_genai import builder as onnxruntime_genai
    from pipeline.build.targets.tensorrt_llm import builder as tensorrt_llm

    assert hostinfo.installed_version("hydra_core") == hostinfo.installed_version("hydra-core") is not None
    assert hostinfo.installed_version("no-such-dist-xyz") is None
    seen: list[str] = []

    def fake(dist: str) -> str | None:
        seen.append(dist)
        return {"tensorrt-llm": "1.2.1", "onnxruntime-genai": "9.9.9"}.get(dist)

    monkeypatch.setattr(hostinfo, "installed_version", fake)
    assert tensorrt_llm.installed_version() == "1.2.1"
    assert onnxruntime_genai.TARGET.available() == (True, "onnxruntime-genai 9.9.9")
    assert doctor._version("tensorrt-llm") == "1.2.1"
    assert hostinfo.library_versions(["onnxruntime-genai"])["onnxruntime-genai"] == "9.9.9"
    qcommon = pytest.importorskip("pipeline.quantize.common")
    assert qcommon._version("tensorrt-llm") == "1.2.1"
    assert {"tensorrt-llm", "onnxruntime-genai"} <= set(seen)


def test_typed_readers_refuse_a_wrong_field_type_and_read_older_documents(tmp_path):
    """``ModelInfo`` / ``BuildInfo`` are the only readers of ``model_info.json`` / ``build_info.json``: a field of the
    wrong type is an InputError naming the file, the field and the fix (it used to surface as a TypeError wherever
    a stage used it); an older single ``eos_token_id`` and an older ``target: {"name": ...}`` are read."""
    from pipeline.core.contracts.build import BuildArtifact, BuildInfo

    (tmp_path / "a").mkdir()
    exp = _export(tmp_path / "a", config={"eos_token_id": 2}, info={"eos_token_ids": "2", "architecture": "X"})
    with pytest.raises(InputError, match=r"model_info\.json: eos_token_ids='2' is not a list\. Fix: re-run the export"):
        ExportArtifact(exp).model_info()
    # in range, not only of the right type: a size below 1 is refused, a token id of -1 ("no pad token") is read
    for field, value, expected in (("hidden_size", 0, "a positive integer"), ("eos_token_ids", [2, None], "an integer")):
        with pytest.raises(InputError, match=rf"{field}(\[1\])?={value if field == 'hidden_size' else None}.* is not {expected}\."):
            ModelInfo.from_json({field: value}, source="model_info.json")
    assert ModelInfo.from_json({"pad_token_id": -1, "rope_theta": 10000}).rope_theta == 10000.0
    assert ModelInfo.from_json({"eos_token_id": 7, "pad_token_id": 0}).eos_token_ids == (7,)
    assert ModelInfo.from_json({"eos_token_ids": [7, 9]}).end_id == 7 and ModelInfo().end_id == -1

    bdir = tmp_path / "b"
    bdir.mkdir()
    (bdir / "build_info.json").write_text(json.dumps({"target": "onnxruntime_genai", "limits": {"max_seq_len": "512"}}))
    with pytest.raises(InputError, match=r"build_info\.json: limits\.max_seq_len='512' is not a positive integer\. Fix: rebuild"):
        BuildArtifact(bdir).build_info()
    # trial 2: limits.max_seq_len=-10 passed the type check and ended as exit 3 in parity
    for bad in ({"limits": {"max_seq_len": -10}}, {"limits": {"max_batch_size": 0}}, {"limits": {"max_seq_len": None}}):
        with pytest.raises(InputError, match=r"limits\.max_\w+=(-10|0|None) is not a positive integer\. Fix: rebuild"):
            BuildInfo.from_json(bad)
    with pytest.raises(InputError, match=r"engine_bytes=-1 is not a non-negative integer"):
        BuildInfo.from_json({"engine_bytes": -1})
    with pytest.raises(InputError, match=r"host\.gpus\[0\]='H100' is not an object"):
        BuildInfo.from_json({"host": {"gpus": ["H100"]}})
    bi = BuildInfo.from_json({"target": {"name": "tensorrt_llm"}, "versions": {"tensorrt-llm": "1.2.1"}, "host": {"gpus": []}})
    assert (bi.target, bi.tensorrt_llm_version, bi.gpus, bi.recorded) == ("tensorrt_llm", "1.2.1", (), True)
    (tmp_path / "empty").mkdir()
    assert not BuildArtifact(tmp_path / "empty").build_info().recorded  # a build that recorded nothing


def test_a_reader_of_a_missing_or_foreign_folder_refuses_instead_of_an_empty_record(tmp_path):
    """Trial 3: ``ExportArtifact(Path('/nonexistent')).model_info()`` and the same reader on a build folder returned
    ``ModelInfo()`` (every field None), as if export had recorded nothing."""
    from pipeline.core.contracts.build import BuildArtifact

    with pytest.raises(InputError, match=r"ExportArtifact\('.*nope'\): the folder does not exist: not an export artifact"):
        ExportArtifact(tmp_path / "nope").model_info()
    with pytest.raises(InputError, match=r"BuildArtifact\('.*nope'\): the folder does not exist"):
        BuildArtifact(str(tmp_path / "nope")).build_info()
    build = tmp_path / "build"
    build.mkdir()
    (build / "build_info.json").write_text(json.dumps({"target": "onnxruntime_genai"}))
    with pytest.raises(InputError, match=r"no model_info\.json and no hf/config\.json: not an export artifact"):
        ExportArtifact(build).model_info()


def test_eval_report_reader_types_what_other_stages_read(tmp_path):
    """``EvalArtifact.report()`` is how package, parity, publish and the runner read ``eval_report.json``: a missing
    file or a wrong-typed field is an InputError with the fix; ``gate_metrics`` takes the candidate's numbers."""
    from pipeline.core.contracts.evaluate import EvalArtifact, EvalReport

    with pytest.raises(InputError, match=r"eval_report\.json is missing\. Fix: re-run the evaluate stage"):
        EvalArtifact(tmp_path).report()
    (tmp_path / "eval_report.json").write_text(json.dumps({"candidate": 3}))
    with pytest.raises(InputError, match=r"candidate=3 is not a string\. Fix: re-run the evaluate stage"):
        EvalArtifact(tmp_path).report()
    with pytest.raises(InputError, match=r"limits\.max_input_len=-1 is not a positive integer"):
        EvalReport.from_json({"limits": {"max_input_len": -1, "max_seq_len": None}})
    doc = {
        "candidate": "engine",
        "notes": {"candidate": "auto -> engine: built"},
        "eval_set": {"name": "support", "path": "/data/es.jsonl", "sha256": "ab", "limit": 4},
        "runners": {"engine": {"score": 0.75, "slices": {"faq": {"score": 0.5}}}, "baseline": {"score": 0.8}},
        "comparison": {"overall": {"baseline": 0.8, "drop": 0.05, "upper": 0.12}, "slices": {"faq": {"drop": 0.1, "upper": 0.3}}},
        "gate": {"allowed_drop": {"overall": 0.1}},
        "fidelity": None,
    }
    rep = EvalReport.from_json(doc)
    assert (rep.candidate, rep.candidate_note, rep.eval_set.path, rep.eval_set.limit) == (
        "engine",
        "auto -> engine: built",
        Path("/data/es.jsonl"),
        4,
    )
    assert rep.gate_metrics() == {
        "score": 0.75,
        "baseline": 0.8,
        "drop": 0.05,
        "drop_upper": 0.12,
        "allowed_drop": 0.1,
        "slice.faq.score": 0.5,
        "slice.faq.drop": 0.1,
        "slice.faq.drop_upper": 0.3,
    }
