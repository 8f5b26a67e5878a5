"""`seg-mean` in veRL's real trainer: the worker hook counts each whole mini-batch's segments before the split."""

from __future__ import annotations

import pytest
from shared_runs import WINDOW

pytestmark = pytest.mark.e2e


def test_seg_mean_divides_by_the_whole_mini_batch_segment_count(shared_run):
    # the legacy trainer, windows of 4, micro-batches of one response (the run test_cpu_credit traces)
    run = shared_run("legacy_probe_seg_mean").run
    assert run.ok, run.log_tail()
    # a mini-batch holds 4 * 2 / 2 = 4 responses of 16 tokens -> 4 * 16 / 4 = 16 segments, counted before veRL
    # cut it into micro-batches of one response (4 segments each)
    assert run.series("response_length/mean") == [16.0] * 2
    assert run.series("actor/maspo/minibatch_segments") == [16.0] * 2
    assert run.series("actor/maspo/segments_per_response") == [16.0 / WINDOW] * 2
