"""The code ear (`reward_fns.code_ear`): a tiny random ear with the real class, loading code and read-outs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_fns.code_ear import CodeEar, EarConfig, phoneme_error_rate
from reward_fns.phonemes import phonemes_of

PHONEMES = ("@", "D", "a#", "aI3", "eI", "f", "i:", "k", "m", "p", "r", "V", "w")


def tiny_ear(inputs: str = "codes", seed: int = 0) -> CodeEar:
    torch.manual_seed(seed)
    config = EarConfig(
        codebook_size=1024, phonemes=PHONEMES, inputs=inputs, fsq_levels=(4,) * 5, width=16, dilations=(1, 2)
    )
    return CodeEar(config).eval()


def test_phonemes_are_espeaks_without_stress_marks():
    assert phonemes_of("Keep away from fire.") == ("k", "i:", "p", "a#", "w", "eI", "f", "r", "V", "m", "f", "aI3")
    with pytest.raises(ValueError, match="no phonemes"):
        phonemes_of("...")


def test_phoneme_error_rate_counts_edits_per_reference_phoneme():
    assert phoneme_error_rate(["k", "i:", "p"], ["k", "p"]) == pytest.approx(1 / 3)
    assert phoneme_error_rate(["k", "i:", "p"], ["k", "i:", "p", "p", "p"]) == pytest.approx(2 / 3)
    assert phoneme_error_rate(["k"], []) == 1.0


@pytest.mark.parametrize("inputs", ["codes", "digits"])
def test_a_response_is_heard_the_same_alone_and_beside_a_longer_one(inputs):
    ear = tiny_ear(inputs)
    rng = np.random.default_rng(0)
    short, long = rng.integers(0, 1024, 40), rng.integers(0, 1024, 90)
    targets = ear.targets("Keep away from fire.")
    alone = ear.hear([short], [targets])[0]
    both = ear.hear([long, short], [targets, targets])[1]
    assert both.per == alone.per and both.transcript == alone.transcript
    assert both.nll == pytest.approx(alone.nll, rel=1e-5)
    np.testing.assert_array_equal(both.frame_units, alone.frame_units)
    np.testing.assert_allclose(both.unit_scores, alone.unit_scores, rtol=1e-5)
    assert alone.frame_units.shape == (40,) and alone.unit_scores.shape == (len(targets),)
    assert alone.aligned and np.isfinite(alone.unit_scores).all() and (alone.unit_scores > 0).all()
    assert (np.diff(alone.frame_units) >= 0).all()  # the alignment is monotonic: phonemes in order


def test_too_few_codes_for_the_phonemes_have_no_alignment():
    ear = tiny_ear()
    heard = ear.hear([np.arange(5)], [ear.targets("Keep away from fire.")])[0]
    assert not heard.aligned and heard.nll == float("inf")
    assert (heard.frame_units == -1).all() and np.isnan(heard.unit_scores).all()


def test_codes_outside_the_codebook_and_unknown_phonemes_are_refused():
    ear = tiny_ear()
    with pytest.raises(ValueError, match="outside the ear's codebook"):
        ear.hear([np.array([1, 2, 1024])], [("k",)])
    with pytest.raises(ValueError, match="not among the ear's"):
        ear.targets("The birch canoe slid on the smooth planks.")


def test_a_saved_ear_loads_and_hears_the_same(tmp_path):
    ear = tiny_ear("digits", seed=3)
    ear.save_pretrained(tmp_path / "ear")
    loaded = CodeEar.from_pretrained(tmp_path / "ear")
    assert loaded.config == ear.config
    codes = np.random.default_rng(1).integers(0, 1024, 60)
    a, b = (e.hear([codes], [("k", "i:", "p")])[0] for e in (ear, loaded))
    assert a.nll == b.nll and a.transcript == b.transcript
    with pytest.raises(FileNotFoundError, match="build-ear"):
        CodeEar.from_pretrained(tmp_path)


def test_config_errors_name_what_is_valid():
    with pytest.raises(ValueError, match="inputs="):
        EarConfig(codebook_size=4, phonemes=("a",), inputs="audio")
    with pytest.raises(ValueError, match="fsq_levels"):
        EarConfig(codebook_size=4, phonemes=("a",), inputs="digits")
    with pytest.raises(ValueError, match="distinct"):
        EarConfig(codebook_size=4, phonemes=("a", "a"))
