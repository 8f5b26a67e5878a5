"""The segment-level rollout correction over the units the reward heard (``segmenter.name=heard_words``), through
veRL's own driver functions on constructed batches (no Ray): the legacy trainer's ``DataProto`` with the reward's
``frame_words`` in its ``non_tensor_batch``, the v1 trainer's with them in an in-memory TransferQueue.

In float64 against veRL's own levels: one heard unit per response is its ``sequence`` level (and ``seq_sum_k1``),
one heard unit per token its ``token`` level (and ``token_k1``); a response the reward could not align is cut by
the segmenter's ``fallback`` (``response``: one segment; ``fixed`` windows), as in the loss. Every response here is
codec tokens only (an end tag would be a segment of its own). Then the driver's check that the reward reports them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo import rollout_corr_helper

import maspo_verl.verl_plugin  # noqa: F401 - installs the hooks in this process
from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET
from maspo_verl.config import MaspoConfigError
from maspo_verl.verl_patches import rollout_correction as hooks
from maspo_verl.verl_patches import trainer as trainer_hooks

LENGTHS = [12, 7, 1, 12, 4, 9, 3, 12]
ROWS, WIDTH = len(LENGTHS), max(LENGTHS)
RC = "algorithm.rollout_correction"
UNALIGNED_METRIC = "rollout_corr/heard_unaligned_samples"


def one_word(n: int) -> str:
    return ",".join(["0"] * n)


def word_per_frame(n: int) -> str:
    return ",".join(str(k) for k in range(n))


def tensors() -> dict[str, torch.Tensor]:
    """float64 log-probs far enough apart that the thresholds act, a right-padded mask, codec tokens (0 past it)."""
    generator = torch.Generator().manual_seed(1)
    old = -torch.rand(ROWS, WIDTH, generator=generator, dtype=torch.float64) * 3
    rollout = old - 0.35 * torch.randn(ROWS, WIDTH, generator=generator, dtype=torch.float64)
    mask = (torch.arange(WIDTH) < torch.tensor(LENGTHS).unsqueeze(1)).long()
    responses = (CODEC_OFFSET + torch.randint(0, 60000, (ROWS, WIDTH), generator=generator)) * mask
    return {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask, "responses": responses}


def legacy_batch(signals: list[str] | None) -> DataProto:
    non_tensor = {} if signals is None else {"frame_words": np.array(signals, dtype=object)}
    return DataProto(batch=TensorDict(tensors(), batch_size=ROWS), non_tensor_batch=non_tensor)


def block(fallback: str = "fixed", window: int = 5, level: str = "segment", option: str = "seg_sum_k1") -> dict:
    segmenter = {"name": "heard_words", "fallback": fallback, "fallback_window": window}
    return {
        "rollout_is": level,
        "rollout_is_threshold": 2.0,
        "rollout_rs": option,
        "rollout_rs_threshold": "0.4_3.0",
        "bypass_mode": False,
        "segmenter": segmenter,
    }


def veRLs(level: str, option: str):
    """veRL's own ``compute_rollout_correction_and_add_to_batch`` at its level (the plugin's wrapper bypassed)."""
    verl_block = {**block(level=level, option=option), "segmenter": None}
    own = rollout_corr_helper.compute_rollout_correction_and_add_to_batch.__wrapped__
    return own(legacy_batch(None), OmegaConf.create(verl_block))


TOKEN_IS_KEYS = [
    f"rollout_corr/rollout_is_{key}"
    for key in ("mean", "std", "eff_sample_size", "seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation")
    + ("ratio_fraction_high", "ratio_fraction_low")
]
"""veRL's token-level IS metrics the segment level defines alike (its max and min are of the untruncated segment
weights, veRL's token level's of the truncated ones: tests/test_rollout_correction.py)."""


def assert_same_correction(ours, theirs, level: str):
    (out, metrics), (expected, verl_metrics) = ours, theirs
    rtol = 1e-14 if level == "sequence" else 0  # a sum in another order
    torch.testing.assert_close(
        out.batch["rollout_is_weights"], expected.batch["rollout_is_weights"], rtol=rtol, atol=1e-15
    )
    assert torch.equal(out.batch["response_mask"], expected.batch["response_mask"])
    assert out.batch["response_mask"].dtype == torch.long
    keys = [key for key in verl_metrics if key.startswith("rollout_corr/rollout_is_")]
    for key in keys if level == "sequence" else TOKEN_IS_KEYS:
        # veRL takes its fractions in float32 on the trainer's integer mask, and divides per-response means by
        # count + 1e-8 (1e-8 relative on the one-token response)
        assert metrics[key] == pytest.approx(verl_metrics[key], rel=1e-7, abs=1e-12), key
    # the thresholds act on this batch: some weights truncated, some tokens dropped
    assert 0 < verl_metrics["rollout_corr/rollout_is_ratio_fraction_high"] < 1
    assert 0 < verl_metrics["rollout_corr/rollout_rs_masked_fraction"] < 1


def correct(data: DataProto, settings: dict):
    return rollout_corr_helper.compute_rollout_correction_and_add_to_batch(data, OmegaConf.create(settings))


ALL_ALIGNED_CASES = [
    # (frame words of every response, the segmenter's settings, veRL's level and the option it equals)
    ([one_word(n) for n in LENGTHS], {}, "sequence", "seq_sum_k1"),
    ([word_per_frame(n) for n in LENGTHS], {}, "token", "token_k1"),
]


@pytest.mark.parametrize(("signals", "settings", "level", "option"), ALL_ALIGNED_CASES, ids=["sequence", "token"])
def test_heard_units_at_both_ends_are_verls_levels(signals, settings, level, option):
    ours = correct(legacy_batch(signals), block(**settings))
    assert_same_correction(ours, veRLs(level, option), level)
    expected_length = float(np.mean(LENGTHS)) if level == "sequence" else 1.0
    assert ours[1]["rollout_corr/rollout_is_mean_segment_length"] == pytest.approx(expected_length)
    assert ours[1][UNALIGNED_METRIC] == 0.0


UNALIGNED = [1, 4, 6]
"""Responses the reward could not align (its frame words empty, as for an unscored response or no timestamps)."""


def _with_unaligned(signals: list[str]) -> list[str]:
    return ["" if row in UNALIGNED else signal for row, signal in enumerate(signals)]


@pytest.mark.parametrize(
    ("signals", "settings", "level", "option"),
    [
        (_with_unaligned([one_word(n) for n in LENGTHS]), {"fallback": "response"}, "sequence", "seq_sum_k1"),
        (_with_unaligned([word_per_frame(n) for n in LENGTHS]), {"window": 1}, "token", "token_k1"),
        (None, {"fallback": "response"}, "sequence", "seq_sum_k1"),  # the reward reported no frame_words at all
    ],
    ids=["response-fallback", "one-token-windows", "no-frame-words"],
)
def test_unaligned_responses_take_the_segmenters_fallback(signals, settings, level, option):
    ours = correct(legacy_batch(signals), block(**settings))
    assert_same_correction(ours, veRLs(level, option), level)
    assert ours[1][UNALIGNED_METRIC] == (ROWS if signals is None else len(UNALIGNED))


def test_the_fixed_fallback_cuts_windows_by_position():
    # one word per aligned response, windows of 5 for the unaligned ones (MASPO's default fallback)
    signals = _with_unaligned([one_word(n) for n in LENGTHS])
    _, metrics = correct(legacy_batch(signals), block())
    windows = sum(-(-LENGTHS[row] // 5) for row in UNALIGNED)
    assert metrics["rollout_corr/rollout_is_segments_per_response"] == (ROWS - len(UNALIGNED) + windows) / ROWS


class _Fields(dict):
    pass


def test_the_v1_trainer_reads_the_frame_words_from_its_queue(monkeypatch):
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import trainer_base

    # the v1 batch the trainer corrects: its fields from the queue, no responses, no frame words
    fields = tensors()
    data = DataProto(batch=TensorDict({k: v for k, v in fields.items() if k != "responses"}, batch_size=ROWS))
    signals = _with_unaligned([one_word(n) for n in LENGTHS])
    extras = [{"reward_extra_info": {"frame_words": signal}} for signal in signals]
    rows = [row[:n] for row, n in zip(fields["responses"], LENGTHS)]
    nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    fetched = []

    def kv_batch_get(keys, partition_id, select_fields):
        fetched.append(select_fields)
        return _Fields({"responses": nested, "extra_fields": extras})

    monkeypatch.setattr(tq, "kv_batch_get", kv_batch_get)
    settings = block()  # one segment per heard word, windows of 5 where unaligned
    trainer = type("Trainer", (), {"config": OmegaConf.create({"algorithm": {"rollout_correction": settings}})})()
    tags = [{"is_padding": True} if row == UNALIGNED[-1] else {} for row in range(ROWS)]  # a padding sample
    meta = KVBatchMeta(keys=[str(k) for k in range(ROWS)], tags=tags, partition_id="train")
    with hooks.fetched_responses(trainer, meta):
        out, metrics = trainer_base.compute_rollout_correction_and_add_to_batch(data, OmegaConf.create(settings))
    assert fetched == [["responses"], ["extra_fields"]]
    # the legacy trainer's correction of the same responses and frame words, to the last bit
    expected, expected_metrics = correct(legacy_batch(signals), settings)
    assert torch.equal(out.batch["rollout_is_weights"], expected.batch["rollout_is_weights"])
    assert torch.equal(out.batch["response_mask"], expected.batch["response_mask"])
    assert metrics[UNALIGNED_METRIC] == len(UNALIGNED) - 1  # the padding sample not counted
    assert metrics == {**expected_metrics, UNALIGNED_METRIC: len(UNALIGNED) - 1}
    with pytest.raises(RuntimeError, match=rf"{RC}.segmenter.name='heard_words': the batch holds no `responses`"):
        correct(data, settings)  # outside the trainer's hook nothing fetched the token ids


# ------------------------------------------------------------------------------ the driver: settings and reward


def _config(reward_config: dict, correction: dict, loss: dict | None = None):
    reward_kwargs = {"codec": "/c", "asr": "en=faster_whisper", "reward_config": reward_config}
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"actor": {"policy_loss": loss or {"loss_mode": "vanilla"}}},
            "algorithm": {"adv_estimator": "grpo", "rollout_correction": correction},
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://reward_fns.verl_reward",
                    "name": "compute_score",
                    "reward_kwargs": reward_kwargs,
                }
            },
        }
    )


def test_a_correction_over_heard_words_needs_a_reward_that_reports_them():
    check = trainer_hooks.check_heard_words_reward
    with pytest.raises(MaspoConfigError, match=rf"{RC}\.segmenter\.name=heard_words .*frame_words=true \(got None\)"):
        check(_config({}, block()))
    check(_config({"frame_words": True}, block()))
    check(_config({}, {**block(), "segmenter": {"name": "fixed"}}))  # nothing heard needed
    check(_config({}, {**block(), "rollout_is": "token", "rollout_rs": None}))  # veRL's own level


def test_a_maspo_heard_run_corrects_over_its_losss_heard_words():
    from maspo_lab import methods
    from maspo_verl.rollout_correction_config import prepare_rollout_correction, segmentation_settings

    overrides = [*methods.BUILTIN_METHODS["maspo-heard"].overrides, f"{RC}.rollout_is=segment"]
    config = methods.compose_config(overrides)
    prepare_rollout_correction(config)  # formerly refused: no heard words in the driver
    settings = segmentation_settings(OmegaConf.to_container(config.algorithm.rollout_correction))
    assert settings.segmenter.name == "heard_words" and settings.segmenter.params.fallback == "fixed"
    assert settings.segmenter.params.fallback_window == 5
