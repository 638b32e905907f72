#!/usr/bin/env python3
"""Deterministic generator of the synthetic customer-support task data.

Produces three pairwise-disjoint sets from the same templates/distribution:

* the business eval set      (``support_eval_v2.jsonl``, seed ``EVAL_SEED``)
* the calibration set        (``support_calib_v2.jsonl``, seed ``CALIB_SEED``)
* the training stream        (``training_examples(seed, n)``, never written to git)

Disjointness is enforced here, in the generator: the calibration set skips any
prompt whose normalized text is in the base eval set (the first EVAL_PER_SLICE
items of every slice), the training stream skips any prompt whose normalized
text is in the base eval or calibration set, and the items the grown slices add
after their base items (EVAL_GROWN_PER_SLICE) skip every calibration prompt and
every prompt of the first TRAINED_EXAMPLES training examples (what the shipped
model was trained on), so the training stream stays what it was.

CLI::

    python evaluation/generate_data.py --out-dir evaluation/data

Only the Python standard library is used (``random.Random`` with integer seeds
is stable across CPython 3.x versions), so the output is byte-for-byte
reproducible.
"""
from __future__ import annotations

import argparse
import calendar
import hashlib
import json
import os
import random
import re
import unicodedata
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

DATA_VERSION = "v2"
EVAL_SEED = 20240501
CALIB_SEED = 20240502
DEFAULT_TRAIN_SEED = 1234

EVAL_PER_SLICE = 80
CALIB_PER_SLICE = 100
# The quantization-sensitive v2 slices carry more items than the others: on 80 paired items one lost answer already
# puts the 95 % upper bound of a slice's drop at +5.4 pp, above the 4 pp per-slice allowance of fp8 and int8_wo, so the
# gate could only say "inconclusive" for those recipes (pipeline/evaluate/gate.py, Tango's bound). The first
# EVAL_PER_SLICE items of these slices are the v2 items as they were; the rest are drawn after them from the same
# stream, skipping every prompt the shipped model was trained on (TRAINED_EXAMPLES) and every calibration prompt.
EVAL_GROWN_PER_SLICE = {"copy_number": 200, "extract_fields": 200, "order_total": 200}
# Examples of the training stream (seed DEFAULT_TRAIN_SEED) the shipped model's v2 training drew
# (models/support-llama/README.md: --n-train 150000); grown eval items are never among them.
TRAINED_EXAMPLES = 150_000

EVAL_FILENAME = f"support_eval_{DATA_VERSION}.jsonl"
CALIB_FILENAME = f"support_calib_{DATA_VERSION}.jsonl"

# Plain-text rendering of one example used for the calibration texts (the chat
# template without the special tokens; see models/support-llama/tokenizer_config.json).
USER_PREFIX = "User: "
ASSISTANT_PREFIX = "\nAssistant:"

INTENTS = [
    "refund",
    "shipping_delay",
    "cancel_order",
    "change_address",
    "damaged_item",
    "billing_question",
    "account_access",
    "product_info",
]

# --------------------------------------------------------------------------
# vocabularies
# --------------------------------------------------------------------------
PRODUCTS_EN = [
    "wireless earbuds", "phone case", "coffee maker", "desk lamp", "running shoes",
    "backpack", "smart watch", "blender", "yoga mat", "laptop stand", "water bottle",
    "bluetooth speaker", "kitchen scale", "air fryer", "office chair", "winter jacket",
    "USB-C charger", "gaming mouse", "electric kettle", "baby stroller", "rice cooker",
    "tablet", "sunglasses", "hair dryer",
]
PRODUCTS_ZH = [
    "无线耳机", "手机壳", "咖啡机", "台灯", "跑鞋", "双肩包", "智能手表", "榨汁机",
    "瑜伽垫", "笔记本支架", "保温杯", "蓝牙音箱", "厨房秤", "空气炸锅", "办公椅",
    "羽绒服", "充电器", "游戏鼠标", "电热水壶", "婴儿车", "电饭煲", "平板电脑",
    "太阳镜", "吹风机",
]
STREETS_EN = ["Oak Street", "Maple Avenue", "Pine Road", "Cedar Lane", "Elm Drive",
              "Lake View Road", "Hill Street", "River Road", "Park Avenue", "Sunset Blvd"]
CITIES_EN = ["Austin", "Denver", "Seattle", "Boston", "Chicago", "Portland", "Miami",
             "Dallas", "Atlanta", "Phoenix"]
CITIES_ZH = ["北京", "上海", "广州", "深圳", "杭州", "成都", "南京", "武汉", "西安", "苏州"]
ROADS_ZH = ["人民路", "中山路", "解放路", "建设路", "长江路", "和平路", "文化路", "新华路"]
NAMES_EN = ["Maria", "John", "Aisha", "Lucas", "Emma", "Noah", "Olivia", "Liam", "Sofia",
            "Ethan", "Chloe", "Mason", "Zoe", "Daniel", "Grace", "Ryan"]
