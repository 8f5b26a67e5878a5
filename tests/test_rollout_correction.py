"""The segment-level rollout correction against veRL's own: one-token segments are its ``token`` level and
``token_kN`` rejection, one segment per response its ``sequence`` level and ``seq_sum_kN`` / ``seq_mean_kN``.

Compared in float64 with veRL's functions (``verl.trainer.ppo.rollout_corr_helper``), on padded batches of varied
lengths (one of length 1) with log-ratios far enough from 0 that the thresholds act; then hand-computed values,
invariance to micro-batch splits and row order, padding, all-masked rows and bf16 inputs.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from verl.trainer.ppo import rollout_corr_helper as verl_rc

from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET
from maspo_verl.config import MaspoConfig
from maspo_verl.rollout_correction import (
    SEGMENT_RS_OPTIONS,
    compute_rollout_correction,
    segment_is_weights,
    split_rejection_options,
)

WIDTH = 12
ONE_TOKEN, WHOLE = 1, 1000
"""Fixed windows of one token (veRL's token level) and longer than any response (its sequence level)."""


def batch(rows=8, width=WIDTH, scale=0.4, seed=0, dtype=torch.float64, lengths=None):
    """Trainer and rollout log-probs and a right-padded mask of varied lengths (the first full, the last 1 token)."""
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=generator, dtype=dtype) * 3
    rollout = old - scale * torch.randn(rows, width, generator=generator, dtype=dtype)
    if lengths is None:
        lengths = torch.randint(1, width + 1, (rows,), generator=generator)
        lengths[0], lengths[-1] = width, 1
    mask = (torch.arange(width) < torch.as_tensor(lengths).unsqueeze(1)).to(dtype)
    return old, rollout, mask


def layout(old, mask, window=None, segmenter=None, response_ids=None):
    block = segmenter or {"name": "fixed", "window": window}
    return MaspoConfig.from_mapping({"segmenter": block}).segment_layout(old, mask, response_ids)


def verl(old, rollout, mask, **settings):
    proto, new_mask, metrics = verl_rc.compute_rollout_correction_and_rejection_mask(old, rollout, mask, **settings)
    return (proto.batch["rollout_is_weights"] if proto is not None else None), new_mask, metrics


def ours(old, rollout, mask, window=None, **settings):
    return compute_rollout_correction(old, rollout, mask, layout(old, mask, window), **settings)


IS_KEYS = ("mean", "std", "eff_sample_size", "seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation")
"""veRL's IS metrics that every level defines alike (token-weighted and per response)."""


@pytest.mark.parametrize("threshold", [2.0, "0.5_2.0", "1.5"])
def test_one_token_segments_are_verls_token_level(threshold):
    old, rollout, mask = batch(scale=0.6, seed=1)
    expected, _, verl_metrics = verl(old, rollout, mask, rollout_is="token", rollout_is_threshold=threshold)
    weights, new_mask, metrics = ours(
        old, rollout, mask, ONE_TOKEN, rollout_is="segment", rollout_is_threshold=threshold
    )
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-15)
    assert torch.equal(new_mask, mask)
    keys = [*IS_KEYS, "ratio_fraction_high", "ratio_fraction_low"] + (["oob_ratio"] if "_" in str(threshold) else [])
    for key in keys:
        name = f"rollout_corr/rollout_is_{key}"
        assert metrics[name] == pytest.approx(verl_metrics[name], rel=1e-9, abs=1e-12), (
            key
        )  # veRL divides by count + 1e-8
    assert metrics["rollout_corr/rollout_is_mean_segment_length"] == 1.0
    # the thresholds act on this batch
    assert 0 < verl_metrics["rollout_corr/rollout_is_ratio_fraction_high"] < 1
    # veRL's off-policy metrics ride along
    assert metrics["rollout_corr/kl"] == verl_metrics["rollout_corr/kl"]


