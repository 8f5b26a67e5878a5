"""The in-process reward backend: a batch of responses -> gate -> codec decode -> ASR -> scores.

`SpeechReward.score_batch` is what both the in-process veRL entry point and the reward server call. It runs the
reward's stages (`reward_fns.stages`: admit, decode, recognise, measure, score, extras) over one `Sample` record per
response, and never raises because of one sample: every per-sample step (request checks, parse and gate, prompt
decode, decode, ASR, speaker similarity, scoring) is isolated, a batched stage that fails is retried sample by
sample, and a sample that still fails scores ``invalid_score`` with ``speech_reason`` naming the stage
(`reward_fns.score_record.FAILURE_REASONS`) and ``speech_detail`` the message. Its neighbours are scored as if it
were not there.

Every result has the same keys (veRL gathers them per key across the batch):

    score, speech_valid, speech_reason, speech_detail, speech_error_rate, speech_error_rate_raw,
    speech_intelligibility, speech_error_utility, speech_rate, speech_duration_score, speech_duration_s,
    speech_n_codes, speech_transcript
    (+ speech_similarity, speech_similarity_counted when a speaker backend is configured;
     + speech_asr_nll, speech_likelihood_utility when a likelihood model is;
     + speech_quality_mos, speech_quality when a quality backend is;
     + frame_errors / frame_likelihood / frame_words when ``reward_config`` asks for them;
     + speech_second_error_rate, speech_second_error_rate_raw, speech_second_transcript when a second ear is)

A second ear (``second_asr``) is a recogniser that never enters the score: a request that asks for it
(``second_ear=True``, as evaluation rows do) is heard by it too, and its error rate in the reward's unit is reported
beside the reward's own, so that a gain only the reward's recogniser hears can be told from one that any listener
hears. A request that does not ask reports NaN there; an unscorable one asking reports every character wrong (1).

An unscored sample reports every part at its worst: error rate 1, utilities 0, ``asr_nll`` = `MAX_TOKEN_NLL`,
DNSMOS 1.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from maspo_base.codecs import Codec, codec_layout
from maspo_base.llasa_response import GateConfig
from maspo_base.speech_tokens.layouts import SpeechTokenLayout
from maspo_base.typed_settings import build
from reward_fns.asr import AsrBackend
from reward_fns.code_ear import CodeEar
from reward_fns.ear_scoring import AUDIO_KEYS, score_with_ear
from reward_fns.likelihood import WhisperLikelihood
from reward_fns.quality import DnsMos
from reward_fns.reward import RewardConfig
from reward_fns.reward_models import load_models
from reward_fns.reward_settings import ModelSettings
from reward_fns.score_record import RecordShape, ScoreRequest
from reward_fns.speaker_similarity import SpeakerBackend
from reward_fns.stages.admit import Admission
from reward_fns.stages.decode import decode_prompts, decode_responses
from reward_fns.stages.measure import measure_likelihood, measure_quality, measure_similarity
from reward_fns.stages.recognise import check_waveforms, recognise, require_transcript
from reward_fns.stages.sample import Sample, Stage, through
from reward_fns.stages.score import add_frame_signals, score
from reward_fns.stages.second_ear import hear_again
from reward_fns.text_norm import base_language


class SpeechReward:
    """Holds the codec decoder (`maspo_base.codecs`), one ASR backend per language and an optional speaker backend.

    ``asr`` maps a base language code (``zh``, ``en``) to a backend; a request without ``language`` uses
    ``default_language``; a language without a backend is scored ``invalid_score`` with reason ``no_asr_for_language``.
    ``second_asr``, the same shape, is the second ear (module docstring).
    Token-id requests are read with ``layout`` (`maspo_base.codecs.codec_layout`: a registered name, or None for
    Llasa-1B's ids), whose codebook is the codec's: a code the codec lacks is gated as ``code_out_of_range``.
    """

    def __init__(
        self,
        codec: Codec,
        asr: Mapping[str, AsrBackend],
        default_language: str = "en",
        config: RewardConfig | None = None,
        gate: GateConfig | None = None,
        speaker: SpeakerBackend | None = None,
        codec_max_batch: int = 16,
        num_threads: int | None = None,
        codec_pad_multiple: int = 1,
        likelihood: Mapping[str, WhisperLikelihood] | None = None,
        quality: DnsMos | None = None,
        layout: str | SpeechTokenLayout | None = None,
        second_asr: Mapping[str, AsrBackend] | None = None,
        ear: CodeEar | None = None,
    ):
        self.codec, self.speaker, self.quality, self.ear = codec, speaker, quality, ear
        self.second_asr = {base_language(k): v for k, v in (second_asr or {}).items()}
        self.layout = codec_layout(codec, layout)
        self.likelihood = {base_language(k): v for k, v in (likelihood or {}).items()}
        self.asr = {base_language(k): v for k, v in asr.items()}
        self.default_language = base_language(default_language)
        self.config, self.gate = config or RewardConfig(), gate or GateConfig()
        if (self.config.recogniser == "ear") != (ear is not None):
            raise ValueError("reward_config.recogniser='ear' goes with a code ear (ear=), and a code ear with it")
        # what the audio recogniser scores with: the reward's config, or, under the ear, its plain error rate (the
        # audio then only reports what it heard of evaluation rows; the frame signals are the ear's)
        self.audio_config = self.config
        if ear is not None:
            self.audio_config = dataclasses.replace(
                self.config, recogniser="audio", intelligibility="error_rate", frame_errors=False, frame_words=False
            )
        self.codec_max_batch, self.codec_pad_multiple = codec_max_batch, codec_pad_multiple
        needs_likelihood = self.config.intelligibility in ("anchors", "likelihood") or self.config.frame_likelihood
        self.admission = Admission(
            self.layout,
            self.gate,
            self.default_language,
            recognised=tuple(sorted(self.asr)),
            ear_voice=ear.config.voice if ear is not None else None,
            likelihood=tuple(sorted(self.likelihood)) if needs_likelihood and ear is None else None,
        )
        self._lock = threading.Lock()  # models are not re-entrant: one batch at a time
        # CPU thread count changes float reductions; pin it in whichever thread scores, so that a response scores
        # the same in process, in the server's worker thread and one by one.
        self.num_threads = num_threads or torch.get_num_threads()

    def _enter(self) -> None:
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)

    @classmethod
    def from_spec(cls, **values: Any) -> SpeechReward:
        """Build from plain values (CLI flags, veRL ``reward_kwargs``): the fields of
        `reward_settings.ModelSettings`."""
        return cls.from_settings(build(ModelSettings, values, "reward settings"))

    @classmethod
    def from_settings(cls, settings: ModelSettings) -> SpeechReward:
        """Load the models `reward_settings.ModelSettings` names (`reward_models.load_models`)."""
        num_threads = settings.num_threads or torch.get_num_threads()  # FunASR's loader sets its own; this one wins
        models = load_models(settings)
        return cls(
            models.codec,
            models.asr,
            default_language=settings.default_language,
            config=settings.reward_config,
            gate=GateConfig(max_codes=settings.max_codes),
            speaker=models.speaker,
            codec_max_batch=settings.codec_max_batch,
            num_threads=num_threads,
            codec_pad_multiple=settings.codec_pad_multiple,
            likelihood=models.likelihood,
            quality=models.quality,
            layout=models.layout,
            second_asr=models.second_asr,
            ear=models.ear,
        )

    def record_shape(self) -> RecordShape:
        """Which optional parts this reward's results carry (every result has the same keys)."""
        return RecordShape(
            invalid_score=self.config.invalid_score,
            speaker=self.speaker is not None,
            likelihood=bool(self.likelihood),
            quality=self.quality is not None,
            frame_errors=self.config.frame_errors,
            frame_likelihood=self.config.frame_likelihood,
            frame_words=self.config.frame_words,
            second_ear=bool(self.second_asr),
            ear=self.ear is not None,
        )

    def score_batch(self, requests: Sequence[ScoreRequest | Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Score Llasa responses: gate, decode, recognise, score. One result dict per request, in order.

        Never raises because of one request: an unusable one scores ``invalid_score`` (`FAILURE_REASONS`)."""
        with self._lock:
            self._enter()
            samples = [self.admission.request(raw) for raw in requests]
            return self._results(self._hear(samples) if self.ear is None else self._hear_by_ear(samples))

    def score_audio(
        self,
        audio: Sequence[np.ndarray],
        ground_truths: Sequence[str],
        languages: Sequence[str | None] | None = None,
        prompt_audio: Sequence[np.ndarray | None] | None = None,
    ) -> list[dict[str, Any]]:
        """Score 16 kHz waveforms directly (no codec): recognise and score as `score_batch` does after decoding.
        A reward heard by the code ear has no audio path to score: ``ValueError``."""
        if self.ear is not None:
            raise ValueError("reward_config.recogniser='ear' scores codes: score them with score_batch, not audio")
        n = len(audio)
        languages, prompt_audio = languages or [None] * n, prompt_audio or [None] * n
        samples = [
            self.admission.audio(wave, ScoreRequest(truth, language=lang, prompt_audio=prompt))
            for wave, truth, lang, prompt in zip(audio, ground_truths, languages, prompt_audio)
        ]
        with self._lock:
            self._enter()
            return self._results(self._recognise(samples))

    def _hear(self, samples: list[Sample]) -> list[Sample]:
        """Decode each live sample's codes, then recognise and score its audio (`_recognise`)."""
        decode = partial(
            decode_responses, codec=self.codec, max_batch=self.codec_max_batch, pad_multiple=self.codec_pad_multiple
        )
        return self._recognise(through(decode, samples))

    def _recognise(self, samples: list[Sample]) -> list[Sample]:
        """The audio stages (`reward_fns.stages`) in order over the live samples, each skipping those that failed."""
        config = self.audio_config
        with_times = config.frame_errors or config.frame_words  # one timed transcription serves both
        stages: list[Stage] = [check_waveforms, partial(recognise, asr=self.asr, timed=with_times), require_transcript]
        if self.likelihood:
            stages.append(partial(measure_likelihood, models=self.likelihood))
        if self.quality is not None:
            stages.append(partial(measure_quality, backend=self.quality))
        if self.speaker is not None:
            stages.append(partial(decode_prompts, codec=self.codec, max_batch=self.codec_max_batch))
            stages.append(partial(measure_similarity, speaker=self.speaker))
        stages.append(partial(score, config=config, shape=self.record_shape(), speaker=self.speaker is not None))
        if with_times or config.frame_likelihood:
            stages.append(partial(add_frame_signals, config=config))
        for stage in stages:
            samples = through(stage, samples)
        return samples

    def _hear_by_ear(self, samples: list[Sample]) -> list[Sample]:
        """The code ear scores (`reward_fns.ear_scoring`); the audio ears hear the rows that ask to be evaluated."""
        shape, frame_rate = self.record_shape(), self.layout.frame_rate
        scored = through(
            partial(score_with_ear, ear=self.ear, config=self.config, shape=shape, frame_rate=frame_rate), samples
        )
        return through(self._hear_beside_ear, scored, where=lambda s: s.live and s.request.second_ear)

    def _hear_beside_ear(self, scored: list[Sample]) -> list[Sample]:
        """Evaluation rows the ear scored, with what the audio recogniser heard of their decoded codes (`AUDIO_KEYS`);
        their score stays the ear's."""
        shape = self.record_shape()
        heard = self._hear([sample.learnt(result=None) for sample in scored])
        out = []
        for sample, audio in zip(scored, heard):
            audio_result = audio.result if audio.live else audio.failure.record(shape)
            result = {**sample.result, **{key: audio_result[key] for key in AUDIO_KEYS}}
            out.append(sample.learnt(audio=audio.audio, result=result))
        return out

    def _results(self, samples: list[Sample]) -> list[dict[str, Any]]:
        """Each sample's result (a failed one's from its failure), with the second ear's parts where asked."""
        shape = self.record_shape()
        samples = [s if s.live else s.learnt(result=s.failure.record(shape)) for s in samples]
        if self.second_asr:
            samples = hear_again(samples, self.second_asr, self.audio_config.error_unit)
        return [sample.result for sample in samples]