NAMES_ZH = ["王先生", "李女士", "张先生", "刘女士", "陈先生", "杨女士", "赵先生", "黄女士"]

MONTHS_FULL = ["January", "February", "March", "April", "May", "June", "July", "August",
               "September", "October", "November", "December"]
MONTHS_ABBR = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


# --------------------------------------------------------------------------
# normalisation used for disjointness
# --------------------------------------------------------------------------
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalize_text(s: str) -> str:
    """NFKC, lower-case, drop whitespace and punctuation (used for dedup/disjointness)."""
    return _NON_WORD.sub("", unicodedata.normalize("NFKC", s).lower())


def text_key(s: str) -> str:
    return hashlib.sha1(normalize_text(s).encode("utf-8")).hexdigest()


def render_plain(prompt: str, answer: Optional[str] = None) -> str:
    """The chat format as plain text (no <s>/</s>); used for calibration texts."""
    text = USER_PREFIX + prompt + ASSISTANT_PREFIX
    if answer is not None:
        text += " " + answer
    return text


def prompt_from_plain(text: str) -> str:
    """Inverse of :func:`render_plain` (recovers the user prompt)."""
    assert text.startswith(USER_PREFIX) and ASSISTANT_PREFIX in text, text
    return text[len(USER_PREFIX):text.index(ASSISTANT_PREFIX)]


# --------------------------------------------------------------------------
# random slot values
# --------------------------------------------------------------------------
def order_id(rng: random.Random) -> str:
    return f"ORD-{rng.randint(10000, 99999)}"


def tracking_id(rng: random.Random) -> str:
    return f"TRK-{rng.randint(100000, 999999)}"


def small_money(rng: random.Random) -> str:
    return f"{rng.randint(5, 499)}.{rng.randint(0, 99):02d}"


def address_en(rng: random.Random) -> str:
    return f"{rng.randint(1, 999)} {rng.choice(STREETS_EN)}, {rng.choice(CITIES_EN)}"


def address_zh(rng: random.Random) -> str:
    return f"{rng.choice(CITIES_ZH)}市{rng.choice(ROADS_ZH)}{rng.randint(1, 300)}号"


def fill(template: str, rng: random.Random, lang: str, o: Optional[str] = None) -> str:
    vals = {
        "p": rng.choice(PRODUCTS_EN if lang == "en" else PRODUCTS_ZH),
        "o": o or order_id(rng),
        "n": str(rng.randint(2, 21)),
        "addr": address_en(rng) if lang == "en" else address_zh(rng),
        "amt": small_money(rng),
        "trk": tracking_id(rng),
    }
    return template.format(**vals)


# --------------------------------------------------------------------------
# intent tickets
# --------------------------------------------------------------------------
TICKETS_EN: Dict[str, List[str]] = {
    "refund": [
        "I would like a refund for the {p} I bought.",
        "Please refund my money for order {o}.",
        "Can I get my money back? The {p} is not what I expected.",
        "I returned the {p} {n} days ago and still have not received my refund.",
        "How do I request a refund for order {o}?",
        "I want to return the {p} from order {o} and get a full refund.",
    ],
    "shipping_delay": [
        "My order {o} still has not arrived after {n} days.",
        "Where is my package? The {p} was supposed to arrive {n} days ago.",
        "The tracking for order {o} has not updated in {n} days.",
        "My {p} is late. When will it be delivered?",
        "The delivery of my {p} is delayed again, it has been {n} days.",
    ],
    "cancel_order": [
        "Please cancel my order {o}.",
        "I ordered the {p} by mistake, please cancel it.",
        "I want to cancel order {o} before it ships.",
        "Can you cancel the {p} I ordered {n} days ago?",
        "I changed my mind, cancel the {p} in order {o}.",
    ],
    "change_address": [
        "I need to change the shipping address for order {o} to {addr}.",
        "Please update my delivery address to {addr}.",
        "I moved, can you send the {p} to {addr} instead?",
        "Wrong address on order {o}, the correct one is {addr}.",
    ],
    "damaged_item": [
        "The {p} arrived broken.",
        "My {p} came with a cracked case and a damaged box.",
        "The {p} from order {o} was damaged in shipping.",
        "I opened the package and the {p} is scratched and dented.",
        "The {p} I received {n} days ago is broken and does not turn on.",
    ],
    "billing_question": [
        "I was charged twice for order {o}.",
        "Why is there an extra charge of ${amt} on my card?",
        "My invoice for order {o} shows the wrong amount.",
        "I do not recognize a payment of ${amt} on my statement.",
        "The price of the {p} was ${amt} but my bank shows a higher charge.",
    ],
    "account_access": [
        "I can't log in to my account, it says the password is wrong.",
        "I forgot my password and the reset email never arrives.",
        "My account is locked after {n} failed login attempts.",
        "I am not receiving the verification code to sign in.",
        "I cannot access my account since yesterday, the login page shows error code {n}.",
    ],
    "product_info": [
        "Is the {p} waterproof?",
        "Does the {p} come with a warranty?",
        "What colors is the {p} available in?",
        "How long does the battery of the {p} last?",
        "Is the {p} compatible with the model I bought {n} months ago?",
    ],
}

