"""Segmenters and segment-id algebra on hand-computed cases, plus invariants on random batches."""

import pytest
import torch

from maspo_base.speech_tokens.layouts import LLASA_1B, MINI_LLASA
from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET as LLASA_CODEC_OFFSET
from maspo_base.speech_tokens.llasa_tokens import TAG_IDS
from maspo_base.speech_tokens.xcodec2_fsq import fsq_digits, fsq_step_distance
from maspo_verl.segmentation import SEGMENTER_REGISTRY, SegmentationInput, register_segmenter, segment_responses
from maspo_verl.segmentation.segment_ids import SegmentLayout, bound_segment_lengths, ids_from_starts, starts_from_ids
from maspo_verl.segmentation.segmenters import FixedWindowParams, FSQDistanceParams, LogProbDropParams, TokenJumpParams

END = 128261  # <|SPEECH_GENERATION_END|>


def ids(rows):
    return torch.tensor(rows)


def canonical_segment_ids(segment_ids, mask):
    """Any labelling renumbered: contiguous runs, 0-based per row, -1 on padding."""
    return ids_from_starts(starts_from_ids(segment_ids, mask), mask)


def bounded(segment_ids, mask, min_len=None, max_len=None):
    """`bound_segment_lengths` on segment ids."""
    return ids_from_starts(bound_segment_lengths(starts_from_ids(segment_ids, mask), mask, min_len, max_len), mask)


def segment_lengths(segment_ids):
    """Length of the segment each token belongs to, 0 on padding (-1 ids)."""
    mask = segment_ids >= 0
    layout = SegmentLayout.from_starts(starts_from_ids(segment_ids, mask), mask)
    lengths = layout.lengths.to(torch.long)
    lengths[0] = 0  # the padding slot
    return layout.broadcast(lengths)


def speech(*codes):
    return [LLASA_CODEC_OFFSET + c for c in codes]


def run(name, params, mask, old_log_prob=None, response_ids=None, **common):
    mask = torch.as_tensor(mask, dtype=torch.bool)
    old = torch.zeros(mask.shape, dtype=torch.float64) if old_log_prob is None else torch.tensor(old_log_prob)
    response_ids = None if response_ids is None else torch.tensor(response_ids)
    inputs = SegmentationInput(old_log_prob=old, response_mask=mask, response_ids=response_ids)
    return segment_responses(inputs, name, params, **common)


def test_fixed_windows_follow_response_positions_and_stop_at_padding():
    out = run("fixed", FixedWindowParams(window=2), [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 1, 1], [0] * 5])
    # windows {0,1} {2,3} {4}; in row 3 the masked position 2 closes a window, position 3 opens one
    assert out.tolist() == [[0, 0, 1, 1, 2], [0, 0, 1, -1, -1], [0, 0, -1, 1, 2], [-1] * 5]


def test_logprob_absolute_drops():
    # deltas: -0.1, -1.8 (cut), -0.1, +1.6, -2.5 (cut)
    old = [[-0.1, -0.2, -2.0, -2.1, -0.5, -3.0]]
    out = run("logprob", LogProbDropParams(threshold=1.0, mode="absolute"), [[1] * 6], old)
    assert out.tolist() == [[0, 0, 1, 1, 1, 2]]


def test_logprob_zscore_uses_each_responses_own_statistics():
    # deltas [0, -3, 0, 0]: mean -0.75, std 1.299 -> z = [0.577, -1.732, 0.577, 0.577]; cut only where z < -1.
    # The second row is the first shifted by -5 nats and padded: same cut, the padding's delta is ignored.
    old = [[0.0, 0.0, -3.0, -3.0, -3.0, 0.0], [-5.0, -5.0, -8.0, -8.0, -8.0, 99.0]]
    mask = [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]]
    out = run("logprob", LogProbDropParams(threshold=1.0), mask, old)
    assert out.tolist() == [[0, 0, 1, 1, 1, -1]] * 2
    assert run("logprob", LogProbDropParams(threshold=2.0), mask, old).tolist() == [[0, 0, 0, 0, 0, -1]] * 2


def test_token_jump_cuts_on_raw_codec_id_difference_and_isolates_non_speech():
    tokens = [speech(5, 8, 100, 101) + [END, 0], speech(7) + [500] + speech(7, 7) + [END, 0]]
    mask = [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]]
    out = run("token_jump", TokenJumpParams(threshold=10), mask, response_ids=tokens)
    # row 1: |3| keep, |92| cut, |1| keep, END alone; row 2: text token 500 alone, speech after it starts anew
    assert out.tolist() == [[0, 0, 1, 1, 2, -1], [0, 1, 2, 2, 3, -1]]


