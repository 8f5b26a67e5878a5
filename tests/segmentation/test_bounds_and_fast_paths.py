"""The vectorised hot paths against plain references: ``min_len``/``max_len`` on flattened starts, the fused FSQ
boundary lookup, and the batch-wide segment numbering."""

import math

import pytest
import torch

from maspo_base.speech_tokens.layouts import LLASA_1B
from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET
from maspo_base.speech_tokens.xcodec2_fsq import fsq_digits, fsq_far_steps, units_threshold
from maspo_verl.segmentation import SegmentationInput, segment_layout, segmenters
from maspo_verl.segmentation import segment_ids as layout_module
from maspo_verl.segmentation.registry import SEGMENTER_REGISTRY
from maspo_verl.segmentation.segment_ids import SegmentLayout, bound_segment_lengths, canonical_starts
from maspo_verl.segmentation.segmenters import FSQDistanceParams, TokenJumpParams


@pytest.fixture(params=["read_back", "fixed_shape"])
def layout_kind(request, monkeypatch):
    """Both ways of laying out segments: the CPU's (``K`` read back, bounds that list run ends and long segments) and
    a GPU's (tables of the static size ``B T + 1``, bounds in fixed-shape passes), forced here on the CPU."""
    if request.param == "fixed_shape":
        monkeypatch.setattr(layout_module, "host_reads_are_free", lambda device: False)
    return request.param


def reference_bounds(starts: list[bool], mask: list[bool], min_len: int | None, max_len: int | None) -> list[bool]:
    """One row, one segment at a time, as `bound_segment_lengths` describes it."""
    segments = []  # [start, length, opens_run]
    for t, (start, valid) in enumerate(zip(starts, mask)):
        if not valid:
            continue
        if start:
            segments.append([t, 0, t == 0 or not mask[t - 1]])
        segments[-1][1] += 1
    if min_len is not None and min_len > 1:
        groups = []
        for k, segment in enumerate(segments):  # pass 1: a short segment takes the next one in
            if segment[2] or segments[k - 1][1] >= min_len:
                groups.append(list(segment))
            else:
                groups[-1][1] += segment[1]
        merged = []
        for k, group in enumerate(groups):  # pass 2: a short group closing its run joins the one before
            closes_run = k + 1 == len(groups) or groups[k + 1][2]
            if group[2] or not closes_run or group[1] >= min_len:
                merged.append(group)
            else:
                merged[-1][1] += group[1]
        segments = merged
    out = [False] * len(starts)
    for start, length, _ in segments:
        out[start] = True
        if max_len is not None and length > max_len:
            pieces = math.ceil(length / max_len)
            for j in range(1, pieces):
                out[start + math.ceil(j * length / pieces)] = True
    return out


