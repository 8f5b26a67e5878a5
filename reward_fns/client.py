"""Async client of the reward server, with retries.

Only what can succeed on a retry is retried, each request on its own, with exponential backoff (``backoff_s * 2**k``
before attempt k + 1): connection failures and timeouts, 502 (a proxy), 503 (queue full: nothing was scored) and
504 (dropped from the queue unscored). Every attempt of one request carries the same ``Idempotency-Key``, so the
server scores it at most once even when an earlier attempt's answer was lost. After ``retries`` retries the client
raises `RewardServerUnavailable`: a training step must stop loudly rather than score a whole batch zero. Any other
status (4xx: a request the server will never accept; 500: the server failed on this request) is
`RewardRequestError`, at once. A sample the server cannot score is not an error: it comes back 200 with its
``speech_reason``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

RETRYABLE_STATUS = {502, 503, 504}


class RewardServerUnavailable(RuntimeError):
    pass


class RewardRequestError(ValueError):
    pass


class RewardClient:
    """``await client.score({"solution_str": ..., "ground_truth": ..., "language": ...})`` -> reward dict.

    One client per event loop (httpx connection pools are bound to the loop that opened them).
    """

    def __init__(self, url: str, timeout_s: float = 600.0, retries: int = 3, backoff_s: float = 1.0):
        if retries < 0 or backoff_s < 0:
            raise ValueError(f"retries and backoff_s must be >= 0, got {retries}, {backoff_s}")
        self.url = url.rstrip("/")
        self.retries, self.backoff_s = retries, backoff_s
        self._http = httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(max_connections=256))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, payload: Any = None) -> Any:
        last = "no attempt made"
        headers = {"Idempotency-Key": uuid.uuid4().hex} if method == "POST" else {}
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = await self._http.request(method, self.url + path, json=payload, headers=headers)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in RETRYABLE_STATUS:
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code >= 400:
                raise RewardRequestError(
                    f"reward server rejected {path}: HTTP {response.status_code}: {response.text[:1000]}"
                )
            return response.json()
        raise RewardServerUnavailable(
            f"reward server {self.url} did not answer {path} after {self.retries + 1} attempts (last: {last}). "
            "Check that `maspo-verl reward-server` is running and reachable at that address."
        )

    async def score(self, item: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", "/score", item)

    async def score_batch(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return (await self._request("POST", "/score_batch", {"items": items}))["results"]

    async def health(self) -> dict[str, Any]:
        return await self._request("GET", "/health")
