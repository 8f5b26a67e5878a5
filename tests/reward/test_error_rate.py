"""Seed-TTS-eval normalisation and jiwer scoring, against error rates counted by hand."""

import math

import pytest

from reward_fns.error_rate import error_rate
from reward_fns.text_norm import scoring_units


def test_chinese_is_scored_per_character_without_punctuation():
    # 今天天气很好 (6 characters) vs 今天天汽很好: one substitution
    er = error_rate("今天天气很好。", "今天天汽很好", "zh")
    assert er.unit == "char" and er.ref_units == 6
    assert er.value == pytest.approx(1 / 6)


def test_chinese_transcript_in_traditional_script_or_spaced_scores_zero():
    assert error_rate("今天天气很好", "今天天氣很好！", "zh").value == 0.0  # zhconv zh-cn
    assert error_rate("今天天气很好", "今 天 天 气 很 好", "zh-CN").value == 0.0  # Paraformer with timestamps


def test_chinese_deletion_and_insertion_counts():
    # ref 你好世界 (4); hyp 你好世界啊啊: 2 insertions -> 2/4; hyp 你界: 2 deletions -> 2/4
    assert error_rate("你好，世界", "你好世界啊啊", "zh").value == pytest.approx(0.5)
    assert error_rate("你好，世界", "你界", "zh").value == pytest.approx(0.5)


def test_english_is_lower_cased_per_word_and_keeps_the_apostrophe():
    # ref: hello world it's me (4 words); hyp: hello world its me -> 1 substitution
    er = error_rate("Hello, world! It's me.", "hello world its me", "en")
    assert er.unit == "word" and er.ref_units == 4
    assert er.value == pytest.approx(0.25)
    assert error_rate("Hello, world! It's me.", "HELLO world, it's me!", "en-US").value == 0.0


def test_mixed_chinese_and_english_follows_seed_tts_per_character_and_case_sensitive():
    # 我用iPhone拍照 = 10 characters; iphone differs from iPhone in one character (P/p)
    assert scoring_units("我用iPhone拍照", "zh") == list("我用iPhone拍照")
    assert error_rate("我用iPhone拍照", "我用iphone拍照", "zh").value == pytest.approx(0.1)


def test_insertions_beyond_the_reference_are_clipped_to_one_but_kept_raw():
    er = error_rate("a b", "a b c d e", "en")  # 3 insertions / 2 words
    assert er.raw == pytest.approx(1.5) and er.value == 1.0


@pytest.mark.parametrize("hyp", ["", "   ", "。，！", "?!"])
def test_empty_transcript_scores_one_not_zero(hyp):
    assert error_rate("今天天气很好", hyp, "zh").value == 1.0
    assert error_rate("good morning", hyp, "en").value == 1.0


def test_empty_reference_is_an_error_naming_it():
    with pytest.raises(ValueError, match="empty after normalisation"):
        error_rate("。！", "你好", "zh")
    with pytest.raises(ValueError, match="language"):
        error_rate("hi", "hi", "")


def test_unit_count_matches_jiwer_cer_on_space_free_chinese():
    import jiwer

    ref, hyp = "我们一起去公园散步吧", "我们去公园里散步"
    assert error_rate(ref, hyp, "zh").raw == pytest.approx(jiwer.cer(ref, hyp))
    assert not math.isnan(error_rate(ref, hyp, "zh").value)


# ------------------------------------------------------------------------------------ error_unit="char"


def test_char_unit_counts_english_characters_with_the_space_as_one():
    # "hello world": h e l l o _ w o r l d = 11 characters (punctuation gone, case folded); "helo world": 1 deletion
    er = error_rate("Hello, world!", "HELO world", "en", unit="char")
    assert (er.unit, er.ref_units, er.hyp_units) == ("char", 11, 10)
    assert er.value == er.raw == pytest.approx(1 / 11)
    assert er.language_units == 2  # the reference's words, for the speech rate
    # a missing space is one deletion of 12 characters; by words the same transcript is wrong twice in two words
    assert error_rate("good morning", "goodmorning", "en", unit="char").value == pytest.approx(1 / 12)
    assert error_rate("good morning", "goodmorning", "en").value == 1.0
    # the apostrophe is kept and counts: it's_me (7) against its_me (6)
    assert error_rate("It's me.", "its me", "en", unit="char").value == pytest.approx(1 / 7)
    assert error_rate("Hello, world!", "hello world", "en", unit="char").value == 0.0


def test_char_unit_empty_transcript_is_every_character_deleted():
    er = error_rate("good morning", "?!", "en", unit="char")
    assert (er.value, er.raw, er.ref_units, er.hyp_units) == (1.0, 1.0, 12, 0)


def test_char_unit_leaves_chinese_as_it_is():
    for ref, hyp, expected in [("今天天气很好。", "今天天汽很好", 1 / 6), ("你好，世界", "你界", 0.5)]:
        char, language = (error_rate(ref, hyp, "zh", unit=u) for u in ("char", "language"))
        assert char == language and char.unit == "char" and char.value == pytest.approx(expected)
        assert char.language_units == char.ref_units


def test_unknown_unit_and_config_value_are_errors_naming_them():
    from maspo_base.typed_settings import SettingsError
    from reward_fns.reward import RewardConfig

    with pytest.raises(ValueError, match=r"unit='word'; valid: \['language', 'char'\]"):
        error_rate("a", "a", "en", unit="word")
    valid = r"valid values: \['language', 'char'\]"
    with pytest.raises(SettingsError, match=rf"reward_config.error_unit='word' is not valid; {valid}"):
        RewardConfig.from_dict({"error_unit": "word"})
    with pytest.raises(SettingsError, match=rf"reward_config.error_unit: error_unit='word' is not valid; {valid}"):
        RewardConfig(error_unit="word")  # built in code, not from a mapping
    assert RewardConfig.from_dict({"error_unit": "char"}).error_unit == "char"