TICKETS_ZH: Dict[str, List[str]] = {
    "refund": [
        "我想申请退款，订单号{o}。",
        "{p}不好用，能退钱吗？",
        "我退回的{p}已经{n}天了，还没收到退款。",
        "请帮我把订单{o}的钱退回来。",
        "{p}和描述不符，我要退货退款。",
    ],
    "shipping_delay": [
        "我的订单{o}已经{n}天了还没到。",
        "快递怎么还没送到？{p}已经等了{n}天。",
        "订单{o}的物流信息{n}天没有更新了。",
        "我买的{p}一直没收到，什么时候能送达？",
    ],
    "cancel_order": [
        "请帮我取消订单{o}。",
        "{p}拍错了，麻烦取消订单。",
        "我不想要了，取消订单{o}。",
        "{n}天前下单的{p}还没发货，请取消。",
    ],
    "change_address": [
        "订单{o}的收货地址要改成{addr}。",
        "我搬家了，请把{p}寄到{addr}。",
        "地址填错了，请修改为{addr}。",
        "麻烦把订单{o}的地址更新为{addr}。",
    ],
    "damaged_item": [
        "收到的{p}是坏的。",
        "{p}到货时外壳破损了。",
        "订单{o}的{p}在运输中被摔坏了。",
        "打开包裹发现{p}有划痕和裂缝。",
    ],
    "billing_question": [
        "订单{o}被重复扣款了。",
        "为什么我的卡上多扣了{amt}元？",
        "发票上的金额不对，订单{o}。",
        "{p}标价{amt}元，但银行显示扣了更多钱。",
    ],
    "account_access": [
        "我登录不了账号，一直提示密码错误。",
        "忘记密码了，重置邮件一直收不到。",
        "账号被锁定了，连续输错{n}次密码。",
        "收不到登录验证码，进不去账户。",
    ],
    "product_info": [
        "{p}防水吗？",
        "{p}有保修吗？",
        "{p}有哪些颜色可选？",
        "{p}的电池能用多久？",
    ],
}

GREET_EN = ["", "", "Hi, ", "Hello, ", "Hello team, ", "Hey, "]
CLOSE_EN = ["", "", " Thanks.", " Please help.", " Thank you!", " Regards."]
GREET_ZH = ["", "", "你好，", "您好，", "客服你好，"]
CLOSE_ZH = ["", "", "谢谢。", "请尽快处理。", "麻烦了！"]

INTENT_WRAP_EN = [
    "Classify the intent of this support ticket: {t}",
    "What is the intent of this ticket? {t}",
    "Intent label for the ticket: {t}",
]
INTENT_WRAP_ZH = [
    "请判断这条客服工单的意图：{t}",
    "工单意图分类：{t}",
    "这条工单属于哪类意图？{t}",
]


def ticket(rng: random.Random, lang: str, intent: str, o: Optional[str] = None,
           need_order: bool = False) -> str:
    table = TICKETS_EN if lang == "en" else TICKETS_ZH
    templates = table[intent]
    if need_order:
        templates = [t for t in templates if "{o}" in t]
    body = fill(rng.choice(templates), rng, lang, o=o)
    if lang == "en":
        greet = rng.choice(GREET_EN)
        if greet and not body.startswith("I "):
            body = body[0].lower() + body[1:]
        return greet + body + rng.choice(CLOSE_EN)
    return rng.choice(GREET_ZH) + body + rng.choice(CLOSE_ZH)


def gen_intent(rng: random.Random, lang: str) -> Tuple[str, str, str]:
    intent = rng.choice(INTENTS)
    wrap = rng.choice(INTENT_WRAP_EN if lang == "en" else INTENT_WRAP_ZH)
    return wrap.format(t=ticket(rng, lang, intent)), intent, lang


def gen_intent_en(rng: random.Random) -> Tuple[str, str, str]:
    return gen_intent(rng, "en")


def gen_intent_zh(rng: random.Random) -> Tuple[str, str, str]:
    return gen_intent(rng, "zh")