@pytest.mark.parametrize("min_len, max_len", [(2, None), (3, None), (None, 1), (None, 3), (2, 5), (4, 6), (5, 2)])
def test_bounds_equal_a_per_segment_reference_on_random_batches(min_len, max_len, layout_kind):
    generator = torch.Generator().manual_seed((min_len or 0) + 10 * (max_len or 0))  # one seed per case
    for trial in range(40):
        batch, width = (
            int(torch.randint(1, 7, (1,), generator=generator)),
            int(torch.randint(1, 30, (1,), generator=generator)),
        )
        mask = torch.rand(batch, width, generator=generator) > 0.4 * float(torch.rand(1, generator=generator))
        mask[0] = trial % 3 != 0  # an all-masked row every third batch, a full row otherwise
        if batch > 1:
            mask[1] = False
            mask[1, width // 2] = True  # a run of length 1
        raw = torch.rand(batch, width, generator=generator) < float(torch.rand(1, generator=generator))
        starts = canonical_starts(raw, mask)
        got = bound_segment_lengths(starts, mask, min_len, max_len)
        expected = [reference_bounds(s, m, min_len, max_len) for s, m in zip(starts.tolist(), mask.tolist())]
        assert got.tolist() == expected, (trial, starts.tolist(), mask.tolist())


@pytest.mark.parametrize("min_len", [2, 4, 9])
def test_bounds_on_fragmented_masks_equal_the_reference(min_len, layout_kind):
    # runs of one to three tokens: with a larger min_len there are too many run ends to look back from each of
    # them, and min_len takes its second running maximum instead
    mask = torch.tensor([[1, 0, 1, 1, 0, 1, 1, 1, 0] * 4, [0, 1, 1, 0, 1, 0, 1, 1, 1] * 4], dtype=torch.bool)
    raw = torch.rand(mask.shape, generator=torch.Generator().manual_seed(min_len)) < 0.5
    starts = canonical_starts(raw, mask)
    got = bound_segment_lengths(starts, mask, min_len, 2)
    expected = [reference_bounds(s, m, min_len, 2) for s, m in zip(starts.tolist(), mask.tolist())]
    assert got.tolist() == expected


def test_bounds_on_length_one_rows_all_masked_rows_and_empty_batches(layout_kind):
    mask = torch.tensor([[True], [False], [True]])
    starts = canonical_starts(torch.zeros_like(mask), mask)
    assert bound_segment_lengths(starts, mask, 2, 1).tolist() == [[True], [False], [True]]
    empty = torch.zeros(3, 0, dtype=torch.bool)
    assert bound_segment_lengths(empty, empty, 2, 4).shape == (3, 0)
    nothing = torch.zeros(2, 5, dtype=torch.bool)
    assert not bound_segment_lengths(nothing, nothing, 2, 3).any()


def reference_fsq_starts(token_ids: torch.Tensor, threshold: float, metric: str) -> torch.Tensor:
    """Digits of each id, the metric on consecutive codec tokens, every non-codec token a segment of its own."""
    codes = token_ids - CODEC_OFFSET
    is_code = (codes >= 0) & (codes < 65536)
    step = (fsq_digits(codes[:, 1:].clamp(0, 65535)) - fsq_digits(codes[:, :-1].clamp(0, 65535))).abs()
    distance = {
        "l1": step.sum(-1).double(),
        "l2": (step.double() / 2).pow(2).sum(-1).sqrt(),
        "changed_dims": (step > 0).sum(-1).double(),
    }[metric]
    # compare in units as the segmenter does (l2 in squared level steps), free of float rounding at the threshold
    units = step.pow(2).sum(-1) if metric == "l2" else distance.long()
    far = units > (4 * threshold * threshold if metric == "l2" else threshold)
    far = far | ~is_code[:, 1:] | ~is_code[:, :-1]
    return torch.nn.functional.pad(far, (1, 0), value=True)


@pytest.mark.parametrize("metric", ["l1", "l2", "changed_dims"])
@pytest.mark.parametrize("threshold", [0.0, 1.0, 2.5, 4.0, 8.0, 24.0, 300.0])
def test_fused_fsq_boundaries_equal_the_digit_reference_on_random_and_extreme_ids(metric, threshold):
    generator = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 65536, (6, 257), generator=generator)
    codes[0, :8] = torch.tensor([0, 65535, 0, 43690, 43690, 65535, 65535, 1])  # extremes, the zero code, repeats
    codes[1] = torch.randint(-5, 65541, (257,), generator=generator)  # non-codec ids on both sides of the run
    codes[2, ::3] = codes[2, 1::3][: codes[2, ::3].numel()]  # many near pairs
    token_ids = CODEC_OFFSET + codes
    token_ids[3, 10] = 128261  # <|SPEECH_GENERATION_END|>
    expected = reference_fsq_starts(token_ids, threshold, metric)
    assert torch.equal(fsq_far_steps(token_ids, CODEC_OFFSET, units_threshold(threshold, metric), metric), expected)
    mask = torch.ones_like(token_ids, dtype=torch.bool)
    params = FSQDistanceParams(threshold=threshold, metric=metric)
    fast = segment_layout(SegmentationInput(torch.zeros(codes.shape), mask, token_ids), "fsq", params)
    assert torch.equal(fast.starts, expected)
    # the general path (`FsqLattice.step_distance`, any lattice) agrees, including thresholds beyond the largest
    # distance and non-codec ids on both sides of the run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segmenters, "XCODEC2_FSQ", None)  # no lattice equals it: every layout takes the general path
        general = segment_layout(SegmentationInput(torch.zeros(codes.shape), mask, token_ids), "fsq", params)
    assert torch.equal(general.starts, expected)
    # a codebook smaller than the lattice has no FSQ digits: the layout drops its lattice and the segmenter refuses it
    smaller = LLASA_1B.replace(codebook_size=65535, fsq_levels=None)
    with pytest.raises(ValueError, match="segmenter 'fsq' needs codes with FSQ digits.*codebook_size 65535"):
        segment_layout(SegmentationInput(torch.zeros(codes.shape), mask, token_ids, smaller), "fsq", params)


def test_l2_threshold_above_every_distance_cuts_nowhere():
    # 0 and 65534 are 4 + 7 * 9 = 67 squared level steps apart; a threshold of 8 is 256 of them, which must not wrap
    # around in the uint8 units (it once compared as 0 and cut everywhere)
    token_ids = CODEC_OFFSET + torch.tensor([[0, 65534, 0, 65534]])
    mask = torch.ones_like(token_ids, dtype=torch.bool)
    params = FSQDistanceParams(threshold=8.0, metric="l2")
    for fused in (segmenters.XCODEC2_FSQ, None):  # the fused path and the general one
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(segmenters, "XCODEC2_FSQ", fused)
            layout = segment_layout(SegmentationInput(torch.zeros(1, 4), mask, token_ids, LLASA_1B), "fsq", params)
        assert layout.starts.tolist() == [[True, False, False, False]]


