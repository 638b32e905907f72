"""OpenAI-compatible HTTP endpoint in front of the Triton deployment (``pipeline serve --openai``).

Routes (the OpenAI API's shapes; https://platform.openai.com/docs/api-reference):

* ``GET  /v1/models``                 the one served model (its id = the package's model name);
* ``POST /v1/completions``            ``prompt`` (text or list of texts) -> ``choices[i].text``;
* ``POST /v1/chat/completions``       ``messages`` rendered **server-side** with the served package's chat template
  (passed on as the ensemble's ``messages`` input where it has one: user content stays data, docs/package.md);
* ``GET  /health``                    200, or 503 with the reason as soon as requests would get a 503.

Rule: this module is the HTTP side only: the routes, their response and Server-Sent-Event shapes (streamed answers
end with ``data: [DONE]``; every answer carries ``usage``), and the uvicorn server in a thread. What a request may
send is :mod:`pipeline.serve.openai_schema`; how it becomes ``ensemble`` requests and answers (token counts,
``finish_reason``, stop strings) is :mod:`pipeline.serve.openai_frontend`.

Binds to 127.0.0.1 unless told otherwise.  Starlette + uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError
from .limits import LimitError, body_limit, check_prompts, read_json_body
from .openai_frontend import Answer, Frontend
from .openai_schema import APIError, check_text, limited, parse_common

if TYPE_CHECKING:  # starlette is imported when the app is built (the serving extra)
    from starlette.requests import Request
    from starlette.responses import JSONResponse

DEFAULT_PORT = 9000


def build_app(fe: Frontend) -> Any:
    """The Starlette application for ``fe`` (routes: :class:`_Handlers`)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    h = _Handlers(fe)
    return Starlette(
        routes=[
            Route("/v1/models", h.models, methods=["GET"]),
            Route("/v1/completions", h.completions, methods=["POST"]),
            Route("/v1/chat/completions", h.chat, methods=["POST"]),
            Route("/health", h.health, methods=["GET"]),
        ]
    )