# --------------------------------------------------------------------------
# order id extraction
# --------------------------------------------------------------------------
EXTRA_ORDER_EN = [
    "I paid ${amt} for order {o} and the tracking number is {trk}.",
    "Tracking {trk} shows nothing, my order number is {o}.",
    "Order {o}: I was charged ${amt} but the {p} never shipped.",
    "My phone is 555-{n}{n}0 and the order is {o}, please call me.",
]
EXTRA_ORDER_ZH = [
    "我付了{amt}元，订单号是{o}，快递单号{trk}。",
    "快递单号{trk}查不到，我的订单号是{o}。",
    "订单{o}扣了{amt}元，但{p}一直没发货。",
]
EXTRACT_WRAP_EN = [
    "Extract the order ID from this message: {t}",
    "What is the order number in this ticket? {t}",
    "Find the order ID: {t}",
]
EXTRACT_WRAP_ZH = [
    "从以下消息中提取订单号：{t}",
    "这条工单里的订单号是什么？{t}",
    "提取订单编号：{t}",
]


def gen_extract_order(rng: random.Random) -> Tuple[str, str, str]:
    lang = rng.choice(["en", "zh"])
    o = order_id(rng)
    if rng.random() < 0.35:
        body = fill(rng.choice(EXTRA_ORDER_EN if lang == "en" else EXTRA_ORDER_ZH), rng, lang, o=o)
    else:
        intents = [i for i in INTENTS
                   if any("{o}" in t for t in (TICKETS_EN if lang == "en" else TICKETS_ZH)[i])]
        body = ticket(rng, lang, rng.choice(intents), o=o, need_order=True)
    wrap = rng.choice(EXTRACT_WRAP_EN if lang == "en" else EXTRACT_WRAP_ZH)
    return wrap.format(t=body), o, lang


