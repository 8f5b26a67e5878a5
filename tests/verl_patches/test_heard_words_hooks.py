"""The heard words reach the loss: the reward's ``frame_words`` placed on the tokens by the trainer hooks (veRL's own
legacy ``_update_actor`` with its real padding conversion, and the v1 one against an in-memory TransferQueue), carried
through veRL's real ``ppo_loss`` in both micro-batch layouts, and the driver's check of the reward.

One batch by hand: three responses (widths 6, 2, 4) whose frame words are ``0,0,-1,1,1`` (word 0, an unheard
frame, word 1, then the end tag), none (unaligned), ``0,0,0``; with ``heard_words`` (fixed fallback of 5) they cut
into [0 0 | -1 | 1 1 | END], [frame | END], [0 0 0 | END]: 8 segments.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import verl.workers.utils.losses as verl_losses
from loss_helpers import actor_config
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.utils import tensordict_utils as tu

import maspo_verl.verl_plugin  # noqa: F401 - installs the hooks in this process
from maspo_base.frame_words import NOT_A_FRAME, UNALIGNED
from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET, SPEECH_GENERATION_END_ID
from maspo_verl.config import MaspoConfigError
from maspo_verl.loss import compute_policy_loss_maspo
from maspo_verl.loss_inputs import provide_loss_inputs
from maspo_verl.verl_patches import actor, trainer
from maspo_verl.verl_patches.actor import HEARD_WORDS_FIELD
from maspo_verl.verl_patches.reward_signals import heard_words_on_tokens

S, END, N, U = CODEC_OFFSET, SPEECH_GENERATION_END_ID, NOT_A_FRAME, UNALIGNED
PROMPT_LENGTHS = [3, 5, 2]
RESPONSE_LENGTHS = [6, 2, 4]
WIDTH = max(RESPONSE_LENGTHS)
SIGNALS = ["0,0,-1,1,1", "", "0,0,0"]
HEARD = torch.tensor([[0, 0, -1, 1, 1, N], [U, N, N, N, N, N], [0, 0, 0, N, N, N]])
SEGMENTS = 4 + 2 + 2


@pytest.fixture
def batch():
    generator = torch.Generator().manual_seed(0)
    mask = (torch.arange(WIDTH) < torch.tensor(RESPONSE_LENGTHS).unsqueeze(1)).float()
    codes = torch.tensor([[7, 7, 7, 900, 900, -1], [50, -1, 0, 0, 0, 0], [3, 3, 3000, -1, 0, 0]])
    responses = torch.where(codes >= 0, S + codes, torch.full_like(codes, END)) * mask.long()
    prompt_width = max(PROMPT_LENGTHS)
    prompt_mask = (torch.arange(prompt_width) >= prompt_width - torch.tensor(PROMPT_LENGTHS).unsqueeze(1)).long()
    prompts = torch.randint(10, 100, (3, prompt_width), generator=generator) * prompt_mask
    old = -torch.rand(3, WIDTH, generator=generator, dtype=torch.float64) * mask
    new = (old + 0.3 * torch.randn(3, WIDTH, generator=generator, dtype=torch.float64) * mask).requires_grad_()
    advantages = torch.tensor([[1.0], [-0.5], [2.0]], dtype=torch.float64).expand(3, WIDTH) * mask
    return dict(
        prompts=prompts, prompt_mask=prompt_mask, responses=responses, mask=mask, old=old, new=new, adv=advantages
    )


def _flat_log_probs(new):
    """Log-probs as the engine returns them: flat over each sequence's prompt + response, shifted left by one."""
    pieces = []
    for row, (prompt_length, response_length) in enumerate(zip(PROMPT_LENGTHS, RESPONSE_LENGTHS)):
        pieces += [torch.zeros(prompt_length - 1, dtype=new.dtype), new[row, :response_length], torch.zeros(1)]
    return torch.cat([p.to(new.dtype) for p in pieces])


def _loss_config(**maspo):
    return actor_config(segmenter={"name": "heard_words", **maspo.pop("segmenter", {})}, **maspo)


def _direct_loss(b, config):
    with provide_loss_inputs(response_ids=b["responses"], heard_words=HEARD):
        loss, metrics = compute_policy_loss_maspo(
            old_log_prob=b["old"],
            log_prob=b["new"],
            advantages=b["adv"],
            response_mask=b["mask"].bool(),
            loss_agg_mode=config.loss_agg_mode,
            config=config,
        )
    return loss, torch.autograd.grad(loss, b["new"])[0], metrics


