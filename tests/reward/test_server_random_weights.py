"""The reward server as users run it (`maspo-verl reward-server`, real uvicorn on 127.0.0.1), random tiny models."""

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from reward_fns.client import RewardClient, RewardRequestError, RewardServerUnavailable
from reward_fns.testing.tiny_models import random_codes, speech_response
from reward_fns.verl_reward import compute_score


@pytest.fixture
def server(reward_server):
    """``(url, process)`` of the session's reward server (tests/conftest.py), started through the recipe's
    reward_server.sh, which runs ``maspo-verl reward-server`` with its flags."""
    return reward_server.url, reward_server.proc


def _requests(n):
    out = []
    for i in range(n):
        if i % 5 == 4:  # every fifth is truncated: scored by the gate, no model
            out.append(
                {"solution_str": speech_response(random_codes(10 + i, seed=i), end=False), "ground_truth": "你好"}
            )
        else:
            out.append({"solution_str": speech_response(random_codes(10 + 3 * i, seed=i)), "ground_truth": "你好世界"})
    return out


def test_random_weights_concurrent_requests_each_get_their_own_result_in_batches(server, random_weights_reward):
    url, _ = server
    requests = _requests(24)
    expected = [random_weights_reward.score_batch([r])[0] for r in requests]  # one by one, in process
    before = httpx.get(url + "/stats").json()["batch_sizes"]  # the server may have served other tests

    async def fire():
        client = RewardClient(url, retries=0)
        try:
            return await asyncio.gather(*(client.score(r) for r in requests))
        finally:
            await client.aclose()

    got = asyncio.run(fire())
    for e, g in zip(expected, got):
        assert g["speech_reason"] == e["speech_reason"]
        assert g["speech_n_codes"] == e["speech_n_codes"]
        assert g["speech_transcript"] == e["speech_transcript"]
        assert g["score"] == pytest.approx(e["score"], abs=1e-9)
    assert sum(g["speech_reason"] == "truncated" for g in got) == 4
    stats = httpx.get(url + "/stats").json()
    batches = {int(size): count - before.get(size, 0) for size, count in stats["batch_sizes"].items()}
    batches = {size: count for size, count in batches.items() if count}  # this test's batches, by size
    assert max(batches) > 1 and sum(size * count for size, count in batches.items()) >= 24, (before, stats)


def test_veRL_entry_point_scores_through_the_server(server, random_weights_reward):
    url, _ = server
    req = _requests(3)

    async def run():
        return await asyncio.gather(
            *(
                compute_score(
                    "tts",
                    r["solution_str"],
                    {"text": r["ground_truth"]},
                    {"language": "zh"},
                    backend="server",
                    server_url=url,
                )
                for r in req
            )
        )

    got = asyncio.run(run())
    expected = random_weights_reward.score_batch(req)
    assert [g["score"] for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-9)


def test_malformed_requests_get_422_naming_the_field_and_the_server_keeps_serving(server):
    url, _ = server
    missing = httpx.post(url + "/score", json={"solution_str": "<|s_1|>"})
    assert missing.status_code == 422 and "ground_truth" in missing.json()["detail"]
    extra = httpx.post(url + "/score", json={"solution_str": "<|s_1|>", "ground_truth": "a", "txt": 1})
    assert extra.status_code == 422 and "txt" in extra.json()["detail"]
    neither = httpx.post(url + "/score", json={"ground_truth": "a"})
    assert neither.status_code == 422 and "solution_str" in neither.json()["detail"]
    not_json = httpx.post(url + "/score", content=b"{oops", headers={"content-type": "application/json"})
    assert not_json.status_code == 422

    async def client_side():
        client = RewardClient(url, retries=3, backoff_s=0.01)
        try:
            with pytest.raises(RewardRequestError, match="422"):
                await client.score({"ground_truth": "a"})
            return await client.score({"solution_str": speech_response([1, 2, 3]), "ground_truth": "你好"})
        finally:
            await client.aclose()

    # decoded and recognised: 3 codes of the random codec are nothing to the random Paraformer, scored worst
    served = asyncio.run(client_side())
    assert served["speech_reason"] == "empty_transcript" and served["speech_n_codes"] == 3
    assert httpx.get(url + "/health").json()["status"] == "ok"


BAD_ITEMS = [
    ({"solution_str": "<|s_1|><|s_99999999999999999999|><|SPEECH_GENERATION_END|>"}, "code_out_of_range"),
    ({"token_ids": [128264 + 5, 2**63, 128261]}, "invalid_request"),
    ({"solution_str": "<|s_1|><|SPEECH_GENERATION_END|>", "prompt_codes": [2**63]}, "invalid_request"),
    ({"solution_str": "<|s_1|><|SPEECH_GENERATION_END|>", "language": "  "}, "invalid_request"),
    ({"solution_str": "<|s_1|><|SPEECH_GENERATION_END|>", "prompt_audio": [0.0, float("nan")]}, "invalid_request"),
    ({"solution_str": "<|s_1|><|SPEECH_GENERATION_END|>", "prompt_audio": [float("inf")]}, "invalid_request"),
]