# --------------------------------------------------------------------------
# date normalisation
# --------------------------------------------------------------------------
def _ordinal(d: int) -> str:
    if 11 <= d % 100 <= 13:
        return f"{d}th"
    return str(d) + {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")


DATE_FORMATS_EN: List[Callable[[int, int, int], str]] = [
    lambda y, m, d: f"{MONTHS_FULL[m - 1]} {d}, {y}",
    lambda y, m, d: f"{d} {MONTHS_FULL[m - 1]} {y}",
    lambda y, m, d: f"{MONTHS_ABBR[m - 1]} {d}, {y}",
    lambda y, m, d: f"{d} {MONTHS_ABBR[m - 1]} {y}",
    lambda y, m, d: f"{MONTHS_FULL[m - 1]} {_ordinal(d)}, {y}",
    lambda y, m, d: f"{m:02d}/{d:02d}/{y} (US)",
    lambda y, m, d: f"{d:02d}/{m:02d}/{y} (EU)",
    lambda y, m, d: f"{y}.{m:02d}.{d:02d}",
    lambda y, m, d: f"{y}/{m}/{d}",
]
DATE_FORMATS_ZH: List[Callable[[int, int, int], str]] = [
    lambda y, m, d: f"{y}年{m}月{d}日",
    lambda y, m, d: f"{y}年{m:02d}月{d:02d}日",
    lambda y, m, d: f"{y}/{m}/{d}",
    lambda y, m, d: f"{y}.{m:02d}.{d:02d}",
]
DATE_WRAP_EN = [
    "Convert this date to YYYY-MM-DD: {d}",
    "Normalize the date {d} to YYYY-MM-DD format.",
    "What is {d} in ISO format (YYYY-MM-DD)?",
]
DATE_WRAP_ZH = [
    "把日期{d}转换成YYYY-MM-DD格式。",
    "请将日期标准化为YYYY-MM-DD：{d}",
    "日期{d}用YYYY-MM-DD怎么写？",
]


def gen_normalize_date(rng: random.Random) -> Tuple[str, str, str]:
    lang = rng.choice(["en", "zh"])
    y = rng.randint(2019, 2027)
    m = rng.randint(1, 12)
    d = rng.randint(1, calendar.monthrange(y, m)[1])
    fmt = rng.choice(DATE_FORMATS_EN if lang == "en" else DATE_FORMATS_ZH)
    wrap = rng.choice(DATE_WRAP_EN if lang == "en" else DATE_WRAP_ZH)
    return wrap.format(d=fmt(y, m, d)), f"{y:04d}-{m:02d}-{d:02d}", lang


# --------------------------------------------------------------------------
# amount normalisation
# --------------------------------------------------------------------------
def _commas(n: int) -> str:
    return f"{n:,}"


def _amount_parts(rng: random.Random) -> Tuple[int, int, str]:
    digits = rng.choice([1, 2, 3, 3, 4, 4, 5])
    whole = rng.randint(1 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)
    kind = rng.choice(["int", "one", "two", "two"])
    if kind == "int":
        return whole, 0, ""
    if kind == "one":
        c = rng.randint(0, 9)
        return whole, c * 10, str(c)
    c = rng.randint(0, 99)
    return whole, c, f"{c:02d}"


def _num(whole: int, frac: str, commas: bool) -> str:
    s = _commas(whole) if commas else str(whole)
    return s + ("." + frac if frac else "")


AMOUNT_FORMATS_EN: List[Callable[[int, str], str]] = [
    lambda w, f: "$" + _num(w, f, True),
    lambda w, f: "$" + _num(w, f, False),
    lambda w, f: _num(w, f, False) + " dollars",
    lambda w, f: "USD " + _num(w, f, True),
    lambda w, f: _num(w, f, True) + " USD",
]
AMOUNT_FORMATS_ZH: List[Callable[[int, str], str]] = [
    lambda w, f: _num(w, f, False) + "元",
    lambda w, f: "¥" + _num(w, f, True),
    lambda w, f: "人民币" + _num(w, f, False) + "元",
    lambda w, f: _num(w, f, True) + "元",
]
AMOUNT_WRAP_EN = [
    "Normalize this amount to a number with two decimals: {a}",
    "Convert {a} to a plain number with 2 decimal places.",
    "Write the amount {a} as a number like 12.50.",
]
AMOUNT_WRAP_ZH = [
    "把金额{a}转换为保留两位小数的数字。",
    "请将金额标准化为两位小数：{a}",
    "金额{a}写成数字（两位小数）是多少？",
]


def gen_amount(rng: random.Random) -> Tuple[str, str, str]:
    lang = rng.choice(["en", "zh"])
    whole, cents, frac = _amount_parts(rng)
    fmt = rng.choice(AMOUNT_FORMATS_EN if lang == "en" else AMOUNT_FORMATS_ZH)
    wrap = rng.choice(AMOUNT_WRAP_EN if lang == "en" else AMOUNT_WRAP_ZH)
    return wrap.format(a=fmt(whole, frac)), f"{whole}.{cents:02d}", lang


# --------------------------------------------------------------------------
# templated replies
# --------------------------------------------------------------------------
# (prompt templates, answer template, answer template with name)
REPLY_EN = [
    (["Write a one-line reply confirming the refund for order {o}.",
      "Reply in one line: confirm the refund for order {o}."],
     "Your refund for order {o} has been approved."),
    (["Write a one-line reply confirming the cancellation of order {o}.",
      "Reply in one line: confirm that order {o} is cancelled."],
     "Your order {o} has been cancelled."),
    (["Write a one-line reply saying that order {o} has shipped.",
      "Reply in one line: tell the customer order {o} has shipped."],
     "Good news: your order {o} has shipped."),
    (["Write a one-line reply confirming the new address for order {o}.",
      "Reply in one line: confirm the address change for order {o}."],
     "The shipping address for order {o} has been updated."),
    (["Write a one-line apology for the delay of order {o}.",
      "Reply in one line: apologize that order {o} is delayed."],
     "We are sorry that order {o} is delayed."),
]
REPLY_ZH = [
    (["写一句回复，确认订单{o}已退款。", "用一句话回复客户：订单{o}退款成功。"],
     "您的订单{o}已退款。"),
    (["写一句回复，确认订单{o}已取消。", "用一句话回复客户：订单{o}取消成功。"],
     "您的订单{o}已取消。"),
    (["写一句回复，通知订单{o}已发货。", "用一句话回复客户：订单{o}已经发货。"],
     "您的订单{o}已发货，请注意查收。"),
    (["写一句回复，确认订单{o}的地址已修改。", "用一句话回复客户：订单{o}地址修改成功。"],
     "订单{o}的收货地址已更新。"),
    (["写一句道歉回复，订单{o}延迟发货。", "用一句话回复客户：为订单{o}的延迟道歉。"],
     "很抱歉，订单{o}延迟了。"),
]


def gen_reply(rng: random.Random) -> Tuple[str, str, str]:
    lang = "en" if rng.random() < 0.6 else "zh"
    o = order_id(rng)
    prompts, answer = rng.choice(REPLY_EN if lang == "en" else REPLY_ZH)
    prompt = rng.choice(prompts).format(o=o)
    answer = answer.format(o=o)
    if rng.random() < 0.4:
        if lang == "en":
            name = rng.choice(NAMES_EN)
            prompt = prompt + f" The customer is {name}."
            answer = f"Hi {name}, " + answer[0].lower() + answer[1:]
        else:
            name = rng.choice(NAMES_ZH)
            prompt = f"客户是{name}。" + prompt
            answer = f"{name}，" + answer
    return prompt, answer, lang


# --------------------------------------------------------------------------
# harder, quantization-sensitive slices (added in v2)
# --------------------------------------------------------------------------
# Long digit strings: copy a 12-16 digit number exactly, separators removed.
NUMBER_KINDS_EN = ["account number", "card number", "tracking number", "membership number", "invoice number"]
NUMBER_KINDS_ZH = ["账号", "卡号", "快递单号", "会员号", "发票号"]
COPY_BODY_EN = [
    "My {k} is {x}.",
    "The {k} on file is {x}, order {o}.",
    "Please check {k} {x} for me.",
    "I was asked for my {k}: {x}",
]
COPY_BODY_ZH = [
    "我的{k}是{x}。",
    "{k}{x}，订单{o}。",
    "请帮我查一下{k}{x}。",
]
COPY_WRAP_EN = [
    "Write the {k} as digits only: {t}",
    "Copy the {k} without spaces or dashes: {t}",
    "Read back the {k} exactly, digits only: {t}",
]
COPY_WRAP_ZH = [
    "只写出{k}的数字：{t}",
    "去掉空格和横线，写出{k}：{t}",
    "请准确复述{k}（只要数字）：{t}",
]


def long_digits(rng: random.Random) -> str:
    n = rng.randint(12, 16)
    return str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(n - 1))


