"""ASR backends behind one registry: ``@register_asr_backend(name)`` on a subclass of `AsrBackend`.

Every backend transcribes a batch of 16 kHz float32 waveforms, one language code per waveform, and returns the
transcripts in input order. A backend loads from a local directory (offline) or, where its library allows, a hub
name. Registered here:

- ``paraformer``: FunASR ``AutoModel`` (default model ``paraformer-zh``, the Seed-TTS-eval Chinese recogniser).
- ``sensevoice``: FunASR ``AutoModel`` with SenseVoice's tags (``<|zh|><|NEUTRAL|>...``) stripped.
- ``faster_whisper``: Whisper on CTranslate2; English (Seed-TTS-eval uses ``large-v3``). Waveforms up to 30 s are
  recognised in one batched ``generate`` call per language.
- ``pocketsphinx``: CMU PocketSphinx with its bundled US English models; English, CPU, no network: the second ear
  evaluations are heard by (it shares nothing with Whisper).
"""

from __future__ import annotations

import abc
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from maspo_base.registry import Registry
from reward_fns.alignment import TimedWord, aligned_words, paraformer_words, whisper_words
from reward_fns.text_norm import base_language

ASR_BACKEND_REGISTRY = Registry("ASR backend")
register_asr_backend = ASR_BACKEND_REGISTRY.register
"""``@register_asr_backend(name)`` on a subclass of `AsrBackend` (the shape of veRL's ``register_policy_loss``)."""
get_asr_backend_cls = ASR_BACKEND_REGISTRY.lookup


class AsrBackend(abc.ABC):
    """A speech recogniser. ``model`` is a local directory or a name the library resolves; ``num_threads``: CPU
    threads for a backend whose engine keeps its own (None: the engine's default)."""

    default_model: str = ""

    def __init__(self, model: str | None = None, device: str = "cpu", num_threads: int | None = None, **options):
        self.model_name = model or self.default_model
        self.device = device
        self.num_threads = num_threads
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
        options = {"frontend_conf": {"dither": 0.0}, **self.options}
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
    timestamps or previous-text conditioning, as a reward should be. ``num_threads``: CTranslate2's CPU threads
    (None: its default, ``OMP_NUM_THREADS`` when set).

    `transcribe_timed` hears exactly what `transcribe` hears: the same decoding gives the transcript, then a forced
    alignment of that transcript's tokens (CTranslate2's ``Whisper.align``, the cross-attention alignment behind
    faster-whisper's ``word_timestamps``) gives each word its span. The score of a response therefore does not depend
    on whether frame errors or heard words were asked for (faster-whisper's ``transcribe(word_timestamps=True)``
    decodes with timestamp tokens and temperature fallback, and heard other words on the same audio). Waveforms over
    ``max_batch_seconds`` go through faster-whisper's long-form ``transcribe`` in both.
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

        options = {**self.options, **({"cpu_threads": self.num_threads} if self.num_threads else {})}
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

    def _batch(self, audio: list[np.ndarray], lang: str, timed: bool) -> list[tuple[str, list[TimedWord] | None]]:
        """``(transcript, timed words or None)`` per waveform: one greedy ``generate`` over the batch, then, when
        ``timed``, the forced alignment of each transcript's tokens on the same encoder output."""
        from faster_whisper.audio import pad_or_trim

        tokenizer = self._tokenizer(lang)
        prompt = self.model.get_prompt(tokenizer, previous_tokens=[], without_timestamps=True)
        features = [self.model.feature_extractor(a) for a in audio]
        encoded = self.model.encode(np.stack([pad_or_trim(f) for f in features]))
        results = self.model.model.generate(
            encoded,
            [list(prompt) for _ in audio],
            beam_size=self.beam_size,
            max_length=self.model.max_length,
            suppress_blank=True,
            suppress_tokens=[-1],
        )
        tokens = [[t for t in r.sequences_ids[0] if t < tokenizer.eot] for r in results]
        texts = [tokenizer.decode(t).strip() for t in tokens]
        if not timed:
            return [(text, None) for text in texts]
        words: list[list[TimedWord]] = [[] for _ in audio]
        spoken = [i for i, t in enumerate(tokens) if t]  # nothing heard: no word to align
        if spoken:
            chunk = self.model.feature_extractor.nb_max_frames  # 3000 frames: 30 s
            if len(spoken) < len(audio):
                encoded = self.model.encode(np.stack([pad_or_trim(features[i]) for i in spoken]))
            aligned = self.model.find_alignment(
                tokenizer, [tokens[i] for i in spoken], encoded, [min(features[i].shape[-1], chunk) for i in spoken]
            )
            for i, found in zip(spoken, aligned):
                words[i] = aligned_words(found, lang)
        return list(zip(texts, words))

    def _long(self, audio: np.ndarray, lang: str, timed: bool) -> tuple[str, list[TimedWord] | None]:
        multilingual = self.model.model.is_multilingual
        segments, _ = self.model.transcribe(
            audio,
            language=lang if multilingual else None,
            beam_size=self.beam_size,
            condition_on_previous_text=False,
            word_timestamps=timed,
        )
        segments = list(segments)
        return " ".join(s.text.strip() for s in segments), whisper_words(segments) if timed else None

    def transcribe_timed(
        self, audio: Sequence[np.ndarray], languages: Sequence[str]
    ) -> list[tuple[str, list[TimedWord] | None]]:
        """`transcribe`'s transcripts, each word with its span (the class docstring)."""
        return self._recognise(audio, languages, timed=True)

    def transcribe(self, audio: Sequence[np.ndarray], languages: Sequence[str]) -> list[str]:
        return [text for text, _ in self._recognise(audio, languages, timed=False)]

    def _recognise(
        self, audio: Sequence[np.ndarray], languages: Sequence[str], timed: bool
    ) -> list[tuple[str, list[TimedWord] | None]]:
        out: list[tuple[str, list[TimedWord] | None]] = [None] * len(audio)  # every waveform filled below
        by_lang: dict[str, list[int]] = defaultdict(list)
        for i, (a, lang) in enumerate(zip(audio, languages)):
            if len(a) > self.max_batch_seconds * 16_000:
                out[i] = self._long(np.asarray(a, dtype=np.float32), base_language(lang), timed)
            else:
                by_lang[base_language(lang)].append(i)
        for lang, idx in by_lang.items():
            for start in range(0, len(idx), self.batch_size):
                chunk = idx[start : start + self.batch_size]
                heard = self._batch([np.asarray(audio[i], dtype=np.float32) for i in chunk], lang, timed)
                for i, result in zip(chunk, heard):
                    out[i] = result
        return out


