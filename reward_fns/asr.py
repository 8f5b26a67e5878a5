"""ASR backends behind one registry: ``@register_asr_backend(name)`` on a subclass of `AsrBackend`.

Every backend transcribes a batch of 16 kHz float32 waveforms, one language code per waveform, and returns the
transcripts in input order. A backend loads from a local directory (offline) or, where its library allows, a hub
name. Registered here:

- ``paraformer``: FunASR ``AutoModel`` (default model ``paraformer-zh``, the Seed-TTS-eval Chinese recogniser).
- ``sensevoice``: FunASR ``AutoModel`` with SenseVoice's tags (``<|zh|><|NEUTRAL|>...``) stripped.
- ``faster_whisper``: Whisper on CTranslate2; English (Seed-TTS-eval uses ``large-v3``). Waveforms up to 30 s are
  recognised in one batched ``generate`` call per language.
"""

from __future__ import annotations

import abc
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from .alignment import TimedWord, paraformer_words, whisper_words
from .registry import Registry
from .text_norm import base_language

ASR_BACKEND_REGISTRY = Registry("ASR backend")
register_asr_backend = ASR_BACKEND_REGISTRY.register
"""``@register_asr_backend(name)`` on a subclass of `AsrBackend` (the shape of veRL's ``register_policy_loss``)."""
get_asr_backend_cls = ASR_BACKEND_REGISTRY.lookup


class AsrBackend(abc.ABC):
    """A speech recogniser. ``model`` is a local directory or a name the library resolves."""

    default_model: str = ""

    def __init__(self, model: str | None = None, device: str = "cpu", **options):
        self.model_name = model or self.default_model
        self.device = device
        self.options = options

    @abc.abstractmethod
    def transcribe(self, audio: Sequence[np.ndarray], languages: Sequence[str]) -> list[str]:
        """Transcripts of 16 kHz mono float32 ``audio``, in input order."""

    def transcribe_timed(
        self, audio: Sequence[np.ndarray], languages: Sequence[str]
    ) -> list[tuple[str, list[TimedWord] | None]]:
        """Transcripts with each word's time span (`reward_fns.alignment`); None where the backend has none."""
        return [(text, None) for text in self.transcribe(audio, languages)]


@register_asr_backend("paraformer")
class FunAsrBackend(AsrBackend):
    """FunASR ``AutoModel``; a local directory holds ``config.yaml``, ``model.pt``, ``tokens.json`` (+ ``am.mvn``).

    ``batch_size`` is the waveforms per ``generate`` call. Paraformer pads a batch to its longest waveform and its
    output shifts with the batch's make-up (F5-TTS notes it for evaluation; measured here on a random model): with the
    default 1 a response's transcript does not depend on its neighbours. Larger values buy GPU throughput for that.

    Determinism: FunASR's ``WavFrontend`` adds Kaldi dither (random noise, ``dither=1.0`` unless the model's
    ``config.yaml`` sets it) to every waveform before the filterbank, so the same audio gives different features, and
    near a decision boundary different transcripts, from call to call. A reward must not be random: the backend loads
    the model with ``frontend_conf={"dither": 0.0}``. FunASR has no other randomness at inference
    (``AutoModel(seed=...)`` only seeds the RNGs once at load).
    """

    default_model = "paraformer-zh"
    generate_kwargs: dict = {}

    def __init__(self, model: str | None = None, device: str = "cpu", batch_size: int | None = None, **options):
        super().__init__(model, device, **options)
        from funasr import AutoModel

        self.batch_size = batch_size or 1
        # merged into config.yaml's frontend_conf (FunASR restores its kwargs before each call, so it is set here)
        options.setdefault("frontend_conf", {"dither": 0.0})
        self.model = AutoModel(
            model=self.model_name, device=device, disable_update=True, disable_pbar=True, disable_log=True, **options
        )

    def postprocess(self, text: str) -> str:
        return text

    def transcribe(self, audio: Sequence[np.ndarray], languages: Sequence[str]) -> list[str]:
        if not audio:
            return []
        out = self.model.generate(
            input=[np.asarray(a, dtype=np.float32) for a in audio], batch_size=self.batch_size, **self.generate_kwargs
        )
        if len(out) != len(audio):
            raise RuntimeError(f"FunASR returned {len(out)} results for {len(audio)} waveforms")
        # Results come in input order; keys repeat for array inputs, so never join on them.
        return [self.postprocess(r.get("text", "")) for r in out]

    def transcribe_timed(
        self, audio: Sequence[np.ndarray], languages: Sequence[str]
    ) -> list[tuple[str, list[TimedWord] | None]]:
        """Paraformer's CIF timestamps, one ``[start_ms, end_ms]`` per token (``output_timestamp=True``)."""
        if not audio:
            return []
        out = self.model.generate(
            input=[np.asarray(a, dtype=np.float32) for a in audio],
            batch_size=self.batch_size,
            output_timestamp=True,
            **self.generate_kwargs,
        )
        if len(out) != len(audio):
            raise RuntimeError(f"FunASR returned {len(out)} results for {len(audio)} waveforms")
        return [(self.postprocess(r.get("text", "")), paraformer_words(r)) for r in out]


