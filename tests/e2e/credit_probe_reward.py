"""A reward for the end-to-end credit tests: the synthetic TTS score, with a frame-error signal that a test can
recompute from token ids alone: frame k is flagged iff its codec id is odd (about half the frames of any response).
Loaded by veRL from this file (``reward.custom_reward_function.path``)."""

import re

from maspo_base.frame_errors import encode_frame_errors
from maspo_lab.data import synthetic_tts

_CODE = re.compile(r"<\|s_(\d+)\|>")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    result = synthetic_tts.compute_score(data_source, solution_str, ground_truth, extra_info)
    codes = [int(code) for code in _CODE.findall(solution_str)]
    result["frame_errors"] = encode_frame_errors([code % 2 for code in codes]) if codes else ""
    return result
