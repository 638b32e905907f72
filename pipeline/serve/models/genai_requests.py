"""Request handling of the CPU serving model (``onnxruntime_genai_model.py``): request tensors -> :class:`Job` s.

Copied by the package stage next to that model's ``model.py`` (``pipeline/package/repository.py``
``MODEL_HELPERS``), which imports it as a sibling module; it runs inside Triton's Python backend stub, so it imports
only numpy and its sibling ``tokenization.py`` (``pipeline/core/tokenization.py``), never the ``pipeline`` package.

What it holds: the :class:`Group` (one Triton request) and :class:`Job` (one prompt of it) records the scheduler and
the sender share; :class:`RequestParser`, which reads and validates a request's tensors (prompt ids or text,
``messages``, sampling inputs, words lists, beam search, perf metrics), refuses what the engine cannot honour with
the input's name (``ValueError``: INVALID_ARG) and checks the request limits (bytes per prompt, prompts per request,
``max_input_len``, room under ``max_seq_len``, token ids inside the vocabulary) before anything reaches the engine.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:  # only inside Triton
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - importable for unit tests of the pure helpers
    pb_utils = None

# Inputs the engine cannot honour: a request that sets them to a non-default value gets a clear error.
_UNSUPPORTED = {
    "decoder_input_ids": "encoder-decoder models",
    "embedding_bias": "embedding_bias",
    "prompt_embedding_table": "prompt tuning",
    "prompt_table_extra_ids": "prompt tuning",
    "lora_weights": "LoRA",
    "lora_config": "LoRA",
    "lora_task_id": "LoRA",
    "guided_decoding_guide": "guided decoding",
    "prompt_vocab_size": "prompt tuning",
}
# The text interface (served as ``ensemble`` and ``tensorrt_llm_bls`` on the CPU target): the ensemble's input names
# for the engine inputs they feed (TensorRT-LLM ensemble step 2 mapping); the prompt and the word lists are text.
TEXT_NAMES = {
    "request_output_len": "max_tokens",
    "streaming": "stream",
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "len_penalty": "length_penalty",
}
_UNSUPPORTED_TEXT = {
    "decoder_text_input": "encoder-decoder models",
    "embedding_bias_words": "embedding bias",
    "embedding_bias_weights": "embedding bias",
    "prompt_embedding_table": "prompt tuning",
    "prompt_table_extra_id": "prompt tuning",
    "prompt_vocab_size": "prompt tuning",
    "lora_weights": "LoRA",
    "lora_config": "LoRA",
    "lora_task_id": "LoRA",
    "guided_decoding_guide": "guided decoding",
    "num_draft_tokens": "speculative decoding",
    "use_draft_logits": "speculative decoding",
}
# FP32 inputs whose neutral value is accepted and any other value refused (og.Engine 0.18 has no such search option).
_NEUTRAL_FLOATS = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "len_penalty": 1.0}


def parse_words_list(arr: np.ndarray | None) -> list[list[int]]:
    """Token sequences from a TensorRT-LLM ``[2, L]`` words list (row 0: ids, row 1: end offsets, -1 padded)."""
    if arr is None:
        return []
    a = np.asarray(arr).reshape(2, -1) if np.asarray(arr).size else np.zeros((2, 0), np.int32)
    ids, offsets = a[0].tolist(), a[1].tolist()
    out, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end > start:
            out.append([int(t) for t in ids[start:end]])
        start = end
    return out


def encode_served(codec: Any, text: str) -> list[int]:
    """Ids of a served ``text_input``: already-rendered prompt text (the client applied the chat template, whose
    control tokens are control ids), nothing added; BOS prepended only when the tokenizer itself adds it
    (``TextCodec.adds_bos``: tokenizer post-processor, ``add_bos_token`` or a template that starts with BOS) and the
    text lacks it - never from ``config.json`` (a Qwen2-style tokenizer gets none)."""
    ids = codec.encode_rendered(text)
    if codec.adds_bos and codec.bos_id is not None and (not ids or ids[0] != codec.bos_id):
        ids = [codec.bos_id] + ids
    return ids


def policy_penalty(path: str) -> float | None:
    """The ``repetition_penalty`` of the package's decoding policy (``decoding.json``, written by the package stage
    from the export's policy, ``pipeline/core/decoding.py``); None when the file is absent or the penalty is 1.0."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        rp = float(json.load(f).get("repetition_penalty", 1.0))
    return None if rp == 1.0 else rp


