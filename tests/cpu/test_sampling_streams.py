"""Per-request sampling streams of the `hf` rollout: the hash, the uniforms, and draws that follow the distribution."""

from __future__ import annotations

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from maspo_verl.cpu.sampling_streams import StreamSampler, request_stream, splitmix64, stream_uniforms

MASK = (1 << 64) - 1


def _splitmix64_reference(x: int) -> int:
    """SplitMix64's output function on Python ints, modulo 2**64 (the published constants)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _as_signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def test_splitmix64_on_int64_equals_the_unsigned_reference():
    values = [0, 1, 2, 12345, -1, -(1 << 63), (1 << 63) - 1, 0x0123456789ABCDEF, -0x0123456789ABCDEF]
    got = splitmix64(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [_as_signed(_splitmix64_reference(v & MASK)) for v in values]
    # the first output of SplitMix64 seeded with 0 (the generator adds the constant, then mixes)
    assert _splitmix64_reference(0) == 0xE220A8397B1DCDAF


def test_stream_uniforms_lie_in_the_unit_interval_and_spread_evenly():
    streams = torch.arange(50_000, dtype=torch.int64)
    u = torch.cat([stream_uniforms(streams, step) for step in range(4)])
    assert u.dtype == torch.float64
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    counts = torch.histc(u.float(), bins=10, min=0.0, max=1.0) / u.numel()
    assert counts.sub(0.1).abs().max().item() < 0.005  # 200,000 draws: one bin's sd is 0.0007
    # step t and step t + 1 of a stream, and neighbouring streams, are not correlated
    first, second = stream_uniforms(streams, 0), stream_uniforms(streams, 1)
    assert abs(torch.corrcoef(torch.stack([first, second]))[0, 1].item()) < 0.02
    assert abs(torch.corrcoef(torch.stack([first[:-1], first[1:]]))[0, 1].item()) < 0.02


def test_request_stream_separates_seed_weights_prompt_and_occurrence():
    base = request_stream(0, 0, [5, 6, 7], 0)
    assert request_stream(0, 0, [5, 6, 7], 0) == base
    others = {
        request_stream(1, 0, [5, 6, 7], 0),
        request_stream(0, 1, [5, 6, 7], 0),
        request_stream(0, 0, [5, 6, 8], 0),
        request_stream(0, 0, [5, 6], 0),
        request_stream(0, 0, [5, 6, 7], 1),
    }
    assert base not in others and len(others) == 5
    assert -(1 << 63) <= base < 1 << 63


def _draw(scores: torch.Tensor, rows: int, **sampling) -> torch.Tensor:
    """One draw for each of ``rows`` streams from the same next-token scores; the drawn token per row."""
    sampler = StreamSampler(torch.arange(rows, dtype=torch.int64), **sampling)
    out = sampler(torch.zeros(rows, 1, dtype=torch.long), scores.expand(rows, -1).clone())
    finite = torch.isfinite(out)
    assert finite.sum(dim=1).eq(1).all()  # one token per row is left for greedy decoding to append
    assert out[finite].eq(0).all()
    return out.argmax(dim=1)


def _frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).double() / tokens.numel()


SCORES = torch.tensor([[1.5, -0.5, 0.0, 2.0, -3.0, 0.7]])
ROWS = 40_000  # a frequency's sd is at most 0.0025


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_draws_follow_softmax_at_the_temperature(temperature):
    tokens = _draw(SCORES, ROWS, temperature=temperature)
    expected = torch.softmax(SCORES[0].double() / temperature, dim=-1)
    assert (_frequencies(tokens, 6) - expected).abs().max().item() < 0.01


@pytest.mark.parametrize(("top_k", "top_p"), [(2, 1.0), (0, 0.6), (3, 0.9)])
def test_draws_follow_hfs_own_top_k_and_top_p(top_k, top_p):
    warped = TemperatureLogitsWarper(0.8)(None, SCORES.clone())
    if top_k:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1:
        warped = TopPLogitsWarper(top_p)(None, warped)
    expected = torch.softmax(warped[0].double(), dim=-1)
    tokens = _draw(SCORES, ROWS, temperature=0.8, top_k=top_k, top_p=top_p)
    frequencies = _frequencies(tokens, 6)
    assert frequencies[expected == 0].eq(0).all()  # a token the warpers removed is never drawn
    assert (frequencies - expected).abs().max().item() < 0.01


def test_tokens_without_mass_are_never_drawn_at_either_end_of_the_vocabulary():
    scores = torch.full((1, 9), float("-inf"))
    scores[0, -1] = 0.0  # all mass on the last token
    assert _draw(scores, 5_000, temperature=1.0).eq(8).all()
    scores = torch.tensor([[0.0, 0.0, float("-inf"), 1.0, float("-inf")]])
    tokens = _draw(scores, 20_000, temperature=1.0)
    assert set(tokens.unique().tolist()) == {0, 1, 3}
    # extreme logits: one token far above the rest of a wide vocabulary
    wide = torch.randn(1, 193_800, generator=torch.Generator().manual_seed(0))
    wide[0, 4242] = 1e4
    assert _draw(wide, 64, temperature=1.0).eq(4242).all()


def test_each_step_draws_afresh_and_rows_do_not_depend_on_their_neighbours():
    streams = torch.tensor([11, 22, 33, 44], dtype=torch.int64)
    flat = torch.zeros(4, 50)
    sampler = StreamSampler(streams, temperature=1.0)
    steps = [sampler(torch.zeros(4, 1, dtype=torch.long), flat.clone()).argmax(dim=1) for _ in range(8)]
    assert len({tuple(s.tolist()) for s in steps}) > 1
    # row 2 alone draws what it drew among the others, step by step
    alone = StreamSampler(streams[2:3], temperature=1.0)
    for step in steps:
        assert alone(torch.zeros(1, 1, dtype=torch.long), flat[:1].clone()).argmax().item() == step[2].item()


def test_a_sampler_needs_a_positive_temperature():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        StreamSampler(torch.zeros(1, dtype=torch.int64), temperature=0.0)
