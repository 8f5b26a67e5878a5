"""The recipe's reward as veRL loads it, with the reward_kwargs run.sh composes: in process (CODEC + ASR_ZH) and
through recipes/llasa_1b/reward_server.sh (REWARD_URL). Tiny random XCodec2 and Paraformer (random weights)."""

from __future__ import annotations

import asyncio

import pytest
from recipe_helpers import compose_recipe, run_sh_overrides

from reward_fns.testing.tiny_models import random_codes, speech_response

SAMPLES = [(speech_response(random_codes(15 + 5 * i, seed=i), end=i != 2), "你好世界") for i in range(4)]


@pytest.fixture
def models(tiny_codec_dir, tiny_paraformer_dir):
    return tiny_codec_dir, tiny_paraformer_dir


def score_with_recipe(config) -> list[dict]:
    """Load the recipe's reward function the way veRL's reward loop does and await it on `SAMPLES`."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(config)

    async def run():
        return await asyncio.gather(
            *(
                fn(data_source="llasa_tts", solution_str=s, ground_truth=g, extra_info={"language": "zh"})
                for s, g in SAMPLES
            )
        )

    return asyncio.run(run())


def test_random_weights_in_process_reward_scores_with_the_recipe_kwargs(models):
    codec, paraformer = models
    env = {
        "MODEL": "/m",
        "DATA": "/d",
        "REWARD_IN_PROCESS": "1",
        "CODEC": str(codec),
        "ASR_ZH": f"paraformer:{paraformer}",
    }
    results = score_with_recipe(compose_recipe(run_sh_overrides("grpo", **env)))
    assert [r["speech_reason"] for r in results] == ["ok", "ok", "truncated", "ok"]  # no "reward_kwargs lack"
    assert all(0.0 <= r["score"] <= 1.0 for r in results)


def test_random_weights_reward_server_script_and_the_recipe_pointed_at_it(models, reward_server):
    # reward_server (tests/conftest.py): reward_server.sh with CODEC, ASR_ZH, REWARD_DEVICE=cpu, --default-language zh
    codec, paraformer = models
    url = reward_server.url
    remote = score_with_recipe(compose_recipe(run_sh_overrides("maspo-fsq", MODEL="/m", DATA="/d", REWARD_URL=url)))
    local = score_with_recipe(
        compose_recipe(
            run_sh_overrides(
                "grpo",
                MODEL="/m",
                DATA="/d",
                REWARD_IN_PROCESS="1",
                CODEC=str(codec),
                ASR_ZH=f"paraformer:{paraformer}",
                DEFAULT_LANGUAGE="zh",
            )
        )
    )
    assert [r["score"] for r in remote] == pytest.approx([r["score"] for r in local], abs=1e-6)
    assert [r["speech_reason"] for r in remote] == ["ok", "ok", "truncated", "ok"]