def test_layout_numbers_segments_after_the_padding_slot(layout_kind):
    mask = torch.tensor([[1, 1, 1, 0, 1], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    starts = torch.tensor([[1, 0, 1, 0, 1], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    layout = SegmentLayout.from_starts(starts, mask)
    assert layout.num_segments == 5 and int(layout.segment_count) == 5
    assert layout.num_slots == (6 if layout_kind == "read_back" else 16)  # K + 1, or B T + 1
    assert layout.index.tolist() == [[1, 1, 2, 0, 3], [0, 0, 0, 0, 0], [4, 5, 0, 0, 0]]
    empty_slots = [0] * (layout.num_slots - 6)
    # the CPU counts the 1 + 5 + 3 padded tokens in slot 0; elsewhere they add 0 into the segment before them
    padding_slot = 9 if layout_kind == "read_back" else 0
    assert layout.lengths.tolist() == [padding_slot, 2, 1, 1, 1, 1] + empty_slots
    assert layout.segments_per_row.tolist() == [3, 0, 2]
    values = torch.tensor([[1.0, 2.0, 3.0, float("nan"), 5.0], [float("nan")] * 5, [6.0, 7.0, 0.0, 0.0, 0.0]])
    assert layout.sum(values)[1:].tolist() == [3.0, 3.0, 5.0, 6.0, 7.0] + empty_slots
    empty = SegmentLayout.from_starts(torch.zeros(2, 0, dtype=torch.bool), torch.zeros(2, 0, dtype=torch.bool))
    assert empty.num_segments == 0 and empty.segments_per_row.tolist() == [0, 0]


@pytest.mark.parametrize(
    "segmenter, min_len, max_len",
    [("fixed", None, None), ("logprob", 3, None), ("token_jump", None, 4), ("fsq", 2, 16), ("fsq", 9, 20)],
)
def test_segmentation_has_no_data_dependent_shape_off_the_cpu(segmenter, min_len, max_len):
    # The meta device holds shapes and no data: an operation whose output shape depends on the data (nonzero,
    # boolean indexing, bincount, reading K back) cannot run there, as it cannot run on a GPU without waiting.
    batch, width = 3, 40
    inputs = SegmentationInput(
        torch.empty(batch, width, device="meta"),
        torch.empty(batch, width, dtype=torch.bool, device="meta"),
        torch.empty(batch, width, dtype=torch.long, device="meta"),
    )
    params = SEGMENTER_REGISTRY.lookup(segmenter).params()
    layout = segment_layout(inputs, segmenter, params, min_len, max_len)
    assert layout.num_slots == batch * width + 1
    assert layout.lengths.shape == (batch * width + 1,) and layout.index.shape == (batch, width)


@pytest.mark.parametrize("codebook_size", [65536, 4096, 1000])
def test_codec_ids_range_check_by_shift_equals_the_two_sided_check(codebook_size):
    offsets = torch.tensor([-(2**20), -1, 0, 1, 999, 1000, 4095, 4096, 65535, 65536, 2**20])
    offsets = torch.cat([offsets, torch.randint(-70000, 140000, (500,), generator=torch.Generator().manual_seed(1))])
    codes, is_speech = LLASA_1B.replace(codebook_size=codebook_size, fsq_levels=None).codec_ids(CODEC_OFFSET + offsets)
    in_range = (offsets >= 0) & (offsets < codebook_size)
    assert torch.equal(is_speech, in_range)
    assert torch.equal(codes, torch.where(in_range, offsets, 0).int())


@pytest.mark.parametrize("threshold", [0, 3, 4096, 70000])
def test_token_jump_cuts_equal_a_pairwise_reference(threshold):
    generator = torch.Generator().manual_seed(threshold)
    codes = torch.randint(-3, 65539, (5, 200), generator=generator)
    codes[:, 1::2] = (codes[:, 0::2] + torch.randint(-5000, 5000, (5, 100), generator=generator)).clamp(0, 65535)
    token_ids = CODEC_OFFSET + codes
    is_code = (codes >= 0) & (codes < 65536)
    far = ((codes[:, 1:] - codes[:, :-1]).abs() > threshold) | ~is_code[:, 1:] | ~is_code[:, :-1]
    expected = torch.nn.functional.pad(far, (1, 0), value=True)
    mask = torch.ones_like(token_ids, dtype=torch.bool)
    params = TokenJumpParams(threshold=threshold)
    layout = segment_layout(SegmentationInput(torch.zeros(codes.shape), mask, token_ids), "token_jump", params)
    assert torch.equal(layout.starts, expected)