def _through_ppo_loss(b, data):
    config = _loss_config()
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(b["mask"].sum()), global_batch_size=3)
    loss, metrics = verl_losses.ppo_loss(config, {"log_probs": _flat_log_probs(b["new"])}, data)
    (grad,) = torch.autograd.grad(loss, b["new"])
    direct_config = _loss_config()
    direct_config.global_batch_info.update(config.global_batch_info)
    expected, expected_grad, _ = _direct_loss(b, direct_config)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
    assert metrics["actor/maspo/segments_per_response"].values[0] == pytest.approx(SEGMENTS / 3)


# ------------------------------------------------------------------------------------------ actor side: ppo_loss


def _nested(tensor, lengths):
    return torch.nested.as_nested_tensor([tensor[i, :n] for i, n in enumerate(lengths)], layout=torch.jagged)


def _padded_micro_batch(b):
    return TensorDict(
        {
            "prompts": b["prompts"],
            "responses": b["responses"],
            "attention_mask": torch.cat([b["prompt_mask"], b["mask"].long()], dim=1),
            "response_mask": b["mask"],
            "old_log_probs": b["old"],
            "advantages": b["adv"],
            HEARD_WORDS_FIELD: HEARD,
        },
        batch_size=[3],
    )


def _nested_micro_batch(b):
    prompts = [b["prompts"][i, -n:] for i, n in enumerate(PROMPT_LENGTHS)]
    return TensorDict(
        {
            "prompts": torch.nested.as_nested_tensor(prompts, layout=torch.jagged),
            "responses": _nested(b["responses"], RESPONSE_LENGTHS),
            "response_mask": _nested(b["mask"], RESPONSE_LENGTHS),
            "old_log_probs": _nested(b["old"], RESPONSE_LENGTHS),
            "advantages": _nested(b["adv"], RESPONSE_LENGTHS),
            HEARD_WORDS_FIELD: _nested(HEARD, RESPONSE_LENGTHS),
        },
        batch_size=[3],
    )


@pytest.mark.parametrize("layout", [_padded_micro_batch, _nested_micro_batch])
def test_heard_words_reach_the_loss_through_verl_ppo_loss(batch, layout):
    _through_ppo_loss(batch, layout(batch))


@pytest.mark.parametrize("layout", [_padded_micro_batch, _nested_micro_batch])
def test_minibatch_segments_are_counted_on_heard_words(batch, layout):
    config = _loss_config(loss_agg_mode="seg-mean")
    assert actor.count_minibatch_segments(config, layout(batch)) == SEGMENTS


def test_a_nested_field_pads_as_no_frame():
    data = TensorDict({HEARD_WORDS_FIELD: _nested(HEARD, RESPONSE_LENGTHS)}, batch_size=[3])
    assert actor.heard_words_of(data).tolist() == HEARD.tolist()
    assert actor.heard_words_of(TensorDict({}, batch_size=[3])) is None


# ------------------------------------------------------------------------------------- trainer side: the driver


def _trainer_config(segmenter="heard_words"):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"multi_turn": {"enable": False}, "temperature": 1.0, "n": 1},
                "actor": {
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                    "ppo_mini_batch_size": 3,
                    "ppo_epochs": 1,
                    "data_loader_seed": 0,
                    "shuffle": False,
                    "policy_loss": {"loss_mode": "maspo", "maspo": {"segmenter": {"name": segmenter}}},
                },
            }
        }
    )


class _Workers:
    """The actor worker group: records what ``update_actor`` receives, returns veRL's metrics shape."""

    def __init__(self):
        self.received = None

    def update_actor(self, data):
        self.received = data
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"mfu": [0.0]}})


