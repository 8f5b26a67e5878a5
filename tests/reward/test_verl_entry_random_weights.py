"""The veRL entry point in process, loaded the way veRL loads it, with random tiny models."""

import asyncio
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from reward_fns import verl_reward
from reward_fns.reward_settings import IN_PROCESS_SETTINGS, REMOTE_SETTINGS, BatchSettings, field_names
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
    with pytest.raises(
        ValueError, match=r"reward_kwargs: unknown key\(s\) \['sever_url'\]; valid keys: .*'server_url'"
    ):
        asyncio.run(verl_reward.compute_score("tts", "<|s_1|>", "a", sever_url="http://127.0.0.1:1"))
    with pytest.raises(ValueError, match=r"valid keys: \[.*'backend'") as raised:  # the speech_reward group's key
        asyncio.run(verl_reward.compute_score("tts", "<|s_1|>", "a", backend="server", sever_url="x"))
    listed = set(re.search(r"valid keys: (\[.*\])", str(raised.value)).group(1)[2:-2].split("', '"))
    assert listed == {*field_names(*IN_PROCESS_SETTINGS, *REMOTE_SETTINGS), "backend"}
    with pytest.raises(ValueError, match=r"lack \['codec', 'asr'\]"):
        asyncio.run(verl_reward.compute_score("tts", "<|s_1|>", "a"))


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"max_wait_ms": float("nan")}, "reward_kwargs.max_wait_ms must be a finite number"),
        ({"client_backoff_s": float("inf")}, "reward_kwargs.client_backoff_s must be a finite number"),
        ({"client_timeout_s": float("-inf")}, "reward_kwargs.client_timeout_s must be a finite number"),
        ({"reward_config": {"cer_scale": float("nan")}}, "reward_kwargs.reward_config.cer_scale must be a finite"),
        ({"reward_config": {"rate_bounds": {"char": [1.0, float("inf")]}}}, r"rate_bounds.char\[1\] must be a finite"),
        ({"max_codes": 2.5}, "reward_kwargs.max_codes must be an integer"),
        ({"max_queue": 0}, "reward_kwargs.max_queue: max_queue must be > 0"),
        ({"dtype": "float16"}, r"reward_kwargs.dtype='float16' is not valid; valid values: \['float32', 'bfloat16'\]"),
        (
            {"whisper_compute_type": "int4"},
            r"reward_kwargs.whisper_compute_type='int4' is not valid; valid values: \['default', .*'float32'\]",
        ),
    ],
)
def test_reward_kwargs_reject_nan_inf_and_bad_values_naming_the_key(kwargs, key):
    # as Hydra hands them over; no retries, so that a setting that slipped through fails at once rather than waits
    omega = OmegaConf.create({"server_url": "http://127.0.0.1:1", "client_retries": 0, **kwargs})
    with pytest.raises(ValueError, match=key):
        asyncio.run(verl_reward.compute_score("tts", "<|s_1|>", "a", **omega))


def test_every_setting_is_a_reward_kwarg_and_a_server_flag_with_help():
    from reward_fns import reward_settings
    from reward_fns.http_server import build_parser

    flags = {a.dest: a for a in build_parser()._actions if a.dest != "help"}
    server_fields = reward_settings.field_names(*reward_settings.SERVER_SETTINGS)
    assert sorted(flags) == sorted(server_fields)
    assert all(flags[name].help for name in server_fields)
    assert flags["num_threads"].option_strings == ["--threads"]  # the flag users already pass
    assert set(reward_settings.field_names(*reward_settings.IN_PROCESS_SETTINGS)) <= set(server_fields)
    docs = Path(__file__).parents[2] / "docs"
    # the reward's page, and the page on the anchors' reward it points to for likelihood and quality
    page = (docs / "reward.md").read_text() + (docs / "reward-anchors.md").read_text()
    for name in reward_settings.field_names(*reward_settings.IN_PROCESS_SETTINGS, *reward_settings.REMOTE_SETTINGS):
        assert f"`{name}`" in page, f"docs/reward.md and docs/reward-anchors.md do not list reward_kwargs.{name}"
    for name in server_fields:
        assert f"`{flags[name].option_strings[0]}`" in page, (
            f"docs/reward.md and docs/reward-anchors.md lack {name}'s flag"
        )


