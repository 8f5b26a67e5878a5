"""Token ids reach the MASPO loss through veRL's real `ppo_loss`, in both micro-batch layouts.

The legacy trainer hands `ppo_loss` padded tensors, the v1 trainer nested (jagged) ones; model log-probs arrive
flat over prompt + response tokens either way, and `ppo_loss` narrows the batch before it calls the policy loss.
"""

import pytest
import torch
import verl.workers.engine_workers as engine_workers
import verl.workers.utils.losses as verl_losses
from loss_helpers import actor_config
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from maspo_verl.loss import compute_policy_loss_maspo
from maspo_verl.loss_inputs import provide_loss_inputs
from maspo_verl.segmentation import MissingResponseIdsError
from maspo_verl.verl_patches import actor

OFFSET = 128264
PROMPT_LENGTHS = [3, 5, 2]
RESPONSE_LENGTHS = [6, 2, 4]
WIDTH = max(RESPONSE_LENGTHS)


@pytest.fixture
def micro_batch():
    generator = torch.Generator().manual_seed(0)
    batch = len(RESPONSE_LENGTHS)
    mask = (torch.arange(WIDTH) < torch.tensor(RESPONSE_LENGTHS).unsqueeze(1)).float()
    # codec runs of equal codes with a jump every few tokens, then the end tag
    codes = torch.tensor([[7, 7, 7, 900, 900, -1], [50, -1, 0, 0, 0, 0], [3, 3, 3000, -1, 0, 0]])
    responses = torch.where(codes >= 0, OFFSET + codes, torch.full_like(codes, 128261))
    responses = torch.where(mask.bool(), responses, torch.zeros_like(responses))
    prompts = torch.randint(10, 100, (batch, max(PROMPT_LENGTHS)), generator=generator)
    old = -torch.rand(batch, WIDTH, generator=generator, dtype=torch.float64) * mask
    new = (old + 0.3 * torch.randn(batch, WIDTH, generator=generator, dtype=torch.float64) * mask).requires_grad_()
    advantages = torch.tensor([[1.0], [-0.5], [2.0]], dtype=torch.float64).expand(batch, WIDTH) * mask
    return dict(prompts=prompts, responses=responses, mask=mask, old=old, new=new, advantages=advantages)


def _flat_model_log_probs(new):
    """Log-probs as the engine returns them: flat over each sequence's prompt + response, shifted left by one."""
    pieces = []
    for row, (prompt_length, response_length) in enumerate(zip(PROMPT_LENGTHS, RESPONSE_LENGTHS)):
        pieces += [
            torch.zeros(prompt_length - 1, dtype=new.dtype),
            new[row, :response_length],
            torch.zeros(1, dtype=new.dtype),
        ]
    return torch.cat(pieces)


def _common_non_tensors(td, mask):
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=len(RESPONSE_LENGTHS))
    return td


def padded_layout(b):
    """Legacy trainer: left-padded prompts, right-padded responses, a full attention mask."""
    prompt_width = b["prompts"].shape[1]
    prompt_mask = (torch.arange(prompt_width) >= prompt_width - torch.tensor(PROMPT_LENGTHS).unsqueeze(1)).long()
    td = TensorDict(
        {
            "prompts": b["prompts"],
            "responses": b["responses"],
            "attention_mask": torch.cat([prompt_mask, b["mask"].long()], dim=1),
            "response_mask": b["mask"],
            "old_log_probs": b["old"],
            "advantages": b["advantages"],
        },
        batch_size=[len(RESPONSE_LENGTHS)],
    )
    return _common_non_tensors(td, b["mask"])


def nested_layout(b):
    """v1 trainer: every per-token field a jagged nested tensor of each sample's own length."""

    def nested(tensor, lengths):
        return torch.nested.as_nested_tensor([tensor[i, :n] for i, n in enumerate(lengths)], layout=torch.jagged)

    prompts = [b["prompts"][i, :n] for i, n in enumerate(PROMPT_LENGTHS)]
    td = TensorDict(
        {
            "prompts": torch.nested.as_nested_tensor(prompts, layout=torch.jagged),
            "responses": nested(b["responses"], RESPONSE_LENGTHS),
            "response_mask": nested(b["mask"], RESPONSE_LENGTHS),
            "old_log_probs": nested(b["old"], RESPONSE_LENGTHS),
            "advantages": nested(b["advantages"], RESPONSE_LENGTHS),
        },
        batch_size=[len(RESPONSE_LENGTHS)],
    )
    return _common_non_tensors(td, b["mask"])


def _config():
    return actor_config(segmenter={"name": "token_jump", "threshold": 100}, clip_ratio_low=0.1, clip_ratio_high=0.1)


def test_plugin_wraps_verl_ppo_loss_everywhere_it_is_bound():
    assert verl_losses.ppo_loss is engine_workers.ppo_loss
    assert getattr(verl_losses.ppo_loss, "__maspo_wrapped__", False)
    assert engine_workers.ActorRolloutRefWorker.actor_worker_cls.__maspo_wrapped__
    assert issubclass(engine_workers.ActorRolloutRefWorker.actor_worker_cls, engine_workers.TrainingWorker)


@pytest.mark.parametrize("layout", [padded_layout, nested_layout])
def test_response_ids_reach_the_loss_through_verl_ppo_loss(micro_batch, layout):
    config = _config()
    data = layout(micro_batch)
    loss, metrics = verl_losses.ppo_loss(config, {"log_probs": _flat_model_log_probs(micro_batch["new"])}, data)
    (grad,) = torch.autograd.grad(loss, micro_batch["new"])

    direct_config = _config()
    direct_config.global_batch_info.update(config.global_batch_info)
    with provide_loss_inputs(response_ids=micro_batch["responses"]):
        expected, expected_metrics = compute_policy_loss_maspo(
            old_log_prob=micro_batch["old"],
            log_prob=micro_batch["new"],
            advantages=micro_batch["advantages"],
            response_mask=micro_batch["mask"].bool(),
            loss_agg_mode=config.loss_agg_mode,
            config=direct_config,
        )
    (expected_grad,) = torch.autograd.grad(expected, micro_batch["new"])
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
    # segments from the token ids: [777 | 900 900 | END], [50 | END], [3 3 | 3000 | END]
    segments_per_response = metrics["actor/maspo/segments_per_response"].values[0]
    assert segments_per_response == pytest.approx((3 + 2 + 3) / 3)


@pytest.mark.parametrize("layout", [padded_layout, nested_layout])
def test_without_the_channel_a_token_segmenter_fails_clearly(micro_batch, layout):
    unwrapped_ppo_loss = verl_losses.ppo_loss.__wrapped__
    with pytest.raises(MissingResponseIdsError, match="'token_jump' needs the response token ids"):
        unwrapped_ppo_loss(_config(), {"log_probs": _flat_model_log_probs(micro_batch["new"])}, layout(micro_batch))


@pytest.mark.parametrize("layout", [padded_layout, nested_layout])
def test_minibatch_segment_count_in_both_layouts(micro_batch, layout):
    config = actor_config(segmenter={"name": "token_jump", "threshold": 100}, loss_agg_mode="seg-mean")
    assert actor.count_minibatch_segments(config, layout(micro_batch)) == 3 + 2 + 3