@register_asr_backend("pocketsphinx")
class PocketSphinxBackend(AsrBackend):
    """CMU PocketSphinx 5 (PyPI ``pocketsphinx``, which carries its US English acoustic model, language model and
    dictionary): a recogniser that shares nothing with Whisper, for hearing evaluations with a second ear.

    ``model``: a directory holding ``en-us/`` as the package lays it out (default: the package's own). English only:
    another language raises. Every waveform is decoded as one utterance from the same state (``reinit_feat`` resets
    the adaptive cepstral mean and noise estimate the decoder would otherwise carry from one utterance to the next),
    so a transcript depends on its waveform alone, not on what was heard before it.
    """

    default_model = ""

    def __init__(self, model: str | None = None, device: str = "cpu", batch_size: int | None = None, **options):
        super().__init__(model, device, **options)
        import pocketsphinx

        if device != "cpu":
            raise ValueError(f"pocketsphinx runs on the CPU only (device={device!r})")
        settings = {"samprate": 16000, **self.options}
        if self.model_name:
            settings.update(
                hmm=str(Path(self.model_name) / "en-us" / "en-us"),
                lm=str(Path(self.model_name) / "en-us" / "en-us.lm.bin"),
                dict=str(Path(self.model_name) / "en-us" / "cmudict-en-us.dict"),
            )
        self.decoder = pocketsphinx.Decoder(**settings)

    def transcribe(self, audio: Sequence[np.ndarray], languages: Sequence[str]) -> list[str]:
        wrong = sorted({lang for lang in languages if base_language(lang) != "en"})
        if wrong:
            raise ValueError(f"pocketsphinx hears English only; got languages {wrong}")
        return [self._one(a) for a in audio]

    def _one(self, audio: np.ndarray) -> str:
        pcm = (np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767).astype(np.int16)
        self.decoder.reinit_feat()
        self.decoder.start_utt()
        self.decoder.process_raw(pcm.tobytes(), full_utt=True)
        self.decoder.end_utt()
        hypothesis = self.decoder.hyp()
        return hypothesis.hypstr if hypothesis is not None else ""