def _grouped(digits: str, rng: random.Random) -> str:
    sep = rng.choice(["", " ", "-"])
    if not sep:
        return digits
    return sep.join(digits[i:i + 4] for i in range(0, len(digits), 4))


def gen_copy_number(rng: random.Random) -> Tuple[str, str, str]:
    lang = rng.choice(["en", "zh"])
    digits = long_digits(rng)
    k = rng.randrange(len(NUMBER_KINDS_EN))
    kind = NUMBER_KINDS_EN[k] if lang == "en" else NUMBER_KINDS_ZH[k]
    body = rng.choice(COPY_BODY_EN if lang == "en" else COPY_BODY_ZH)
    body = body.format(k=kind, x=_grouped(digits, rng), o=order_id(rng))
    wrap = rng.choice(COPY_WRAP_EN if lang == "en" else COPY_WRAP_ZH)
    return wrap.format(k=kind, t=body), digits, lang


# Multi-field extraction: order id + amount + date in one structured answer.
FIELDS_BODY_EN = [
    "Order {o} was charged {a} on {d}.",
    "On {d} I paid {a} for order {o}.",
    "I was billed {a} for the {p} in order {o} on {d}.",
    "Refund {a} for order {o}, purchased {d}.",
]
FIELDS_BODY_ZH = [
    "订单{o}在{d}扣款{a}。",
    "我在{d}为订单{o}支付了{a}。",
    "订单{o}的{p}于{d}付款{a}。",
]
FIELDS_WRAP_EN = [
    "Extract order ID | amount | date (YYYY-MM-DD): {t}",
    "Give the order ID, the amount with two decimals and the date as YYYY-MM-DD, separated by |: {t}",
]
FIELDS_WRAP_ZH = [
    "提取订单号 | 金额 | 日期(YYYY-MM-DD)：{t}",
    "请用|分隔写出订单号、两位小数金额和YYYY-MM-DD日期：{t}",
]


def gen_extract_fields(rng: random.Random) -> Tuple[str, str, str]:
    lang = rng.choice(["en", "zh"])
    o = order_id(rng)
    whole, cents, frac = _amount_parts(rng)
    a = rng.choice(AMOUNT_FORMATS_EN if lang == "en" else AMOUNT_FORMATS_ZH)(whole, frac)
    y = rng.randint(2019, 2027)
    m = rng.randint(1, 12)
    d = rng.randint(1, calendar.monthrange(y, m)[1])
    ds = rng.choice(DATE_FORMATS_EN if lang == "en" else DATE_FORMATS_ZH)(y, m, d)
    p = rng.choice(PRODUCTS_EN if lang == "en" else PRODUCTS_ZH)
    body = rng.choice(FIELDS_BODY_EN if lang == "en" else FIELDS_BODY_ZH).format(o=o, a=a, d=ds, p=p)
    wrap = rng.choice(FIELDS_WRAP_EN if lang == "en" else FIELDS_WRAP_ZH)
    return wrap.format(t=body), f"{o} | {whole}.{cents:02d} | {y:04d}-{m:02d}-{d:02d}", lang


