"""The speech reward as a Ray Serve application (`reward_fns.ray_serve`), tiny random XCodec2 and Paraformer (random
weights): two CPU replicas in one Ray instance for the module, reached as veRL's reward function reaches them
(`verl_reward.compute_score` with ``serve_app``) and over Serve's HTTP ingress as a client outside the cluster does.
Replicas are killed with SIGKILL while they score."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tempfile
import threading
import time

import pytest
import ray
from ray import serve
from ray.serve.exceptions import BackPressureError

from reward_fns.testing.tiny_models import random_codes, speech_response

APP, MAX_BATCH, MAX_QUEUE = "speech_reward_test", 4, 32
MAX_ONGOING = 2 * MAX_BATCH  # serve_max_ongoing's default
TEXT = "你好世界"
MODEL_KEYS = ("codec", "asr", "default_language", "num_threads")


@pytest.fixture(scope="module")
def cluster(tiny_codec_dir, tiny_paraformer_dir):
    """A Ray instance with the application deployed as ``maspo-verl reward-serve`` does it (scorer behind the HTTP
    ingress); yields the reward_kwargs that reach it and the HTTP address."""
    from reward_fns.ray_serve import QUIET, _clients, build_app
    from reward_fns.reward_settings import BatchSettings, ModelSettings, ServerSettings, ServeSettings

    model = {"codec": str(tiny_codec_dir), "asr": f"zh=paraformer:{tiny_paraformer_dir}", "default_language": "zh"}
    model["num_threads"] = 1
    batch = {"max_batch": MAX_BATCH, "max_wait_ms": 50.0, "max_queue": MAX_QUEUE}
    settings = {"serve_app": APP, "serve_replicas": 2, "serve_cpus": 1.0}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray.init(
        num_cpus=4,  # logical: two replicas of one CPU each, callers of none
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=tempfile.mkdtemp(dir="/tmp", prefix="ray_"),  # socket paths stay under 108 bytes
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = build_app(
        ModelSettings(**model), BatchSettings(**batch), ServeSettings(**settings), ServerSettings(request_timeout_s=60)
    )
    serve.run(app, name=APP, route_prefix="/", logging_config=QUIET)
    yield {"backend": "serve", **model, **batch, **settings}, f"http://127.0.0.1:{port}"  # speech_reward=serve's
    _clients.clear()  # compute_score's clients hold handles of this Ray instance
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def local(tiny_codec_dir, tiny_paraformer_dir):
    """The in-process reward with the replicas' settings (one thread each)."""
    from reward_fns.pipeline import SpeechReward

    return SpeechReward.from_spec(
        codec=str(tiny_codec_dir), asr=f"zh=paraformer:{tiny_paraformer_dir}", default_language="zh", num_threads=1
    )


def requests_of(responses, language="zh"):
    from reward_fns.verl_reward import build_request

    return [build_request(r, TEXT, {"language": language}) for r in responses]


def one_by_one(local, requests):
    return [local.score_batch([request])[0] for request in requests]


STEP = [speech_response(random_codes(10 + 3 * (i % 7), seed=i), end=i % 5 != 4) for i in range(20)]
"""A step's responses: speech of 10 to 28 codes, every fifth truncated (no end tag)."""


def scorer_stats(min_replicas: int = 2, timeout_s: float = 60) -> dict[int, dict]:
    """The counters of each replica, by pid: a call lands on the replica Serve's router picks, so ask until
    ``min_replicas`` have answered (the router avoids a replica it last saw full until its cache expires)."""
    handle = serve.get_deployment_handle("SpeechScorer", APP)
    seen, deadline = {}, time.monotonic() + timeout_s
    while len(seen) < min_replicas and time.monotonic() < deadline:
        for response in [handle.stats.remote() for _ in range(8)]:
            stats = response.result()
            seen[stats["replica_pid"]] = stats
        time.sleep(0.2)
    return seen


