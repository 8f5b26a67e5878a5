"""The ``heard_words`` segmenter: one segment per word the recogniser heard, per unheard stretch, per non-speech token.

Hand-computed from timed words through the reward's frame words and their place on the tokens to segments, on a
padded batch; the fallback of responses without alignment; its settings through `MaspoConfig.from_mapping` (errors
name the key); the MASPO loss on it by hand; and its limit: one-frame words are one-token segments, veRL's
``vanilla``.
"""

import math

import pytest
import torch
from loss_helpers import VERL_AGG_MODES, actor_config, loss_and_grad, random_batch

from maspo_base.frame_words import NOT_A_FRAME, UNALIGNED, UNHEARD, encode_frame_words, scatter_frame_words
from maspo_base.speech_tokens.layouts import LLASA_1B
from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET, SPEECH_GENERATION_END_ID
from maspo_verl.config import MaspoConfig, MaspoConfigError
from maspo_verl.loss_inputs import provide_loss_inputs
from maspo_verl.segmentation.registry import MissingHeardWordsError, SegmentationInput, get_segmenter
from reward_fns.alignment import TimedWord as W
from reward_fns.alignment import frame_words_from_words

S, END, TEXT = CODEC_OFFSET, SPEECH_GENERATION_END_ID, 7
N, U, H = NOT_A_FRAME, UNALIGNED, UNHEARD


def _batch():
    """Four responses of width 8 (0 pads), their frame-word signals as the reward encodes them."""
    responses = torch.tensor(
        [
            [S + 1, S + 2, S + 3, S + 4, S + 5, S + 6, END, 0],  # aligned: a word, an unheard stretch, a word
            [S + 1, S + 2, S + 3, S + 4, S + 5, END, 0, 0],  # no alignment (unscored)
            [S + 1, S + 2, TEXT, S + 3, S + 4, S + 5, END, 0],  # a text token inside a word
            [S + 1, S + 2, S + 3, END, 0, 0, 0, 0],  # 4 values for 3 frames: no alignment
        ]
    )
    lengths = torch.tensor([7, 6, 7, 4])
    mask = torch.arange(8) < lengths.unsqueeze(1)
    signals = [
        # "hello" 0-0.06 s = frames 0..2; "," is no word; "you" 0.10-0.12 s = frame 5 (index 2 among the words)
        encode_frame_words(
            frame_words_from_words([W("hello", 0.0, 0.06), W(",", 0.06, 0.08), W("you", 0.1, 0.12)], "en", 6)
        ),
        "",
        encode_frame_words(frame_words_from_words([W("one", 0.02, 0.08)], "en", 5)),  # frames 1..3
        "0,0,1,1",
    ]
    return responses, mask, signals


def _heard_words(responses, mask, signals):
    _, is_speech = LLASA_1B.codec_ids(responses)
    words, aligned = scatter_frame_words(signals, is_speech & mask)
    return words, aligned


def _segment_ids(mask, words, **segmenter):
    settings = MaspoConfig.from_mapping({"segmenter": {"name": "heard_words", **segmenter}})
    old = torch.zeros(mask.shape, dtype=torch.float64)
    return settings.segment_layout(old, mask, None, words).segment_ids(mask).tolist()


def test_word_spans_to_frame_words_to_tokens_to_segments():
    responses, mask, signals = _batch()
    assert signals[0] == "0,0,0,-1,-1,2" and signals[2] == "-1,0,0,0,-1"
    words, aligned = _heard_words(responses, mask, signals)
    assert aligned.tolist() == [True, False, True, False]
    assert words.tolist() == [
        [0, 0, 0, H, H, 2, N, N],
        [U, U, U, U, U, N, N, N],
        [H, 0, N, 0, 0, H, N, N],
        [U, U, U, N, N, N, N, N],
    ]
    assert _segment_ids(mask, words) == [
        [0, 0, 0, 1, 1, 2, 3, -1],  # hello | unheard stretch | you | end tag
        [0, 0, 0, 0, 0, 1, -1, -1],  # fallback: windows of 5 by position, end tag alone
        [0, 1, 2, 3, 3, 4, 5, -1],  # unheard | one | text | one (a segment never crosses a text token) | unheard | end
        [0, 0, 0, 1, -1, -1, -1, -1],
    ]