@pytest.mark.parametrize("threshold", [2.0, "0.5_2.0", 8.0])
@pytest.mark.parametrize("window", [WIDTH, WHOLE])
def test_one_segment_per_response_is_verls_sequence_level(threshold, window):
    old, rollout, mask = batch(scale=0.3, seed=2)
    expected, _, verl_metrics = verl(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=threshold)
    weights, _, metrics = ours(old, rollout, mask, window, rollout_is="segment", rollout_is_threshold=threshold)
    torch.testing.assert_close(weights, expected, rtol=1e-14, atol=1e-15)
    is_keys = {key for key in verl_metrics if key.startswith("rollout_corr/rollout_is_")}
    assert is_keys <= set(metrics)
    for key in is_keys:  # every key, max and min (untruncated, in log space) and the fractions over responses too
        assert metrics[key] == pytest.approx(verl_metrics[key], rel=1e-9, abs=1e-12), (
            key
        )  # veRL divides by count + 1e-8
    assert metrics["rollout_corr/rollout_is_segments_per_response"] == 1.0
    assert 0 < verl_metrics["rollout_corr/rollout_is_ratio_fraction_high"] < 1 or threshold == 8.0


def test_geometric_segments_between_token_and_the_geometric_mean_of_the_response():
    old, rollout, mask = batch(scale=0.6, seed=3)
    token, _, _ = verl(old, rollout, mask, rollout_is="token", rollout_is_threshold=2.0)
    weights, _, _ = ours(old, rollout, mask, ONE_TOKEN, rollout_is="segment_geo", rollout_is_threshold=2.0)
    torch.testing.assert_close(weights, token, rtol=0, atol=1e-15)
    # one segment per response: exp of the response's mean log-ratio (veRL's seq_mean_k1 statistic, negated)
    log_ratio = old - rollout
    geometric = torch.exp((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).clamp(max=2.0)
    weights, _, _ = ours(old, rollout, mask, WHOLE, rollout_is="segment_geo", rollout_is_threshold=2.0)
    torch.testing.assert_close(weights, geometric * mask, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize(("window", "level"), [(ONE_TOKEN, "token"), (WHOLE, "sequence")])
def test_batch_normalisation_at_both_ends(window, level):
    old, rollout, mask = batch(scale=0.3, seed=4)
    expected, _, verl_metrics = verl(
        old, rollout, mask, rollout_is=level, rollout_is_threshold=3.0, rollout_is_batch_normalize=True
    )
    weights, _, metrics = ours(
        old, rollout, mask, window, rollout_is="segment", rollout_is_threshold=3.0, rollout_is_batch_normalize=True
    )
    # veRL's mean divides by (count + 1e-8): agreement to 1e-8 relative
    torch.testing.assert_close(weights, expected, rtol=1e-8, atol=1e-14)
    factor = "rollout_corr/rollout_is_batch_norm_factor"
    assert metrics[factor] == pytest.approx(verl_metrics[factor], rel=1e-8)


K_THRESHOLDS = {"k1": "0.6_1.5", "k2": 0.05, "k3": 0.05}


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("how", ["sum", "mean"])
def test_one_token_segment_rejection_is_verls_token_rejection(kind, how):
    old, rollout, mask = batch(scale=0.5, seed=5)
    threshold = K_THRESHOLDS[kind]
    _, expected, verl_metrics = verl(old, rollout, mask, rollout_rs=f"token_{kind}", rollout_rs_threshold=threshold)
    option = f"seg_{how}_{kind}"
    _, new_mask, metrics = ours(old, rollout, mask, ONE_TOKEN, rollout_rs=option, rollout_rs_threshold=threshold)
    assert torch.equal(new_mask, expected)
    assert 0 < verl_metrics["rollout_corr/rollout_rs_masked_fraction"] < 1  # the bounds act
    for key, value in verl_metrics.items():
        if key.startswith(f"rollout_corr/rollout_rs_token_{kind}"):
            mine = key.replace(f"token_{kind}", option)
            assert metrics[mine] == pytest.approx(value, rel=1e-9, abs=1e-12), key  # veRL divides by count + 1e-8
        elif key.startswith("rollout_corr/rollout_rs_"):
            assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key  # veRL divides by count + 1e-8


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("how", ["sum", "mean"])
def test_whole_response_segment_rejection_is_verls_sequence_rejection(kind, how):
    old, rollout, mask = batch(rows=32, scale=0.3, seed=6)
    threshold = {"k1": "0.9_1.1" if how == "mean" else "0.3_3.0", "k2": 0.05 if how == "mean" else 0.4}.get(kind)
    threshold = threshold or (0.05 if how == "mean" else 0.4)
    _, expected, verl_metrics = verl(old, rollout, mask, rollout_rs=f"seq_{how}_{kind}", rollout_rs_threshold=threshold)
    _, new_mask, metrics = ours(
        old, rollout, mask, WHOLE, rollout_rs=f"seg_{how}_{kind}", rollout_rs_threshold=threshold
    )
    # veRL's sequence mean divides by (count + 1e-8): equal masks unless a statistic sits within 1e-9 of a bound
    assert torch.equal(new_mask, expected)
    assert 0 < verl_metrics["rollout_corr/rollout_rs_seq_masked_fraction"] < 1
    for key in ("rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction"):
        assert metrics[f"rollout_corr/{key}"] == pytest.approx(verl_metrics[f"rollout_corr/{key}"], abs=1e-12)
    for stat in ("mean", "max", "min"):
        key = f"rollout_corr/rollout_rs_seq_{how}_{kind}_{stat}"
        assert metrics[key.replace("seq_", "seg_", 1)] == pytest.approx(verl_metrics[key], rel=1e-7), key


def test_segment_and_verl_options_combine_as_veRLs_do():
    old, rollout, mask = batch(rows=16, scale=0.4, seed=7)
    combined = ours(old, rollout, mask, 4, rollout_rs="seg_mean_k1,token_k3", rollout_rs_threshold="0.8_1.25,0.1")
    alone_segment = ours(old, rollout, mask, 4, rollout_rs="seg_mean_k1", rollout_rs_threshold="0.8_1.25")
    alone_token = ours(old, rollout, mask, 4, rollout_rs="token_k3", rollout_rs_threshold=0.1)
    assert torch.equal(combined[1], alone_segment[1] * alone_token[1])
    fraction = 1 - combined[1].sum() / mask.sum()
    assert combined[2]["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(float(fraction), abs=1e-7)
    assert "rollout_corr/rollout_rs_token_k3_mean" in combined[2]
    assert "rollout_corr/rollout_rs_seg_mean_k1_seg_masked_fraction" in combined[2]
    # one threshold for both: k1's single float is its upper bound with 1/upper below, as in veRL
    assert split_rejection_options("seg_sum_k1,seq_mean_k3,seg_sum_k1", 2.0) == (
        [("seq_mean_k3", "2.0")],
        [("seg_sum_k1", "2.0")],
    )


def test_hand_computed_segment_weights_and_rejection():
    # log-ratios of one response of 5 tokens and one of 2, windows of 2: segments {0.1, 0.2}, {-0.5, 0.3}, {0.9};
    # {0.4, -0.1}
    log_ratio = torch.tensor([[0.1, 0.2, -0.5, 0.3, 0.9], [0.4, -0.1, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float64)
    rollout = torch.full_like(log_ratio, -1.0)
    old = rollout + log_ratio
    weights, new_mask, metrics = ours(
        old,
        rollout,
        mask,
        2,
        rollout_is="segment",
        rollout_is_threshold=2.0,
        rollout_rs="seg_mean_k1",
        rollout_rs_threshold="0.7_1.3",
    )
    e = math.exp
    expected = [[e(0.3), e(0.3), e(-0.2), e(-0.2), 2.0], [e(0.3), e(0.3), 0, 0, 0]]  # exp(0.9) > 2: truncated
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float64))
    # seg_mean_k1 keeps -mean in [log 0.7, log 1.3] = [-0.357, 0.262]: 0.9 (-0.9) is dropped, the rest stay
    assert new_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 4)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(e(0.9))
    assert metrics["rollout_corr/rollout_rs_seg_mean_k1_seg_masked_fraction"] == pytest.approx(1 / 4)
    assert metrics["rollout_corr/rollout_rs_seg_mean_k1_masked_fraction"] == pytest.approx(1 / 7)
    assert metrics["rollout_corr/rollout_is_segments_per_response"] == 2.0
    assert metrics["rollout_corr/rollout_is_mean_segment_length"] == pytest.approx(7 / 4)


SEGMENTERS = [
    {"name": "fixed", "window": 3},
    {"name": "logprob", "threshold": 0.5},
    {"name": "token_jump", "threshold": 300},
    {"name": "fixed", "window": 2, "max_len": 2},
]


def _token_ids(rows, width, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return CODEC_OFFSET + torch.randint(0, 1000, (rows, width), generator=generator)


@pytest.mark.parametrize("segmenter", SEGMENTERS, ids=lambda s: s["name"] + str(s.get("max_len", "")))
def test_invariant_to_micro_batch_splits_and_row_order(segmenter):
    old, rollout, mask = batch(rows=10, scale=0.5, seed=8)
    ids = _token_ids(10, WIDTH)
    settings = dict(
        rollout_is="segment",
        rollout_is_threshold=2.0,
        rollout_rs="seg_sum_k1,seg_mean_k3",
        rollout_rs_threshold="0.5_2.0,0.05",
    )

    def run(rows):
        return compute_rollout_correction(
            old[rows],
            rollout[rows],
            mask[rows],
            layout(old[rows], mask[rows], segmenter=segmenter, response_ids=ids[rows]),
            **settings,
        )

    whole = run(torch.arange(10))
    halves = [run(torch.arange(0, 3)), run(torch.arange(3, 10))]
    for part in (0, 1):
        torch.testing.assert_close(torch.cat([h[part] for h in halves]), whole[part], rtol=0, atol=0)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(1))
    permuted = run(order)
    torch.testing.assert_close(permuted[0], whole[0][order], rtol=0, atol=0)
    torch.testing.assert_close(permuted[1], whole[1][order], rtol=0, atol=0)
    assert 0 < whole[2]["rollout_corr/rollout_rs_masked_fraction"] < 1


def test_padding_values_never_reach_the_weights_and_empty_rows_get_none():
    old, rollout, mask = batch(rows=6, scale=0.4, seed=9, lengths=[12, 5, 0, 1, 7, 0])
    clean = ours(old, rollout, mask, 4, rollout_is="segment", rollout_rs="seg_sum_k2", rollout_rs_threshold=0.5)
    poisoned_old = torch.where(mask.bool(), old, torch.full_like(old, float("nan")))
    poisoned_rollout = torch.where(mask.bool(), rollout, torch.full_like(old, float("inf")))
    dirty = ours(
        poisoned_old, poisoned_rollout, mask, 4, rollout_is="segment", rollout_rs="seg_sum_k2", rollout_rs_threshold=0.5
    )
    torch.testing.assert_close(dirty[0], clean[0], rtol=0, atol=0)
    assert torch.equal(dirty[1], clean[1])
    weights, new_mask, metrics = clean
    assert torch.all(weights[~mask.bool()] == 0) and torch.all(new_mask[~mask.bool()] == 0)
    assert torch.all(weights[[2, 5]] == 0)
    assert all(math.isfinite(v) for k, v in metrics.items() if "rollout_is" in k or "seg_" in k), metrics
    # segments per response count responses with a token only
    assert metrics["rollout_corr/rollout_is_segments_per_response"] == pytest.approx((3 + 2 + 1 + 2) / 4)


def test_a_one_token_response_is_token_sequence_and_segment_alike():
    old, rollout, mask = batch(rows=3, scale=0.8, seed=10, lengths=[1, 1, 1])
    token = verl(old, rollout, mask, rollout_is="token", rollout_is_threshold=2.0)[0]
    sequence = verl(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=2.0)[0]
    for level in ("segment", "segment_geo"):
        weights = ours(old, rollout, mask, 5, rollout_is=level, rollout_is_threshold=2.0)[0]
        torch.testing.assert_close(weights, token, rtol=0, atol=1e-15)
        torch.testing.assert_close(weights, sequence, rtol=0, atol=1e-15)


def test_an_all_masked_batch_is_refused_as_veRL_refuses_it():
    old, rollout, mask = batch(rows=2, lengths=[0, 0])
    with pytest.raises(ValueError, match="at least one valid token"):
        ours(old, rollout, mask, 4, rollout_is="segment")


def test_bf16_log_probs_are_summed_in_float32():
    old64, rollout64, mask = batch(rows=8, width=64, scale=0.05, seed=11)
    old, rollout = old64.bfloat16(), rollout64.bfloat16()
    seg = layout(old.float(), mask.float(), 16)
    weights, new_mask, metrics = compute_rollout_correction(
        old,
        rollout,
        mask.bfloat16(),
        seg,
        rollout_is="segment",
        rollout_rs="seg_mean_k1",
        rollout_rs_threshold="0.98_1.02",
    )
    assert weights.dtype == torch.float32 and new_mask.dtype == torch.bfloat16
    reference = segment_is_weights(old.float() - rollout.float(), mask.float(), seg, "segment", 2.0)[0]
    torch.testing.assert_close(weights, reference, rtol=0, atol=0)
    assert torch.isfinite(weights).all() and all(math.isfinite(v) for v in metrics.values())


def test_a_segment_mode_without_segments_is_an_error():
    old, rollout, mask = batch(rows=2)
    with pytest.raises(ValueError, match="need the segments"):
        compute_rollout_correction(old, rollout, mask, None, rollout_is="segment")
    assert set(SEGMENT_RS_OPTIONS) == {f"seg_{h}_k{n}" for h in ("sum", "mean") for n in (1, 2, 3)}


VERL_FUNCTIONS = {
    "compute_rollout_correction_and_rejection_mask": (
        "old_log_prob",
        "rollout_log_prob",
        "response_mask",
        "rollout_is",
        "rollout_is_threshold",
        "rollout_is_batch_normalize",
        "rollout_rs",
        "rollout_rs_threshold",
    ),
    "compute_is_metrics": (
        "rollout_is_weights",
        "raw_rollout_is_weights",
        "log_ratio_for_metrics",
        "response_mask",
        "rollout_is",
        "rollout_is_threshold",
        "rollout_is_threshold_lower",
    ),
    "compute_rs_metrics": (
        "option_name",
        "rs_statistic",
        "response_mask",
        "seq_valid_mask",
        "level",
        "per_sequence_values",
        "rollout_rs_threshold",
        "rollout_rs_threshold_lower",
        "apply_lower_threshold",
    ),
    "_parse_rollout_is_threshold": ("threshold_spec",),
    "_parse_rollout_rs_thresholds": ("options", "threshold_spec"),
}
"""veRL's functions the segment correction calls (two of them private): a veRL upgrade that reshapes one fails
here first, as the patched targets do in tests/verl_patches/test_targets.py."""


@pytest.mark.parametrize("name", sorted(VERL_FUNCTIONS))
def test_the_verl_functions_called_keep_their_parameters(name):
    assert tuple(inspect.signature(getattr(verl_rc, name)).parameters) == VERL_FUNCTIONS[name]


@pytest.mark.parametrize("segmenter", SEGMENTERS, ids=lambda s: s["name"] + str(s.get("max_len", "")))
def test_the_gpus_static_layout_gives_the_same_correction(segmenter, monkeypatch):
    # off the CPU the layout has B T + 1 slots and padding scatters into the segment before it with weight 0
    from maspo_verl.segmentation import segment_ids as layout_module

    old, rollout, mask = batch(rows=6, scale=0.5, seed=12, lengths=[12, 5, 0, 1, 7, 9])
    ids = _token_ids(6, WIDTH, seed=3)
    settings = dict(
        rollout_is="segment",
        rollout_is_threshold="0.6_1.6",
        rollout_is_batch_normalize=True,
        rollout_rs="seg_sum_k1,seg_mean_k3",
        rollout_rs_threshold="0.5_2.0,0.05",
    )
    results = {}
    for free in (True, False):
        monkeypatch.setattr(layout_module, "host_reads_are_free", lambda device, free=free: free)
        segments = layout(old, mask, segmenter=segmenter, response_ids=ids)
        assert segments.num_slots == (segments.num_segments + 1 if free else old.numel() + 1)
        results[free] = compute_rollout_correction(old, rollout, mask, segments, **settings)
    torch.testing.assert_close(results[False][0], results[True][0], rtol=1e-14, atol=1e-15)
    assert torch.equal(results[False][1], results[True][1])
    assert results[False][2].keys() == results[True][2].keys()
    for key, value in results[True][2].items():
        assert results[False][2][key] == pytest.approx(value, rel=1e-12, abs=1e-14), key
