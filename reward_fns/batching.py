"""Dynamic batching of concurrent requests for one model, on an asyncio event loop.

Requests wait in a bounded queue. The worker takes the first waiting request, then gathers more until it holds
``max_batch`` or ``max_wait_s`` has passed since the first, and runs the batch function in a thread so the loop keeps
accepting requests; those arriving meanwhile form the next batch. A full queue rejects at once (`QueueFullError`),
which a server turns into 503 so clients back off instead of piling up.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any


class QueueFullError(RuntimeError):
    pass


class DynamicBatcher:
    """``await batcher.submit(item)`` returns ``fn([... item ...])[k]`` for the batch the item landed in.

    ``fn`` maps a list of items to a list of results of the same length. An exception from ``fn`` fails every request
    of that batch with it (per-item problems are ``fn``'s to report in its results).
    """

    def __init__(
        self,
        fn: Callable[[list[Any]], Sequence[Any]],
        max_batch: int = 32,
        max_wait_s: float = 0.01,
        max_queue: int = 1024,
    ):
        if max_batch < 1 or max_wait_s < 0 or max_queue < 1:
            raise ValueError(
                f"need max_batch >= 1, max_wait_s >= 0, max_queue >= 1; got {max_batch}, {max_wait_s}, {max_queue}"
            )
        self.fn, self.max_batch, self.max_wait_s, self.max_queue = fn, max_batch, max_wait_s, max_queue
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

    async def submit(self, item: Any) -> Any:
        queue = self._ensure_started()
        future = asyncio.get_running_loop().create_future()
        try:
            queue.put_nowait((item, future))
        except asyncio.QueueFull:
            raise QueueFullError(f"request queue is full ({self.max_queue} waiting); retry later") from None
        return await future

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
            live = [(item, fut) for item, fut in batch if not fut.done()]  # drop requests that timed out meanwhile
            if not live:
                continue
            self.batch_sizes[len(live)] += 1
            start = time.monotonic()
            try:
                results = await asyncio.to_thread(self.fn, [item for item, _ in live])
                if len(results) != len(live):
                    raise RuntimeError(f"batch function returned {len(results)} results for {len(live)} items")
            except Exception as exc:  # noqa: BLE001 - delivered to every waiting request
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
            else:
                for (_, fut), result in zip(live, results):
                    if not fut.done():
                        fut.set_result(result)
            finally:
                self.busy_s += time.monotonic() - start
