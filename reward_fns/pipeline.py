"""The in-process reward backend: a batch of responses -> gate -> codec decode -> ASR -> scores.

`SpeechReward.score_batch` is what both the in-process veRL entry point and the reward server call. It never raises
because of one sample: every per-sample step (request checks, parse and gate, prompt decode, decode, ASR, speaker
similarity, scoring) is isolated, a batched stage that fails is retried sample by sample, and a sample that still
fails scores ``invalid_score`` with ``speech_reason`` naming the stage (`reward_fns.score_record.FAILURE_REASONS`)
and ``speech_detail`` the message. Its neighbours are scored as if it were not there.

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
import logging
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from maspo_base.codecs import Codec, codec_layout, load_codec
from maspo_base.frame_errors import CREDIT_SOURCE_KEYS, encode_frame_errors
from maspo_base.frame_words import FRAME_WORDS_KEY, encode_frame_words
from maspo_base.llasa_response import GateConfig, ParsedResponse, parse_response, parse_token_ids
from maspo_base.speech_tokens.layouts import SpeechTokenLayout
from maspo_base.typed_settings import SettingsError, build
from maspo_base.xcodec2_decoder import HOP_LENGTH, SAMPLE_RATE
from reward_fns.alignment import frame_errors_from_words, frame_words_from_words
from reward_fns.asr import AsrBackend, get_asr_backend_cls
from reward_fns.code_ear import CodeEar
from reward_fns.ear_scoring import AUDIO_KEYS, score_with_ear
from reward_fns.error_rate import error_rate
from reward_fns.likelihood import ReferenceLikelihood, WhisperLikelihood
from reward_fns.quality import DnsMos, build_quality_backend
from reward_fns.reward import RewardConfig, compose
from reward_fns.reward_settings import ModelSettings, parse_asr_spec, parse_likelihood_spec
from reward_fns.score_record import (
    NOT_HEARD_TWICE,
    RecordShape,
    ScoreRequest,
    error_message,
    per_item,
    unscored_record,
)
from reward_fns.speaker_similarity import SpeakerBackend, build_speaker_backend
from reward_fns.text_norm import base_language, scoring_units

logger = logging.getLogger(__name__)


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
        """Load the models `reward_settings.ModelSettings` names; see `parse_asr_spec` for ``asr``."""
        missing = [name for name in ("codec", "asr") if not getattr(settings, name)]
        if missing:
            raise SettingsError(f"reward settings lack {missing}: the codec checkpoint and the ASR per language")
        asr_spec = parse_asr_spec(settings.asr)  # type: ignore[arg-type]
        num_threads = settings.num_threads or torch.get_num_threads()
        codec_spec: str = settings.codec  # type: ignore[assignment]
        decoder = load_codec(codec_spec, device=settings.device, dtype=getattr(torch, settings.dtype))
        try:
            layout = codec_layout(decoder, settings.layout)
        except ValueError as error:
            raise SettingsError(f"reward settings layout={settings.layout!r}: {error}") from None
        backends: dict[tuple[str, str | None], AsrBackend] = {}
        whisper_options = {"compute_type": settings.whisper_compute_type} if settings.whisper_compute_type else {}

        def backend(key: tuple[str, str | None]) -> AsrBackend:
            if key not in backends:  # one model serves every language mapped to it
                backends[key] = get_asr_backend_cls(key[0])(
                    model=key[1],
                    device=settings.device,
                    batch_size=settings.asr_batch_size,
                    num_threads=settings.num_threads,
                    **(whisper_options if key[0] == "faster_whisper" else {}),
                )
            return backends[key]

        by_lang = {lang: backend(key) for lang, key in asr_spec.items()}
        second_spec = parse_asr_spec(settings.second_asr) if settings.second_asr else {}
        second = {lang: backend(key) for lang, key in second_spec.items()}
        likelihood = {}
        for lang, model in parse_likelihood_spec(settings.likelihood or {}).items() if settings.likelihood else ():
            shared = backends.get(("faster_whisper", model))  # the ASR's own model: loaded once
            likelihood[lang] = WhisperLikelihood(
                shared.model if shared else model,
                device=settings.device,
                **({} if shared else whisper_options),
                **({"batch_size": settings.asr_batch_size} if settings.asr_batch_size else {}),
            )
        speaker = settings.speaker
        return cls(
            decoder,
            by_lang,
            default_language=settings.default_language,
            config=settings.reward_config,
            gate=GateConfig(max_codes=settings.max_codes),
            speaker=build_speaker_backend(speaker, settings.device) if speaker else None,
            codec_max_batch=settings.codec_max_batch,
            num_threads=num_threads,  # FunASR's loader sets its own thread count; this one wins
            codec_pad_multiple=settings.codec_pad_multiple,
            likelihood=likelihood,
            quality=build_quality_backend(settings.quality) if settings.quality else None,
            layout=layout,
            second_asr=second,
            ear=CodeEar.from_pretrained(settings.ear, device=settings.device) if settings.ear else None,
        )

    def _record(self, reason: str, detail: str = "", n_codes: int = 0) -> dict[str, Any]:
        """A result with every key, as for a response that is not scored; a scored one overwrites its parts."""
        return unscored_record(self.record_shape(), reason, detail, n_codes)

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

    def _parse(self, req: ScoreRequest) -> ParsedResponse:
        if req.token_ids is not None:
            return parse_token_ids(req.token_ids, self.layout, prompt_codes=req.prompt_codes, config=self.gate)
        if req.solution_str is None:
            return ParsedResponse(
                np.zeros(0, np.int64), "no_speech_tokens", "request has neither solution_str nor token_ids"
            )
        return parse_response(req.solution_str, prompt_codes=req.prompt_codes, config=self.gate, layout=self.layout)

    def _prepare(self, raw: ScoreRequest | Mapping[str, Any]) -> tuple[ScoreRequest | None, dict | None, Any]:
        """Check, parse and gate one request: ``(request, None, (parsed, lang))`` to score it, else a result."""
        try:
            codebook = self.layout.codebook_size
            req = raw.checked(codebook) if isinstance(raw, ScoreRequest) else ScoreRequest.from_dict(raw, codebook)
        except Exception as exc:  # noqa: BLE001 - one request's problem, reported in its result
            return None, self._record("invalid_request", error_message(exc)), None
        try:
            parsed, lang = self._parse(req), self._language(req)
            if not parsed.ok:
                return req, self._record(parsed.reason, parsed.detail, len(parsed.codes)), None
            return req, self._precheck(req, lang, len(parsed.codes)), (parsed, lang)
        except Exception as exc:  # noqa: BLE001
            logger.warning("parsing a response failed: %s", exc)
            return req, self._record("invalid_request", error_message(exc)), None

    def score_batch(self, requests: Sequence[ScoreRequest | Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Score Llasa responses: gate, decode, recognise, score. One result dict per request, in order.

        Never raises because of one request: an unusable one scores ``invalid_score`` (`FAILURE_REASONS`)."""
        with self._lock:
            self._enter()
            return self._score_batch(list(requests))

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
        languages = languages or [None] * n
        prompt_audio = prompt_audio or [None] * n
        requests = [
            ScoreRequest(ground_truth=g, language=lang, prompt_audio=p)
            for g, lang, p in zip(ground_truths, languages, prompt_audio)
        ]
        results: list[dict[str, Any] | None] = [None] * n
        items = []
        for i, req in enumerate(requests):
            try:
                requests[i] = req = req.checked(self.layout.codebook_size)
            except ValueError as exc:
                results[i] = self._record("invalid_request", error_message(exc), len(audio[i]) // HOP_LENGTH)
                continue
            lang = self._language(req)
            results[i] = self._precheck(req, lang, len(audio[i]) // HOP_LENGTH)
            if results[i] is None:
                items.append((i, np.asarray(audio[i], dtype=np.float32), lang))
        with self._lock:
            self._enter()
            self._recognise(requests, items, results)
        return results  # type: ignore[return-value]

    def _language(self, req: ScoreRequest) -> str:
        return base_language(req.language) if req.language else self.default_language

    def _precheck(self, req: ScoreRequest, lang: str, n_codes: int) -> dict[str, Any] | None:
        if not isinstance(req.ground_truth, str) or not req.ground_truth.strip():
            return self._record("empty_reference", f"ground_truth={req.ground_truth!r}", n_codes)
        if lang not in self.asr:
            return self._record("no_asr_for_language", f"language {lang!r}; configured: {sorted(self.asr)}", n_codes)
        if self.ear is not None:
            if lang != base_language(self.ear.config.voice):
                return self._record(
                    "no_asr_for_language", f"language {lang!r}; the code ear hears {self.ear.config.voice}"
                )
            return None
        if lang not in self.likelihood and (
            self.config.intelligibility in ("anchors", "likelihood") or self.config.frame_likelihood
        ):
            return self._record(
                "no_asr_for_language", f"no likelihood model for {lang!r}; configured: {sorted(self.likelihood)}"
            )
        return None

    def _score_batch(self, raw: list[ScoreRequest | Mapping[str, Any]]) -> list[dict[str, Any]]:
        results: list[dict[str, Any] | None] = [None] * len(raw)
        requests: list[ScoreRequest | None] = [None] * len(raw)
        todo: list[tuple[int, ParsedResponse, str]] = []
        for i, item in enumerate(raw):
            requests[i], results[i], work = self._prepare(item)
            if results[i] is None:
                todo.append((i, *work))
        if self.ear is not None:  # the ear scores; the audio ears hear what asks to be evaluated, never scored
            scored = score_with_ear(self.ear, self.config, self._record, requests, todo, self.layout.frame_rate)
            for i, result in scored.items():
                results[i] = result
            todo = [(i, p, lang) for i, p, lang in todo if requests[i].second_ear and results[i]["speech_valid"]]
        self._hear_audio(requests, todo, results)
        return results  # type: ignore[return-value]

    def _hear_audio(self, requests: list, todo: list[tuple[int, ParsedResponse, str]], results: list) -> None:
        """Decode and recognise each ``(i, parsed, lang)`` of ``todo`` into ``results[i]``; under the code ear only
        the audio ears' parts (`AUDIO_KEYS`, the second ear's) join the ear's result."""
        by_ear = {i: results[i] for i, _, _ in todo} if self.ear is not None else {}
        for i in by_ear:
            results[i] = None
        decoded = (
            per_item(
                lambda items: self.codec.decode(
                    [p.codes for _, p, _ in items], max_batch=self.codec_max_batch, pad_multiple=self.codec_pad_multiple
                ),
                todo,
                "codec decode",
            )
            if todo
            else []
        )
        items = []
        for (i, parsed, lang), (audio, err) in zip(todo, decoded):
            if err is not None:
                results[i] = self._record("decode_error", err, len(parsed.codes))
            else:
                items.append((i, audio, lang))
        self._recognise(requests, items, results)  # type: ignore[arg-type]
        for i, scored in by_ear.items():
            heard = results[i]
            results[i] = scored
            scored.update({k: heard[k] for k in (*AUDIO_KEYS, *NOT_HEARD_TWICE) if k in heard})

    def _recognise(self, requests: list[ScoreRequest], items: list[tuple[int, np.ndarray, str]], results: list) -> None:
        """ASR (one batch per backend), speaker similarity, scores: fills ``results[i]`` for each item."""
        by_backend: dict[int, list[tuple[int, np.ndarray, str]]] = defaultdict(list)
        for item in items:
            i, audio, _ = item
            if audio.size == 0 or not np.isfinite(audio).all():
                why = "empty waveform" if audio.size == 0 else "waveform has NaN/inf samples"
                results[i] = self._record("unscorable_audio", why, len(audio) // HOP_LENGTH)
                continue
            by_backend[id(self.asr[item[2]])].append(item)
        recognised: dict[int, tuple[np.ndarray, str, str]] = {}
        timed: dict[int, list | None] = {}
        with_times = (
            self.audio_config.frame_errors or self.audio_config.frame_words
        )  # one timed transcription serves both
        for group in by_backend.values():
            backend = self.asr[group[0][2]]
            transcribe = backend.transcribe_timed if with_times else backend.transcribe
            texts = per_item(
                lambda batch, transcribe=transcribe: transcribe(
                    [a for _, a, _ in batch], [lang for _, _, lang in batch]
                ),
                group,
                "ASR",
            )
            for (i, audio, lang), (text, err) in zip(group, texts):
                if err is not None:
                    results[i] = self._record("asr_error", err, len(audio) // HOP_LENGTH)
                else:
                    text, timed[i] = text if with_times else (text, None)
                    recognised[i] = (audio, text, lang)

        for i, (audio, text, _) in list(recognised.items()):
            if not scoring_units(text, recognised[i][2]):  # silence or noise: never scored as if it were right
                results[i] = self._record("empty_transcript", f"transcript {text!r}", len(audio) // HOP_LENGTH)
                del recognised[i]
        likelihood = self._likelihood(requests, recognised, results)
        quality = self._quality(recognised, results)
        similarity, sim_errors = self._similarity(requests, {i: audio for i, (audio, _, _) in recognised.items()})
        for i, (audio, text, lang) in recognised.items():
            if i in sim_errors:
                results[i] = self._record("similarity_error", sim_errors[i], len(audio) // HOP_LENGTH)
                continue
            try:
                results[i] = self._score_text(
                    requests[i], audio, text, lang, similarity.get(i), likelihood.get(i), quality.get(i)
                )
                n_frames = len(audio) // HOP_LENGTH
                if self.audio_config.frame_errors and results[i]["speech_valid"] and timed.get(i) is not None:
                    errors = frame_errors_from_words(requests[i].ground_truth, timed[i], lang, n_frames)
                    results[i]["frame_errors"] = encode_frame_errors(errors)
                if self.audio_config.frame_words and results[i]["speech_valid"] and timed.get(i) is not None:
                    words = frame_words_from_words(timed[i], lang, n_frames)
                    results[i][FRAME_WORDS_KEY] = encode_frame_words(words)
                if self.audio_config.frame_likelihood and results[i]["speech_valid"]:
                    results[i][CREDIT_SOURCE_KEYS["likelihood"]] = encode_frame_errors(
                        likelihood[i].frame_surprise(n_frames)
                    )
            except Exception as exc:  # noqa: BLE001
                results[i] = self._record("scoring_error", error_message(exc), len(audio) // HOP_LENGTH)
        if self.second_asr:
            self._hear_again(requests, items, results)

    def _hear_again(
        self, requests: list[ScoreRequest], items: list[tuple[int, np.ndarray, str]], results: list
    ) -> None:
        """The second ear's error rate of every request that asks for it (module docstring): heard where its audio
        is, every character wrong where there is none or the second ear has no model for its language or fails."""
        audio_of = {i: (audio, lang) for i, audio, lang in items if audio.size and np.isfinite(audio).all()}
        asked = [i for i, req in enumerate(requests) if req is not None and req.second_ear and results[i] is not None]
        heard = [i for i in asked if i in audio_of and audio_of[i][1] in self.second_asr]
        by_backend: dict[int, list[int]] = defaultdict(list)
        for i in heard:
            by_backend[id(self.second_asr[audio_of[i][1]])].append(i)
        texts: dict[int, str] = {}
        for idx in by_backend.values():
            backend = self.second_asr[audio_of[idx[0]][1]]
            transcribed = per_item(
                lambda batch, backend=backend: backend.transcribe(
                    [audio_of[i][0] for i in batch], [audio_of[i][1] for i in batch]
                ),
                idx,
                "second ear",
            )
            texts.update({i: text for i, (text, err) in zip(idx, transcribed) if err is None})
        for i in asked:
            raw = 1.0
            if i in texts and scoring_units(requests[i].ground_truth, audio_of[i][1]):
                raw = error_rate(requests[i].ground_truth, texts[i], audio_of[i][1], self.audio_config.error_unit).raw
            results[i].update(
                speech_second_error_rate=min(raw, 1.0),
                speech_second_error_rate_raw=raw,
                speech_second_transcript=texts.get(i, ""),
            )

    def _likelihood(
        self, requests: list[ScoreRequest], recognised: dict[int, tuple[np.ndarray, str, str]], results: list
    ) -> dict[int, ReferenceLikelihood]:
        """The reference likelihood of each recognised sample whose language has a model (one batch per model);
        a sample it fails on is dropped from ``recognised`` and scored worst (``likelihood_error``)."""
        by_model: dict[int, list[int]] = defaultdict(list)
        for i, (_, _, lang) in recognised.items():
            if lang in self.likelihood:
                by_model[id(self.likelihood[lang])].append(i)
        out: dict[int, ReferenceLikelihood] = {}
        for idx in by_model.values():
            model = self.likelihood[recognised[idx[0]][2]]
            scored = per_item(
                lambda batch, model=model: model.score(
                    [recognised[i][0] for i in batch],
                    [requests[i].ground_truth for i in batch],
                    [recognised[i][2] for i in batch],
                ),
                idx,
                "likelihood",
            )
            out.update(self._keep_scored(idx, scored, recognised, results, "likelihood_error"))
        return out

    def _quality(self, recognised: dict[int, tuple[np.ndarray, str, str]], results: list) -> dict[int, float]:
        """DNSMOS OVRL of each recognised sample (when a quality backend is configured); failures scored worst."""
        if self.quality is None:
            return {}
        idx = list(recognised)
        scored = per_item(lambda batch: self.quality.score([recognised[i][0] for i in batch]), idx, "quality")
        return {
            i: value.ovrl_mos
            for i, value in self._keep_scored(idx, scored, recognised, results, "quality_error").items()
        }

    def _keep_scored(
        self,
        idx: list[int],
        scored: list[tuple[Any, str | None]],
        recognised: dict[int, tuple[np.ndarray, str, str]],
        results: list,
        reason: str,
    ) -> dict[int, Any]:
        """The values a stage gave the samples ``idx`` (``scored``: `per_item`'s value, error pairs); a sample it
        failed on leaves ``recognised`` and its result records ``reason`` (scored worst), its neighbours untouched."""
        kept = {}
        for i, (value, err) in zip(idx, scored):
            if err is None:
                kept[i] = value
            else:
                results[i] = self._record(reason, err, len(recognised[i][0]) // HOP_LENGTH)
                del recognised[i]
        return kept

    def _score_text(
        self,
        req: ScoreRequest,
        audio: np.ndarray,
        text: str,
        lang: str,
        similarity: float | None,
        likelihood: ReferenceLikelihood | None = None,
        quality: float | None = None,
    ) -> dict[str, Any]:
        n_codes = len(audio) // HOP_LENGTH
        try:
            er = error_rate(req.ground_truth, text, lang, self.audio_config.error_unit)
        except ValueError as exc:
            return self._record("empty_reference", str(exc), n_codes)
        if self.speaker is not None and similarity is None:
            similarity = 0.0  # no prompt audio: nothing to compare with
        out = self._record("ok", "", n_codes)
        out.update(
            compose(
                self.audio_config,
                er.value,
                len(audio) / SAMPLE_RATE,
                er.language_units,
                lang,
                similarity,
                asr_nll=likelihood.nll if likelihood is not None else None,
                quality=quality,
            ),
            speech_valid=1.0,
            speech_error_rate=er.value,
            speech_error_rate_raw=er.raw,
            speech_transcript=text,
        )
        return out

    def _similarity(
        self, requests: list[ScoreRequest], audio_of: dict[int, np.ndarray]
    ) -> tuple[dict[int, float], dict[int, str]]:
        """Speaker similarity of each output to its prompt audio (given, or decoded from the prompt codes)."""
        if self.speaker is None:
            return {}, {}
        prompts: dict[int, np.ndarray] = {}
        errors: dict[int, str] = {}
        decode_prompt = [
            i
            for i in audio_of
            if requests[i].prompt_audio is None
            and requests[i].prompt_codes is not None
            and len(requests[i].prompt_codes)
        ]
        decoded = per_item(
            lambda items: self.codec.decode([requests[i].prompt_codes for i in items], max_batch=self.codec_max_batch),
            decode_prompt,
            "prompt decode",
        )
        for i, (audio, err) in zip(decode_prompt, decoded):
            if err is None:
                prompts[i] = audio
            else:
                errors[i] = f"decoding prompt_codes failed: {err}"
        for i in audio_of:
            if requests[i].prompt_audio is not None:
                prompts[i] = requests[i].prompt_audio
        idx = list(prompts)
        sims = per_item(
            lambda items: list(self.speaker.similarity([audio_of[i] for i in items], [prompts[i] for i in items])),
            idx,
            "speaker similarity",
        )
        values = {i: float(sim) for i, (sim, err) in zip(idx, sims) if err is None}
        errors.update({i: f"similarity failed: {err}" for i, (_, err) in zip(idx, sims) if err is not None})
        return values, errors