# Arithmetic on amounts: quantity x unit price (exact cents).  Kept small (quantity 2-4, unit price 1.00-49.50 in
# steps of 0.50: 294 products) so the 4.6 M-parameter default model can learn it; with any cents and prices up to
# 99.99 it stayed near 10 % after 2000 steps.
TOTAL_CENTS = [0, 50]
TOTAL_BODY_EN = [
    "I ordered {q} x {p} at ${u} each.",
    "I bought {q} units of the {p}, unit price ${u}.",
    "Please refund {q} {p} items, each cost ${u}.",
]
TOTAL_BODY_ZH = [
    "我买了{q}个{p}，单价{u}元。",
    "请退{q}件{p}，每件{u}元。",
]
TOTAL_WRAP_EN = [
    "What is the total amount (two decimals)? {t}",
    "Compute quantity x unit price as a number with 2 decimals: {t}",
]
TOTAL_WRAP_ZH = [
    "总金额是多少（两位小数）？{t}",
    "计算数量乘以单价（保留两位小数）：{t}",
]


def gen_order_total(rng: random.Random) -> Tuple[str, str, str]:
    lang = rng.choice(["en", "zh"])
    q = rng.randint(2, 4)
    unit_cents = rng.randint(1, 49) * 100 + rng.choice(TOTAL_CENTS)
    u = f"{unit_cents // 100}.{unit_cents % 100:02d}"
    p = rng.choice(PRODUCTS_EN if lang == "en" else PRODUCTS_ZH)
    body = rng.choice(TOTAL_BODY_EN if lang == "en" else TOTAL_BODY_ZH).format(q=q, p=p, u=u)
    wrap = rng.choice(TOTAL_WRAP_EN if lang == "en" else TOTAL_WRAP_ZH)
    total = q * unit_cents
    return wrap.format(t=body), f"{total // 100}.{total % 100:02d}", lang


# --------------------------------------------------------------------------
# slices
# --------------------------------------------------------------------------
# name -> (generator, metric, max_new_tokens)
SLICES: Dict[str, Tuple[Callable[[random.Random], Tuple[str, str, str]], str, int]] = {
    "intent_en": (gen_intent_en, "exact_match", 16),
    "intent_zh": (gen_intent_zh, "exact_match", 16),
    "extract_order": (gen_extract_order, "exact_match", 16),
    "normalize_date": (gen_normalize_date, "exact_match", 16),
    "amount": (gen_amount, "numeric", 16),
    "reply": (gen_reply, "normalized_exact_match", 48),
    # v2: harder slices whose answers are long exact strings or computed digits (quantization-sensitive)
    "copy_number": (gen_copy_number, "exact_match", 24),
    "extract_fields": (gen_extract_fields, "exact_match", 40),
    "order_total": (gen_order_total, "numeric", 16),
}
SLICE_NAMES = list(SLICES)

# relative sampling weights of the training stream: the intent slices are
# learned early, the copy-heavy slices (ids, dates, amounts) need the most steps
TRAIN_WEIGHTS = {
    "intent_en": 0.5,
    "intent_zh": 0.5,
    "extract_order": 1.2,
    "normalize_date": 1.3,
    "amount": 1.5,
    "reply": 1.2,
    "copy_number": 3.0,
    "extract_fields": 2.0,
    "order_total": 3.0,
}


def _unique_items(rng: random.Random, slice_name: str, n: int,
                  exclude: Set[str]) -> List[Tuple[str, str, str]]:
    gen = SLICES[slice_name][0]
    out = []
    seen = set(exclude)
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n:
            raise RuntimeError(f"could not draw {n} unique items for {slice_name}")
        prompt, answer, lang = gen(rng)
        k = text_key(prompt)
        if k in seen:
            continue
        seen.add(k)
        out.append((prompt, answer, lang))
    return out


def _eval_row(name: str, i: int, prompt: str, answer: str, lang: str) -> dict:
    _, metric, max_new = SLICES[name]
    return {
        "id": f"{name}-{i + 1:04d}",
        "prompt": prompt,
        "reference": answer,
        "slice": name,
        "metric": metric,
        "lang": lang,
        "max_new_tokens": max_new,
    }


def _eval_draws(seed: int, per_slice: int) -> Dict[str, Tuple[random.Random, List[Tuple[str, str, str]]]]:
    """Per slice: its stream (left just after the draws) and the first ``per_slice`` unique items."""
    out = {}
    for s_idx, name in enumerate(SLICE_NAMES):
        rng = random.Random(seed * 1000 + s_idx)
        out[name] = (rng, _unique_items(rng, name, per_slice, set()))
    return out


def base_eval_items(seed: int = EVAL_SEED, per_slice: int = EVAL_PER_SLICE) -> List[dict]:
    """The first ``per_slice`` items of every slice: what calibration and the training stream were kept apart from."""
    return [_eval_row(name, i, *item) for name, (_, items) in _eval_draws(seed, per_slice).items() for i, item in enumerate(items)]


