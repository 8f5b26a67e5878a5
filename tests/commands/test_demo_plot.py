"""`maspo-verl demo`'s plot: every series in a panel is named by its metric, so the reward parts can be told apart."""

from maspo_verl.commands.demo import PLOT_PANELS, _series_label


def test_reward_parts_are_labelled_by_part():
    parts = dict(PLOT_PANELS)["reward parts"]
    assert [_series_label(key) for key in parts] == ["content", "duration", "end"]


def test_metrics_without_a_mean_suffix_keep_their_last_name():
    assert _series_label("actor/pg_clipfrac") == "pg_clipfrac"
    assert _series_label("actor/maspo/segments_per_response") == "segments_per_response"
    assert _series_label("mean") == "mean"