@register_asr_backend("sensevoice")
class SenseVoiceBackend(FunAsrBackend):
    default_model = "iic/SenseVoiceSmall"
    generate_kwargs = {"language": "auto", "use_itn": False}

    def postprocess(self, text: str) -> str:
        from funasr.utils.postprocess_utils import rich_transcription_postprocess

        return rich_transcription_postprocess(text)

    transcribe_timed = AsrBackend.transcribe_timed  # SenseVoice gives no timestamps: no alignment


@register_asr_backend("faster_whisper")
class FasterWhisperBackend(AsrBackend):
    """faster-whisper ``WhisperModel`` (a CTranslate2 model directory or a size name such as ``large-v3``).

    ``compute_type``: ``int8`` on CPU, ``float16`` on GPU. Greedy decoding (``beam_size=1``) by default, without
    timestamps or previous-text conditioning, as a reward should be.
    """

    default_model = "large-v3"
    max_batch_seconds = 30.0

    def __init__(
        self,
        model: str | None = None,
        device: str = "cpu",
        compute_type: str | None = None,
        beam_size: int = 1,
        batch_size: int | None = None,
        **options,
    ):
        super().__init__(model, device, **options)
        from faster_whisper import WhisperModel

        compute_type = compute_type or ("int8" if device == "cpu" else "float16")
        # every waveform is padded to 30 s, so a batch does not change any one transcript
        self.beam_size, self.batch_size = beam_size, batch_size or 16
        self.model = WhisperModel(self.model_name, device=device, compute_type=compute_type, **options)

    def _tokenizer(self, lang: str):
        from faster_whisper.tokenizer import Tokenizer

        multilingual = self.model.model.is_multilingual
        return Tokenizer(
            self.model.hf_tokenizer, multilingual, task="transcribe", language=lang if multilingual else None
        )

    def _batch(self, audio: list[np.ndarray], lang: str) -> list[str]:
        from faster_whisper.audio import pad_or_trim

        tokenizer = self._tokenizer(lang)
        prompt = self.model.get_prompt(tokenizer, previous_tokens=[], without_timestamps=True)
        features = np.stack([pad_or_trim(self.model.feature_extractor(a)) for a in audio])
        results = self.model.model.generate(
            self.model.encode(features),
            [list(prompt) for _ in audio],
            beam_size=self.beam_size,
            max_length=self.model.max_length,
            suppress_blank=True,
            suppress_tokens=[-1],
        )
        return [tokenizer.decode(r.sequences_ids[0]).strip() for r in results]

    def _long(self, audio: np.ndarray, lang: str) -> str:
        multilingual = self.model.model.is_multilingual
        segments, _ = self.model.transcribe(
            audio, language=lang if multilingual else None, beam_size=self.beam_size, condition_on_previous_text=False
        )
        return " ".join(s.text.strip() for s in segments)

    def transcribe_timed(
        self, audio: Sequence[np.ndarray], languages: Sequence[str]
    ) -> list[tuple[str, list[TimedWord] | None]]:
        """One waveform at a time through faster-whisper's ``transcribe(word_timestamps=True)`` (cross-attention
        alignment of each word); the transcript is the words joined, so score and frame errors agree."""
        out = []
        multilingual = self.model.model.is_multilingual
        for a, lang in zip(audio, languages):
            segments, _ = self.model.transcribe(
                np.asarray(a, dtype=np.float32),
                language=base_language(lang) if multilingual else None,
                beam_size=self.beam_size,
                condition_on_previous_text=False,
                word_timestamps=True,
            )
            segments = list(segments)
            out.append((" ".join(s.text.strip() for s in segments), whisper_words(segments)))
        return out

    def transcribe(self, audio: Sequence[np.ndarray], languages: Sequence[str]) -> list[str]:
        out = [""] * len(audio)
        by_lang: dict[str, list[int]] = defaultdict(list)
        for i, (a, lang) in enumerate(zip(audio, languages)):
            if len(a) > self.max_batch_seconds * 16_000:
                out[i] = self._long(np.asarray(a, dtype=np.float32), base_language(lang))
            else:
                by_lang[base_language(lang)].append(i)
        for lang, idx in by_lang.items():
            for start in range(0, len(idx), self.batch_size):
                chunk = idx[start : start + self.batch_size]
                texts = self._batch([np.asarray(audio[i], dtype=np.float32) for i in chunk], lang)
                for i, text in zip(chunk, texts):
                    out[i] = text
        return out
