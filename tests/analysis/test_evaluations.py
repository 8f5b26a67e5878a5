"""Evaluations by both ears, paired by sentence, from dumps written by veRL's own validation code."""

from __future__ import annotations

import math

import pytest
from scipy.stats import t as student_t

from maspo_lab.analysis.evaluations import changes, heard, paired_change, pooled_over_seeds
from maspo_lab.runs.speech_run import HELDOUT_SOURCE, TRAIN_SOURCE


def _dump(tmp_path, step: int, rows: list[tuple[str, float, float]], second_ear: bool = True) -> None:
    """veRL's ``_write_generations`` of one evaluation: ``(sentence, whisper CER, second-ear CER)`` per response."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    texts = [t for t, *_ in rows]
    infos = {"speech_error_rate": [w for _, w, _ in rows], "speech_error_rate_raw": [w for _, w, _ in rows]}
    if second_ear:
        infos["speech_second_error_rate"] = [s for *_, s in rows]
    scores = [1 - w for _, w, _ in rows]
    RayPPOTrainer._write_generations(texts, ["..."] * len(rows), texts, scores, infos, str(tmp_path), step)


SOURCES = {"a": TRAIN_SOURCE, "b": TRAIN_SOURCE, "c": TRAIN_SOURCE, "h": HELDOUT_SOURCE}


def test_changes_pair_each_sentence_with_itself_before_training_for_each_ear(tmp_path):
    _dump(tmp_path, 0, [("a", 0.2, 0.3), ("a", 0.4, 0.5), ("b", 0.6, 0.6), ("b", 0.6, 0.8), ("c", 0.3, 0.2),
                        ("c", 0.1, 0.2), ("h", 0.5, 0.9), ("h", 0.7, 0.7)])  # fmt: skip
    _dump(tmp_path, 10, [("a", 0.1, 0.3), ("a", 0.1, 0.5), ("b", 0.2, 0.6), ("b", 0.4, 0.8), ("c", 0.2, 0.2),
                         ("c", 0.2, 0.2), ("h", 0.4, 0.8), ("h", 0.4, 0.9)])  # fmt: skip
    found = heard(tmp_path, SOURCES)
    assert {(e["ear"], e["source"], e["step"]) for e in found} == {
        (ear, source, step) for ear in ("whisper", "second") for source in SOURCES.values() for step in (0, 10)
    }
    rows = {(r["source"], r["ear"]): r for r in changes(found)}
    train = rows[(TRAIN_SOURCE, "whisper")]
    # per sentence: a 0.3 -> 0.1, b 0.6 -> 0.3, c 0.2 -> 0.2; differences -0.2, -0.3, 0.0
    diffs = [-0.2, -0.3, 0.0]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert train["change"] == pytest.approx(mean)
    assert train["ci95"] == pytest.approx(student_t.ppf(0.975, 2) * sd / math.sqrt(3))
    assert (train["before"], train["after"], train["sentences"], train["repeats"]) == (
        pytest.approx(0.3667, abs=1e-4),
        pytest.approx(0.2),
        3,
        2,
    )
    assert rows[(TRAIN_SOURCE, "second")]["change"] == pytest.approx(0.0)  # the second ear heard no change
    held = rows[(HELDOUT_SOURCE, "second")]
    assert held["change"] == pytest.approx(0.05) and math.isnan(held["ci95"]) and held["sentences"] == 1


def test_a_run_without_a_second_ear_reports_whisper_alone_and_changes_need_a_first_evaluation(tmp_path):
    _dump(tmp_path, 0, [("a", 0.2, 0.0), ("h", 0.5, 0.0)], second_ear=False)
    _dump(tmp_path, 5, [("a", 0.1, 0.0), ("h", 0.5, 0.0)], second_ear=False)
    found = heard(tmp_path, SOURCES)
    assert {e["ear"] for e in found} == {"whisper"}
    assert [r["step"] for r in changes(found)] == [5, 5]
    assert changes([e for e in found if e["step"] == 5]) == []  # no evaluation before training: nothing paired


def test_the_code_ears_error_rate_is_paired_beside_the_audio_ears_when_the_run_reports_it(tmp_path):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    def dump(step, ear_per):
        texts = ["a", "a", "h", "h"]
        infos = {"speech_error_rate": [0.2] * 4, "speech_ear_per": ear_per}
        RayPPOTrainer._write_generations(texts, ["..."] * 4, texts, [0.8] * 4, infos, str(tmp_path), step)

    dump(0, [0.3, 0.5, 0.6, 0.6])
    dump(4, [0.1, 0.1, 0.7, 0.5])
    rows = {(r["source"], r["ear"]): r for r in changes(heard(tmp_path, SOURCES))}
    assert rows[(TRAIN_SOURCE, "ear")]["change"] == pytest.approx(-0.3)  # 0.4 -> 0.1
    assert rows[(HELDOUT_SOURCE, "ear")]["change"] == pytest.approx(0.0)
    assert rows[(TRAIN_SOURCE, "whisper")]["change"] == pytest.approx(0.0)
    # a run rewarded by audio reports the ear's keys as NaN (not heard by it): no code-ear rows
    nan = float("nan")
    for step in (0, 4):
        dump(step, [nan] * 4)
    assert {e["ear"] for e in heard(tmp_path, SOURCES)} == {"whisper"}


def test_paired_change_uses_only_sentences_in_both():
    change, half, n = paired_change({"a": 0.5, "b": 0.2}, {"a": 0.25, "z": 0.9})
    assert (change, n) == (-0.25, 1) and math.isnan(half)


def test_ear_agreement_by_hand(tmp_path):
    from maspo_lab.analysis.evaluations import ear_agreement

    # a: whisper 0.2/0.4 (sphinx 0.3/0.5: moves with it); b: whisper 0.6/0.8 (sphinx 0.9/0.7: against it)
    _dump(tmp_path, 0, [("a", 0.2, 0.3), ("a", 0.4, 0.5), ("b", 0.6, 0.9), ("b", 0.8, 0.7)])
    found = ear_agreement(tmp_path / "0.jsonl")
    assert found["within_correlation"] == pytest.approx(0.0)  # deviations (-.1,-.1) (.1,.1) (-.1,.1) (.1,-.1)
    assert found["between_correlation"] == pytest.approx(1.0)  # means (0.3, 0.4) and (0.7, 0.8)
    # Whisper's best sample of each sentence: a's first (-0.1 / -0.1), b's first (-0.1 / +0.1)
    assert found["best_of_n_whisper"] == pytest.approx(-0.1) and found["best_of_n_second"] == pytest.approx(0.0)
    assert (found["sentences"], found["samples"]) == (2, 2)


def test_a_steps_content_is_one_minus_its_cer_or_under_the_code_ear_one_minus_its_per():
    from maspo_lab.runs.speech_run import step_content

    assert step_content({"reward/speech_error_rate/mean": 0.2, "reward/speech_ear_per/mean": 0.4}) == pytest.approx(0.8)
    assert step_content({"reward/speech_error_rate/mean": math.nan, "reward/speech_ear_per/mean": 0.4}) == (
        pytest.approx(0.6)
    )
    assert math.isnan(step_content({}))


def test_runs_of_two_seeds_pool_each_sentences_change_before_the_interval_over_sentences():
    def rows(step, source, ear, per_sentence):
        return {"step": step, "source": source, "ear": ear, "per_sentence": per_sentence}

    seed0 = [rows(0, TRAIN_SOURCE, "whisper", {"a": 0.4, "b": 0.2, "c": 0.5}),
             rows(8, TRAIN_SOURCE, "whisper", {"a": 0.2, "b": 0.2, "c": 0.2}),
             rows(4, TRAIN_SOURCE, "whisper", {"a": 0.0, "b": 0.0, "c": 0.0})]  # fmt: skip
    seed1 = [rows(0, TRAIN_SOURCE, "whisper", {"a": 0.3, "b": 0.3, "c": 0.3, "d": 0.9}),
             rows(8, TRAIN_SOURCE, "whisper", {"a": 0.3, "b": 0.1, "c": 0.1, "d": 0.0}),
             rows(0, HELDOUT_SOURCE, "ear", {"h": 0.5})]  # fmt: skip
    [row] = pooled_over_seeds({0: seed0, 1: seed1}, step=8)
    # per sentence, averaged over the seeds: a (-0.2 + 0.0) / 2, b (0.0 - 0.2) / 2, c (-0.3 - 0.2) / 2; d, in one seed
    # only, is left out; the held-out ear has no step 8
    changes_by_sentence = [-0.1, -0.1, -0.25]
    mean = sum(changes_by_sentence) / 3
    sd = math.sqrt(sum((c - mean) ** 2 for c in changes_by_sentence) / 2)
    assert row["change"] == pytest.approx(mean)
    assert row["ci95"] == pytest.approx(student_t.ppf(0.975, 2) * sd / math.sqrt(3))
    assert (row["sentences"], row["seeds"]) == (3, 2)
    assert row["seed_changes"] == {0: pytest.approx(-0.5 / 3), 1: pytest.approx(-0.4 / 3)}
    assert pooled_over_seeds({0: seed0, 1: seed1}, step=5) == []
