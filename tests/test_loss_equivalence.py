"""MASPO's limits are veRL's own losses: one-token segments are `vanilla` (GRPO), one segment per response is `gspo`.

Compared in float64, loss and gradients, for every veRL aggregation mode, on padded batches of varied lengths with
ratios far enough from 1 that the clip and the dual clip both act.
"""

import pytest
import torch
from loss_helpers import VERL_AGG_MODES, actor_config, loss_and_grad, random_batch
from torch._dynamo.utils import counters

from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET
from maspo_verl import loss as loss_module
from maspo_verl.loss_inputs import provide_loss_inputs
from maspo_verl.segmentation import segment_ids as layout_module


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
def test_window_one_equals_vanilla(agg):
    old, new, advantages, mask = random_batch(scale=1.2, seed=1)
    config = actor_config(
        clip_ratio=0.2,
        segmenter={"name": "fixed", "window": 1},
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        clip_ratio_c=3.0,
    )
    maspo_loss, maspo_grad, metrics = loss_and_grad("maspo", config, old, new, advantages, mask, agg)
    vanilla_loss, vanilla_grad, vanilla_metrics = loss_and_grad("vanilla", config, old, new, advantages, mask, agg)

    torch.testing.assert_close(maspo_loss, vanilla_loss, rtol=0, atol=1e-14)
    torch.testing.assert_close(maspo_grad, vanilla_grad, rtol=0, atol=1e-14)
    assert metrics["actor/maspo/mean_segment_length"] == 1.0
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert metrics[key] == pytest.approx(vanilla_metrics[key], abs=1e-7), key  # veRL counts in fp32
    # the batch really exercises both clips
    assert 0 < vanilla_metrics["actor/pg_clipfrac"] < 1
    assert vanilla_metrics["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
@pytest.mark.parametrize("window", [12, 1000])
def test_window_at_least_length_equals_gspo(agg, window):
    old, new, advantages, mask = random_batch(scale=0.3, seed=2)
    config = actor_config(
        clip_ratio=0.05,
        segmenter={"name": "fixed", "window": window},
        ratio_length_exponent=1.0,
        clip_ratio_low=0.05,
        clip_ratio_high=0.05,
        clip_length_exponent=0.0,
        clip_ratio_c=None,
    )
    maspo_loss, maspo_grad, metrics = loss_and_grad("maspo", config, old, new, advantages, mask, agg)
    gspo_loss, gspo_grad, gspo_metrics = loss_and_grad("gspo", config, old, new, advantages, mask, agg)

    torch.testing.assert_close(maspo_loss, gspo_loss, rtol=0, atol=1e-14)
    torch.testing.assert_close(maspo_grad, gspo_grad, rtol=0, atol=1e-14)
    assert metrics["actor/maspo/segments_per_response"] == 1.0
    assert metrics["actor/pg_clipfrac"] == pytest.approx(gspo_metrics["actor/pg_clipfrac"], abs=1e-7)
    assert 0 < gspo_metrics["actor/pg_clipfrac"] < 1


def sequence_objective(old, new, advantages, mask, exponent, low, high, agg):
    """P-GSPO's objective written out, its gradient by autograd: ``s_i = exp(sum_t d_t / L_i**p)`` with nothing
    detached, every token of response i carrying ``-min(s_i A_i, clip(s_i, 1 - low, 1 + high) A_i)``, aggregated by
    veRL's ``agg_loss``."""
    from verl.trainer.ppo.core_algos import agg_loss

    lengths = mask.sum(dim=-1, keepdim=True)
    ratio = torch.exp(((new - old) * mask).sum(dim=-1, keepdim=True) / lengths.pow(exponent))
    per_token = -torch.minimum(ratio * advantages, ratio.clamp(1 - low, 1 + high) * advantages)
    loss = agg_loss(loss_mat=per_token, loss_mask=mask, loss_agg_mode=agg)
    (grad,) = torch.autograd.grad(loss, new)
    return loss.detach(), grad


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0])
def test_one_segment_with_a_length_exponent_is_the_sequence_objective(agg, exponent):
    """One segment per response with ``ratio_length_exponent`` p has the loss and the exact gradient of P-GSPO's
    sequence objective (p = 1: GSPO's, p = 0: the sequence ratio's), in every aggregation mode."""
    old, new, advantages, mask = random_batch(scale=0.3, seed=4)
    settings = dict(clip_ratio_low=0.1, clip_ratio_high=0.1, clip_length_exponent=0.0, clip_ratio_c=None)
    config = actor_config(segmenter={"name": "fixed", "window": 1000}, ratio_length_exponent=exponent, **settings)
    maspo_loss, maspo_grad, metrics = loss_and_grad("maspo", config, old, new, advantages, mask, agg)
    loss, grad = sequence_objective(old, new, advantages, mask, exponent, 0.1, 0.1, agg)

    torch.testing.assert_close(maspo_loss, loss, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(maspo_grad, grad, rtol=1e-12, atol=1e-14)
    assert 0 < metrics["actor/pg_clipfrac"] < 1  # some responses clipped, some not


def test_the_p_gspo_method_is_the_sequence_objective_at_its_exponent():
    """``p-gspo`` (its method file) is the sequence objective above at its own p and clip range."""
    from maspo_lab.methods import BUILTIN_METHODS

    method = BUILTIN_METHODS["p-gspo"]
    maspo, agg = method.settings.maspo, method.config["actor_rollout_ref"]["actor"]["loss_agg_mode"]
    old, new, advantages, mask = random_batch(scale=0.3, seed=4)
    maspo_loss, maspo_grad, _ = loss_and_grad(
        "maspo", actor_config(**method.settings.maspo_block), old, new, advantages, mask, agg
    )
    low, high = maspo.clip_ratio_low, maspo.clip_ratio_high
    loss, grad = sequence_objective(old, new, advantages, mask, maspo.ratio_length_exponent, low, high, agg)
    torch.testing.assert_close(maspo_loss, loss, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(maspo_grad, grad, rtol=1e-12, atol=1e-14)
    assert maspo.segmenter.params.window >= mask.shape[-1]


def test_intermediate_window_differs_from_both_limits():
    """A window between 1 and T is neither GRPO nor GSPO: the equivalences above are not vacuous."""
    old, new, advantages, mask = random_batch(scale=0.3, seed=3)
    common = dict(clip_ratio_low=0.05, clip_ratio_high=0.05, clip_length_exponent=0.0, clip_ratio_c=None)
    window3 = loss_and_grad(
        "maspo", actor_config(segmenter={"name": "fixed", "window": 3}, **common), old, new, advantages, mask
    )
    gspo = loss_and_grad("gspo", actor_config(clip_ratio=0.05), old, new, advantages, mask)
    vanilla = loss_and_grad("vanilla", actor_config(clip_ratio=0.05), old, new, advantages, mask)
    assert not torch.allclose(window3[1], gspo[1])
    assert not torch.allclose(window3[1], vanilla[1])


def test_float32_segment_sums_on_long_rows_match_float64():
    """One 8192-token segment per row: the float32 segment log-ratio (a sum of 8192 terms) loses no more than float32
    round-off, so loss and gradient match the float64 computation to 1e-5 relative."""
    old, new, advantages, mask = random_batch(batch=4, width=8192, scale=0.05, seed=5, lengths=[8192, 8000, 5000, 1])
    config = actor_config(segmenter={"name": "fixed", "window": 8192}, clip_ratio_low=0.3, clip_ratio_high=0.3)
    loss64, grad64, _ = loss_and_grad("maspo", config, old, new, advantages, mask)
    new32 = new.detach().float().requires_grad_(True)
    loss32, grad32, _ = loss_and_grad("maspo", config, old.float(), new32, advantages.float(), mask.float())
    assert abs(loss32.double() - loss64) <= 1e-5 * abs(loss64)
    torch.testing.assert_close(grad32.double(), grad64, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize(
    "segmenter, agg, gate",
    [
        ({"name": "fixed", "window": 3}, "token-mean", "clip"),
        ({"name": "logprob", "threshold": 0.5}, "seg-mean", "clip"),
        ({"name": "fsq", "threshold": 4, "min_len": 2, "max_len": 5}, "seq-mean-seg-mean", "clip"),
        ({"name": "token_jump", "threshold": 4096, "min_len": 3, "max_len": 6}, "seg-mean", "sapo"),
    ],
)
def test_static_size_tables_give_the_same_loss_gradient_and_metrics(monkeypatch, segmenter, agg, gate):
    """A GPU's layout (per-segment tables of the static size ``B T + 1``, fixed-shape ``min_len``/``max_len``) and
    the CPU's (``K + 1`` entries, ``K`` read back) give the same loss, gradient and metrics, whichever device runs;
    so does the GPU's layout compiled (``maspo.compile``; here by ``aot_eager``, inductor's CPU code generation being
    unusable on it), as one graph."""
    old, new, advantages, mask = random_batch(batch=6, width=40, scale=0.3, seed=11)
    generator = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 65536, (6, 40), generator=generator)
    codes = torch.where(torch.rand(6, 40, generator=generator) < 0.6, codes[:, :1], codes)  # runs of one code
    response_ids = (CODEC_OFFSET + codes).to(old.device)
    settings = dict(segmenter=segmenter, gate=gate, clip_ratio_low=0.1, clip_ratio_high=0.1, clip_ratio_c=3.0)
    monkeypatch.setitem(loss_module.COMPILE_BACKENDS, "cpu", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    results = {}
    for reads_free, compiled in ((True, False), (False, False), (False, True)):
        monkeypatch.setattr(layout_module, "host_reads_are_free", lambda device, free=reads_free: free)
        config = actor_config(**settings, compile=compiled)
        with provide_loss_inputs(response_ids=response_ids):
            results[reads_free, compiled] = loss_and_grad("maspo", config, old, new, advantages, mask, agg)
    loss, grad, metrics = results[True, False]
    for variant in ((False, False), (False, True)):  # the GPU's layout, eager and compiled
        static_loss, static_grad, static_metrics = results[variant]
        torch.testing.assert_close(static_loss, loss, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(static_grad, grad, rtol=1e-12, atol=1e-15)
        assert static_metrics.keys() == metrics.keys()
        for key, value in metrics.items():
            assert static_metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (key, variant)
    # maspo.compile: the segmentation and the segment tables are one graph, no break
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert gate == "sapo" or metrics["actor/pg_clipfrac"] > 0  # the clip acts, so its flags are exercised
