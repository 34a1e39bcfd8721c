"""The ASGI app of `cuca serve` (Starlette): OpenAI's completions and chat completions, streaming or not, on one
LocalModel. The model's scheduler runs the requests in arrival order on its worker thread; a handler only awaits
its request's channel, so no lock is held across an await. A client that goes away cancels its request: the worker
stops at its next token (or skips it, if it is still queued)."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine import Generation
from ..errors import CucaError
from ..local import LocalModel
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (
    MAX_BODY_BYTES,
    APIError,
    Job,
    chat_job,
    chunk,
    completion_job,
    from_cuca,
    last_chunks,
    parse_body,
    reply,
)


@dataclass(frozen=True)
class ServeConfig:
    """The served model's name (what `model` must say), the API key (None: none asked), and how many requests may
    wait behind the running ones (the model's `parallel` slots) before new ones get 429."""

    name: str
    api_key: str | None = None
    max_queue: int = 64
    aliases: tuple[str, ...] = ()  # other names accepted in `model` (the source given on the command line)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


class _Running:
    """One admitted request: its stream, a task that watches for the client going away, and the one place that
    releases the request's queue slot (close() is idempotent)."""

    def __init__(self, server: Server, stream: Any, request: Request, endpoint: str):
        self.server, self.stream, self.endpoint = server, stream, endpoint
        self.closed = self.gone = False  # gone: the client hung up before the reply was complete
        server.active += 1
        self.watch = asyncio.get_running_loop().create_task(self._watch(request))

    async def _watch(self, request: Request) -> None:
        try:
            while (await request.receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001 - a receive channel that fails means the client is gone too
            pass
        if not self.closed:  # counted as nginx's 499: the client closed the request
            self.gone = True
            self.server.metrics.requests.labels(endpoint=self.endpoint, status="499").inc()
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.stream.close()
        self.server.active -= 1
        if asyncio.current_task() is not self.watch:
            self.watch.cancel()

    async def next(self) -> str | None:
        """The next text piece, None at the end (also once the client has gone)."""
        try:
            return str(await self.stream.__anext__())
        except StopAsyncIteration:
            return None


class Server:
    """The routes' state: the model, its config, the requests admitted, the metrics."""

    def __init__(self, model: LocalModel, config: ServeConfig):
        self.model, self.config = model, config
        self.names = (config.name, *(a for a in config.aliases if a != config.name))
        self.active = 0  # admitted requests not finished: the running one and those queued behind it
        self.metrics = Metrics(lambda: float(model.scheduler.pending), self._drafting)

    def _drafting(self) -> float:
        return float(self.model.drafting)

    def _auth(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), key.encode()):
            raise APIError(401, "invalid or missing API key (send Authorization: Bearer <key>)", None,
                           "invalid_api_key")

    async def _body(self, request: Request) -> dict[str, Any]:
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is {int(size):,} bytes; the limit is {MAX_BODY_BYTES:,}")
        parts, n = [], 0
        async for part in request.stream():
            n += len(part)
            if n > MAX_BODY_BYTES:
                raise APIError(413, f"the request body exceeds {MAX_BODY_BYTES:,} bytes")
            parts.append(part)
        return parse_body(b"".join(parts))

    def _error(self, endpoint: str, e: APIError) -> JSONResponse:
        self.metrics.requests.labels(endpoint=endpoint, status=str(e.status)).inc()
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    # ---- routes ----------------------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        try:
            self._auth(request)
        except APIError as e:
            return self._error("models", e)
        data = [{"id": self.config.name, "object": "model", "created": 0, "owned_by": "cuca"}]
        return JSONResponse({"object": "list", "data": data})

    async def metrics_text(self, request: Request) -> Response:
        try:
            self._auth(request)
        except APIError as e:
            return self._error("metrics", e)
        return Response(self.metrics.text(), media_type=CONTENT_TYPE)

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, False)

    async def chat(self, request: Request) -> Response:
        return await self._serve(request, True)

    async def _serve(self, request: Request, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        t0 = time.perf_counter()
        try:
            self._auth(request)
            body = await self._body(request)
            job = (chat_job if chat else completion_job)(body, self.names, self.model.engine.n_ctx)
            slots = self.model.config.parallel
            if self.active >= slots + self.config.max_queue:
                raise APIError(429, f"the server is busy: {self.active - slots} requests are waiting (--max-queue "
                               f"{self.config.max_queue}); retry later", None, "queue_full", "server_overloaded")
            gen = Generation()
            run = _Running(self, self._stream(job, gen), request, endpoint)
        except APIError as e:
            return self._error(endpoint, e)
        except CucaError as e:
            return self._error(endpoint, from_cuca(e))
        try:
            first = await run.next()
        except CucaError as e:
            run.close()
            return self._error(endpoint, from_cuca(e))
        except BaseException:
            run.close()
            raise
        self.metrics.ttft.observe(time.perf_counter() - t0)
        if job.stream:
            return StreamingResponse(self._events(job, gen, run, first, endpoint), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            parts = [first] if first is not None else []
            while (piece := await run.next()) is not None:
                parts.append(piece)
        except CucaError as e:
            return self._error(endpoint, from_cuca(e))
        finally:
            run.close()
        if run.gone:  # nobody to answer
            return Response(status_code=499)
        self._finished(endpoint, gen)
        return JSONResponse(reply(job, "".join(parts), gen))

    def _stream(self, job: Job, gen: Generation) -> Any:
        kw = {**job.kw, "gen": gen}
        if job.chat:
            return self.model.stream_chat(job.messages or [], **kw)
        return self.model.stream(job.prompt if job.prompt is not None else "", **kw)

    def _finished(self, endpoint: str, gen: Generation) -> None:
        self.metrics.requests.labels(endpoint=endpoint, status="200").inc()
        self.metrics.finished(gen)

    async def _events(self, job: Job, gen: Generation, run: _Running, first: str | None,
                      endpoint: str) -> AsyncIterator[bytes]:
        try:
            if job.chat:
                yield _sse(chunk(job, None, role=True))
            piece = first
            while piece is not None:
                yield _sse(chunk(job, piece))
                piece = await run.next()
            if run.gone:  # the client went away: nothing more to send
                return
            for c in last_chunks(job, gen):
                yield _sse(c)
            yield b"data: [DONE]\n\n"
            self._finished(endpoint, gen)
        except CucaError as e:  # after the headers went out: the error as the stream's last event
            yield _sse(from_cuca(e).body())
        finally:
            run.close()


def create_app(model: LocalModel, config: ServeConfig) -> Starlette:
    s = Server(model, config)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        msg = exc.detail if isinstance(exc, HTTPException) else "internal error (see the server's log)"
        return JSONResponse(APIError(status, str(msg), None, None, "invalid_request_error" if status < 500 else
                                     "server_error").body(), status_code=status)

    routes = [
        Route("/health", s.health, methods=["GET"]),
        Route("/v1/models", s.models, methods=["GET"]),
        Route("/metrics", s.metrics_text, methods=["GET"]),
        Route("/v1/completions", s.completions, methods=["POST"]),
        Route("/v1/chat/completions", s.chat, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: http_error})
    app.state.server = s
    return app