@dataclass
class Group:
    """One Triton request: its response sender and how many of its prompts are still running."""

    sender: Any
    request_id: str
    size: int
    open: int
    cancelled: bool = False
    gone: bool = False  # the client cancelled or vanished (set by the sender thread's is_cancelled() polls)
    outcome: tuple[str, str] | None = None  # how it ended, when not a success (request_metrics.REASONS); first wins
    responded: bool = False  # a response of it (a token, a prompt's answer) was queued for the client
    counted: bool = False  # counted in request_metrics.REQUESTS_ENDED (once, when its FINAL flag is sent)


@dataclass
class Job:
    group: Group
    batch_index: int
    input_ids: list[int]
    max_new_tokens: int
    streaming: bool
    exclude_input: bool
    end_id: int | None
    stop_sequences: list[list[int]]
    do_sample: bool
    top_k: int
    top_p: float
    temperature: float
    repetition_penalty: float | None
    min_length: int
    seed: int | None
    perf: bool
    requested: set[str]
    arrival_ns: int = field(default_factory=time.time_ns)
    tokens: list[int] = field(default_factory=list)
    og_request: Any = None
    turn_id: int = 0
    first_token_ns: int = 0
    scheduled_ns: int = 0  # admitted to og.Engine (or its og.Generator created): first_scheduled_time_ns
    last_token_ns: int = 0  # the latest generated token (wall clock ns): last_token_time_ns
    decoder: Any = None
    done: bool = False
    beams: int = 1  # beam_width (og search option num_beams)
    n_return: int = 1  # sequences returned (num_return_sequences, <= beams)
    log_probs: bool = False  # return_log_probs
    logps: list[float] = field(default_factory=list)  # log prob of each generated token (greedy/sampled Generator path)
    steps: Any = None  # the Generator path's step iterator (None: the job runs on og.Engine)
    held_ids: list[int] = field(default_factory=list)  # streamed tokens not sent yet (stream_interval)
    held_text: str = ""
    held_logps: list[float] = field(default_factory=list)


def _flag(params: dict[str, str], name: str, default: str) -> bool:
    return params.get(name, default).lower() in ("1", "true", "yes")


def _single_string_rows(arr: np.ndarray, name: str, unit: str) -> Iterator[tuple[str, Any]]:
    """``(where, string)`` per row of a BYTES ``[N, 1]`` input ``name``; ``where`` is `` (prompt b)`` when N > 1.

    Raises:
        ValueError: a row holds more or fewer than one string (``send {unit} ([N, 1])``).
    """
    rows = np.asarray(arr).reshape(arr.shape[0], -1)
    for b, row in enumerate(rows):
        where = f" (prompt {b})" if len(rows) > 1 else ""
        if row.size != 1:
            raise ValueError(f"{name}{where} has {row.size} strings; send {unit} ([N, 1])")
        yield where, row[0]


