"""``maspo-verl reward-server``: the speech reward over HTTP, with concurrent requests batched dynamically.

Endpoints (JSON):

- ``POST /score``: one `ScoreItem` -> the reward dict (``score`` + ``speech_*`` components).
- ``POST /score_batch``: ``{"items": [ScoreItem, ...]}`` -> ``{"results": [...]}``; items join the same dynamic batches.
- ``GET /health``: ``{"status": "ok", "languages": [...], "queue_size": ..., ...}``.
- ``GET /stats``: batch-size histogram, items scored, busy time.

Status codes: 422 for a malformed request (the message names the field), 503 when the queue is full, 504 when a
request waited longer than ``--request-timeout-s``, 500 when a whole batch failed. A problem with one response
(truncated, no speech, ASR failure on it) is not an error: it is scored and its ``speech_reason`` says why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from .batching import DynamicBatcher, QueueFullError

logger = logging.getLogger(__name__)


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


def create_app(
    reward,
    max_batch: int = 32,
    max_wait_s: float = 0.02,
    max_queue: int = 1024,
    request_timeout_s: float = 300.0,
):
    """The FastAPI app around ``reward`` (an object with ``score_batch(list[dict]) -> list[dict]``)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    batcher = DynamicBatcher(reward.score_batch, max_batch=max_batch, max_wait_s=max_wait_s, max_queue=max_queue)
    app = FastAPI(title="maspo-verl speech reward")
    app.state.batcher = batcher

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

    async def score_one(item: ScoreItem) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(batcher.submit(item.model_dump()), request_timeout_s)
        except QueueFullError as exc:
            raise HTTPError(503, str(exc)) from None
        except asyncio.TimeoutError:
            raise HTTPError(504, f"request not scored within request_timeout_s={request_timeout_s}") from None
        except Exception as exc:  # noqa: BLE001 - the whole batch failed
            logger.exception("batch failed")
            raise HTTPError(500, f"scoring failed: {type(exc).__name__}: {exc}") from None

    @app.post("/score")
    async def score(item: ScoreItem) -> dict[str, Any]:
        return await score_one(item)

    @app.post("/score_batch")
    async def score_batch(batch: ScoreBatch) -> dict[str, Any]:
        return {"results": list(await asyncio.gather(*(score_one(item) for item in batch.items)))}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "languages": sorted(getattr(reward, "asr", {})),
            "default_language": getattr(reward, "default_language", None),
            "queue_size": batcher.queue_size,
            "max_queue": max_queue,
            "max_batch": max_batch,
        }

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return batcher.stats()

    return app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="maspo-verl reward-server", description=__doc__.split("\n\n")[0])
    p.add_argument("--codec", required=True, help="XCodec2 checkpoint dir (config.json + model.safetensors) or hub id")
    p.add_argument(
        "--asr",
        action="append",
        required=True,
        metavar="LANG=BACKEND[:MODEL]",
        help="ASR per language, repeatable: zh=paraformer:paraformer-zh, en=faster_whisper:large-v3 (dir or name)",
    )
    p.add_argument("--default-language", default="en", help="language of requests that carry none (default: en)")
    p.add_argument("--speaker", default=None, help="speaker-similarity backend (e.g. resemblyzer); off by default")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="codec decoder compute dtype")
    p.add_argument("--reward-config", default="{}", help="JSON of RewardConfig fields, e.g. '{\"w_duration\": 0.2}'")
    p.add_argument("--max-codes", type=int, default=None, help="gate responses longer than this many speech tokens")
    p.add_argument("--codec-max-batch", type=int, default=16, help="sequences per codec forward pass")
    p.add_argument(
        "--codec-pad-multiple",
        type=int,
        default=1,
        help="decode lengths rounded up to this many tokens together (1: exact lengths only; 50: whole seconds, "
        "larger batches, slightly different audio)",
    )
    p.add_argument(
        "--asr-batch-size",
        type=int,
        default=None,
        help="waveforms per ASR call (default: paraformer/sensevoice 1, whose output depends on batch make-up; "
        "faster_whisper 16)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--max-batch", type=int, default=32, help="most requests scored in one batch")
    p.add_argument("--max-wait-ms", type=float, default=20.0, help="longest wait for a batch to fill")
    p.add_argument("--max-queue", type=int, default=1024, help="waiting requests beyond this get 503")
    p.add_argument("--request-timeout-s", type=float, default=300.0, help="a request waiting longer gets 504")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--log-level", default="info")
    return p


def _build_reward(args: argparse.Namespace, reward_config: dict):
    from .pipeline import SpeechReward

    return SpeechReward.from_spec(
        codec=args.codec,
        asr=";".join(args.asr),
        device=args.device,
        dtype=args.dtype,
        default_language=args.default_language,
        reward_config=reward_config,
        speaker=args.speaker,
        max_codes=args.max_codes,
        codec_max_batch=args.codec_max_batch,
        num_threads=args.threads,
        asr_batch_size=args.asr_batch_size,
        codec_pad_multiple=args.codec_pad_multiple,
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        reward_config = json.loads(args.reward_config)
    except json.JSONDecodeError as exc:
        print(f"reward-server: --reward-config is not JSON ({exc}): {args.reward_config!r}", file=sys.stderr)
        return 2
    import uvicorn

    try:
        reward = _build_reward(args, reward_config)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"reward-server: {exc}", file=sys.stderr)
        return 2
    app = create_app(
        reward,
        max_batch=args.max_batch,
        max_wait_s=args.max_wait_ms / 1000,
        max_queue=args.max_queue,
        request_timeout_s=args.request_timeout_s,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
