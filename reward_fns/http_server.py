"""``maspo-verl reward-server``: the speech reward over HTTP, with concurrent requests batched dynamically.

Endpoints (JSON):

- ``POST /score``: one `ScoreItem` -> the reward dict (``score`` + ``speech_*`` components).
- ``POST /score_batch``: ``{"items": [ScoreItem, ...]}`` -> ``{"results": [...]}``; items join the same dynamic batches.
- ``GET /health``: ``{"status": "ok", "languages": [...], "queue_size": ..., ...}``.
- ``GET /stats``: batch-size histogram, items scored, busy time, requests dropped after a timeout.

Status codes: 200 for every response that could be read, also a response that cannot be scored (its ``speech_reason``
says why: gate, ``invalid_request``, ``decode_error``, ...); 422 for a malformed request (the message names the field);
413 for a body over ``--max-body-mb`` or a ``/score_batch`` with more items than ``--max-queue``; 503 when the queue
has no room (nothing of the request was scored); 504 when a request waited in the queue longer than
``--request-timeout-s`` (it was dropped unscored). A request that carries an ``Idempotency-Key`` header is scored at
most once per key: a retry of it joins the work in flight or gets the stored result.

Every flag comes from `reward_fns.reward_settings` (`ModelSettings`, `BatchSettings`, `ServerSettings`).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, model_validator

from maspo_base.typed_settings import SettingsError, add_arguments, parse_arguments
from reward_fns.batching import DynamicBatcher, QueueFullError, QueueTimeoutError
from reward_fns.reward_settings import (
    SERVER_SETTINGS,
    ModelSettings,
    ServerSettings,
)

logger = logging.getLogger(__name__)

IDEMPOTENCY_HEADER = "idempotency-key"


class ScoreItem(BaseModel):
    """One response to score: ``solution_str`` (veRL's decoded response) or ``token_ids``, and the target text."""

    model_config = ConfigDict(extra="forbid")

    ground_truth: str
    solution_str: str | None = None
    token_ids: list[int] | None = None
    language: str | None = None
    prompt_codes: list[int] | None = None
    prompt_audio: list[float] | None = None

    @model_validator(mode="after")
    def _one_response(self) -> ScoreItem:
        if (self.solution_str is None) == (self.token_ids is None):
            raise ValueError("give exactly one of 'solution_str' (decoded response) or 'token_ids'")
        return self


class ScoreBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[ScoreItem]


class BodyLimit:
    """ASGI middleware: a request body over ``max_body_mb`` MiB gets 413 before the app reads any of it."""

    def __init__(self, app, max_body_mb: float):
        self.app, self.max_body_mb, self.max_bytes = app, max_body_mb, int(max_body_mb * 2**20)

    async def _reject(self, send) -> None:
        body = f'{{"detail": "request body over max_body_mb={self.max_body_mb:g} MiB (--max-body-mb)"}}'.encode()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(send)
        chunks, size, more = [], 0, True
        while more:  # read (bounded) and replay, so chunked bodies are limited too
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, receive, send)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._reject(send)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