def test_random_weights_bad_samples_get_200_with_their_reason_and_their_batch_neighbours_score(
    server, random_weights_reward
):
    url, _ = server
    good = [r for r in _requests(8) if r["solution_str"].endswith("END|>")][:4]
    bad = [({"ground_truth": "你好", **item}, reason) for item, reason in BAD_ITEMS]
    order = [(g, None) for g in good[:2]] + bad[:3] + [(g, None) for g in good[2:]] + bad[3:]
    body = json.dumps({"items": [item for item, _ in order]})  # Python writes NaN/Infinity, as numpy-fed clients do
    response = httpx.post(url + "/score_batch", content=body, headers={"content-type": "application/json"}, timeout=120)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    for (item, reason), result in zip(order, results):
        if reason is not None:
            assert result["speech_reason"] == reason and result["score"] == 0.0, (item, result)
    alone = [random_weights_reward.score_batch([g])[0] for g in good]
    assert [r for (_, reason), r in zip(order, results) if reason is None] == alone

    async def through_the_veRL_client():  # single requests, batched together on the server
        calls = [(g["solution_str"], None) for g in good] + [
            ("<|s_99999999999999999999|><|SPEECH_GENERATION_END|>", None),
            ("<|s_1|><|SPEECH_GENERATION_END|>", {"language": "  "}),
            ("<|s_1|><|SPEECH_GENERATION_END|>", {"prompt_codes": [2**63]}),
        ]
        return await asyncio.gather(
            *(
                compute_score("tts", s, "你好世界", extra, backend="server", server_url=url, client_retries=0)
                for s, extra in calls
            )
        )

    got = asyncio.run(through_the_veRL_client())
    assert [g["speech_reason"] for g in got[4:]] == ["code_out_of_range", "invalid_request", "invalid_request"]
    assert [g["score"] for g in got[:4]] == pytest.approx(
        [r["score"] for r in random_weights_reward.score_batch([{**g, "ground_truth": "你好世界"} for g in good])]
    )


def test_server_defaults_bound_the_work(server):
    url, _ = server
    health = httpx.get(url + "/health").json()
    assert health["max_codes"] == 1500 and health["max_body_mb"] == 32 and health["max_queue"] == 1024
    long = {"solution_str": speech_response(random_codes(1501, seed=0)), "ground_truth": "你好"}
    out = httpx.post(url + "/score", json=long, timeout=60).json()
    assert out["speech_reason"] == "too_long" and "max_codes=1500" in out["speech_detail"]
    huge = httpx.post(url + "/score", content=b" " * (33 * 2**20), headers={"content-type": "application/json"})
    assert huge.status_code == 413 and "max_body_mb=32" in huge.json()["detail"]
    wide = httpx.post(url + "/score_batch", json={"items": [{"solution_str": "x", "ground_truth": "a"}] * 1025})
    assert wide.status_code == 413 and "max_queue=1024" in wide.json()["detail"]


def test_stopped_server_makes_the_client_raise_after_its_retries(server, monkeypatch):
    url, proc = server
    proc.terminate()
    proc.wait(timeout=20)
    waits, sleep = [], asyncio.sleep

    async def recorded_sleep(seconds, *args, **kwargs):
        # the client's own waits only: the HTTP stack may sleep too (a 5 s wait was seen once on a loaded machine)
        if sys._getframe(1).f_code.co_filename.endswith(str(Path("reward_fns", "client.py"))):
            waits.append(seconds)
        await sleep(seconds, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", recorded_sleep)

    async def run():
        client = RewardClient(url, retries=2, backoff_s=0.1)
        try:
            with pytest.raises(RewardServerUnavailable, match="after 3 attempts"):
                await client.score({"solution_str": "<|s_1|>", "ground_truth": "a"})
        finally:
            await client.aclose()

    asyncio.run(run())
    assert [w for w in waits if w > 0] == [0.1, 0.2]  # backoff_s * 2**k before each retry
    with pytest.raises(RewardServerUnavailable, match="reward-server"):
        asyncio.run(
            compute_score(
                "tts", "<|s_1|>", "a", None, backend="server", server_url=url, client_retries=1, client_backoff_s=0.01
            )
        )


def test_server_command_reports_a_bad_checkpoint_and_exits_2(tmp_path, capsys):
    from reward_fns.http_server import main

    assert main(["--codec", str(tmp_path / "missing"), "--asr", "zh=paraformer"]) == 2
    assert "neither a directory nor a hub id" in capsys.readouterr().err
    assert main(["--codec", str(tmp_path), "--asr", "zh=paraformer", "--reward-config", "{oops"]) == 2
    assert "--reward-config is not JSON" in capsys.readouterr().err
