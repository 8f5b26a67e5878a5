"""The veRL entry point in process, loaded the way veRL loads it, with random tiny models."""

import asyncio

import pytest
from omegaconf import OmegaConf

from reward_fns import verl_reward
from reward_fns.testing.tiny_models import random_codes, speech_response


@pytest.fixture(scope="module")
def reward_kwargs(tiny_codec_dir, tiny_paraformer_dir):
    return {
        "codec": str(tiny_codec_dir),
        "asr": {"zh": f"paraformer:{tiny_paraformer_dir}"},
        "default_language": "zh",
        "num_threads": 2,
        "max_batch": 16,
        "max_wait_ms": 50,
    }


def test_random_weights_veRL_loads_and_awaits_compute_score_in_process(reward_kwargs, random_weights_reward):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://reward_fns.verl_reward",
                    "name": "compute_score",
                    "reward_kwargs": reward_kwargs,
                }
            }
        }
    )
    fn = get_custom_reward_fn(config)  # veRL wraps an async function so it stays awaitable
    samples = [(speech_response(random_codes(12 + 2 * i, seed=i), end=i != 3), "你好世界") for i in range(10)]

    async def run():
        return await asyncio.gather(
            *(
                fn(data_source="tts", solution_str=s, ground_truth=g, extra_info={"language": "zh-CN"})
                for s, g in samples
            )
        )

    got = asyncio.run(run())
    expected = random_weights_reward.score_batch([{"solution_str": s, "ground_truth": g} for s, g in samples])
    assert [g["score"] for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-9)
    assert [g["speech_reason"] for g in got] == ["ok"] * 3 + ["truncated"] + ["ok"] * 6
    batchers = [b for key, b in verl_reward._batchers.items() if str(reward_kwargs["codec"]) in key]
    assert max(b.stats()["max_batch_seen"] for b in batchers) > 1  # the concurrent calls were batched


def test_reward_kwargs_errors_name_the_key():
    with pytest.raises(ValueError, match=r"unknown reward_kwargs \['sever_url'\]"):
        asyncio.run(verl_reward.compute_score("tts", "<|s_1|>", "a", sever_url="http://127.0.0.1:1"))
    with pytest.raises(ValueError, match=r"lack \['codec', 'asr'\]"):
        asyncio.run(verl_reward.compute_score("tts", "<|s_1|>", "a"))


def test_request_from_veRL_fields():
    req = verl_reward.build_request("<|s_1|>", {"text": "你好"}, {"language": "zh", "prompt_codes": [3, 4]})
    assert req == {"solution_str": "<|s_1|>", "ground_truth": "你好", "language": "zh", "prompt_codes": [3, 4]}
    assert verl_reward.build_request("x", "hello", None) == {"solution_str": "x", "ground_truth": "hello"}