def test_fsq_measures_lattice_steps_not_raw_ids():
    codes = [0, 1, 5, 5 + 16 * 3, 5 + 16 * 3 + 4**7]
    # FSQ L1 steps: 1 (d0), 1 (d1), 3 (d2 0->3, cut at threshold 2), 1 (d7)
    tokens = [speech(*codes)]
    out = run("fsq", FSQDistanceParams(threshold=2, metric="l1"), [[1] * 5], response_ids=tokens)
    assert out.tolist() == [[0, 0, 0, 1, 1]]
    # raw id differences 1, 4, 48, 16384: token_jump at 40 cuts at the d2 step and at the one-level d7 step
    jumps = run("token_jump", TokenJumpParams(threshold=40), [[1] * 5], response_ids=tokens)
    assert jumps.tolist() == [[0, 0, 0, 1, 2]]
    # l2 in code units: the d2 step is 1.5 > 1.2; changed_dims counts 1 everywhere
    assert run("fsq", FSQDistanceParams(1.2, "l2"), [[1] * 5], response_ids=tokens).tolist() == [[0, 0, 0, 1, 1]]
    assert run("fsq", FSQDistanceParams(0.5, "changed_dims"), [[1] * 5], response_ids=tokens).tolist() == [
        [0, 1, 2, 3, 4]
    ]


def test_fsq_on_the_mini_llasa_layout_uses_its_own_lattice():
    """mini-llasa: codes at 113.., FSQ 5 dims x 4 levels (`FsqLattice.step_distance`, not XCodec2's fused tables)."""
    lattice, offset = MINI_LLASA.fsq, MINI_LLASA.offset
    digits = [
        (0, 0, 0, 0, 0),
        (1, 0, 0, 0, 0),
        (1, 3, 0, 0, 0),
        (1, 3, 0, 0, 0),
        None,
        (3,) * 5,
        (2, 3, 3, 3, 3),
        (2,) * 5,
    ]
    tokens = [[MINI_LLASA.end_id if d is None else offset + lattice.code_of(d) for d in digits] + [0]]
    assert tokens == [[113, 114, 126, 126, 12, 1136, 1135, 795, 0]]
    mask = [[1] * 8 + [0]]

    def cuts(threshold, metric):
        inputs = SegmentationInput(
            torch.zeros(1, 9), torch.tensor(mask, dtype=torch.bool), torch.tensor(tokens), MINI_LLASA
        )
        return segment_responses(inputs, "fsq", FSQDistanceParams(threshold, metric)).tolist()

    # l1 level steps 1, 3, 0, (END alone), 1, 4; threshold 2.5 cuts the 3 and the 4
    assert cuts(2.5, "l1") == [[0, 0, 1, 1, 2, 3, 3, 4, -1]]
    # l2 in code units (h = 2): 0.5, 1.5, 0, 0.5, 1.0; a step equal to the threshold does not cut
    assert cuts(1.0, "l2") == [[0, 0, 1, 1, 2, 3, 3, 3, -1]]
    # changed dims 1, 1, 0, 1, 4
    assert cuts(1, "changed_dims") == [[0, 0, 0, 0, 1, 2, 2, 3, -1]]
    # the same ids read as Llasa-1B's are text: every token its own segment
    llasa = SegmentationInput(torch.zeros(1, 9), torch.tensor(mask, dtype=torch.bool), torch.tensor(tokens))
    assert segment_responses(llasa, "fsq", FSQDistanceParams(2.5, "l1")).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, -1]]


def test_fsq_refuses_a_layout_without_a_lattice():
    plain = MINI_LLASA.replace(codebook_size=1000, fsq_levels=None)
    inputs = SegmentationInput(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), torch.tensor([[113, 114]]), plain)
    with pytest.raises(ValueError, match="layout 'mini-llasa' declares no fsq_levels \\(codebook_size 1000\\)"):
        segment_responses(inputs, "fsq", FSQDistanceParams())


def test_fsq_digits_follow_xcodec2_layout():
    digits = fsq_digits(torch.tensor([43690, 1, 4**7, 65535]))
    assert digits[0].tolist() == [2] * 8  # the all-zero code
    assert digits[1].tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
    assert digits[2].tolist() == [0] * 7 + [1]
    assert digits[3].tolist() == [3] * 8


@pytest.mark.parametrize("metric", ["l1", "l2", "changed_dims"])
def test_fsq_table_distance_equals_digit_distance(metric):
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 65536, (2, 4096), generator=generator)
    step = (fsq_digits(a) - fsq_digits(b)).abs()
    expected = {
        "l1": step.sum(-1).float(),
        "l2": (step.float() / 2).pow(2).sum(-1).sqrt(),
        "changed_dims": (step > 0).sum(-1).float(),
    }[metric]
    torch.testing.assert_close(fsq_step_distance(a, b, metric), expected)