class _Handlers:
    """The OpenAI-compatible routes of :func:`build_app` over one :class:`Frontend`."""

    def __init__(self, fe: Frontend) -> None:
        self.fe = fe

    async def models(self, _request: Request) -> JSONResponse:
        from starlette.responses import JSONResponse

        return JSONResponse(
            {"object": "list", "data": [{"id": self.fe.model_id, "object": "model", "created": self.fe.created, "owned_by": "pipeline"}]}
        )

    async def body_of(self, request: Request, kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            body = await read_json_body(request, body_limit(self.fe.prompt_limit))
        except LimitError as e:
            raise APIError(str(e), e.param, code="request_too_large") from None
        except (ValueError, UnicodeDecodeError):
            raise APIError("the request body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object.")
        if body.get("model") != self.fe.model_id:
            raise APIError(
                f"model {body.get('model')!r} does not exist here; this endpoint serves {self.fe.model_id!r} (GET /v1/models).",
                "model",
                status=404,
                code="model_not_found",
            )
        p = parse_common(body, kind, self.fe.sampling_defaults)
        if p["stream"] and not self.fe.decoupled:
            raise APIError("stream=true needs a decoupled deployment (package.decoupled=true).", "stream")
        return body, p

    # a prompt is completion text, or chat messages (Frontend.render_chat) when the deployment renders chat itself
    async def run_choices(self, texts: Sequence[str | list[dict]], p: dict[str, Any]) -> list[Answer]:
        jobs = [asyncio.to_thread(self.fe.generate, t, p) for t in texts for _ in range(p["n"])]
        return list(await asyncio.gather(*jobs))

    def usage(self, prompts: Sequence[str | list[dict]], answers: Sequence[Answer | None]) -> dict[str, int]:
        """OpenAI ``usage``: each prompt counted once however many choices (``n``) it has, as OpenAI's API and vLLM's
        server count it; every choice's generated ids."""
        pt = sum(self.fe.prompt_tokens(t) for t in prompts)
        ct = sum(a.completion_tokens for a in answers if a is not None)
        return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}

    def _chunk(
        self, kind: str, p: dict[str, Any], rid: str, created: int, idx: int, content: str | None, reason: str | None, first: bool = False
    ) -> bytes:
        """One SSE event of a streamed answer (OpenAI's chunk shapes for completions and chat)."""
        obj = "text_completion" if kind == "completions" else "chat.completion.chunk"
        if kind == "completions":
            choice: dict[str, Any] = {"index": idx, "text": content or "", "logprobs": None, "finish_reason": reason}
        else:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if content:
                delta["content"] = content
            choice = {"index": idx, "delta": delta, "logprobs": None, "finish_reason": reason}
        ev = {"id": rid, "object": obj, "created": created, "model": self.fe.model_id, "choices": [choice]}
        if p["include_usage"]:
            ev["usage"] = None
        return f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode()

    async def stream_response(self, kind: str, texts: Sequence[str | list[dict]], p: dict[str, Any], rid: str, created: int) -> Any:
        """A streamed answer. The response starts once the first event is there: a request the deployment refuses before
        any token gets the same HTTP status and error body as unstreamed (vLLM / OpenAI), never 200 + an error event."""
        from starlette.responses import JSONResponse, StreamingResponse

        obj = "text_completion" if kind == "completions" else "chat.completion.chunk"
        n_choices = len(texts) * p["n"]
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        answers: list[Answer | None] = [None] * n_choices

        def worker(idx: int, text: str) -> None:
            def on_chunk(delta: str) -> None:
                loop.call_soon_threadsafe(q.put_nowait, ("delta", idx, delta))

            try:
                ans = self.fe.generate(text, p, on_chunk=on_chunk, cancel=cancel)
                loop.call_soon_threadsafe(q.put_nowait, ("done", idx, ans))
            except APIError as e:
                loop.call_soon_threadsafe(q.put_nowait, ("error", idx, e))

        # the references keep the tasks alive until the stream ends
        running = [asyncio.create_task(asyncio.to_thread(worker, i, texts[i // p["n"]])) for i in range(n_choices)]
        first = await q.get()
        if first[0] == "error":
            cancel.set()
            return JSONResponse(first[2].body(), status_code=first[2].status)

        async def events() -> AsyncIterator[bytes]:
            pending, _keep = [first], running
            try:
                if kind == "chat":
                    for i in range(n_choices):
                        yield self._chunk(kind, p, rid, created, i, None, None, first=True)
                done = 0
                while done < n_choices:
                    what, idx, val = pending.pop() if pending else await q.get()
                    if what == "delta":
                        yield self._chunk(kind, p, rid, created, idx, val, None)
                    elif what == "done":
                        done += 1
                        answers[idx] = val
                        yield self._chunk(kind, p, rid, created, idx, None, val.reason)
                    else:
                        cancel.set()
                        yield f"data: {json.dumps(val.body())}\n\n".encode()
                        return
                if p["include_usage"]:
                    ev: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": self.fe.model_id, "choices": []}
                    yield f"data: {json.dumps({**ev, 'usage': self.usage(texts, answers)}, ensure_ascii=False)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                cancel.set()  # a client that went away cancels its requests in Triton (LLMClient stops the stream)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(self, request: Request) -> Any:
        from starlette.responses import JSONResponse

        try:
            body, p = await self.body_of(request, "completions")
            for f in ("echo", "suffix"):
                if body.get(f):
                    raise APIError(f"{f} is not supported by this endpoint. Fix: remove it.", f)
            prompt = body.get("prompt")
            texts = [prompt] if isinstance(prompt, str) else prompt
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
                raise APIError(
                    "prompt must be a non-empty string or a list of non-empty strings (token-id prompts are not supported).", "prompt"
                )
            texts = [check_text(t, "prompt" if isinstance(prompt, str) else f"prompt[{i}]") for i, t in enumerate(texts)]
            limited(check_prompts, texts, p["n"], self.fe.prompt_limit, "prompt")  # bytes of valid text, before tokenizing
            rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
            for t in texts:  # a max_tokens over the room is a 400 before any stream starts (streamed or not)
                self.fe.budget(p, t)
            if p["stream"]:
                return await self.stream_response("completions", texts, p, rid, created)
            outs = await self.run_choices(texts, p)
            choices = [{"index": i, "text": a.text, "logprobs": None, "finish_reason": a.reason} for i, a in enumerate(outs)]
            return JSONResponse(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": self.fe.model_id,
                    "choices": choices,
                    "usage": self.usage(texts, outs),
                }
            )
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status)

    async def chat(self, request: Request) -> Any:
        from starlette.responses import JSONResponse

        try:
            body, p = await self.body_of(request, "chat")
            if body.get("tools") or body.get("functions"):
                raise APIError("tool/function calling is not supported by this deployment. Fix: remove tools/functions.", "tools")
            rf = body.get("response_format")
            if rf not in (None, {"type": "text"}):
                raise APIError(f"response_format={rf!r}: only text is supported.", "response_format")
            msgs = body.get("messages")
            limited(check_prompts, [msgs] if isinstance(msgs, list) else [], p["n"], self.fe.prompt_limit, "messages")
            text = self.fe.render_chat(msgs)
            rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
            self.fe.budget(p, text)  # a max_tokens over the room is a 400 before any stream starts
            if p["stream"]:
                return await self.stream_response("chat", [text], p, rid, created)
            outs = await self.run_choices([text], p)
            choices = [
                {"index": i, "message": {"role": "assistant", "content": a.text}, "logprobs": None, "finish_reason": a.reason}
                for i, a in enumerate(outs)
            ]
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": self.fe.model_id,
                    "choices": choices,
                    "usage": self.usage([text], outs),
                }
            )
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status)

    async def health(self, _request: Request) -> JSONResponse:
        """200 ``{"status": "ok"}``; 503 ``{"status": "unhealthy", "reason"}`` as soon as requests would get a 503
        (:meth:`Frontend.down`: the engine process died, tritonserver exited) or Triton reports the served model not
        ready."""
        from starlette.responses import JSONResponse

        why = self.fe.down() or await asyncio.to_thread(self.fe.not_ready)
        if why:
            return JSONResponse({"status": "unhealthy", "reason": why}, status_code=503)
        return JSONResponse({"status": "ok"})


