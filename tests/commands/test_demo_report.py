"""`maspo-verl demo`'s report: the plot names every series by its metric, and the line read first gives first ->
last step and the means over the first and last steps."""

from maspo_verl.commands.demo import PLOT_PANELS, _series_label, learning_line


def _step(step, content, length, expected=9.0):
    return {
        "step": step,
        "critic/score/mean": content / 2,
        "reward/content/mean": content,
        "response_length/mean": length,
        "reward/expected_frames/mean": expected,
    }


def test_reward_parts_are_labelled_by_part():
    parts = dict(PLOT_PANELS)["reward parts"]
    assert [_series_label(key) for key in parts] == ["content", "duration", "end"]
    frames = dict(PLOT_PANELS)["codec frames: spoken and expected"]
    assert [_series_label(key) for key in frames] == ["frames", "expected_frames"]


def test_metrics_without_a_mean_suffix_keep_their_last_name():
    assert _series_label("actor/pg_clipfrac") == "pg_clipfrac"
    assert _series_label("actor/maspo/segments_per_response") == "segments_per_response"
    assert _series_label("mean") == "mean"


def test_learning_line_gives_first_last_and_window_means():
    steps = [_step(1, 0.2, 10.0), _step(2, 0.4, 12.0), _step(3, 0.3, 8.0, 11.0), _step(4, 0.5, 9.0), _step(5, 0.7, 7.0)]
    line = learning_line(steps, window=2)
    assert "content (1 - unit error rate) 0.200 -> 0.700 (first/last 2 steps 0.300 -> 0.600)" in line
    assert "reward 0.100 -> 0.350 (first/last 2 steps 0.150 -> 0.300)" in line
    assert "length 10.0 -> 7.0 (first/last 2 steps 11.0 -> 8.0) tokens; expected 10.0 -> 10.0 (frames + end)" in line


def test_learning_line_window_shrinks_to_half_the_run_and_skips_missing_metrics():
    steps = [_step(1, 0.2, 10.0), _step(2, 0.4, 12.0)]
    del steps[1]["reward/expected_frames/mean"]
    line = learning_line(steps, window=3)
    assert "0.200 -> 0.400 (first/last 1 steps 0.200 -> 0.400)" in line
    assert "expected" not in line
    single = learning_line(steps[:1])
    assert "content (1 - unit error rate) 0.200 -> 0.200 (first/last 1 steps" in single
