"""CTC read-outs (`reward_fns.ctc`): hand-built posteriors with known alignments, and brute force over every path."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from reward_fns.ctc import ctc_nll, forced_align, greedy_units


def peaked(labels: list[int], probs: list[float], vocab: int = 4) -> torch.Tensor:
    """Log-posteriors ``(1, T, vocab)``: frame t gives ``probs[t]`` to ``labels[t]``, the rest shared evenly."""
    out = torch.empty((1, len(labels), vocab), dtype=torch.float64)
    for t, (label, p) in enumerate(zip(labels, probs)):
        out[0, t] = (1 - p) / (vocab - 1)
        out[0, t, label] = p
    return out.log()


def batch(*rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    frames = max(r.shape[1] for r in rows)
    out = torch.full((len(rows), frames, rows[0].shape[2]), math.log(1 / rows[0].shape[2]), dtype=torch.float64)
    for b, r in enumerate(rows):
        out[b, : r.shape[1]] = r[0]
    return out, torch.tensor([r.shape[1] for r in rows])


def test_forced_alignment_of_a_hand_built_utterance():
    # blank, y1, y1, blank, y2, blank: frames 1-2 say unit 0, frame 4 unit 1; blanks belong to the unit before
    log_probs = peaked([0, 1, 1, 0, 2, 0], [0.9, 0.8, 0.6, 0.9, 0.7, 0.9])
    out = forced_align(log_probs, torch.tensor([6]), torch.tensor([[1, 2]]), torch.tensor([2]))
    assert out.frame_units[0].tolist() == [-1, 0, 0, 0, 1, 1]
    assert out.unit_scores[0].tolist() == pytest.approx([0.7, 0.7])  # (0.8 + 0.6) / 2, and 0.7
    assert out.frame_scores[0, 1:].tolist() == pytest.approx([0.7] * 5)
    assert math.isnan(out.frame_scores[0, 0])
    assert bool(out.feasible[0])


def test_a_repeated_unit_needs_a_blank_between_and_too_few_frames_have_no_path():
    log_probs = peaked([1, 1, 1], [0.9, 0.9, 0.9])
    three = forced_align(log_probs, torch.tensor([3]), torch.tensor([[1, 1]]), torch.tensor([2]))
    assert three.frame_units[0].tolist() == [0, 0, 1]  # y1, blank, y1: the middle frame is forced to blank
    assert three.unit_scores[0].tolist() == pytest.approx([0.9, 0.9])
    two = forced_align(log_probs[:, :2], torch.tensor([2]), torch.tensor([[1, 1]]), torch.tensor([2]))
    assert not bool(two.feasible[0])
    assert two.frame_units[0].tolist() == [-1, -1]
    assert torch.isnan(two.unit_scores).all()
    assert math.isinf(float(ctc_nll(log_probs[:, :2], torch.tensor([2]), torch.tensor([[1, 1]]), torch.tensor([2]))))


def _paths(frames: int, vocab: int, target: list[int]):
    """Every frame labelling that collapses to ``target`` (repeats merged, blanks dropped)."""
    for labels in itertools.product(range(vocab), repeat=frames):
        merged = [a for i, a in enumerate(labels) if a != 0 and (i == 0 or labels[i - 1] != a)]
        if merged == target:
            yield labels


@pytest.mark.parametrize("seed", range(6))
def test_viterbi_and_likelihood_equal_brute_force_over_every_path(seed):
    gen = torch.Generator().manual_seed(seed)
    frames, vocab, target = 6, 3, [[1, 2], [2, 2], [1, 2, 1], [1]][seed % 4]
    log_probs = torch.randn((1, frames, vocab), generator=gen, dtype=torch.float64).log_softmax(-1)
    paths = list(_paths(frames, vocab, target))
    scores = [sum(float(log_probs[0, t, a]) for t, a in enumerate(p)) for p in paths]
    best = paths[max(range(len(paths)), key=scores.__getitem__)]
    lengths, targets, target_lengths = torch.tensor([frames]), torch.tensor([target]), torch.tensor([len(target)])
    out = forced_align(log_probs, lengths, targets, target_lengths)
    # the path's frame units: the k-th non-blank run is unit k-1; blanks belong to the unit before
    unit, expected = -1, []
    for t, a in enumerate(best):
        if a != 0 and (t == 0 or best[t - 1] != a):
            unit += 1
        expected.append(unit)
    assert out.frame_units[0].tolist() == expected
    nll = ctc_nll(log_probs, lengths, targets, target_lengths)
    assert float(nll[0]) == pytest.approx(-math.log(sum(math.exp(s) for s in scores)), rel=1e-9)


def test_rows_align_as_if_alone_whatever_their_neighbours():
    gen = torch.Generator().manual_seed(0)
    short = torch.randn((1, 5, 4), generator=gen, dtype=torch.float64).log_softmax(-1)
    long = torch.randn((1, 9, 4), generator=gen, dtype=torch.float64).log_softmax(-1)
    alone = forced_align(short, torch.tensor([5]), torch.tensor([[3, 1]]), torch.tensor([2]))
    log_probs, lengths = batch(long, short)
    both = forced_align(log_probs, lengths, torch.tensor([[1, 2, 3], [3, 1, 0]]), torch.tensor([3, 2]))
    assert both.frame_units[1, :5].tolist() == alone.frame_units[0].tolist()
    assert both.frame_units[1, 5:].tolist() == [-1] * 4  # padding has no unit
    torch.testing.assert_close(both.unit_scores[1, :2], alone.unit_scores[0])
    assert torch.isnan(both.unit_scores[1, 2])


def test_greedy_transcript_merges_repeats_and_drops_blanks_and_padding():
    log_probs, lengths = batch(peaked([1, 1, 0, 1, 2, 2], [0.9] * 6), peaked([3, 0, 3], [0.9] * 3))
    assert greedy_units(log_probs, lengths) == [[1, 1, 2], [3, 3]]