def test_the_fallback_of_responses_without_alignment():
    responses, mask, signals = _batch()
    words, _ = _heard_words(responses, mask, signals)
    fixed2 = _segment_ids(mask, words, fallback="fixed", fallback_window=2)
    whole = _segment_ids(mask, words, fallback="response")
    assert fixed2[1] == [0, 0, 1, 1, 2, 3, -1, -1] and whole[1] == [0, 0, 0, 0, 0, 1, -1, -1]
    assert fixed2[3] == [0, 0, 1, 2, -1, -1, -1, -1] and whole[3] == [0, 0, 0, 1, -1, -1, -1, -1]
    assert fixed2[0] == whole[0] == _segment_ids(mask, words)[0]  # aligned rows do not change


def test_the_common_bounds_apply_to_words():
    # one word of 4 frames and two one-frame words: max_len=2 splits the long word in two, min_len=2 merges the short
    words = torch.tensor([[0, 0, 0, 0, 1, 2, N]])
    mask = torch.ones_like(words, dtype=torch.bool)
    assert _segment_ids(mask, words, max_len=2) == [[0, 0, 1, 1, 2, 3, 4]]
    merged = _segment_ids(mask, words, min_len=2)[0]
    assert merged[:4] == [0, 0, 0, 0] and len(set(merged)) < 5


def test_without_heard_words_the_error_says_how_to_enable_them():
    mask = torch.ones(1, 3, dtype=torch.bool)
    inputs = SegmentationInput(old_log_prob=torch.zeros(1, 3), response_mask=mask, segmenter_name="heard_words")
    segmenter = get_segmenter("heard_words")
    assert segmenter.needs_heard_words and not segmenter.needs_response_ids
    with pytest.raises(MissingHeardWordsError, match=r"reward_config\.frame_words=true.*provide_loss_inputs"):
        segmenter.fn(inputs, segmenter.params())
    wrong = SegmentationInput(old_log_prob=torch.zeros(1, 3), response_mask=mask, heard_words=torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"heard_words has shape \(1, 2\) but response_mask has \(1, 3\)"):
        segmenter.fn(wrong, segmenter.params())


@pytest.mark.parametrize(
    ("segmenter", "message"),
    [
        ({"fallback_window": 0}, r"maspo\.segmenter\.fallback_window: fallback_window must be >= 1, got 0"),
        (
            {"fallback": "words"},
            r"maspo\.segmenter\.fallback='words' is not valid; valid values: \['fixed', 'response'\]",
        ),
        ({"window": 3}, r"maspo\.segmenter: unknown key\(s\) \['window'\] for segmenter 'heard_words'"),
    ],
)
def test_settings_errors_name_the_key(segmenter, message):
    with pytest.raises(MaspoConfigError, match=r"actor_rollout_ref\.actor\.policy_loss\." + message):
        MaspoConfig.from_mapping({"segmenter": {"name": "heard_words", **segmenter}})


# --------------------------------------------------------------------------------------------- the loss, by hand

# One response: 3 frames then the end tag; token log-ratios d = [0.2, 0.0, -0.1, -0.3].
D = [0.2, 0.0, -0.1, -0.3]


def _one_response():
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.5]], dtype=torch.float64)
    new = (old + torch.tensor([D], dtype=torch.float64)).requires_grad_(True)
    return old, new, torch.ones_like(old), torch.ones_like(old)


def _config(**segmenter):
    return actor_config(
        segmenter={"name": "heard_words", **segmenter},
        clip_ratio_low=0.1,
        clip_ratio_high=0.05,
        clip_length_exponent=0.0,
        clip_ratio_c=None,
    )


