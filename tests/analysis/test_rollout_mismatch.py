"""The rollout-mismatch measurement's pieces (`maspo_lab.analysis.rollout_mismatch`): the fp8 rounding of weights,
the per-level figures against veRL's own token and sequence levels, the length quarters, and the closed forms of the
independent-token extrapolation against a simulation. The measurement itself: docs/rollout-correction.md."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo import rollout_corr_helper as verl_rc

from maspo_lab.analysis.rollout_mismatch import (
    THRESHOLD,
    extrapolate,
    fp8_weights,
    length_bins,
    level_statistics,
    lognormal_figures,
)


def test_fp8_rounding_keeps_the_dtype_and_three_mantissa_bits():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to(torch.bfloat16)
    before = [layer.weight.float().clone() for layer in model if isinstance(layer, torch.nn.Linear)]
    fp8_weights(model)
    for weight, layer in zip(before, [m for m in model if isinstance(m, torch.nn.Linear)], strict=True):
        assert layer.weight.dtype == torch.bfloat16
        big = weight.abs() > weight.abs().max() / 64  # e4m3's normal range below the tensor's scale
        relative = ((layer.weight.float() - weight).abs() / weight.abs())[big]
        assert 0 < float(relative.max()) <= 2**-4 + 2**-8  # round to nearest with 3 mantissa bits (+ bf16's own)


def _batch(seed=0, rows=12, width=30):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 3
    rollout = old - 0.3 * torch.randn(rows, width, generator=generator, dtype=torch.float64)
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width) < lengths.unsqueeze(1)).double()
    return old, rollout, mask


@pytest.mark.parametrize(("level", "verl_level"), [("token", "token"), ("sequence", "sequence")])
def test_the_ends_of_the_levels_are_veRLs(level, verl_level):
    old, rollout, mask = _batch()
    figures = level_statistics(old, rollout, mask, level)
    _, _, metrics = verl_rc.compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_is=verl_level, rollout_is_threshold=THRESHOLD
    )
    assert figures["ess"] == pytest.approx(metrics["rollout_corr/rollout_is_eff_sample_size"], rel=1e-8)
    assert figures["is_std"] == pytest.approx(metrics["rollout_corr/rollout_is_std"], rel=1e-8)
    log_ratio = (old - rollout) * mask
    units = log_ratio[mask.bool()] if level == "token" else log_ratio.sum(-1)
    assert figures["log_weight_std"] == pytest.approx(float(units.std()), rel=1e-10)


def test_length_quarters_partition_the_rows_shortest_first():
    _, _, mask = _batch(rows=10)
    bins = length_bins(mask, 4)
    assert sorted(torch.cat(bins).tolist()) == list(range(10))
    means = [float(mask[index].sum(-1).mean()) for index in bins]
    assert means == sorted(means)


@pytest.mark.parametrize("log_std", [0.05, 0.4, 1.0, 2.5])
def test_the_closed_forms_match_a_simulation(log_std):
    z = np.random.default_rng(0).normal(-(log_std**2) / 2, log_std, 1_000_000)
    weights = np.exp(z)
    truncated = np.minimum(weights, THRESHOLD)
    figures = lognormal_figures(log_std)
    assert figures["mean_weight"] == pytest.approx(truncated.mean(), abs=3e-3)
    assert figures["ess"] == pytest.approx(truncated.mean() ** 2 / (truncated**2).mean(), abs=3e-3)
    assert figures["fraction_truncated"] == pytest.approx((weights > THRESHOLD).mean(), abs=2e-3)
    assert figures["raw_ess"] == pytest.approx(math.exp(-(log_std**2)))


def test_extrapolation_grows_the_spread_with_the_unit_not_the_response():
    rows = extrapolate(0.025)
    by = {(r["length"], r["window"]): r for r in rows}
    assert by[(1500, 25)]["ess"] == by[(150, 25)]["ess"]  # a segment's weight does not see the response's length
    assert by[(1500, "sequence")]["ess"] < by[(500, "sequence")]["ess"] < by[(150, "sequence")]["ess"]
    assert by[(150, 1)]["raw_ess"] == pytest.approx(math.exp(-(0.025**2)))


def test_the_trainer_pads_with_the_checkpoints_pad_id_and_recomputes_the_samplers_log_probs():
    from maspo_lab.analysis.rollout_mismatch import Settings, sample_rollouts, trainer_log_probs
    from maspo_lab.sampler import Sampler, load_model
    from maspo_lab.speaking_model import SHIPPED_MODEL

    model, tokenizer = load_model(SHIPPED_MODEL, "float32", "cpu")
    settings = Settings(texts=2, group=1, max_seconds=0.2)
    texts = ["Hi.", "A longer sentence to say."]  # prompts of two lengths: the trainer pads the shorter
    sampled = sample_rollouts(model.eval(), tokenizer, texts, settings)
    assert sampled.pad_id == Sampler(model, tokenizer, 0, 1.0, 1).pad_id == model.generation_config.pad_token_id
    old = trainer_log_probs(model, sampled, settings.temperature)  # the same float32 model: no mismatch
    mask = sampled.mask.bool()
    torch.testing.assert_close(old[mask], sampled.rollout_log_prob[mask], atol=1e-4, rtol=0)