class RequestParser:
    """A request's tensors -> its :class:`Job` s (one per prompt), or ``ValueError`` naming what is refused and why.

    ``params``: the model's ``config.pbtxt`` parameters; ``gcfg``: the engine's ``genai_config.json``;
    ``text``: the text interface (``ensemble`` / ``tensorrt_llm_bls``) rather than ``tensorrt_llm``'s ids.
    """

    def __init__(
        self,
        params: dict[str, str],
        gcfg: dict[str, Any],
        codec: Any,
        *,
        eos_ids: set[int],
        decoupled: bool,
        text: bool,
        default_repetition_penalty: float | None,
    ) -> None:
        self.codec, self.eos_ids, self.decoupled, self.text = codec, eos_ids, decoupled, text
        self.default_repetition_penalty = default_repetition_penalty
        self.vocab_size = int(gcfg.get("model", {}).get("vocab_size") or 0) or int(codec.tokenizer.get_vocab_size(with_added_tokens=True))
        # og.Engine honours TurnOptions.set_seed only when genai_config.json configures engine.dynamic_batching
        # ("A per-turn seed requires an Engine configured for dynamic batching.", onnxruntime-genai 0.18)
        self.per_turn_seed = isinstance(gcfg.get("engine"), dict) and "dynamic_batching" in gcfg["engine"]
        self.max_input_len = int(params.get("max_input_len") or 0)
        self.max_seq_len = int(params.get("max_seq_len") or gcfg.get("search", {}).get("max_length") or 0)
        self.max_beam_width = max(1, int(params.get("max_beam_width") or 1))  # package.max_beam_width
        self.default_exclude_input = _flag(params, "exclude_input_in_output", "true")
        self.skip_special = _flag(params, "skip_special_tokens", "true")
        self._init_limits(params)

    def _init_limits(self, params: dict[str, str]) -> None:
        """Request limits checked before tokenizing (tokenization.py "request limits"): bytes per prompt
        (``max_prompt_bytes`` parameter, else derived from ``max_input_len`` and the longest token) and prompt rows."""
        from tokenization import MAX_REQUEST_GENERATIONS, max_token_bytes, prompt_byte_limit

        configured = int(params.get("max_prompt_bytes") or 0) or None
        self.max_prompt_bytes = prompt_byte_limit(self.max_input_len or self.max_seq_len, max_token_bytes(self.codec.tokenizer), configured)
        self.max_rows = MAX_REQUEST_GENERATIONS

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids, skip_special_tokens=self.skip_special)

    def _check_size(self, arr: np.ndarray | None, name: str) -> None:
        """ValueError (INVALID_ARG) when ``arr`` has more rows than ``max_rows`` or a string over ``max_prompt_bytes``."""
        from tokenization import prompt_too_large

        if arr is None or not arr.size:
            return
        if arr.shape[0] > self.max_rows:
            raise ValueError(f"{name} has {arr.shape[0]} prompts, over the limit of {self.max_rows} per request; send fewer per request")
        for b, x in enumerate(np.asarray(arr).reshape(-1).tolist()):
            msg = prompt_too_large(len(x) if isinstance(x, bytes) else len(str(x).encode("utf-8")), self.max_prompt_bytes, name)
            if msg:
                raise ValueError(msg + (f" (prompt {b})" if arr.shape[0] > 1 else ""))

    @staticmethod
    def get(request: Any, name: str) -> np.ndarray | None:
        t = pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy()

    @staticmethod
    def _row(a: np.ndarray | None, b: int, n: int) -> np.ndarray | None:
        """Row ``b`` of a batched input (a [1, ...] input applies to every row)."""
        if a is None or a.size == 0:
            return None
        if a.ndim == 0:
            return a.reshape(1)
        if a.shape[0] == n:
            return a[b]
        if a.shape[0] == 1:
            return a[0]
        raise ValueError(f"has {a.shape[0]} rows but the request has {n} prompts")

    def _scalar(self, cache: dict, request: Any, name: str, b: int, n: int, default: Any) -> Any:
        if self.text:
            name = TEXT_NAMES.get(name, name)
        if name not in cache:
            cache[name] = self.get(request, name)
        try:
            r = self._row(cache[name], b, n)
        except ValueError as e:
            raise ValueError(f"input '{name}' {e}") from None
        if r is None or np.asarray(r).size == 0:
            return default
        return np.asarray(r).reshape(-1)[0].item()

    def stop_id(self, request: Any) -> str | None:
        """TensorRT-LLM's convention: a request with ``stop=true`` names, by its own request id, the running request to
        end; returns that id (None for any other request).  Without a request id it is refused (ValueError)."""
        stop = self.get(request, "stop")
        if stop is None or not stop.size or not bool(stop.reshape(-1)[0]):
            return None
        rid = request.request_id()
        if not rid:
            raise ValueError("stop=true needs the request id of the request to stop (send it as request_id)")
        return str(rid)

    def parse(self, request: Any) -> list[Job]:
        ids_arr: list[list[int]] | np.ndarray  # one row of prompt ids per prompt
        if self.text:
            self._check_size(self.get(request, "text_input"), "text_input")  # before anything is tokenized
            self._check_size(self.get(request, "messages"), "messages")
            ids_arr = self._encode_rows(self.get(request, "text_input"), self.get(request, "messages"))
        else:
            raw = self.get(request, "input_ids")
            if raw is None:
                raise ValueError("input 'input_ids' is missing")
            ids_arr = raw.reshape(1, -1) if raw.ndim == 1 else raw.reshape(raw.shape[0], -1)
        n = int(len(ids_arr))
        if n > 1 and not self.decoupled:
            raise ValueError(
                f"{n} prompts in one request need the model deployed in decoupled mode (package.decoupled=true); "
                f"send one prompt per request"
            )
        cache: dict[str, Any] = {}
        sc = lambda name, b, default: self._scalar(cache, request, name, b, n, default)  # noqa: E731
        self._refuse_unsupported(request)
        lp = self.get(request, "return_log_probs")
        log_probs = bool(lp is not None and lp.size and bool(lp.reshape(-1).any()))
        requested = set(request.requested_output_names())
        group = Group(sender=request.get_response_sender(), request_id=request.request_id(), size=n, open=n)
        jobs = []
        for b in range(n):
            where = f"prompt {b}: " if n > 1 else ""
            try:
                jobs.append(self._parse_row(request, ids_arr[b], b, sc, group, requested, log_probs))
            except ValueError as e:
                raise ValueError(f"{where}{e}") from None
        return jobs

    def _refuse_unsupported(self, request: Any) -> None:
        """ValueError for an input the engine cannot honour that the request sets (nothing is silently ignored)."""
        for name, what in (_UNSUPPORTED_TEXT if self.text else _UNSUPPORTED).items():
            a = self.get(request, name)
            if a is not None and a.size and any(bool(x) for x in a.reshape(-1).tolist()):  # zeros / empty strings = unset
                raise ValueError(f"input '{name}' ({what}) is not supported by the onnxruntime_genai engine; remove it")
        for name, neutral in _NEUTRAL_FLOATS.items():
            a = self.get(request, TEXT_NAMES.get(name, name) if self.text else name)
            if a is not None and a.size and any(float(x) != neutral for x in a.reshape(-1).tolist()):
                raise ValueError(
                    f"input '{name}'={a.reshape(-1).tolist()[0]} is not supported by the onnxruntime_genai engine "
                    f"(no such search option in onnxruntime-genai 0.18); remove it or send {neutral}"
                )
        for name in ("return_context_logits", "return_generation_logits"):
            a = self.get(request, name)
            if a is not None and a.size and bool(a.reshape(-1).any()):
                raise ValueError(
                    f"{name}=true is not supported by the onnxruntime_genai engine (og.Engine 0.18 exposes no "
                    f"logits or log probs); remove it"
                )

    def _encode(self, text: str) -> list[int]:
        """Prompt text -> ids, the preprocessing model's rule (:func:`encode_served`)."""
        return encode_served(self.codec, text)

    def _encode_messages(self, arr: np.ndarray, text: np.ndarray | None) -> list[list[int]]:
        """Rows of the optional ``messages`` input (BYTES [N, 1], each a JSON list of ``{"role", "content"}``): rendered
        with this package's chat template by ``TextCodec.encode_prompt`` (message contents are data: a special-token
        string inside a content never becomes a control id; BOS only where the template puts it), exactly the ids the
        evaluate stage fed the engine.  ``text_input`` must then be empty (it stays a required tensor of the
        TensorRT-LLM interface): sending both is refused, never resolved silently."""
        if text is not None and any(
            (x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)) for x in np.asarray(text).reshape(-1).tolist()
        ):
            raise ValueError(
                "both text_input and messages are set; send the conversation as messages with an empty text_input, "
                "or the rendered prompt as text_input without messages"
            )
        out = []
        for where, x in _single_string_rows(arr, "messages", "one JSON list per row"):
            try:
                msgs = json.loads(x.decode("utf-8") if isinstance(x, bytes) else str(x))
            except (UnicodeDecodeError, ValueError) as e:
                raise ValueError(f"messages{where} is not a UTF-8 JSON list of {{role, content}} objects ({e})") from None
            if (
                not isinstance(msgs, list)
                or not msgs
                or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs)
            ):
                raise ValueError(f'messages{where} must be a non-empty JSON list of {{"role": str, "content": str}} objects')
            try:
                out.append(self.codec.encode_prompt(messages=msgs))
            except Exception as e:  # the template refused the conversation, or a content cannot be kept as data
                raise ValueError(f"messages{where}: {e}") from None
        return out

    def _encode_rows(self, arr: np.ndarray | None, messages: np.ndarray | None = None) -> list[list[int]]:
        if messages is not None and messages.size:
            return self._encode_messages(messages, arr)
        if arr is None or arr.size == 0:
            raise ValueError("text_input is empty; send a non-empty prompt")
        out = []
        for where, x in _single_string_rows(arr, "text_input", "one prompt per row"):
            try:
                text = x.decode("utf-8") if isinstance(x, bytes) else str(x)
            except UnicodeDecodeError:
                raise ValueError(f"text_input{where} is not valid UTF-8") from None
            if not text:
                raise ValueError(f"text_input is empty{where}; send a non-empty prompt")
            out.append(self._encode(text))
        return out

    def _parse_row(self, request: Any, row_ids: Any, b: int, sc: Any, group: Group, requested: set[str], log_probs: bool = False) -> Job:
        ids, max_new = self._prompt_and_budget(row_ids, b, sc)
        streaming = bool(sc("streaming", b, False))
        if streaming and not self.decoupled:
            raise ValueError("streaming is only supported when the model is deployed in decoupled mode (package.decoupled=true)")
        beam, n_return = self._beams(b, sc)
        top_k = int(sc("runtime_top_k", b, 0))
        top_p = float(sc("runtime_top_p", b, 0.0))
        temperature = float(sc("temperature", b, 1.0))
        if top_k < 0 or not 0.0 <= top_p <= 1.0 or temperature < 0:
            raise ValueError(f"invalid sampling values top_k={top_k} top_p={top_p} temperature={temperature}")
        # top_k == 1 keeps only the top token: greedy (TensorRT-LLM's convention; og.Engine 0.18 refuses temperature /
        # top_p next to top_k=1, so a model recommending top_k=1 would otherwise fail every default request)
        do_sample = top_k != 1 and (top_k > 1 or top_p > 0.0) and temperature > 0.0
        rp = sc("repetition_penalty", b, None)
        if rp is None:
            rp = self.default_repetition_penalty  # the model's policy (decoding.json), as evaluate applied it
        if rp is not None and not float(rp) > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {rp}")
        end_id = sc("end_id", b, None)
        exclude = sc("exclude_input_in_output", b, None)
        seed = sc("random_seed", b, None)
        if seed is not None and do_sample and not self.per_turn_seed:
            raise ValueError(
                f"random_seed={seed} with sampling cannot be honoured: this engine was built without onnxruntime-genai's "
                f"engine.dynamic_batching, and og.Engine applies per-request seeds only there; remove random_seed "
                f"(or decode greedily, which is deterministic)"
            )
        if self._words_row(request, "bad_words_list", b):
            raise ValueError("bad_words is not supported by the onnxruntime_genai engine; send an empty bad_words list")
        if beam > 1:
            self._check_beam_search(request, b, sc, beam, streaming, do_sample, end_id)
        job = Job(
            group=group,
            batch_index=b,
            input_ids=ids,
            max_new_tokens=max_new,
            streaming=streaming,
            exclude_input=self.default_exclude_input if exclude is None else bool(exclude),
            end_id=None if end_id is None or int(end_id) < 0 else int(end_id),
            stop_sequences=self._words_row(request, "stop_words_list", b),
            do_sample=do_sample,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            repetition_penalty=None if rp is None else float(rp),
            min_length=int(sc("min_length", b, 0)),
            seed=None if seed is None else int(seed),
            perf=bool(sc("return_perf_metrics", b, False)),
            requested=requested,
            beams=beam,
            n_return=n_return,
            log_probs=log_probs,
        )
        if streaming and (self.text or "text_output" in requested):
            job.decoder = self.codec.stream_decoder(skip_special_tokens=self.skip_special)
        return job

    def _beams(self, b: int, sc: Any) -> tuple[int, int]:
        """Row ``b``'s ``beam_width`` and the sequences it returns (``num_return_sequences``); ValueError outside range."""
        beam = int(sc("beam_width", b, 1))
        if not 1 <= beam <= self.max_beam_width:
            raise ValueError(
                f"beam_width={beam} is outside this deployment's range 1..{self.max_beam_width} "
                f"(package.max_beam_width); send a beam_width in that range or repackage with a larger "
                f"package.max_beam_width"
            )
        nrs = sc("num_return_sequences", b, None)
        n_return = beam if nrs is None or int(nrs) == 0 else int(nrs)
        if not 1 <= n_return <= beam:
            raise ValueError(
                f"num_return_sequences={nrs} with beam_width={beam}: the onnxruntime_genai engine returns 1.."
                f"beam_width beams of one beam search (several sampled sequences per request are not supported); "
                f"send num_return_sequences <= beam_width, or one request per sampled sequence"
            )
        return beam, n_return

    def _prompt_and_budget(self, row_ids: Any, b: int, sc: Any) -> tuple[list[int], int]:
        """Row ``b``'s prompt ids (cut to ``input_lengths``) and its output budget (``request_output_len`` capped by the
        room under ``max_seq_len``). Raises ValueError for an empty or out-of-vocabulary prompt, a prompt over
        ``max_input_len`` (never truncated), a budget < 1 or no room left."""
        ids = [int(t) for t in (row_ids if isinstance(row_ids, list) else row_ids.tolist())]
        n_in = len(ids) if self.text else int(sc("input_lengths", b, len(ids)))
        if not 0 <= n_in <= len(ids):
            raise ValueError(f"input_lengths={n_in} but input_ids has {len(ids)} ids")
        ids = ids[:n_in]
        if not ids:
            raise ValueError("the prompt is empty (0 tokens); send a non-empty text_input")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"input_ids contains token id {bad[0]} outside the vocabulary [0, {self.vocab_size}); "
                f"send ids produced by this model's tokenizer"
            )
        if self.max_input_len and len(ids) > self.max_input_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens, more than the engine's max_input_len {self.max_input_len}; "
                f"shorten the prompt (the server never truncates)"
            )
        max_new = int(sc("request_output_len", b, 0))
        if max_new < 1:
            raise ValueError(f"max_tokens (request_output_len) must be >= 1, got {max_new}")
        if self.max_seq_len:
            room = self.max_seq_len - len(ids)
            if room < 1:
                raise ValueError(f"prompt ({len(ids)} tokens) leaves no room under the engine's max_seq_len {self.max_seq_len}")
            max_new = min(max_new, room)
        return ids, max_new

    def _check_beam_search(self, request: Any, b: int, sc: Any, beam: int, streaming: bool, do_sample: bool, end_id: Any) -> None:
        """og beam search (Generator, num_beams) runs to its own end; what it cannot honour is refused (ValueError)."""
        for refused, why in (
            (streaming, "streaming"),
            (do_sample, "sampling (top_k > 1 / top_p > 0)"),
            (self._words_row(request, "stop_words_list", b), "stop words"),
            (end_id is not None and int(end_id) >= 0 and int(end_id) not in self.eos_ids, f"end_id={end_id}"),
            (int(sc("min_length", b, 0)) > 0, "min_length"),
        ):
            if refused:
                raise ValueError(
                    f"beam_width={beam} with {why} is not supported by the onnxruntime_genai engine "
                    f"(og.Generator beam search 0.18); send beam_width=1 or remove {why.split(' ')[0]}"
                )

    def _words_row(self, request: Any, name: str, b: int) -> list[list[int]]:
        """Token sequences of row ``b`` of a words-list input ([N, 2, L]; a [1, 2, L] list applies to every row).

        Text interface: ``stop_words``/``bad_words`` BYTES [N, k], each word encoded without special tokens.
        """
        if self.text:
            a = self.get(request, name.replace("_list", ""))
            if a is None or a.size == 0:
                return []
            a = np.asarray(a).reshape(a.shape[0], -1)
            row = a[b] if a.shape[0] > b else a[0]
            words = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in row.tolist()]
            return [ids for ids in (self.codec.encode_text(w) for w in words if w) if ids]
        a = self.get(request, name)
        if a is None or a.size == 0:
            return []
        a = np.asarray(a)
        if a.ndim == 3:
            a = a[b] if a.shape[0] > b else a[0]
        return parse_words_list(a)
