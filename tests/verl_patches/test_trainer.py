"""The frame-error channel through veRL's own `compute_advantage` (legacy layout) and the v1 utility that wraps it."""

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto

import maspo_verl.verl_plugin  # noqa: F401 - installs the hooks in this process
from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET, SPEECH_GENERATION_END_ID
from maspo_verl.verl_patches import trainer
from maspo_verl.verl_patches.metrics import wrap_compute_data_metrics

S, END = CODEC_OFFSET, SPEECH_GENERATION_END_ID


def batch(with_responses=True):
    responses = torch.tensor([[S + 1, S + 2, END, 0], [S + 3, 7, S + 4, END], [S + 5, S + 6, S + 7, END]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    rewards = torch.zeros(3, 4)
    rewards[0, 2], rewards[1, 3], rewards[2, 3] = 1.0, 0.0, 0.5
    tensors = {"response_mask": mask, "token_level_rewards": rewards}
    if with_responses:
        tensors["responses"] = responses
    non_tensor = {"uid": np.array(["g", "g", "g"], dtype=object)}
    if with_responses:
        non_tensor["frame_errors"] = np.array(["1,0", "0,1", ""])
    return DataProto(batch=TensorDict(tensors, batch_size=3), non_tensor_batch=non_tensor), responses


ALGORITHM = OmegaConf.create(
    {"adv_estimator": "maspo", "norm_adv_by_std_in_grpo": True, "maspo": {"credit_weight": 1.0}}
)


def expected_advantages():
    a = (torch.tensor([1.0, 0.0, 0.5]) - 0.5) / (0.5 + 1e-6)
    u = 0.5 / (0.5 + 1e-6)
    out = a.unsqueeze(-1).repeat(1, 4) * torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    out[0, 0] += u * (0.5 - 1)
    out[0, 1] += u * 0.5
    out[1, 0] += u * 0.5  # the text token (id 7) between the two frames keeps A_1
    out[1, 2] += u * (0.5 - 1)
    return out  # row 2: no alignment, GRPO


def test_legacy_compute_advantage_reads_the_batch():
    from verl.trainer.ppo import ray_trainer

    assert getattr(ray_trainer.compute_advantage, "__maspo_wrapped__", False)
    data, _ = batch()
    out = ray_trainer.compute_advantage(data, adv_estimator="maspo", config=ALGORITHM)
    torch.testing.assert_close(out.batch["advantages"], expected_advantages())
    # the legacy trainer logs them through its compute_data_metrics (wrapped), once per advantage call
    assert getattr(ray_trainer.compute_data_metrics, "__maspo_wrapped__", False)
    data_metrics = wrap_compute_data_metrics(lambda batch, **kwargs: {"critic/score/mean": 0.5})
    metrics = data_metrics(batch=out, use_critic=False)
    assert metrics["critic/score/mean"] == 0.5 and metrics["maspo_credit/unaligned_samples"] == 1.0
    assert metrics["maspo_credit/flagged_frame_fraction"] == 0.5
    assert data_metrics(batch=out, use_critic=False) == {"critic/score/mean": 0.5}


def test_v1_path_reads_what_the_trainer_fetched():
    from verl.trainer.ppo.v1 import utils

    data, responses = batch(with_responses=False)
    token = trainer._v1_credit_fields.set({"responses": responses, "signals": ["1,0", "0,1", ""]})
    try:
        out = utils.compute_advantage_for_multi_trajectories(
            data, batch_keys=["g_0_0", "g_1_0", "g_2_0"], adv_estimator="maspo", config=ALGORITHM
        )
    finally:
        trainer._v1_credit_fields.reset(token)
    torch.testing.assert_close(out.batch["advantages"], expected_advantages())
    assert trainer.pop_credit_metrics()["maspo_credit/unaligned_samples"] == 1.0


def test_other_estimators_pass_through():
    from verl.trainer.ppo import ray_trainer

    data, _ = batch()
    trainer.pop_credit_metrics()
    out = ray_trainer.compute_advantage(data, adv_estimator="grpo", config=ALGORITHM)
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    reference, _ = compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    )
    assert torch.equal(out.batch["advantages"], reference)
    assert trainer.pop_credit_metrics() == {}


def test_kl_in_reward_changes_the_scores_not_the_channel():
    """use_kl_in_reward: veRL's apply_kl_penalty rewrites token_level_rewards; the frame errors still land where
    they did, and the estimator works on the penalised scores."""
    from verl.trainer.ppo import core_algos, ray_trainer

    data, _ = batch()
    data.batch["token_level_scores"] = data.batch.pop("token_level_rewards")
    generator = torch.Generator().manual_seed(0)
    data.batch["old_log_probs"] = -torch.rand(3, 4, generator=generator)
    data.batch["ref_log_prob"] = -torch.rand(3, 4, generator=generator)
    data, kl_metrics = ray_trainer.apply_kl_penalty(data, core_algos.FixedKLController(kl_coef=0.5), kl_penalty="kl")
    assert kl_metrics["actor/reward_kl_penalty"] != 0
    out = ray_trainer.compute_advantage(data, adv_estimator="maspo", config=ALGORITHM)

    scores = data.batch["token_level_rewards"].sum(-1)
    mean, std = scores.mean(), scores.std()
    a = (scores - mean) / (std + 1e-6)
    u = std / (std + 1e-6)
    mask = data.batch["response_mask"].float()
    expected = a.unsqueeze(-1) * mask
    expected[0, 0] += u * (0.5 - 1)
    expected[0, 1] += u * 0.5
    expected[1, 0] += u * 0.5
    expected[1, 2] += u * (0.5 - 1)
    torch.testing.assert_close(out.batch["advantages"], expected)


def test_legacy_compute_advantage_reads_the_units_for_per_unit_credit():
    """``credit_mode=per_unit``: the hook reads ``frame_words`` beside ``frame_errors`` from the legacy batch; a
    response with errors but no units is unaligned."""
    from verl.trainer.ppo import ray_trainer

    data, _ = batch()
    data.non_tensor_batch["frame_errors"] = np.array(["0.2,0.6", "0.6,0.2", "0,0,0"])
    data.non_tensor_batch["frame_words"] = np.array(["0,1", "0,1", ""])
    algorithm = OmegaConf.create(
        {
            "adv_estimator": "maspo",
            "norm_adv_by_std_in_grpo": True,
            "maspo": {"credit_weight": 1.0, "credit_mode": "per_unit"},
        }
    )
    out = ray_trainer.compute_advantage(data, adv_estimator="maspo", config=algorithm)
    a = (torch.tensor([1.0, 0.0, 0.5]) - 0.5) / (0.5 + 1e-6)
    expected = a.unsqueeze(-1).repeat(1, 4) * data.batch["response_mask"]
    unit = 0.2 / (0.2 * 2**0.5 + 1e-6)  # errors (0.2, 0.6): deviation 0.2, std 0.2828
    expected[0, 0] += unit  # unit 0: response 0 erred less (0.2 vs 0.6)
    expected[0, 1] -= unit
    expected[1, 0] -= unit  # the text token between the frames keeps A_1
    expected[1, 2] += unit
    torch.testing.assert_close(out.batch["advantages"], expected)
    assert trainer.pop_credit_metrics()["maspo_credit/unaligned_samples"] == 1.0