class OpenAIServer:
    """uvicorn serving :func:`build_app` in a background thread (context manager).

    Args:
        grpc_url, repository, model_id: see :class:`Frontend`.
        host: bind address (default 127.0.0.1: this machine only); port: 0 = a free one.
        triton: the :class:`~pipeline.serve.server.TritonServer` behind ``grpc_url`` when this process started it: its
            ``failure()`` (a dead engine process, tritonserver gone) turns ``/health`` and every request to 503 at once.
    Attributes after :meth:`start`: ``port``, ``url`` (``http://host:port/v1``).
    Raises :class:`InputError` when the port is taken.
    """

    def __init__(
        self,
        grpc_url: str,
        repository: Path,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        model_id: str | None = None,
        triton: Any = None,
    ) -> None:
        self.grpc_url, self.repository, self.host, self.requested_port, self.model_id = (
            grpc_url,
            Path(repository),
            host,
            int(port),
            model_id,
        )
        self.port = 0
        self.triton = triton
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.frontend: Frontend | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout_s: float = 60.0) -> OpenAIServer:
        import uvicorn

        from .server import check_port_free, free_port

        if self.requested_port:
            check_port_free(self.requested_port, self.host, "package.openai_port")
        self.port = self.requested_port or free_port(self.host)
        self.frontend = Frontend(self.grpc_url, self.repository, self.model_id)
        self.frontend.watch = self.triton.failure if self.triton is not None else None
        cfg = uvicorn.Config(
            build_app(self.frontend), host=self.host, port=self.port, log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, name="openai-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise PipelineError(f"the OpenAI endpoint could not start on {self.host}:{self.port} (see the log above).")
            if time.monotonic() > deadline:
                raise PipelineError(f"the OpenAI endpoint did not start within {timeout_s:.0f} s.")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self.frontend is not None:
            self.frontend.close()

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["DEFAULT_PORT", "OpenAIServer", "build_app"]
