"""Real test speech: espeak-ng (Debian package) synthesises a sentence, sox converts it to 16 kHz mono 16-bit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf


def espeak(text: str, path: str | Path, voice: str = "en-us") -> np.ndarray:
    """Write ``text`` spoken by espeak-ng (130 words per minute) to ``path`` as a 16 kHz mono wav; its float32
    samples."""
    path = Path(path)
    raw = path.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-v", voice, "-s", "130", "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(path)], check=True)
    audio, rate = sf.read(path, dtype="float32")
    assert rate == 16000
    return audio
