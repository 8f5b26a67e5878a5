"""DynamicBatcher and the server app's 503/504 paths, with a scorer that scores when the test lets it.

No outcome here depends on how fast the machine is: a batch is held by a gate until the test releases it, and a
request's timeout passes when the test moves the event loop's clock (`ManualClockLoop`), not with the wall clock.
"""

import asyncio
import threading

import httpx
import pytest

from reward_fns.batching import DynamicBatcher, QueueFullError
from reward_fns.http_server import create_app

GATE_TIMEOUT_S = 60.0
"""A hang guard only: how long a gated batch waits for the test before it gives up."""


class GatedScorer:
    """Scores ``len(ground_truth)``; records the batches it saw. ``gated``: each batch sets `started` and waits for
    `release` (set by the test)."""

    def __init__(self, gated: bool = False):
        self.batches, self.lock = [], threading.Lock()
        self.started, self.release = threading.Event(), threading.Event()
        if not gated:
            self.release.set()

    def score_batch(self, items):
        self.started.set()
        assert self.release.wait(GATE_TIMEOUT_S), "the test never released the batch"
        with self.lock:
            self.batches.append(len(items))
        return [{"score": float(len(item["ground_truth"]))} for item in items]


class ManualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only by `advance`: a timeout fires when the test says, whatever the load."""

    def __init__(self):
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now

    async def settle(self, turns: int = 10_000) -> None:
        """Let every task that is ready take its steps (a request in flight reaches its timeout's ``wait_for``)."""
        for _ in range(turns):
            await asyncio.sleep(0)
            if not self._ready:  # only this coroutine's own wake-up was pending
                return
        raise AssertionError("the event loop never settled")

    async def advance(self, seconds: float) -> None:
        """Move the clock once everything set in motion waits: timeouts due by then fire, nothing else runs."""
        await self.settle()
        self.now += seconds
        await self.settle()


def run_on_manual_clock(main):
    """``main(loop)`` on a `ManualClockLoop`, as `asyncio.run` would run it."""
    loop = ManualClockLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


async def started(scorer: GatedScorer) -> None:
    """Wait (in a thread, not on the clock) until the scorer holds a batch."""
    assert await asyncio.to_thread(scorer.started.wait, GATE_TIMEOUT_S)


async def until(condition, steps: int = 10_000) -> None:
    """Yield to the event loop until ``condition()`` holds (a number of loop turns, not a time)."""
    for _ in range(steps):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


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


def test_an_exception_in_a_batch_reaches_only_the_item_that_raises_alone():
    seen = []

    def fn(xs):
        seen.append(list(xs))
        if 3 in xs:
            raise RuntimeError("boom on 3")
        return [x * 10 for x in xs]

    async def run():
        batcher = DynamicBatcher(fn, max_batch=8, max_wait_s=0.05)
        return await asyncio.gather(*(batcher.submit(i) for i in range(6)), return_exceptions=True)

    out = asyncio.run(run())
    assert out[:3] == [0, 10, 20] and out[4:] == [40, 50]
    assert isinstance(out[3], RuntimeError) and "boom on 3" in str(out[3])
    assert seen[0] == [0, 1, 2, 3, 4, 5] and seen[1:] == [[i] for i in range(6)]  # the batch, then one by one


def test_blocking_batcher_holds_more_waiting_calls_than_its_queue():
    async def run():
        batcher = DynamicBatcher(lambda xs: [x + 1 for x in xs], max_batch=4, max_wait_s=0, max_queue=2, block=True)
        return await asyncio.gather(*(batcher.submit(i) for i in range(50))), batcher.stats()

    out, stats = asyncio.run(run())
    assert out == [i + 1 for i in range(50)] and stats["items"] == 50


def test_submit_many_queues_all_or_nothing():
    async def run():
        scored = []
        batcher = DynamicBatcher(lambda xs: (scored.extend(xs), xs)[1], max_batch=1, max_wait_s=0, max_queue=3)
        with pytest.raises(QueueFullError, match="max_queue=3"):
            await batcher.submit_many(list(range(4)))
        return await batcher.submit_many([7, 8, 9]), scored

    # the queue is first in, first out: an item of the rejected request would have been scored before 7
    assert asyncio.run(run()) == ([7, 8, 9], [7, 8, 9])


def test_bounded_queue_rejects_when_full():
    scorer = GatedScorer(gated=True)

    async def run():
        batcher = DynamicBatcher(
            lambda xs: [s["score"] for s in scorer.score_batch([{"ground_truth": "a" * x} for x in xs])],
            max_batch=1,
            max_wait_s=0,
            max_queue=2,
        )
        first = asyncio.ensure_future(batcher.submit(0))
        await started(scorer)  # the worker holds item 0; the queue takes 2 more
        waiting = [asyncio.ensure_future(batcher.submit(i)) for i in (1, 2)]
        await until(lambda: batcher.queue_size == 2)
        with pytest.raises(QueueFullError, match="queue is full"):
            await batcher.submit(3)
        scorer.release.set()
        return await asyncio.gather(first, *waiting)

    assert asyncio.run(run()) == [0, 1, 2]


def test_server_app_answers_503_when_full_and_504_drops_a_request_that_waited_too_long_unscored():
    async def run(loop):
        scorer = GatedScorer(gated=True)
        app = create_app(scorer, max_batch=1, max_wait_s=0, max_queue=1, request_timeout_s=0.3)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            first = asyncio.ensure_future(client.post("/score", json={"solution_str": "<|s_1|>", "ground_truth": "a"}))
            await started(scorer)  # the worker is scoring the first request, held by the gate
            item = {"solution_str": "<|s_1|>", "ground_truth": "abcd"}
            second = asyncio.ensure_future(client.post("/score", json=item))  # waits in the queue of 1
            await until(lambda: app.app.state.batcher.queue_size == 1)  # app.app: inside BodyLimit
            third = await client.post("/score", json=item)  # queue full
            await loop.advance(0.5)  # past request_timeout_s: the first is being scored, the second still queued
            second = await second
            scorer.release.set()
            responses = [await first, second, third]
            again = await client.post("/score", json=item)  # queued behind the dropped one: the worker skipped it
            health = (await client.get("/health")).json()
            stats = (await client.get("/stats")).json()
        return responses, again, health, stats, scorer.batches

    (first, second, third), again, health, stats, batches = run_on_manual_clock(run)
    # first: being scored when its timeout passed -> finished; second: still queued -> dropped; third: rejected
    assert [first.status_code, second.status_code, third.status_code] == [200, 504, 503]
    assert first.json() == {"score": 1.0}
    assert "request_timeout_s=0.3" in second.json()["detail"] and "unscored" in second.json()["detail"]
    assert "queue is full" in third.json()["detail"]
    assert again.status_code == 200 and again.json() == {"score": 4.0}
    assert batches == [1, 1] and stats["dropped"] == 1 and stats["items"] == 2  # the 504 was never scored
    assert health["status"] == "ok" and health["max_queue"] == 1


def test_a_request_already_being_scored_is_finished_not_timed_out():
    async def run(loop):
        scorer = GatedScorer(gated=True)
        app = create_app(scorer, max_batch=1, max_wait_s=0, max_queue=4, request_timeout_s=0.2)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            request = asyncio.ensure_future(
                client.post("/score", json={"solution_str": "<|s_1|>", "ground_truth": "abc"})
            )
            await started(scorer)
            await loop.advance(1.0)  # its timeout passes while it is being scored
            scorer.release.set()
            return await request, scorer

    response, scorer = run_on_manual_clock(run)
    assert response.status_code == 200 and response.json() == {"score": 3.0} and scorer.batches == [1]


def test_a_retried_request_with_the_same_idempotency_key_is_scored_once():
    async def run():
        scorer = GatedScorer(gated=True)
        app = create_app(scorer, max_batch=4, max_wait_s=0, max_queue=8)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            item = {"solution_str": "<|s_1|>", "ground_truth": "abc"}
            headers = {"Idempotency-Key": "k1"}
            abandoned = asyncio.ensure_future(client.post("/score", json=item, headers=headers))
            await started(scorer)
            abandoned.cancel()  # the caller gave up (a client timeout); the server keeps the work
            retry = asyncio.ensure_future(client.post("/score", json=item, headers=headers))  # joins the work
            scorer.release.set()
            retry = await retry
            later = await client.post("/score", json=item, headers=headers)  # gets the stored result
            other = await client.post("/score", json=item, headers={"Idempotency-Key": "k2"})
        return [retry, later, other], scorer.batches

    (retry, later, other), batches = asyncio.run(run())
    assert [r.json() for r in (retry, later, other)] == [{"score": 3.0}] * 3
    assert batches == [1, 1]  # k1 once, k2 once


def test_score_batch_wider_than_the_queue_is_rejected_up_front_naming_the_limit():
    async def run():
        scorer = GatedScorer()
        app = create_app(scorer, max_batch=4, max_wait_s=0, max_queue=3)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            items = [{"solution_str": "<|s_1|>", "ground_truth": "ab"}] * 4
            wide = await client.post("/score_batch", json={"items": items})
            fits = await client.post("/score_batch", json={"items": items[:3]})
        return wide, fits, scorer.batches

    wide, fits, batches = asyncio.run(run())
    assert wide.status_code == 413 and "max_queue=3" in wide.json()["detail"] and "4 items" in wide.json()["detail"]
    assert fits.status_code == 200 and fits.json()["results"] == [{"score": 2.0}] * 3
    assert sum(batches) == 3  # nothing of the rejected request was scored


def test_request_body_over_the_limit_gets_413_also_when_chunked():
    async def run():
        app = create_app(GatedScorer(), max_body_mb=0.001)  # 1048 bytes
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            big = {"solution_str": "<|s_1|>" * 200, "ground_truth": "ab"}
            sized = await client.post("/score", json=big)

            async def chunks():
                yield b'{"solution_str": "' + b"<|s_1|>" * 200
                yield b'", "ground_truth": "ab"}'

            chunked = await client.post("/score", content=chunks(), headers={"content-type": "application/json"})
            small = await client.post("/score", json={"solution_str": "<|s_1|>", "ground_truth": "ab"})
        return sized, chunked, small

    sized, chunked, small = asyncio.run(run())
    assert sized.status_code == 413 and "max_body_mb=0.001" in sized.json()["detail"]
    assert chunked.status_code == 413
    assert small.status_code == 200


def test_a_batcher_serves_successive_event_loops():
    batcher = DynamicBatcher(lambda xs: [x + 1 for x in xs], max_batch=4, max_wait_s=0.01)

    async def run(values):
        return await asyncio.wait_for(asyncio.gather(*(batcher.submit(v) for v in values)), 5)

    assert asyncio.run(run([1, 2])) == [2, 3]
    assert asyncio.run(run([5])) == [6]  # a new loop: the worker of the closed one is replaced, no hang


def test_client_retries_only_what_can_succeed_and_keeps_one_key_across_attempts():
    from reward_fns.client import RewardClient, RewardRequestError, RewardServerUnavailable

    class Broken:
        calls = 0

        def score_batch(self, items):
            Broken.calls += 1
            raise RuntimeError("a scorer bug")

    async def run():
        app = create_app(Broken(), max_batch=4, max_wait_s=0)
        client = RewardClient("http://app", retries=3, backoff_s=0.01)
        client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")
        with pytest.raises(RewardRequestError, match="HTTP 500.*a scorer bug"):
            await client.score({"solution_str": "<|s_1|>", "ground_truth": "a"})
        keys = []

        async def always_503(request):
            keys.append(request.headers["idempotency-key"])
            return httpx.Response(503, json={"detail": "queue is full"})

        client._http = httpx.AsyncClient(transport=httpx.MockTransport(always_503))
        with pytest.raises(RewardServerUnavailable, match="after 4 attempts"):
            await client.score({"solution_str": "<|s_1|>", "ground_truth": "a"})
        return keys

    keys = asyncio.run(run())
    assert Broken.calls == 1  # a 500 is not retried
    assert len(keys) == 4 and len(set(keys)) == 1  # a 503 is, with the same idempotency key
