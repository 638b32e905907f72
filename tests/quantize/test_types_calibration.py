"""A calibration JSONL line that json rejects with a plain ValueError (not JSONDecodeError) is a clear InputError.

Found while making ``pipeline/data/calibration.py`` type-check: the handler read ``e.msg``, which only JSONDecodeError has, so
an integer literal over Python's int digit limit (4300 digits) crashed with AttributeError (exit 1) instead of naming the
line (exit 2). Real tokenizer, real file."""

from __future__ import annotations

import pytest

from pipeline.core.config import compose
from pipeline.data.calibration import load_calibration
from pipeline.errors import InputError


def test_jsonl_integer_over_the_digit_limit_names_the_line(tmp_path):
    import tiny
    from transformers import AutoTokenizer

    d = tmp_path / "tok"
    d.mkdir()
    tiny.make_tokenizer(d)
    tok = AutoTokenizer.from_pretrained(str(d))
    p = tmp_path / "calib.jsonl"
    p.write_text('{"text": "ok"}\n{"text": "x", "n": ' + "1" * 5000 + "}\n", encoding="utf-8")
    cfg = compose(["calibration=support_v2"]).calibration
    cfg.calib_size, cfg.min_samples, cfg.path = 8, 1, str(p)
    with pytest.raises(InputError, match=r"calib.jsonl:2: not valid JSON \(Exceeds the limit"):
        load_calibration(cfg, tok, p)