def wait_for_replicas(n: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = serve.status().applications[APP].deployments["SpeechScorer"].replica_states
        if states.get("RUNNING", 0) == n and sum(states.values()) == n:
            return
        time.sleep(0.5)
    raise AssertionError(f"Serve did not bring the scorer back to {n} running replicas: {states}")


@pytest.mark.slow(30)
def test_random_weights_two_replicas_score_as_the_in_process_reward(cluster, local):
    from reward_fns import verl_reward

    kwargs, _ = cluster
    bad = ["", "hello <|s_1|>", speech_response(random_codes(12, seed=99))]  # no speech, stray text, ok
    responses = STEP + bad

    async def step():
        return await asyncio.gather(
            *(verl_reward.compute_score("llasa_tts", r, TEXT, {"language": "zh"}, **kwargs) for r in responses)
        )

    results = asyncio.run(step())
    expected = one_by_one(local, requests_of(responses))
    assert results == expected  # every key, every value: batched on a replica == in process, one at a time
    reasons = [r["speech_reason"] for r in results]
    assert {"ok", "truncated", "no_speech_tokens"} <= set(reasons)
    busy = {pid: s["items"] for pid, s in scorer_stats().items()}
    assert len(busy) == 2 and all(busy.values())  # 23 at once > max_ongoing=8 per replica: both replicas scored


def test_random_weights_http_ingress_keeps_the_reward_servers_contract(cluster, local):
    from reward_fns.client import RewardClient, RewardRequestError

    _, url = cluster
    requests = requests_of(STEP[:6])
    expected = one_by_one(local, requests)

    async def talk():
        client = RewardClient(url, retries=2, backoff_s=0.2)
        try:
            one = await client.score(requests[0])
            many = await client.score_batch(requests)
            health = await client.health()
            errors = []
            for path, body in (("/score", {"solution_str": "x"}), ("/score_batch", {"items": [requests[0]] * 33})):
                try:
                    await client._request("POST", path, body)
                except RewardRequestError as exc:
                    errors.append(str(exc))
            return one, many, health, errors
        finally:
            await client.aclose()

    one, many, health, errors = asyncio.run(talk())
    assert one == expected[0] and many == expected
    assert health["status"] == "ok" and health["languages"] == ["zh"] and health["max_queue"] == MAX_QUEUE
    assert "HTTP 422" in errors[0] and "ground_truth" in errors[0]
    assert "HTTP 413" in errors[1] and "max_queue=32" in errors[1]


def test_random_weights_http_burst_past_max_queue_is_refused_with_503_and_counted(cluster, local):
    import httpx

    from reward_fns.client import RewardClient

    _, url = cluster
    requests = requests_of([f"<|s_{i}|>" for i in range(40)] + [speech_response(random_codes(12, seed=5))] * 60)

    async def burst():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as http:
            before = (await http.get(url + "/stats")).json()["refused"]
            answers = await asyncio.gather(*(http.post(url + "/score", json=r) for r in requests))
            after = (await http.get(url + "/stats")).json()["refused"]
        client = RewardClient(url, retries=8, backoff_s=0.2)  # what a client outside the cluster does: retry 503
        try:
            retried = await asyncio.gather(*(client.score(r) for r in requests))
        finally:
            await client.aclose()
        return answers, after - before, retried

    answers, refused, retried = asyncio.run(burst())
    expected = one_by_one(local, requests)
    codes = [a.status_code for a in answers]
    assert set(codes) == {200, 503} and codes.count(503) == refused
    for answer, want in zip(answers, expected):
        if answer.status_code == 503:
            assert f"of max_queue={MAX_QUEUE} in flight" in answer.json()["detail"]
        else:
            assert answer.json() == want
    assert retried == expected


@ray.remote(num_cpus=0)
class Caller:
    """A reward-loop worker's stand-in: its own process, its own handle (Serve bounds the queue per caller)."""

    def __init__(self):
        from reward_fns.ray_serve import ServeRewardClient
        from reward_fns.score_record import RecordShape

        self.client = ServeRewardClient(APP, RecordShape(), max_in_flight=MAX_QUEUE)

    async def step(self, requests):
        results = await asyncio.gather(*(self.client.score(r) for r in requests))
        return results, dict(self.client.counts), self.client.most_in_flight


@pytest.mark.slow(36)
def test_random_weights_2000_concurrent_requests_from_four_callers_all_answered_within_the_bounds(cluster, local):
    # 1 in 25 is speech to decode and recognise; the rest stop at the gate (truncated), so the load is Serve's
    responses = [speech_response(random_codes(12, seed=i)) if i % 25 == 0 else f"<|s_{i}|>" for i in range(500)]
    callers = [Caller.remote() for _ in range(4)]
    outcomes = ray.get([caller.step.remote(requests_of(responses)) for caller in callers])
    expected = one_by_one(local, requests_of(responses))
    for results, counts, most_in_flight in outcomes:
        assert len(results) == 500 and counts["answered"] == 500 and "unavailable" not in counts
        assert results == expected
        # 500 at once: max_queue=32 of them in Serve, the rest waiting at the caller; Serve never had to refuse
        assert most_in_flight == MAX_QUEUE and "refused" not in counts
    assert all(s["most_ongoing"] <= MAX_ONGOING for s in scorer_stats().values())


def kill_a_replica_while_it_scores(step_done: threading.Event) -> int | None:
    """SIGKILL the first replica seen scoring a batch with more requests waiting behind it; its pid, or None when
    the step ended before one was seen."""
    handle = serve.get_deployment_handle("SpeechScorer", APP)
    while not step_done.is_set():
        try:
            stats = handle.stats.remote().result()
        except BackPressureError:  # this process's queue holds the step's requests: ask again
            continue
        if stats["scoring"] and stats["ongoing"] > MAX_BATCH:  # a batch running, the next one waiting
            os.kill(stats["replica_pid"], signal.SIGKILL)
            return stats["replica_pid"]
    return None


KILL_ATTEMPTS = 5


def step_with_a_kill(make_client, requests):
    """``(results, killed pid, client)`` of a step during which a replica was killed while it scored. A step that
    ended before the killer saw a replica scoring with requests waiting (a busy machine can starve the killer's
    thread) killed nothing and is sent again by a new client, up to `KILL_ATTEMPTS` times."""

    async def attempt(client):
        step_done = threading.Event()
        killer = asyncio.ensure_future(asyncio.to_thread(kill_a_replica_while_it_scores, step_done))
        try:
            results = await asyncio.gather(*(client.score(r) for r in requests))
        finally:
            step_done.set()
        return results, await killer

    for _ in range(KILL_ATTEMPTS):
        client = make_client()
        results, killed = asyncio.run(attempt(client))
        if killed is not None:
            return results, killed, client
    raise AssertionError(f"no replica was seen scoring with requests waiting in {KILL_ATTEMPTS} steps")


@pytest.mark.slow(60)
def test_random_weights_a_replica_killed_mid_batch_loses_no_response_of_the_step(cluster, local):
    from reward_fns.ray_serve import ServeRewardClient
    from reward_fns.score_record import RecordShape

    requests = requests_of(STEP * 6)  # long enough a step that the kill lands while batches wait behind one
    results, killed, client = step_with_a_kill(
        lambda: ServeRewardClient(APP, RecordShape(), retries=3, backoff_s=0.2, max_in_flight=MAX_QUEUE), requests
    )
    assert results == one_by_one(local, requests)  # one result per response, each scored once into the step
    assert client.counts["resent"] >= 1 and client.counts["answered"] == len(requests)
    wait_for_replicas(2)  # Serve re-creates the dead replica
    assert killed not in scorer_stats()


def test_random_weights_past_its_resends_a_response_scores_reward_unavailable_and_the_step_goes_on(cluster, local):
    from maspo_base.typed_settings import build
    from reward_fns.ray_serve import ServeRewardClient
    from reward_fns.reward_settings import ModelSettings
    from reward_fns.score_record import RecordShape, unscored_record

    requests = requests_of(STEP * 6)
    kwargs, _ = cluster
    shape = RecordShape.from_settings(build(ModelSettings, {k: kwargs[k] for k in MODEL_KEYS}, "reward_kwargs"))
    results, _, client = step_with_a_kill(  # retries=0: compute_score's
        lambda: ServeRewardClient(APP, shape, retries=0, backoff_s=0.2, max_in_flight=MAX_QUEUE), requests
    )
    expected = one_by_one(local, requests)
    lost = [i for i, r in enumerate(results) if r["speech_reason"] == "reward_unavailable"]
    assert lost and len(lost) == client.counts["unavailable"]
    for i, (result, want) in enumerate(zip(results, expected)):
        if i in lost:  # scored worst, with every key the scored ones carry, and why
            assert result == unscored_record(local.record_shape(), "reward_unavailable", result["speech_detail"])
            assert result.keys() == want.keys() and "serve_retries=0" in result["speech_detail"]
        else:
            assert result == want
    wait_for_replicas(2)
