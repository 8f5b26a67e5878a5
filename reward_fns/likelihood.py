"""How likely the recogniser finds the reference text in the audio: Whisper teacher-forced on the reference.

For a waveform and its reference text, tokenised as Whisper tokenises a transcript (`` " " + text``, the text as
given: case and punctuation count), CTranslate2's forced alignment (``ctranslate2.models.Whisper.align``) feeds the
decoder ``start + [<|notimestamps|>] + tokens + [<|endoftext|>]`` (``start``: ``<|startoftranscript|>``, then the
language and task tokens on a multilingual model) and returns

- ``p_j``: the probability of reference token j given the audio and the tokens before it (softmax over the text
  vocabulary: the special tokens are excluded), and
- a time index per token (dynamic time warping over the alignment heads' cross-attention).

    asr_nll = -(1 / J) * sum_j log max(p_j, P_FLOOR)          mean over the J reference tokens (no end token)

Words are the tokenizer's words (`Tokenizer.split_to_word_tokens`, as faster-whisper's ``find_alignment``): word w
has the span of its tokens' time indices and the probability ``p(w) = mean of its tokens' p_j``.
Where this differs from the TTS-RL anchors' NLL (only ``<|startoftranscript|>``, full softmax, the end token
counted) and by how much: docs/reward-anchors.md.

One 30-s window: a longer waveform raises ``ValueError`` (the reward scores that sample worst with its reason).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from reward_fns.alignment import _frames_of
from reward_fns.text_norm import base_language

P_FLOOR = 1e-10
"""Token probabilities are floored here before the log: a token the model rules out costs ``MAX_TOKEN_NLL``."""
MAX_TOKEN_NLL = -math.log(P_FLOOR)
"""The largest ``asr_nll`` (23.03 nats per token); also what a sample that could not be measured reports."""
WINDOW_SECONDS = 30.0


class WordLikelihood(NamedTuple):
    """A reference word, its aligned span in seconds and its probability (mean of its tokens')."""

    text: str
    start: float
    end: float
    probability: float


class ReferenceLikelihood(NamedTuple):
    nll: float  # asr_nll, nats per reference token
    token_probs: tuple[float, ...]
    words: tuple[WordLikelihood, ...]

    def frame_surprise(self, n_frames: int) -> list[float]:
        """Per codec frame, ``1 - p(w)`` of the reference word whose span covers it (the largest where spans
        meet), 0 on frames no word covers (`alignment.FRAMES_PER_SECOND` frames per second)."""
        values = [0.0] * n_frames
        for word in self.words:
            if n_frames:
                for k in _frames_of(word.start, word.end, n_frames):
                    values[k] = max(values[k], min(max(1.0 - word.probability, 0.0), 1.0))
        return values


def likelihood_utility(nll: float, scale: float) -> float:
    """``u_n = exp(-asr_nll / scale)``: 1 for a certain reference, ``exp(-1)`` at ``asr_nll = scale``."""
    return math.exp(-nll / scale)


class WhisperLikelihood:
    """Reference likelihood with a faster-whisper ``WhisperModel`` (a CTranslate2 directory or a size name), or an
    already loaded one (`asr.FasterWhisperBackend.model` shares its model)."""

    def __init__(
        self, model: Any, device: str = "cpu", compute_type: str | None = None, batch_size: int = 16, **options: Any
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: expected at least 1 waveform per encoder call")
        self.batch_size = batch_size
        if isinstance(model, str):
            from faster_whisper import WhisperModel

            compute_type = compute_type or ("int8" if device == "cpu" else "float16")
            model = WhisperModel(model, device=device, compute_type=compute_type, **options)
        self.model = model

    def _tokenizer(self, lang: str):
        from faster_whisper.tokenizer import Tokenizer

        multilingual = self.model.model.is_multilingual
        return Tokenizer(
            self.model.hf_tokenizer, multilingual, task="transcribe", language=lang if multilingual else None
        )

    def score(
        self, audio: Sequence[np.ndarray], references: Sequence[str], languages: Sequence[str]
    ) -> list[ReferenceLikelihood]:
        """One `ReferenceLikelihood` per waveform (16 kHz mono float32), in input order; ``align`` calls of at most
        ``batch_size`` waveforms of one language (the encoder holds a 30-s window per waveform). Raises
        ``ValueError`` for a waveform over 30 s or a reference without tokens."""
        out: list[ReferenceLikelihood | None] = [None] * len(audio)
        by_lang: dict[str, list[int]] = defaultdict(list)
        for i, (a, ref, lang) in enumerate(zip(audio, references, languages)):
            if len(a) > WINDOW_SECONDS * 16_000:
                raise ValueError(f"waveform {i} lasts {len(a) / 16_000:.1f} s; the likelihood covers one 30-s window")
            if not ref.strip():
                raise ValueError(f"reference {i} is empty: there is nothing whose likelihood to measure")
            by_lang[base_language(lang)].append(i)
        for lang, idx in by_lang.items():
            for start in range(0, len(idx), self.batch_size):
                chunk = idx[start : start + self.batch_size]
                for i, result in zip(
                    chunk, self._align([audio[i] for i in chunk], [references[i] for i in chunk], lang)
                ):
                    out[i] = result
        return out  # type: ignore[return-value]

    def _align(self, audio: list[np.ndarray], references: list[str], lang: str) -> list[ReferenceLikelihood]:
        from faster_whisper.audio import pad_or_trim

        tokenizer = self._tokenizer(lang)
        features = [self.model.feature_extractor(np.asarray(a, dtype=np.float32)) for a in audio]
        num_frames = [min(f.shape[-1], self.model.feature_extractor.nb_max_frames) for f in features]
        encoded = self.model.encode(np.stack([pad_or_trim(f) for f in features]))
        tokens = [tokenizer.encode(" " + ref.strip()) for ref in references]
        results = self.model.model.align(encoded, tokenizer.sot_sequence, tokens, num_frames)
        return [self._result(tokenizer, ids, r) for ids, r in zip(tokens, results)]

    def _result(self, tokenizer, ids: list[int], result) -> ReferenceLikelihood:
        probs = np.asarray(result.text_token_probs, dtype=np.float64)
        nll = float(-np.log(np.maximum(probs, P_FLOOR)).mean())
        words, word_tokens = tokenizer.split_to_word_tokens(ids + [tokenizer.eot])
        text_index = np.array([pair[0] for pair in result.alignments])
        time_index = np.array([pair[1] for pair in result.alignments])
        # the time of each token: where the warping path first reaches it (faster-whisper's find_alignment)
        jumps = np.pad(np.diff(text_index), (1, 0), constant_values=1).astype(bool)
        token_times = time_index[jumps] / self.model.tokens_per_second
        bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
        timed = tuple(
            WordLikelihood(word.strip(), float(token_times[lo]), float(token_times[hi]), float(probs[lo:hi].mean()))
            for word, lo, hi in zip(words[:-1], bounds[:-1], bounds[1:])
        )
        return ReferenceLikelihood(nll, tuple(float(p) for p in probs), timed)