def test_the_loss_on_heard_words_by_hand():
    # heard: word 0 on frames 0-1, frame 2 unheard, the end tag -> segments [0 1 | 2 | 3]:
    # l = [0.1, -0.1, -0.3], s = [1.105 (clipped at 1.05: no gradient), 0.905 (inside [0.9, 1.05]), 0.741 (below
    # 0.9 but A > 0 keeps min(s, clip(s)) = s)]; token-mean over 4 tokens
    old, new, advantages, mask = _one_response()
    with provide_loss_inputs(heard_words=torch.tensor([[0, 0, H, N]])):
        loss, grad, metrics = loss_and_grad("maspo", _config(), old, new, advantages, mask)
    s1, s2 = math.exp(-0.1), math.exp(-0.3)
    assert loss.item() == pytest.approx(-(1.05 + 1.05 + s1 + s2) / 4, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -s1 / 4, -s2 / 4]], dtype=torch.float64))
    assert metrics["actor/maspo/segments_per_response"] == 3.0
    assert metrics["actor/maspo/clipfrac_high"] == pytest.approx(1 / 3)


def test_the_loss_on_a_response_without_alignment_by_hand():
    # unaligned, fallback=response: the 3 frames are one segment, l = 0.1 / 3, s = 1.034 (inside), the end tag alone
    old, new, advantages, mask = _one_response()
    with provide_loss_inputs(heard_words=torch.tensor([[U, U, U, N]])):
        loss, grad, metrics = loss_and_grad("maspo", _config(fallback="response"), old, new, advantages, mask)
    s0, s1 = math.exp(0.1 / 3), math.exp(-0.3)
    assert loss.item() == pytest.approx(-(3 * s0 + s1) / 4, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-s0 / 4, -s0 / 4, -s0 / 4, -s1 / 4]], dtype=torch.float64))
    assert metrics["actor/maspo/segments_per_response"] == 2.0


def test_the_loss_without_heard_words_fails_clearly():
    old, new, advantages, mask = _one_response()
    with pytest.raises(MissingHeardWordsError, match="'heard_words' needs the words the recogniser heard"):
        loss_and_grad("maspo", _config(), old, new, advantages, mask)


# ------------------------------------------------------------------------------------- the one-frame-word limit


def _one_frame_words(mask):
    """Every frame its own word, every fourth frame unheard (alone between words), the last token the end tag."""
    width = mask.shape[1]
    words = torch.arange(width).expand(mask.shape[0], width).clone()
    words[:, 3::4] = UNHEARD
    last = mask.long().sum(dim=1) - 1
    words[torch.arange(mask.shape[0]), last] = NOT_A_FRAME
    return torch.where(mask.bool(), words, torch.full_like(words, NOT_A_FRAME))


@pytest.mark.parametrize("agg", VERL_AGG_MODES)
def test_one_frame_words_equal_vanilla(agg):
    old, new, advantages, mask = random_batch(scale=1.2, seed=1)
    common = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    config = actor_config(clip_ratio=0.2, segmenter={"name": "heard_words"}, **common)
    with provide_loss_inputs(heard_words=_one_frame_words(mask).to(mask.device)):
        maspo_loss, maspo_grad, metrics = loss_and_grad("maspo", config, old, new, advantages, mask, agg)
    vanilla_loss, vanilla_grad, vanilla_metrics = loss_and_grad("vanilla", config, old, new, advantages, mask, agg)
    torch.testing.assert_close(maspo_loss, vanilla_loss, rtol=0, atol=1e-14)
    torch.testing.assert_close(maspo_grad, vanilla_grad, rtol=0, atol=1e-14)
    assert metrics["actor/maspo/mean_segment_length"] == 1.0
    assert 0 < vanilla_metrics["actor/pg_clipfrac"] < 1


def test_one_frame_word_rows_are_windows_of_one_in_a_mixed_batch():
    _, _, _, mask = random_batch(seed=4)
    mask = mask.bool()
    words = _one_frame_words(mask)
    words[1::2] = torch.where(mask[1::2], torch.arange(mask.shape[1]) // 3, NOT_A_FRAME)  # odd rows: 3-frame words
    heard = _segment_ids(mask, words)
    fixed1 = MaspoConfig.from_mapping({"segmenter": {"name": "fixed", "window": 1}})
    windows = fixed1.segment_layout(torch.zeros(mask.shape), mask, None).segment_ids(mask).tolist()
    assert heard[0::2] == windows[0::2]
    assert heard[1::2] != windows[1::2]