class OncePerKey:
    """Work keyed by an idempotency key runs once: a repeat joins it in flight or gets its stored result.

    Failed work (503, 504: nothing was scored) is not stored, so a retry runs it afresh."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.inflight: dict[str, asyncio.Future] = {}
        self.done: OrderedDict[str, Any] = OrderedDict()

    async def run(self, key: str | None, work: Callable[[], Awaitable[Any]]) -> Any:
        if key is None:
            return await work()
        if key in self.done:
            return self.done[key]
        task = self.inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(work())
            self.inflight[key] = task
            task.add_done_callback(lambda t: self._settle(key, t))
        return await asyncio.shield(task)  # a dropped connection does not cancel the work: the retry collects it

    def _settle(self, key: str, task: asyncio.Future) -> None:
        self.inflight.pop(key, None)
        if not task.cancelled() and task.exception() is None:
            self.done[key] = task.result()
            while len(self.done) > self.capacity:
                self.done.popitem(last=False)


def create_app(
    reward,
    max_batch: int = 32,
    max_wait_s: float = 0.02,
    max_queue: int = 1024,
    request_timeout_s: float = 300.0,
    max_body_mb: float = ServerSettings.max_body_mb,
):
    """The ASGI app around ``reward`` (an object with ``score_batch(list[dict]) -> list[dict]``)."""
    batcher = DynamicBatcher(reward.score_batch, max_batch=max_batch, max_wait_s=max_wait_s, max_queue=max_queue)

    async def score_many(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return await batcher.submit_many(items, queue_timeout_s=request_timeout_s)
        except QueueTimeoutError:
            raise QueueTimeoutError(
                f"request waited longer than request_timeout_s={request_timeout_s} and was dropped unscored"
            ) from None

    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "languages": sorted(getattr(reward, "asr", {})),
            "default_language": getattr(reward, "default_language", None),
            "queue_size": batcher.queue_size,
            "max_queue": max_queue,
            "max_batch": max_batch,
            "max_codes": getattr(getattr(reward, "gate", None), "max_codes", None),
            "max_body_mb": max_body_mb,
        }

    app = http_app(score_many, health, lambda: {**batcher.stats(), "dropped": batcher.dropped}, max_queue, max_body_mb)
    app.app.state.batcher = batcher
    return app


def http_app(
    score_many: Callable[[list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]],
    health: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
    stats: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
    max_queue: int,
    max_body_mb: float,
) -> BodyLimit:
    """The HTTP contract of the module docstring around ``score_many`` (an async scorer of request dicts that raises
    `QueueFullError` for 503 and `QueueTimeoutError` for 504): this server's, and the Ray Serve ingress's
    (`reward_fns.ray_serve`)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    once = OncePerKey(capacity=4 * max_queue)
    app = FastAPI(title="maspo-verl speech reward")

    class HTTPError(Exception):
        def __init__(self, status: int, detail: str):
            self.status, self.detail = status, detail

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'] if p != 'body') or 'body'}: {err['msg']}" for err in exc.errors()
        )
        return JSONResponse(status_code=422, content={"detail": f"invalid request: {problems}"})

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        return JSONResponse(status_code=exc.status, content={"detail": exc.detail})

    async def scored(items: list[ScoreItem]) -> list[dict[str, Any]]:
        try:
            return await score_many([item.model_dump() for item in items])
        except QueueFullError as exc:
            raise HTTPError(503, str(exc)) from None
        except QueueTimeoutError as exc:
            raise HTTPError(504, str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the scorer raised on an item alone (a bug): name it
            logger.exception("scoring failed")
            raise HTTPError(500, f"scoring failed: {type(exc).__name__}: {exc}") from None

    @app.post("/score")
    async def score(item: ScoreItem, request: Request) -> dict[str, Any]:
        key = request.headers.get(IDEMPOTENCY_HEADER)
        return (await once.run(key and f"score:{key}", lambda: scored([item])))[0]

    @app.post("/score_batch")
    async def score_batch(batch: ScoreBatch, request: Request) -> dict[str, Any]:
        if len(batch.items) > max_queue:
            raise HTTPError(
                413, f"items: {len(batch.items)} items > max_queue={max_queue} (--max-queue); send smaller batches"
            )
        key = request.headers.get(IDEMPOTENCY_HEADER)
        return {"results": await once.run(key and f"batch:{key}", lambda: scored(batch.items))}

    @app.get("/health")
    async def _health() -> dict[str, Any]:
        return await _value(health())

    @app.get("/stats")
    async def _stats() -> dict[str, Any]:
        return await _value(stats())

    return BodyLimit(app, max_body_mb)


async def _value(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="maspo-verl reward-server", description=__doc__.split("\n\n")[0])
    for cls in SERVER_SETTINGS:
        add_arguments(p, cls, required=("codec", "asr") if cls is ModelSettings else ())
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        model, batch, server = (parse_arguments(args, cls, "reward-server") for cls in SERVER_SETTINGS)
    except SettingsError as exc:
        print(f"reward-server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from reward_fns.pipeline import SpeechReward

    try:
        reward = SpeechReward.from_settings(model)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"reward-server: {exc}", file=sys.stderr)
        return 2
    app = create_app(
        reward,
        max_batch=batch.max_batch,
        max_wait_s=batch.max_wait_ms / 1000,
        max_queue=batch.max_queue,
        request_timeout_s=server.request_timeout_s,
        max_body_mb=server.max_body_mb,
    )
    uvicorn.run(app, host=server.host, port=server.port, log_level=server.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