def test_codec_vocabulary_checks_a_tokenizer():
    class Tokenizer:
        def __init__(self, offset):
            self.offset = offset

        def convert_tokens_to_ids(self, token):
            return TAG_IDS.get(token) or self.offset + int(token[len("<|s_") : -2])

    LLASA_1B.check_tokenizer(Tokenizer(LLASA_CODEC_OFFSET))
    with pytest.raises(ValueError, match="maps <\\|s_0\\|> to id 128000.*codec.offset"):
        LLASA_1B.check_tokenizer(Tokenizer(128000))


def test_max_len_splits_into_balanced_pieces():
    segment_ids = ids([[0] * 7 + [1] * 3])
    mask = torch.ones(1, 10, dtype=torch.bool)
    out = bounded(segment_ids, mask, max_len=3)
    # 7 tokens -> 3 pieces of 3, 2, 2; the 3-token segment stays whole
    assert out.tolist() == [[0, 0, 0, 1, 1, 2, 2, 3, 3, 3]]


def test_min_len_merges_forward_then_trailing_backward():
    mask = torch.ones(2, 8, dtype=torch.bool)
    # lengths [1, 1, 3, 1, 2]: the two leading singles join the 3 (5); the single joins the final 2 (3)
    first = [0, 1, 2, 2, 2, 3, 4, 4]
    # lengths [3, 4, 1]: the trailing single has nothing after it and joins the 4
    second = [0, 0, 0, 1, 1, 1, 1, 2]
    out = bounded(ids([first, second]), mask, min_len=2)
    assert out.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]]


def test_min_len_never_merges_across_padding():
    mask = torch.tensor([[1, 1, 1, 0, 1, 1, 1, 1]], dtype=torch.bool)
    out = bounded(ids([[0, 0, 1, -1, 2, 3, 3, 3]]), mask, min_len=2)
    assert out.tolist() == [[0, 0, 0, -1, 1, 1, 1, 1]]


def test_common_options_through_segment_responses():
    out = run("fixed", FixedWindowParams(window=1), [[1] * 7], min_len=2, max_len=4)
    assert segment_lengths(out)[0].tolist() == [4, 4, 4, 4, 3, 3, 3]


def test_random_batches_keep_every_invariant():
    generator = torch.Generator().manual_seed(0)
    batch, width = 64, 40
    mask = torch.rand(batch, width, generator=generator) > 0.15
    mask[:8, 20:] = False
    raw = torch.randint(0, 6, (batch, width), generator=generator)
    for min_len, max_len in [(None, None), (None, 3), (3, None), (2, 5), (3, 6)]:
        segment_ids = canonical_segment_ids(raw, mask)
        if min_len:
            segment_ids = bounded(segment_ids, mask, min_len=min_len)
        if max_len:
            segment_ids = bounded(segment_ids, mask, max_len=max_len)
        assert ((segment_ids == -1) == ~mask).all()
        # ids count up by 0 or 1 along valid tokens; a new id right after padding
        for row in range(batch):
            valid = segment_ids[row][mask[row]]
            if valid.numel():
                steps = valid.diff()
                assert valid[0] == 0 and ((steps == 0) | (steps == 1)).all()
        lengths = segment_lengths(segment_ids)
        if max_len:
            assert lengths.max() <= max_len
        if min_len:
            # a short segment only where the whole run of valid tokens is short
            run_lengths = segment_lengths(canonical_segment_ids(torch.zeros_like(raw), mask))
            short = mask & (lengths < min_len)
            assert (run_lengths[short] < min_len).all()
        # a segment never spans a padded position: consecutive tokens with one id are both valid
        same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] >= 0)
        assert not (same & ~(mask[:, 1:] & mask[:, :-1])).any()


def test_custom_segmenter_registers_and_runs():
    @register_segmenter("test_pairs_of_tokens")
    def pairs(inputs, params):
        return torch.arange(inputs.response_mask.shape[-1]).expand_as(inputs.response_mask) // 2 * 10

    try:
        assert run("test_pairs_of_tokens", None, [[1, 1, 1, 1, 1]]).tolist() == [[0, 0, 1, 1, 2]]
        with pytest.raises(ValueError, match="already registered"):
            register_segmenter("test_pairs_of_tokens")(lambda inputs, params: inputs.response_mask)
    finally:
        SEGMENTER_REGISTRY.pop("test_pairs_of_tokens")


def test_unknown_segmenter_lists_valid_names():
    with pytest.raises(
        ValueError, match=r"unknown segmenter 'nope'.*'fixed', 'fsq', 'heard_words', 'logprob', 'token_jump'"
    ):
        run("nope", None, [[1]])