def test_random_weights_bad_samples_from_veRL_score_invalid_and_their_neighbours_score(reward_kwargs):
    good = speech_response(random_codes(16, seed=3))
    calls = [
        (good, {"language": "zh"}),
        (good.encode(), {"language": "zh"}),
        (good, {"language": "zh", "prompt_codes": ["a"]}),
        (good, {"language": "  "}),
        ("<|s_99999999999999999999|><|SPEECH_GENERATION_END|>", {}),
        (good, {"language": "zh", "prompt_codes": [2**63]}),
        (good, None),
    ]

    async def run():
        return await asyncio.gather(
            *(verl_reward.compute_score("tts", s, "你好世界", extra, **reward_kwargs) for s, extra in calls)
        )

    out = asyncio.run(run())
    reasons = [r["speech_reason"] for r in out]
    assert reasons == ["ok"] + ["invalid_request"] * 3 + ["code_out_of_range", "invalid_request", "ok"]
    assert out[0]["score"] == out[6]["score"] and out[0]["speech_transcript"] == out[6]["speech_transcript"]
    assert all(r["score"] == 0.0 for r in out[1:6])


def test_random_weights_the_shipped_recipe_rollout_batch_passes_in_process_with_back_pressure(reward_kwargs):
    """veRL awaits one call per response of a step: llasa_1b's 256 prompts x 8 samples, beyond the default queue."""
    recipe = OmegaConf.load(Path(__file__).parents[2] / "recipes/llasa_1b/llasa_1b.yaml")
    n = recipe.data.train_batch_size * recipe.actor_rollout_ref.rollout.n
    assert n > BatchSettings.max_queue  # 2048 > 1024: the old fixed queue raised QueueFullError here
    kwargs = {k: v for k, v in reward_kwargs.items() if k not in ("max_batch", "max_wait_ms")}  # defaults
    truncated = speech_response(random_codes(8, seed=1), end=False)  # gate-only: the test measures the queue
    good = speech_response(random_codes(12, seed=2))

    async def run():
        return await asyncio.gather(
            *(
                verl_reward.compute_score("tts", good if i % 512 == 0 else truncated, "你好", None, **kwargs)
                for i in range(n)
            )
        )

    out = asyncio.run(run())
    assert len(out) == n
    assert sum(r["speech_reason"] == "ok" for r in out) == n // 512
    assert sum(r["speech_reason"] == "truncated" for r in out) == n - n // 512


def test_random_weights_max_queue_is_a_reward_kwarg(reward_kwargs):
    truncated = speech_response(random_codes(8, seed=1), end=False)

    async def run():
        kwargs = {**reward_kwargs, "max_queue": 2, "max_batch": 2}
        return await asyncio.gather(
            *(verl_reward.compute_score("tts", truncated, "你好", None, **kwargs) for _ in range(40))
        )

    assert [r["speech_reason"] for r in asyncio.run(run())] == ["truncated"] * 40
    batchers = [b for b in verl_reward._batchers.values() if b.max_queue == 2]
    assert len(batchers) == 1 and batchers[0].block


def test_request_from_veRL_fields():
    req = verl_reward.build_request("<|s_1|>", {"text": "你好"}, {"language": "zh", "prompt_codes": [3, 4]})
    assert req == {"solution_str": "<|s_1|>", "ground_truth": "你好", "language": "zh", "prompt_codes": [3, 4]}
    assert verl_reward.build_request("x", "hello", None) == {"solution_str": "x", "ground_truth": "hello"}
