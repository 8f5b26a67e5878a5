"""`maspo-verl demo`'s report: the plot names every series by its metric, the evaluation line gives content and
length on the training texts before and after training, and the per-step line gives first -> last step and the means
over the first and last steps."""

import pytest

from maspo_lab.commands.demo import (
    PLOT_PANELS,
    _series_label,
    evaluation_line,
    learning_line,
    parse_args,
)
from maspo_lab.data.synthetic_tts import DATA_SOURCE
from maspo_lab.runs.synthetic_run import split_evaluations


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
    content = dict(PLOT_PANELS)["content: step batches and the training texts"]
    assert [_series_label(key) for key in content] == ["content", "content, training texts"]


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


def _validation(samples, content, frames, expected, end):
    parts = {"content": content, "frames": frames, "expected_frames": expected, "end": end}
    return {f"val-aux/{DATA_SOURCE}/{part}/mean@{samples}": value for part, value in parts.items()}


def test_evaluations_are_the_validation_records_and_steps_the_training_ones():
    before = {"step": 0, **_validation(8, 0.5, 10.0, 10.0, 0.9), f"val-core/{DATA_SOURCE}/reward/mean@8": 0.6}
    middle = _step(1, 0.4, 10.0)
    last = {**_step(2, 0.6, 11.0), **_validation(8, 0.7, 9.0, 10.0, 1.0)}
    steps, evaluations = split_evaluations([before, middle, last], samples=8)
    assert [s["step"] for s in steps] == [1, 2]
    assert evaluations == [
        {"step": 0, "eval/content": 0.5, "eval/frames": 10.0, "eval/expected_frames": 10.0, "eval/end": 0.9},
        {"step": 2, "eval/content": 0.7, "eval/frames": 9.0, "eval/expected_frames": 10.0, "eval/end": 1.0},
    ]
    assert split_evaluations([before, middle, last], samples=4)[1] == []  # other sample counts are not read


def test_evaluation_line_gives_content_length_and_end_before_and_after():
    evaluations = [
        {"step": 0, "eval/content": 0.5, "eval/frames": 12.0, "eval/expected_frames": 10.0, "eval/end": 0.9},
        {"step": 12, "eval/content": 0.625, "eval/frames": 9.0, "eval/expected_frames": 10.0, "eval/end": 1.0},
    ]
    line = evaluation_line(evaluations, texts=16, samples=8, temperature=0.8)
    assert "content on the 16 training texts (8 samples each at temperature 0.8) 0.500 -> 0.625 (+0.125)" in line
    assert "frames / expected frames 1.20 -> 0.90; end tag 0.90 -> 1.00; before step 1 -> after step 12" in line
    assert evaluation_line(evaluations[:1], texts=16, samples=8, temperature=0.8).startswith("no evaluation")


@pytest.mark.parametrize(("flag", "value"), [("--texts", "0"), ("--eval-samples", "-1")])
def test_bad_texts_or_eval_samples_are_refused_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit):
        parse_args([flag, value])
    assert flag in capsys.readouterr().err


def test_the_speech_evaluation_line_shows_the_clipped_cer_the_closing_lines_pair():
    from maspo_lab.commands.demo import speech_evaluation
    from maspo_lab.runs.speech_run import HELDOUT_SOURCE, TRAIN_SOURCE

    metrics = {
        f"val-aux/{TRAIN_SOURCE}/speech_error_rate_raw/mean@6": 0.73,  # one response that never ended: raw CER ~25
        f"val-aux/{TRAIN_SOURCE}/speech_error_rate/mean@6": 0.22,
        f"val-core/{TRAIN_SOURCE}/reward/mean@6": 0.57,  # veRL's name for the score
        f"val-aux/{HELDOUT_SOURCE}/speech_error_rate/mean@6": 0.25,
    }
    figures = speech_evaluation(6)(8, metrics)
    assert figures == pytest.approx({"train CER": 0.22, "train score": 0.57, "held-out CER": 0.25})


def test_the_per_step_cer_is_the_clipped_one_a_runaway_response_cannot_swamp():
    from maspo_lab.commands.demo import SPEECH_COLUMNS, SPEECH_PANELS, summary_table

    # a step where one of 16 responses never ended: its raw CER ~8 lifts the raw mean to 0.73
    step = {"step": 3, "reward/speech_error_rate_raw/mean": 0.73, "reward/speech_error_rate/mean": 0.22}
    header, _, row = summary_table([step], SPEECH_COLUMNS).splitlines()
    assert header.split() == ["step", "CER"] and row.split() == ["3", "0.22"]
    panel = next(keys for title, keys in SPEECH_PANELS if "character error rate" in title)
    assert [step[key] for key in panel] == [0.22]


def test_under_the_code_ear_a_step_shows_its_phoneme_error_rate_and_not_the_cer_no_one_heard():
    from maspo_lab.commands.demo import SPEECH_COLUMNS, summary_table

    step = {"step": 2, "reward/speech_error_rate/mean": float("nan"), "reward/speech_ear_per/mean": 0.18}
    header, _, row = summary_table([step], SPEECH_COLUMNS).splitlines()
    assert header.split() == ["step", "PER"] and row.split() == ["2", "0.18"]
