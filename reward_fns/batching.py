"""Dynamic batching of concurrent requests for one model, on an asyncio event loop.

Requests wait in a bounded queue. The worker takes the first waiting request, then gathers more until it holds
``max_batch`` or ``max_wait_s`` has passed since the first, and runs the batch function in a thread so the loop keeps
accepting requests; those arriving meanwhile form the next batch.

A full queue either rejects at once (`QueueFullError`, ``block=False``: a server turns it into 503 so clients back
off) or makes the caller wait for room (``block=True``: back-pressure, for in-process callers that cannot retry).
`submit_many` queues all its items or none. A request whose ``queue_timeout_s`` passes while it still waits is dropped
before any work starts (`QueueTimeoutError`); one already in a running batch is finished and answered, so a request
is never scored twice because its caller gave up and retried. If the batch function raises on a batch, its items
are run again one by one, so an exception reaches only the item that raises alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any


class QueueFullError(RuntimeError):
    pass


class QueueTimeoutError(TimeoutError):
    """The request waited ``queue_timeout_s`` in the queue and was dropped unscored."""


class _Entry:
    __slots__ = ("item", "future", "started")

    def __init__(self, item: Any, future: asyncio.Future):
        self.item, self.future, self.started = item, future, False


class DynamicBatcher:
    """``await batcher.submit(item)`` returns ``fn([... item ...])[k]`` for the batch the item landed in.

    ``fn`` maps a list of items to a list of results of the same length (per-item problems are ``fn``'s to report
    in its results). If it raises on a batch of several, each item is run alone and only those that raise alone get
    the exception.
    """

    def __init__(
        self,
        fn: Callable[[list[Any]], Sequence[Any]],
        max_batch: int = 32,
        max_wait_s: float = 0.01,
        max_queue: int = 1024,
        block: bool = False,
    ):
        if max_batch < 1 or max_wait_s < 0 or max_queue < 1:
            raise ValueError(
                f"need max_batch >= 1, max_wait_s >= 0, max_queue >= 1; got {max_batch}, {max_wait_s}, {max_queue}"
            )
        self.fn, self.max_batch, self.max_wait_s, self.max_queue = fn, max_batch, max_wait_s, max_queue
        self.block = block
        self.dropped = 0  # requests that timed out in the queue, never scored
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self.batch_sizes: Counter[int] = Counter()
        self.busy_s = 0.0

    def _ensure_started(self) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._queue = asyncio.Queue(maxsize=self.max_queue)
            self._worker = loop.create_task(self._run())
        return self._queue  # type: ignore[return-value]

    @property
    def queue_size(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def stats(self) -> dict[str, Any]:
        n = sum(self.batch_sizes.values())
        items = sum(size * count for size, count in self.batch_sizes.items())
        return {
            "batches": n,
            "items": items,
            "mean_batch": items / n if n else 0.0,
            "max_batch_seen": max(self.batch_sizes, default=0),
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "queue_size": self.queue_size,
            "busy_s": self.busy_s,
        }

    async def submit(self, item: Any, queue_timeout_s: float | None = None) -> Any:
        """The result for ``item``; see the module docstring for full queues and ``queue_timeout_s``."""
        queue = self._ensure_started()
        entry = _Entry(item, asyncio.get_running_loop().create_future())
        if self.block:
            await queue.put(entry)
        else:
            self._put_all(queue, [entry])
        return await self._result(entry, queue_timeout_s)

    async def submit_many(self, items: list[Any], queue_timeout_s: float | None = None) -> list[Any]:
        """Results for ``items``: all of them are queued at once, or (queue without room) none and `QueueFullError`."""
        queue = self._ensure_started()
        loop = asyncio.get_running_loop()
        entries = [_Entry(item, loop.create_future()) for item in items]
        if self.block:
            for entry in entries:
                await queue.put(entry)
        else:
            self._put_all(queue, entries)
        return list(await asyncio.gather(*(self._result(e, queue_timeout_s) for e in entries)))

    def _put_all(self, queue: asyncio.Queue, entries: list[_Entry]) -> None:
        room = self.max_queue - queue.qsize()
        if len(entries) > room:
            raise QueueFullError(
                f"request queue is full ({queue.qsize()} of max_queue={self.max_queue} waiting, {len(entries)} "
                "more asked); retry later"
            )
        for entry in entries:
            queue.put_nowait(entry)

    async def _result(self, entry: _Entry, queue_timeout_s: float | None) -> Any:
        if queue_timeout_s is None:
            return await entry.future
        try:
            return await asyncio.wait_for(asyncio.shield(entry.future), queue_timeout_s)
        except asyncio.CancelledError:
            if not entry.started:
                entry.future.cancel()
            raise
        except asyncio.TimeoutError:
            if entry.started:  # being scored: finish it rather than have a retry score it again
                return await entry.future
            entry.future.cancel()  # the worker skips it: never scored
            self.dropped += 1
            raise QueueTimeoutError(
                f"request waited longer than queue_timeout_s={queue_timeout_s} in the queue; dropped unscored"
            ) from None

    async def _run(self) -> None:
        queue = self._queue
        assert queue is not None
        while True:
            batch = [await queue.get()]
            deadline = time.monotonic() + self.max_wait_s
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    while len(batch) < self.max_batch and not queue.empty():
                        batch.append(queue.get_nowait())
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except asyncio.TimeoutError:
                    break
            live = [entry for entry in batch if not entry.future.done()]  # drop requests that timed out meanwhile
            if not live:
                continue
            for entry in live:
                entry.started = True
            self.batch_sizes[len(live)] += 1
            start = time.monotonic()
            try:
                outcomes = await asyncio.to_thread(self._run_batch, [entry.item for entry in live])
            finally:
                self.busy_s += time.monotonic() - start
            for entry, (ok, value) in zip(live, outcomes):
                if entry.future.done():
                    continue
                if ok:
                    entry.future.set_result(value)
                else:
                    entry.future.set_exception(value)

    def _run_batch(self, items: list[Any]) -> list[tuple[bool, Any]]:
        return run_isolated(self.fn, items)


def run_isolated(fn: Callable[[list[Any]], Sequence[Any]], items: list[Any]) -> list[tuple[bool, Any]]:
    """``(True, result)`` or ``(False, exception)`` per item of ``fn(items)``; a failing batch is retried item by
    item, so an exception reaches only the items that raise alone."""
    try:
        results = fn(items)
        if len(results) != len(items):
            raise RuntimeError(f"batch function returned {len(results)} results for {len(items)} items")
        return [(True, r) for r in results]
    except Exception as exc:  # noqa: BLE001 - delivered to the items that fail alone
        if len(items) == 1:
            return [(False, exc)]
    return [run_isolated(fn, [item])[0] for item in items]
