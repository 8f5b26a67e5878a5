"""The segment-level rollout correction through veRL's own driver functions: ``compute_rollout_correction_and_add_to_
batch`` (both trainers' bindings), the v1 trainer's token ids fetched for it, and ``apply_bypass_mode``."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto

import maspo_verl.verl_plugin  # noqa: F401 - installs the hooks in this process
from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET
from maspo_verl.config import MaspoConfig
from maspo_verl.rollout_correction import compute_rollout_correction
from maspo_verl.segmentation import MissingResponseIdsError
from maspo_verl.verl_patches import rollout_correction as hooks

ROWS, WIDTH = 6, 10
TOKEN_JUMP = {"name": "token_jump", "threshold": 300}


def batch(with_responses: bool = True) -> tuple[DataProto, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(ROWS, WIDTH, generator=generator) * 3
    rollout = old - 0.4 * torch.randn(ROWS, WIDTH, generator=generator)
    mask = (torch.arange(WIDTH) < torch.tensor([10, 7, 1, 10, 4, 9]).unsqueeze(1)).long()
    responses = CODEC_OFFSET + torch.randint(0, 1000, (ROWS, WIDTH), generator=generator)
    tensors = {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask}
    if with_responses:
        tensors["responses"] = responses
    return DataProto(batch=TensorDict(tensors, batch_size=ROWS)), responses


BLOCK = {
    "rollout_is": "segment",
    "rollout_is_threshold": 2.0,
    "rollout_rs": "seg_mean_k1",
    "rollout_rs_threshold": "0.8_1.25",
    "bypass_mode": False,
    "segmenter": TOKEN_JUMP,
}


def expected(data: DataProto, responses: torch.Tensor):
    old, rollout, mask = (data.batch[key] for key in ("old_log_probs", "rollout_log_probs", "response_mask"))
    layout = MaspoConfig.from_mapping({"segmenter": TOKEN_JUMP}).segment_layout(old, mask, responses)
    return compute_rollout_correction(
        old, rollout, mask, layout, "segment", 2.0, False, "seg_mean_k1", rollout_rs_threshold="0.8_1.25"
    )


@pytest.mark.parametrize("module", ["verl.trainer.ppo.rollout_corr_helper", "verl.trainer.ppo.v1.trainer_base"])
def test_segment_modes_are_computed_where_veRL_computes_its_own(module):
    import importlib

    add_to_batch = importlib.import_module(module).compute_rollout_correction_and_add_to_batch
    data, responses = batch()
    weights, mask, metrics = expected(data, responses)
    out, out_metrics = add_to_batch(data, OmegaConf.create(BLOCK))
    torch.testing.assert_close(out.batch["rollout_is_weights"], weights, rtol=0, atol=0)
    assert torch.equal(out.batch["response_mask"], mask) and out.batch["response_mask"].dtype == torch.long
    assert 0 < out_metrics["rollout_corr/rollout_rs_seg_mean_k1_seg_masked_fraction"] < 1
    assert out_metrics == metrics and "rollout_corr/kl" in out_metrics
    # token_jump on random codes: segments of 1-2 tokens, unlike MASPO's default windows of 5
    assert 1.0 <= out_metrics["rollout_corr/rollout_is_mean_segment_length"] < 2.0


def test_veRLs_own_modes_go_to_veRL_unchanged():
    from verl.trainer.ppo import rollout_corr_helper

    block = OmegaConf.create({"rollout_is": "token", "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": 1.05})
    ours, our_metrics = rollout_corr_helper.compute_rollout_correction_and_add_to_batch(batch()[0], block)
    theirs, their_metrics = rollout_corr_helper.compute_rollout_correction_and_add_to_batch.__wrapped__(
        batch()[0], block
    )
    assert torch.equal(ours.batch["rollout_is_weights"], theirs.batch["rollout_is_weights"])
    assert torch.equal(ours.batch["response_mask"], theirs.batch["response_mask"]) and our_metrics == their_metrics


class _Fields(dict):
    pass


def test_the_v1_trainer_fetches_the_token_ids_for_the_segmenter(monkeypatch):
    import transfer_queue as tq

    data, responses = batch(with_responses=False)
    nested = torch.nested.as_nested_tensor([row[:n] for row, n in zip(responses, data.batch["response_mask"].sum(-1))])
    fetched = []

    def kv_batch_get(keys, partition_id, select_fields):
        fetched.append(select_fields)
        return _Fields(responses=nested)

    monkeypatch.setattr(tq, "kv_batch_get", kv_batch_get)
    trainer = type("Trainer", (), {"config": OmegaConf.create({"algorithm": {"rollout_correction": BLOCK}})})()
    meta = type("Batch", (), {"keys": list(range(ROWS)), "partition_id": "train"})()
    with hooks.fetched_responses(trainer, meta):
        out, metrics = hooks.wrap_add_to_batch(lambda *a: None)(data, OmegaConf.create(BLOCK))
    assert fetched == [["responses"]]
    # the nested rows padded with 0 past each response: the segments of the valid tokens are those of the ids
    weights, mask, _ = expected(batch()[0], responses)
    torch.testing.assert_close(out.batch["rollout_is_weights"], weights, rtol=0, atol=0)
    assert torch.equal(out.batch["response_mask"], mask)
    # a segmenter that reads no ids, or veRL's own modes, fetch nothing
    fetched.clear()
    for block in ({**BLOCK, "segmenter": {"name": "fixed"}}, {"rollout_is": "token"}):
        trainer.config = OmegaConf.create({"algorithm": {"rollout_correction": block}})
        with hooks.fetched_responses(trainer, meta):
            pass
    assert fetched == []


def test_token_ids_that_never_arrive_are_named():
    data, _ = batch(with_responses=False)
    with pytest.raises(MissingResponseIdsError, match="token_jump"):
        hooks.wrap_add_to_batch(lambda *a: None)(data, OmegaConf.create(BLOCK))


@pytest.mark.parametrize(("loss_mode", "after"), [("maspo", "maspo"), ("vanilla", "bypass_mode")])
def test_bypass_mode_keeps_the_drivers_maspo(loss_mode, after):
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    data, _ = batch()
    policy_loss = OmegaConf.create({"loss_mode": loss_mode})
    apply_bypass_mode(data, OmegaConf.create({"bypass_mode": True}), policy_loss)
    assert policy_loss.loss_mode == after  # veRL's own behaviour for every other loss
    assert torch.equal(data.batch["old_log_probs"], data.batch["rollout_log_probs"])


def test_credit_and_correction_share_one_fetch_of_the_token_ids(monkeypatch):
    # the v1 trainer's _compute_advantage with adv_estimator=maspo and a correction whose segmenter reads ids: one
    # fetch of `responses` serves both the correction and the credit
    import transfer_queue as tq

    from maspo_verl.verl_patches import trainer as trainer_hooks

    _, responses = batch()
    fetched = []

    def kv_batch_get(keys, partition_id, select_fields):
        fetched.append(select_fields)
        return _Fields(responses=responses, extra_fields=[{} for _ in range(ROWS)])

    monkeypatch.setattr(tq, "kv_batch_get", kv_batch_get)
    algorithm = {"adv_estimator": "maspo", "rollout_correction": BLOCK}
    trainer = type("Trainer", (), {"config": OmegaConf.create({"algorithm": algorithm})})()
    meta = type("Batch", (), {"keys": list(range(ROWS)), "partition_id": "train"})()
    seen = {}

    def compute_advantage(self, batch, metrics):
        seen["correction"] = hooks._RESPONSES.get()
        seen["credit"] = trainer_hooks._v1_credit_fields.get()["responses"]

    trainer_hooks.wrap_v1_compute_advantage(compute_advantage)(trainer, meta, {})
    assert fetched.count(["responses"]) == 1
    assert torch.equal(seen["correction"], responses) and seen["credit"] is seen["correction"]
