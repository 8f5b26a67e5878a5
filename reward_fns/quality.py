"""How the speech sounds, offline: DNSMOS P.835 (Microsoft's non-intrusive quality model) from PyPI ``speechmos``.

``speechmos`` 0.0.1.1 (MIT) carries its ONNX models in the wheel (``dnsmos_models/sig_bak_ovr.onnx`` 1.2 MB,
``model_v8.onnx`` 0.2 MB), runs on onnxruntime and librosa, and needs no download. The chosen score is the
overall-quality MOS ``ovrl_mos`` (1 bad .. 5 excellent); ``sig_mos`` (speech distortion), ``bak_mos`` (background
noise) and ``p808_mos`` come with it. Why DNSMOS and not ``distillmos``: docs/reward-anchors.md.

The package's own path (``speechmos.dnsmos.run``) is used as is, after these checks:

- the waveform must be 1-D, non-empty and finite (NaN/inf, empty: ``ValueError`` with the reason; the reward then
  scores the sample worst, never high);
- another sample rate is resampled to 16 kHz (librosa, soxr high quality), as DNSMOS takes 16 kHz only;
- samples beyond [-1, 1] (which DNSMOS refuses) are clipped to it, as writing the audio to a wav file would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

SAMPLE_RATE = 16_000
QUALITY_BACKENDS = ("dnsmos",)
"""The ``quality`` settings the reward accepts."""


class QualityScore(NamedTuple):
    ovrl_mos: float
    sig_mos: float
    bak_mos: float
    p808_mos: float


def checked_waveform(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """``audio`` as a finite 16 kHz float32 waveform in [-1, 1], or ``ValueError`` saying why it cannot be scored."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"the waveform must be 1-D (mono), got shape {audio.shape}")
    if audio.size == 0:
        raise ValueError("the waveform is empty: nothing to score")
    bad = ~np.isfinite(audio)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"sample {first} of the waveform is {audio[first]}: the waveform must be finite")
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
    if sample_rate != SAMPLE_RATE:
        import librosa

        audio = librosa.resample(audio, orig_sr=sample_rate, target_sr=SAMPLE_RATE).astype(np.float32)
    return np.clip(audio, -1.0, 1.0)


class DnsMos:
    """DNSMOS P.835 through ``speechmos.dnsmos`` (its bundled ONNX models)."""

    def score(self, audio: Sequence[np.ndarray], sample_rate: int = SAMPLE_RATE) -> list[QualityScore]:
        """One `QualityScore` per waveform; ``ValueError`` names the first waveform that cannot be scored."""
        from speechmos import dnsmos

        out = []
        for i, a in enumerate(audio):
            try:
                wav = checked_waveform(a, sample_rate)
            except ValueError as exc:
                raise ValueError(f"waveform {i}: {exc}") from None
            result = dnsmos.run(wav, SAMPLE_RATE)
            score = QualityScore(*(float(result[k]) for k in QualityScore._fields))
            if not all(np.isfinite(score)):
                raise ValueError(f"waveform {i}: DNSMOS returned a non-finite score {score}")
            out.append(score)
        return out


def build_quality_backend(name: str) -> DnsMos:
    if name not in QUALITY_BACKENDS:
        raise ValueError(f"quality backend {name!r} is unknown; valid: {list(QUALITY_BACKENDS)}")
    return DnsMos()
