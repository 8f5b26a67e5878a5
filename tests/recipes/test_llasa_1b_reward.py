"""The recipe's reward as veRL loads it, with the reward_kwargs the recipe composes from its overrides: in process
(``speech_reward=in_process`` with codec and asr) and through recipes/llasa_1b/reward_server.sh
(``speech_reward=server`` with its address). Tiny random XCodec2 and Paraformer (random weights)."""

from __future__ import annotations

import asyncio

import pytest
from recipe_helpers import KW, compose_recipe, run_sh_overrides

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


def in_process(codec, paraformer, *extra: str) -> tuple[str, ...]:
    return ("speech_reward=in_process", f"+{KW}.codec={codec}", f"+{KW}.asr.zh=paraformer:{paraformer}", *extra)


def test_random_weights_in_process_reward_scores_with_the_recipe_kwargs(models):
    results = score_with_recipe(compose_recipe(run_sh_overrides("grpo", *in_process(*models), MODEL="/m", DATA="/d")))
    assert [r["speech_reason"] for r in results] == ["ok", "ok", "truncated", "ok"]  # no "reward_kwargs lack"
    assert all(0.0 <= r["score"] <= 1.0 for r in results)


def test_random_weights_reward_server_script_and_the_recipe_pointed_at_it(models, reward_server):
    # reward_server (tests/conftest.py): reward_server.sh with CODEC, ASR_ZH, REWARD_DEVICE=cpu, --default-language zh
    server = ("speech_reward=server", f"{KW}.server_url={reward_server.url}")
    remote = score_with_recipe(compose_recipe(run_sh_overrides("maspo-fsq", *server, MODEL="/m", DATA="/d")))
    local_reward = in_process(*models, f"+{KW}.default_language=zh")
    local = score_with_recipe(compose_recipe(run_sh_overrides("grpo", *local_reward, MODEL="/m", DATA="/d")))
    assert [r["score"] for r in remote] == pytest.approx([r["score"] for r in local], abs=1e-6)
    assert [r["speech_reason"] for r in remote] == ["ok", "ok", "truncated", "ok"]
