"""The phonemes a text should be heard as: espeak-ng's, split one phoneme at a time, stress marks dropped.

The code ear (`reward_fns.code_ear`) hears phonemes, not letters: mini-llasa reads espeak-ng's US English phoneme
mnemonics (`maspo_base.speech_tokens.text_frontend`), so the same front end gives the targets the ear is trained on
and scored against. ``espeak-ng -v en-us -q -x --sep=_`` separates the phonemes of a word with ``_`` and the words
with spaces ("Keep away." -> ``k_'i:_p a#_w_'eI``); stress marks (``'`` primary, ``,`` secondary, ``%`` and ``=``
unstressed) and the palatal mark ``;`` are dropped, so the ear's units are the 40-odd phonemes themselves:
``k i: p a# w eI``.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

MARKS = "',%=;"
"""espeak-ng's stress marks (``'`` ``,`` ``%`` ``=``, before a phoneme) and its palatal mark (``;``, after one):
not phonemes themselves."""


@functools.lru_cache(maxsize=65536)
def phonemes_of(text: str, voice: str = "en-us") -> tuple[str, ...]:
    """espeak-ng's phonemes of ``text`` in order, stress marks dropped (module docstring).

    Raises ``ValueError`` when espeak-ng says nothing for the text (no speech in it) and ``RuntimeError`` when
    espeak-ng is not installed."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("the code ear's phonemes need espeak-ng (Debian package espeak-ng; scripts/setup.sh)")
    out = subprocess.run(
        ["espeak-ng", "-v", voice, "-q", "-x", "--sep=_", "--", text], check=True, capture_output=True, text=True
    ).stdout
    units = []
    for word in out.split():
        for unit in word.split("_"):
            unit = unit.strip(MARKS)
            if unit:
                units.append(unit)
    if not units:
        raise ValueError(f"espeak-ng ({voice}) gives no phonemes for {text!r}")
    return tuple(units)
