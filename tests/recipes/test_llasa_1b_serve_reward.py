"""The recipe's Serve choice (run.sh ``MODEL=tiny`` with ``speech_reward=serve`` and its keys): veRL's own
`RewardLoopManager`, built from the composed recipe as the trainer builds it, scores a step of responses; its reward
worker's first call deploys the Serve application of two replicas (tiny random XCodec2 and Paraformer, random
weights) in the Ray instance, and every score equals the in-process reward's."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import ray
import torch
from ray import serve
from recipe_helpers import compose_recipe, run_sh_overrides

from reward_fns.testing.tiny_models import random_codes, speech_response

TEXT = "你好世界"
RESPONSES = [speech_response(random_codes(10 + 4 * i, seed=i), end=i != 3) for i in range(8)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The tiny Llasa tokenizer (Llasa-1B's id layout): what veRL's reward worker decodes responses with."""
    from maspo_lab.data.tiny_llasa import build_tokenizer

    path = tmp_path_factory.mktemp("tiny_llasa_tokenizer")
    build_tokenizer([TEXT]).save_pretrained(path)
    return path


def step_batch(tokenizer, responses: list[str]):
    """A rollout step's DataProto as the trainer hands it to the reward: prompts, responses, masks, dataset fields."""
    from verl import DataProto

    prompt = tokenizer.encode("Convert the text to speech:", add_special_tokens=False)
    ids = [tokenizer.encode(r, add_special_tokens=False) for r in responses]
    width = max(map(len, ids))
    responses_t = torch.full((len(ids), width), tokenizer.pad_token_id)
    for row, seq in enumerate(ids):
        responses_t[row, : len(seq)] = torch.tensor(seq)
    prompts_t = torch.tensor([prompt] * len(ids))
    mask = torch.cat([torch.ones_like(prompts_t), (torch.arange(width) < torch.tensor([[len(s)] for s in ids]))], 1)
    return DataProto.from_dict(
        tensors={"prompts": prompts_t, "responses": responses_t, "attention_mask": mask.long()},
        non_tensors={
            "data_source": np.array(["llasa_tts"] * len(ids), dtype=object),
            "reward_model": np.array([{"ground_truth": TEXT}] * len(ids), dtype=object),
            "extra_info": np.array([{"language": "zh"} for _ in ids], dtype=object),
        },
    )


@pytest.mark.slow(60)
def test_random_weights_recipe_reward_serve_scores_a_step_through_verls_reward_loop(
    tiny_codec_dir, tiny_paraformer_dir, tokenizer_dir, tmp_path
):
    from transformers import AutoTokenizer
    from verl.experimental.reward_loop import RewardLoopManager

    from reward_fns.pipeline import SpeechReward
    from reward_fns.verl_reward import build_request

    kw = "+reward.custom_reward_function.reward_kwargs"
    choice = (  # the backend's config group and its keys, passed through as Hydra overrides
        "speech_reward=serve",
        f"{kw}.codec={tiny_codec_dir}",
        f"{kw}.asr.zh=paraformer:{tiny_paraformer_dir}",
        f"{kw}.default_language=zh",
        f"{kw}.serve_replicas=2",
        f"{kw}.serve_gpus=0",  # CPU replicas
    )
    overrides = run_sh_overrides("grpo", *choice, MODEL="tiny", WORK=str(tmp_path))
    assert set(choice) <= set(overrides)
    config = compose_recipe([*overrides, f"actor_rollout_ref.model.path={tokenizer_dir}", f"{kw}.num_threads=1"])
    composed = config.reward.custom_reward_function.reward_kwargs
    assert (composed.backend, composed.serve_app, composed.serve_replicas) == ("serve", "speech_reward", 2)
    assert composed.serve_gpus == 0
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=tempfile.mkdtemp(dir="/tmp", prefix="ray_")
    )
    try:
        manager = RewardLoopManager(config)
        scored = manager.compute_rm_score(step_batch(tokenizer, RESPONSES))
        replicas = serve.status().applications["speech_reward"].deployments["SpeechScorer"].replica_states
    finally:
        serve.shutdown()
        ray.shutdown()

    local = SpeechReward.from_spec(
        codec=str(tiny_codec_dir), asr=f"zh=paraformer:{tiny_paraformer_dir}", default_language="zh", num_threads=1
    )
    expected = [local.score_batch([build_request(r, TEXT, {"language": "zh"})])[0] for r in RESPONSES]
    assert replicas == {"RUNNING": 2}
    scores = scored.batch["rm_scores"].sum(dim=1)
    assert scores.tolist() == pytest.approx([e["score"] for e in expected], abs=1e-6)
    assert list(scored.non_tensor_batch["speech_reason"]) == [e["speech_reason"] for e in expected]
    assert list(scored.non_tensor_batch["speech_transcript"]) == [e["speech_transcript"] for e in expected]
    assert "truncated" in scored.non_tensor_batch["speech_reason"]
