"""Async client of the reward server, with retries.

Connection failures, 5xx, 503 (queue full) and 504 (timed out in the queue) are retried with exponential backoff,
``backoff_s * 2**k`` before attempt k + 1. After ``retries`` retries the client raises `RewardServerUnavailable`:
a training step must stop loudly rather than score a whole batch zero. A 4xx other than those is a request the
server will never accept (a client/server version mismatch): `RewardRequestError`, at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

RETRYABLE_STATUS = {500, 502, 503, 504}


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
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = await self._http.request(method, self.url + path, json=payload)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in RETRYABLE_STATUS:
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code >= 400:
                raise RewardRequestError(f"reward server rejected {path}: HTTP {response.status_code}: {response.text}")
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