def eval_items(seed: int = EVAL_SEED, per_slice: int = EVAL_PER_SLICE,
               grown: Optional[Dict[str, int]] = None) -> List[dict]:
    """The business eval set: ``per_slice`` items per slice, and up to ``grown[slice]`` for the grown slices
    (``EVAL_GROWN_PER_SLICE`` by default), the extra ones drawn after the first ``per_slice`` from the same stream
    and never a calibration prompt or a prompt of the first ``TRAINED_EXAMPLES`` training examples."""
    grown = EVAL_GROWN_PER_SLICE if grown is None else grown
    draws = _eval_draws(seed, per_slice)
    exclude: Set[str] = set()
    if any(n > per_slice for n in grown.values()):
        exclude = heldout_keys() | {text_key(ex["prompt"]) for ex in training_examples(DEFAULT_TRAIN_SEED, TRAINED_EXAMPLES)}
    items = []
    for name, (rng, first) in draws.items():
        extra = max(0, grown.get(name, per_slice) - per_slice)
        more = _unique_items(rng, name, extra, exclude | {text_key(p) for p, _, _ in first}) if extra else []
        items.extend(_eval_row(name, i, *item) for i, item in enumerate(first + more))
    return items


def calib_items(seed: int = CALIB_SEED, per_slice: int = CALIB_PER_SLICE,
                exclude: Optional[Set[str]] = None) -> List[dict]:
    if exclude is None:
        exclude = {text_key(it["prompt"]) for it in base_eval_items()}
    items = []
    for s_idx, name in enumerate(SLICE_NAMES):
        rng = random.Random(seed * 1000 + s_idx)
        for i, (prompt, answer, _lang) in enumerate(_unique_items(rng, name, per_slice, exclude)):
            items.append({"id": f"calib-{name}-{i + 1:04d}", "text": render_plain(prompt, answer)})
    return items


_HELDOUT_KEYS: Optional[Set[str]] = None


def heldout_keys() -> Set[str]:
    """Normalized-text keys of the base eval prompts (:func:`base_eval_items`) and every calibration prompt: what the
    training stream skips (cached). The grown eval items are not in it; they skip the trained examples instead."""
    global _HELDOUT_KEYS
    if _HELDOUT_KEYS is None:
        ev = base_eval_items()
        keys = {text_key(it["prompt"]) for it in ev}
        cal = calib_items(exclude=set(keys))
        keys |= {text_key(prompt_from_plain(it["text"])) for it in cal}
        _HELDOUT_KEYS = keys
    return _HELDOUT_KEYS


def iter_training_examples(seed: int = DEFAULT_TRAIN_SEED) -> Iterable[dict]:
    """Infinite deterministic training stream; never yields an eval/calib prompt."""
    exclude = heldout_keys()
    rng = random.Random(seed)
    names = SLICE_NAMES
    weights = [TRAIN_WEIGHTS[n] for n in names]
    while True:
        name = rng.choices(names, weights=weights)[0]
        prompt, answer, lang = SLICES[name][0](rng)
        if text_key(prompt) in exclude:
            continue
        yield {"prompt": prompt, "answer": answer, "slice": name, "lang": lang}


def training_examples(seed: int = DEFAULT_TRAIN_SEED, n: int = 1000) -> List[dict]:
    """First ``n`` examples of the training stream for ``seed`` (dicts with
    ``prompt``, ``answer``, ``slice``, ``lang``)."""
    out = []
    for ex in iter_training_examples(seed):
        out.append(ex)
        if len(out) >= n:
            break
    return out


# --------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------
def dumps_jsonl(rows: List[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in rows)


def write_sets(out_dir: str) -> Tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    ev = eval_items()
    cal = calib_items()
    eval_path = os.path.join(out_dir, EVAL_FILENAME)
    calib_path = os.path.join(out_dir, CALIB_FILENAME)
    with open(eval_path, "w", encoding="utf-8", newline="\n") as f:
        f.write(dumps_jsonl(ev))
    with open(calib_path, "w", encoding="utf-8", newline="\n") as f:
        f.write(dumps_jsonl(cal))
    return eval_path, calib_path


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    ap.add_argument("--show-train", type=int, default=0,
                    help="also print N training examples (seed --train-seed) to stdout")
    ap.add_argument("--train-seed", type=int, default=DEFAULT_TRAIN_SEED)
    args = ap.parse_args(argv)
    eval_path, calib_path = write_sets(args.out_dir)
    print(f"wrote {eval_path}")
    print(f"wrote {calib_path}")
    if args.show_train:
        for ex in training_examples(args.train_seed, args.show_train):
            print(json.dumps(ex, ensure_ascii=False))


if __name__ == "__main__":
    main()