def _legacy_batch(b):
    attention_mask = torch.cat([b["prompt_mask"], b["mask"].long()], dim=1)
    tensors = {
        "prompts": b["prompts"],
        "responses": b["responses"],
        "input_ids": torch.cat([b["prompts"], b["responses"]], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "response_mask": b["mask"],
        "old_log_probs": b["old"],
        "advantages": b["adv"],
    }
    non_tensor = {"uid": np.array(["g"] * 3, dtype=object), "frame_words": np.array(SIGNALS)}
    return DataProto(batch=TensorDict(tensors, batch_size=3), non_tensor_batch=non_tensor)


HEARD_METRICS = {
    "maspo_heard/unaligned_samples": 1.0,
    "maspo_heard/words_per_response": 1.5,  # 2 words in row 0, 1 in row 2
    "maspo_heard/unheard_frame_fraction": 1 / 8,  # 1 of their 5 + 3 frames
}


def test_legacy_update_actor_puts_heard_words_in_the_batch_the_loss_reads(batch):
    from verl.trainer.ppo import ray_trainer

    assert getattr(ray_trainer.RayPPOTrainer._update_actor, "__maspo_wrapped__", False)
    workers = _Workers()
    fake = SimpleNamespace(config=_trainer_config(), actor_rollout_wg=workers)
    output = ray_trainer.RayPPOTrainer._update_actor(fake, _legacy_batch(batch))
    data = workers.received  # veRL's own left_right_2_no_padding ran on it
    assert data["input_ids"].is_nested
    assert data[HEARD_WORDS_FIELD].tolist() == HEARD.tolist()
    for key, value in HEARD_METRICS.items():
        assert output.meta_info["metrics"][key] == pytest.approx(value), key
    _through_ppo_loss(batch, data)  # the whole mini-batch as one micro-batch, through veRL's ppo_loss


def test_the_metrics_count_words_not_their_runs():
    from maspo_base.speech_tokens.layouts import LLASA_1B

    # row 0: word 0 cut in two by a text token is still one word; row 1: two unheard frames, no word
    responses = torch.tensor([[S + 1, 7, S + 2, END], [S + 1, S + 2, END, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    words, metrics = heard_words_on_tokens(responses, mask, ["0,0", "-1,-1"], LLASA_1B)
    assert words.tolist() == [[0, N, 0, N], [-1, -1, N, N]]
    assert metrics == {
        "maspo_heard/unaligned_samples": 0.0,
        "maspo_heard/words_per_response": 0.5,
        "maspo_heard/unheard_frame_fraction": 0.5,
    }


def test_legacy_update_actor_adds_nothing_for_other_segmenters(batch):
    from verl.trainer.ppo import ray_trainer

    workers = _Workers()
    fake = SimpleNamespace(config=_trainer_config("fixed"), actor_rollout_wg=workers)
    output = ray_trainer.RayPPOTrainer._update_actor(fake, _legacy_batch(batch))
    assert HEARD_WORDS_FIELD not in workers.received.keys()
    assert not any(key.startswith("maspo_heard/") for key in output.meta_info["metrics"])


class _Queue:
    """An in-memory TransferQueue for one batch: fields by name; a put adds fields and returns the keys' meta."""

    def __init__(self, fields):
        self.fields = fields

    def kv_batch_get(self, keys, partition_id, select_fields):
        return {name: self.fields[name] for name in select_fields}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        self.fields.update({name: fields[name] for name in fields.keys()})
        return KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id=partition_id, fields=sorted(self.fields))


def test_v1_update_actor_writes_heard_words_to_the_queue_for_the_actor(batch, monkeypatch):
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import trainer_base

    assert getattr(trainer_base.PPOTrainer._update_actor, "__maspo_wrapped__", False)
    # a fourth sample pads the batch for data parallelism: unaligned, not counted
    lengths = [*RESPONSE_LENGTHS, 2]
    responses = torch.cat([batch["responses"], torch.tensor([[S + 1, END, 0, 0, 0, 0]])])
    mask = (torch.arange(WIDTH) < torch.tensor(lengths).unsqueeze(1)).float()
    extras = [{"reward_extra_info": {"frame_words": signal}} for signal in SIGNALS] + [{}]
    queue = _Queue(
        {"responses": _nested(responses, lengths), "response_mask": _nested(mask, lengths), "extra_fields": extras}
    )
    monkeypatch.setattr(tq, "kv_batch_get", queue.kv_batch_get)
    monkeypatch.setattr(tq, "kv_batch_put", queue.kv_batch_put)
    tags = [{}, {}, {}, {"is_padding": True}]
    meta = KVBatchMeta(keys=["a", "b", "c", "d"], tags=tags, partition_id="train", fields=["responses"])
    workers, metrics = _Workers(), {}
    fake = SimpleNamespace(config=_trainer_config(), actor_rollout_wg=workers)
    trainer_base.PPOTrainer._update_actor(fake, meta, metrics)

    received = workers.received
    assert HEARD_WORDS_FIELD in received.fields and received.tags == tags  # the actor fetches every named field
    rows = [row.tolist() for row in queue.fields[HEARD_WORDS_FIELD].unbind()]
    assert rows == [HEARD[i, :n].tolist() for i, n in enumerate(RESPONSE_LENGTHS)] + [[U, N]]
    for key, value in HEARD_METRICS.items():
        assert metrics[key] == pytest.approx(value), key
    assert "perf/mfu/actor" in metrics  # veRL's own metrics still there


# ---------------------------------------------------------------------------------- the driver's config check


def _run_config(reward_kwargs=None, path="pkg://reward_fns.verl_reward", segmenter="heard_words", legacy=False):
    config = _trainer_config(segmenter)
    function = {"path": path, "name": "compute_score", "reward_kwargs": reward_kwargs or {}}
    if legacy:
        config.custom_reward_function = function
        config.reward = {"custom_reward_function": {"path": None}}
    else:
        config.reward = {"custom_reward_function": function}
    return config


SEGMENTER_KEY = r"actor_rollout_ref\.actor\.policy_loss\.maspo\.segmenter\.name=heard_words"


def test_a_heard_words_run_needs_a_reward_that_reports_them():
    check = trainer.check_heard_words_reward
    with pytest.raises(MaspoConfigError, match=SEGMENTER_KEY + r".*reward_kwargs\.reward_config\.frame_words=true"):
        check(_run_config({"codec": "/c", "asr": "en=faster_whisper"}))
    with pytest.raises(MaspoConfigError, match=r"reward\.custom_reward_function\.reward_kwargs\.reward_config\."):
        check(_run_config({"reward_config": {"frame_words": False, "frame_errors": True}}))
    with pytest.raises(MaspoConfigError, match=SEGMENTER_KEY + r".*reward\.custom_reward_function\.path is not set"):
        check(_run_config(path=None))
    with pytest.raises(
        MaspoConfigError, match=r"set custom_reward_function\.reward_kwargs\.reward_config\.frame_words"
    ):
        check(_run_config(legacy=True))
    # deploying on Serve from this run: its reward_config is this one
    with pytest.raises(MaspoConfigError, match="frame_words"):
        check(_run_config({"backend": "serve", "serve_app": "speech", "codec": "/c", "asr": "en=faster_whisper"}))

    check(_run_config({"reward_config": {"frame_words": True}}))
    check(_run_config({"reward_config": {"frame_words": True}}, path="/code/reward_fns/verl_reward.py"))
    check(_run_config({"backend": "server", "server_url": "http://reward:8765"}))  # the server's flags decide
    check(_run_config({"backend": "serve", "serve_app": "speech"}))  # attached to a running application: the same
    check(_run_config(path="pkg://my_lab.rewards"))  # another reward may report frame_words itself
    check(_run_config(segmenter="fixed"))  # no heard words needed: nothing checked


def test_the_wrapped_validate_config_runs_the_check():
    from verl.utils import config as verl_config

    with pytest.raises(MaspoConfigError, match=SEGMENTER_KEY):
        config = _run_config({"codec": "/c", "asr": "en=faster_whisper"})  # in process, frame_words not asked for
        verl_config.validate_config(config, use_reference_policy=False, use_critic=False)


def test_the_maspo_heard_method_passes_the_check_and_fails_without_frame_words():
    from omegaconf import open_dict
    from verl.utils import config as verl_config

    from maspo_lab import methods
    from maspo_verl.config import maspo_settings

    method = methods.BUILTIN_METHODS["maspo-heard"]
    config = methods.compose_config(method.overrides)
    kwargs = config.reward.custom_reward_function
    assert kwargs.reward_kwargs.reward_config.frame_words is True
    settings = maspo_settings(config.actor_rollout_ref.actor.policy_loss)
    assert settings.segmenter.name == "heard_words" and settings.segmenter.params.fallback_window == 5
    kwargs.path = "pkg://reward_fns.verl_reward"  # the recipes' reward (the bare ppo_trainer names none)
    with open_dict(kwargs.reward_kwargs):  # in process, its models given: the driver's check of the backend passes
        kwargs.reward_kwargs.update(codec="/c", asr="en=faster_whisper")
    trainer.check_heard_words_reward(config)
    kwargs.reward_kwargs.reward_config.frame_words = False
    with pytest.raises(MaspoConfigError, match=SEGMENTER_KEY + r".*reward_config\.frame_words=true \(got False\)"):
        verl_config.validate_config(config, use_reference_policy=False, use_critic=False)


def test_per_unit_credit_needs_a_reward_that_reports_the_units():
    check = trainer.check_heard_words_reward
    config = _run_config({"codec": "/c", "asr": "en=faster_whisper"}, segmenter="fixed")
    config.algorithm = OmegaConf.create({"adv_estimator": "maspo", "maspo": {"credit_mode": "per_unit"}})
    with pytest.raises(MaspoConfigError, match=r"algorithm\.maspo\.credit_mode=per_unit.*frame_words=true"):
        check(config)
    config.reward.custom_reward_function.reward_kwargs.reward_config = {"frame_words": True}
    check(config)
    config.algorithm.maspo.credit_mode = "redistribute"
    config.reward.custom_reward_function.reward_kwargs.reward_config = {}
    check(config)  # the within-response credit reads frame errors only
