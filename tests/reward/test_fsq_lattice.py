"""`FsqLattice` (`maspo_base.speech_tokens.fsq`): digits, the zero code and step distances counted by hand, on
XCodec2's 8 x 4 lattice, the mini codec's 5 x 4 and a mixed one; the general distance against XCodec2's fused
byte tables."""

from __future__ import annotations

import math

import pytest
import torch

from maspo_base.speech_tokens.fsq import FsqLattice
from maspo_base.speech_tokens.xcodec2_fsq import (
    XCODEC2_FSQ,
    ZERO_CODE,
    fsq_far_steps,
    fsq_step_distance,
    units_threshold,
)

MINI = FsqLattice((4, 4, 4, 4, 4))
MIXED = FsqLattice((8, 5, 5, 5))  # place values 1, 8, 40, 200; 1,000 codes


def test_sizes_place_values_and_zero_codes():
    assert (XCODEC2_FSQ.codebook_size, MINI.codebook_size, MIXED.codebook_size) == (65536, 1024, 1000)
    assert MIXED.place_values == (1, 8, 40, 200) and MIXED.dims == 4
    # every digit at L // 2: 2 * (1 + 4 + ... + 4**7) = 43690; 2 * (1 + ... + 4**4) = 682; 4 + 2*8 + 2*40 + 2*200
    assert XCODEC2_FSQ.zero_code == ZERO_CODE == 43690
    assert MINI.zero_code == 682 and MIXED.zero_code == 500
    assert MINI.digits_of(682) == (2, 2, 2, 2, 2) and MIXED.digits_of(500) == (4, 2, 2, 2)


@pytest.mark.parametrize("lattice", [MINI, MIXED, FsqLattice((2, 3))], ids=["4x5", "8-5-5-5", "2-3"])
def test_digits_and_codes_round_trip_over_the_whole_codebook(lattice):
    codes = torch.arange(lattice.codebook_size)
    digits = lattice.digits(codes)
    assert digits.shape == (lattice.codebook_size, lattice.dims) and digits.dtype == torch.int64
    for code in range(lattice.codebook_size):
        assert lattice.code_of(lattice.digits_of(code)) == code
        assert tuple(digits[code].tolist()) == lattice.digits_of(code)
    assert len(set(map(tuple, digits.tolist()))) == lattice.codebook_size  # one digit vector per code
    assert MIXED.digits_of(999) == (7, 4, 4, 4) and MIXED.code_of((7, 4, 0, 0)) == 39


def test_step_distances_by_hand_on_the_mini_codecs_lattice():
    # digits (0,0,0,0,0) -> (3,0,0,0,0) -> (3,2,0,0,1) -> the same; h = 2 on every dimension
    codes = torch.tensor(
        [MINI.code_of(d) for d in [(0, 0, 0, 0, 0), (3, 0, 0, 0, 0), (3, 2, 0, 0, 1), (3, 2, 0, 0, 1)]]
    )
    assert codes.tolist() == [0, 3, 3 + 2 * 4 + 1 * 256, 267]
    assert MINI.step_distance(codes, "l1").tolist() == [3.0, 3.0, 0.0]
    assert MINI.step_distance(codes, "changed_dims").tolist() == [1.0, 2.0, 0.0]
    torch.testing.assert_close(MINI.step_distance(codes, "l2"), torch.tensor([1.5, math.sqrt(1 + 0.25), 0.0]))
    assert MINI.step_distance(codes).dtype == torch.float32  # l1 by default


def test_step_distances_by_hand_on_a_mixed_lattice():
    # (0,0,0,0) -> (7,4,0,0) -> (7,4,4,4); h = (4, 2, 2, 2): code values (d - h) / h
    codes = torch.tensor([[0, 39, 999]])
    assert MIXED.step_distance(codes, "l1").tolist() == [[11.0, 8.0]]
    assert MIXED.step_distance(codes, "changed_dims").tolist() == [[2.0, 2.0]]
    expected = torch.tensor([[math.sqrt((7 / 4) ** 2 + (4 / 2) ** 2), math.sqrt(2 * (4 / 2) ** 2)]])
    torch.testing.assert_close(MIXED.step_distance(codes, "l2"), expected)
    assert MIXED.step_distance(torch.zeros(2, 1, dtype=torch.long)).shape == (2, 0)  # one code: no step


def test_largest_distances():
    assert [XCODEC2_FSQ.max_distance(m) for m in ("l1", "l2", "changed_dims")] == [24.0, math.sqrt(18), 8.0]
    assert [MINI.max_distance(m) for m in ("l1", "changed_dims")] == [15.0, 5.0]
    assert MIXED.max_distance("l1") == 19.0 and MIXED.max_distance("l2") == pytest.approx(math.sqrt(3.0625 + 12))
    # the largest step is reached: opposite corners of the lattice
    corners = torch.tensor([0, MIXED.codebook_size - 1])
    assert MIXED.step_distance(corners, "l2").item() == pytest.approx(MIXED.max_distance("l2"))


def test_bad_levels_and_metrics_are_errors():
    with pytest.raises(ValueError, match=r"FSQ levels must be >= 2 per dimension, got \(4, 1\)"):
        FsqLattice((4, 1))
    with pytest.raises(ValueError, match="FSQ levels must be >= 2"):
        FsqLattice(())
    with pytest.raises(ValueError, match=r"unknown FSQ metric 'l3'; valid: \['l1', 'l2', 'changed_dims'\]"):
        MINI.step_distance(torch.tensor([0, 1]), "l3")
    with pytest.raises(ValueError, match="unknown FSQ metric 'l3'"):
        MINI.max_distance("l3")


@pytest.mark.parametrize("metric", ["l1", "l2", "changed_dims"])
def test_the_general_distance_equals_xcodec2s_fused_tables(metric):
    generator = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 65536, (4, 300), generator=generator)
    codes[0, :6] = torch.tensor([0, 65535, 43690, 43690, 1, 16384])  # corners, the zero code, a repeat
    general = XCODEC2_FSQ.step_distance(codes, metric)
    torch.testing.assert_close(general, fsq_step_distance(codes[:, :-1], codes[:, 1:], metric))
    offset = 128264
    for threshold in (0.0, 1.0, 2.5, 4.0, 24.0):
        fused = fsq_far_steps(offset + codes, offset, units_threshold(threshold, metric), metric)
        assert torch.equal(fused[:, 1:], general > threshold), threshold
