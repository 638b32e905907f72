"""Data v2 of the default model's tasks: the three quantization-sensitive slices are correct by construction
(the reference is recomputed here from the prompt text alone), and the six v1 slices kept their v1 items."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
from decimal import Decimal

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "evaluation"))
import generate_data as gd  # noqa: E402

EVAL_PATH = os.path.join(REPO, "evaluation", "data", gd.EVAL_FILENAME)
CALIB_PATH = os.path.join(REPO, "evaluation", "data", gd.CALIB_FILENAME)
HARD = ("copy_number", "extract_fields", "order_total")
V1_SLICES = ("intent_en", "intent_zh", "extract_order", "normalize_date", "amount", "reply")
# sha256 of support_eval_v1.jsonl (480 rows) as committed before v2
V1_EVAL_SHA256 = (
    "971ce3723c707ed089f22c8503c39be7bf4537a17b2d7cdde07df614550ba04c"  # git show 13acfdd:evaluation/data/support_eval_v1.jsonl | sha256sum
)
# sha256 of support_eval_v2.jsonl (720 rows, 80 per slice) as committed before the v2 slices were grown
V2_BASE_EVAL_SHA256 = (
    "47163ccfa8801625fba31cc9c4943b364ab8b810008966e9de210f5a89bc496f"  # git show 7fae375:evaluation/data/support_eval_v2.jsonl | sha256sum
)


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def rows():
    return _rows(EVAL_PATH)


def test_version_and_slices(rows):
    assert gd.DATA_VERSION == "v2" and gd.EVAL_FILENAME == "support_eval_v2.jsonl"
    assert gd.SLICE_NAMES == [*V1_SLICES, *HARD]
    counts = {s: sum(r["slice"] == s for r in rows) for s in gd.SLICE_NAMES}
    assert counts == {s: gd.EVAL_GROWN_PER_SLICE.get(s, gd.EVAL_PER_SLICE) for s in gd.SLICE_NAMES}
    assert set(gd.EVAL_GROWN_PER_SLICE) == set(HARD)
    assert len(_rows(CALIB_PATH)) == gd.CALIB_PER_SLICE * len(gd.SLICE_NAMES)


def test_v1_slices_kept_their_items(rows):
    """Adding slices at the end of SLICES (per-slice seeds) leaves the v1 items, ids and order unchanged."""
    v1 = [r for r in rows if r["slice"] in V1_SLICES]
    assert rows[: len(v1)] == v1  # v1 rows first, then the new slices
    text = gd.dumps_jsonl(v1).encode("utf-8")
    assert len(v1) == 480
    assert hashlib.sha256(text).hexdigest() == V1_EVAL_SHA256


def test_grown_slices_start_with_their_v2_items_and_add_only_unseen_prompts(rows):
    """The first EVAL_PER_SLICE items of every slice are the v2 set as it was (same ids, order and bytes); every item
    after them is neither a calibration prompt nor one of the examples the shipped model was trained on."""
    base = [r for r in rows if int(r["id"].rsplit("-", 1)[1]) <= gd.EVAL_PER_SLICE]
    assert base == gd.base_eval_items()
    assert hashlib.sha256(gd.dumps_jsonl(base).encode("utf-8")).hexdigest() == V2_BASE_EVAL_SHA256
    grown = [r for r in rows if r not in base]
    assert {r["slice"] for r in grown} == set(HARD)
    trained = {gd.text_key(t["prompt"]) for t in gd.training_examples(gd.DEFAULT_TRAIN_SEED, gd.TRAINED_EXAMPLES)}
    calib = {gd.text_key(gd.prompt_from_plain(r["text"])) for r in _rows(CALIB_PATH)}
    keys = [gd.text_key(r["prompt"]) for r in rows]
    assert len(set(keys)) == len(keys)
    assert not {gd.text_key(r["prompt"]) for r in grown} & (trained | calib)
    # the premise: without the filter the grown draws would hit trained prompts (small template spaces)
    unfiltered = gd._unique_items(random.Random(gd.EVAL_SEED * 1000 + gd.SLICE_NAMES.index("order_total")), "order_total", 200, set())
    assert {gd.text_key(p) for p, _, _ in unfiltered[gd.EVAL_PER_SLICE :]} & trained


def test_copy_number_reference_is_the_digits_of_the_number(rows):
    for r in (r for r in rows if r["slice"] == "copy_number"):
        groups = re.findall(r"\d[\d -]{10,}\d", r["prompt"])
        assert len(groups) == 1, r
        assert re.sub(r"[ -]", "", groups[0]) == r["reference"], r
        assert 12 <= len(r["reference"]) <= 16 and r["metric"] == "exact_match"


def _amount(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


def test_order_total_reference_is_quantity_times_unit_price(rows):
    for r in (r for r in rows if r["slice"] == "order_total"):
        if r["lang"] == "en":
            m = re.search(r"(?:ordered|bought|refund) (\d+) .*?\$(\d+\.\d\d)", r["prompt"])
        else:
            m = re.search(r"(?:买了|退)(\d+)[个件].*?(\d+\.\d\d)元", r["prompt"])
        assert m, r
        q, u = int(m.group(1)), _amount(m.group(2))
        assert 2 <= q <= 4 and u * 2 == int(u * 2)
        assert Decimal(r["reference"]) == q * u, r
        assert re.fullmatch(r"\d+\.\d\d", r["reference"]) and r["metric"] == "numeric"


def test_extract_fields_reference_has_the_order_id_amount_and_date(rows):
    for r in (r for r in rows if r["slice"] == "extract_fields"):
        order, amount, date = r["reference"].split(" | ")
        assert re.fullmatch(r"ORD-\d{5}", order) and order in r["prompt"]
        assert re.fullmatch(r"\d+\.\d\d", amount)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date)
        y, m, d = (int(x) for x in date.split("-"))
        assert str(y) in r["prompt"] and r["metric"] == "exact_match"
        # the amount's digits appear in the prompt (commas and trailing zeros aside)
        whole = amount.split(".")[0]
        assert whole in r["prompt"].replace(",", ""), r


def test_training_stream_covers_the_hard_slices_and_stays_disjoint(rows):
    train = gd.training_examples(gd.DEFAULT_TRAIN_SEED, 3000)
    assert {s for s in HARD} <= {t["slice"] for t in train}
    held = {gd.normalize_text(r["prompt"]) for r in rows}
    held |= {gd.normalize_text(gd.prompt_from_plain(r["text"])) for r in _rows(CALIB_PATH)}
    assert not held & {gd.normalize_text(t["prompt"]) for t in train}
