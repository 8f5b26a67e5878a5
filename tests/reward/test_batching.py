"""DynamicBatcher and the server app's 503/504 paths, with a scorer that takes a known time per batch."""

import asyncio
import threading
import time

import httpx
import pytest

from reward_fns.batching import DynamicBatcher, QueueFullError
from reward_fns.server import create_app


class SlowScorer:
    """Scores ``len(ground_truth)`` after ``delay_s`` per batch; records the batches it saw."""

    def __init__(self, delay_s: float):
        self.delay_s, self.batches, self.lock = delay_s, [], threading.Lock()

    def score_batch(self, items):
        time.sleep(self.delay_s)
        with self.lock:
            self.batches.append(len(items))
        return [{"score": float(len(item["ground_truth"]))} for item in items]


def test_concurrent_submissions_form_batches_and_get_their_own_results():
    async def run():
        batcher = DynamicBatcher(lambda xs: [x * 10 for x in xs], max_batch=8, max_wait_s=0.05)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(20)))
        return results, batcher.stats()

    results, stats = asyncio.run(run())
    assert results == [i * 10 for i in range(20)]
    assert stats["items"] == 20 and stats["max_batch_seen"] == 8 and stats["batches"] == 3


def test_a_failing_batch_fails_its_requests_only():
    def fn(xs):
        if 3 in xs:
            raise RuntimeError("boom")
        return xs

    async def run():
        batcher = DynamicBatcher(fn, max_batch=1, max_wait_s=0)
        return await asyncio.gather(*(batcher.submit(i) for i in range(5)), return_exceptions=True)

    out = asyncio.run(run())
    assert out[:3] == [0, 1, 2] and out[4] == 4 and isinstance(out[3], RuntimeError)


def test_bounded_queue_rejects_when_full():
    async def run():
        batcher = DynamicBatcher(lambda xs: (time.sleep(0.3), xs)[1], max_batch=1, max_wait_s=0, max_queue=2)
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.sleep(0.05)  # the worker holds item 0; the queue takes 2 more
        waiting = [asyncio.ensure_future(batcher.submit(i)) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError, match="queue is full"):
            await batcher.submit(3)
        return await asyncio.gather(first, *waiting)

    assert asyncio.run(run()) == [0, 1, 2]


def test_server_app_answers_503_when_full_and_504_after_the_request_timeout():
    async def run():
        scorer = SlowScorer(delay_s=0.4)
        app = create_app(scorer, max_batch=1, max_wait_s=0, max_queue=1, request_timeout_s=0.6)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            item = {"solution_str": "<|s_1|>", "ground_truth": "abc"}
            first = asyncio.ensure_future(client.post("/score", json=item))
            await asyncio.sleep(0.1)  # the worker is scoring the first request
            second = asyncio.ensure_future(client.post("/score", json=item))  # waits in the queue of 1
            await asyncio.sleep(0.05)
            third = await client.post("/score", json=item)  # queue full
            responses = [await first, await second, third]
            await asyncio.sleep(0.5)  # let the queued batch drain
            again = await client.post("/score", json=item)
            health = (await client.get("/health")).json()
        return responses, again, health

    (first, second, third), again, health = asyncio.run(run())
    # first: 0.4 s < 0.6 s; second: queued behind it, done at ~0.8 s > 0.6 s; third: rejected at once
    assert [first.status_code, second.status_code, third.status_code] == [200, 504, 503]
    assert first.json() == {"score": 3.0}
    assert "request_timeout_s=0.6" in second.json()["detail"] and "queue is full" in third.json()["detail"]
    assert again.status_code == 200 and health["status"] == "ok" and health["max_queue"] == 1


def test_a_batcher_serves_successive_event_loops():
    batcher = DynamicBatcher(lambda xs: [x + 1 for x in xs], max_batch=4, max_wait_s=0.01)

    async def run(values):
        return await asyncio.wait_for(asyncio.gather(*(batcher.submit(v) for v in values)), 5)

    assert asyncio.run(run([1, 2])) == [2, 3]
    assert asyncio.run(run([5])) == [6]  # a new loop: the worker of the closed one is replaced, no hang
