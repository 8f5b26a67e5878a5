"""The models a speech reward's settings name (`reward_settings.ModelSettings`), each loaded once: the codec and the
token layout that reads its codes, one recogniser per (backend, checkpoint) whichever languages and ears it serves,
the reference likelihood on the recogniser's own Whisper where both name the same checkpoint, and the speaker,
quality and code-ear models. `reward_fns.pipeline.SpeechReward.from_settings` scores with them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from maspo_base.codecs import Codec, codec_layout, load_codec
from maspo_base.speech_tokens.layouts import SpeechTokenLayout
from maspo_base.typed_settings import SettingsError
from reward_fns.asr import AsrBackend, get_asr_backend_cls
from reward_fns.code_ear import CodeEar
from reward_fns.likelihood import WhisperLikelihood
from reward_fns.quality import DnsMos, build_quality_backend
from reward_fns.reward_settings import ModelSettings, parse_asr_spec, parse_likelihood_spec
from reward_fns.speaker_similarity import SpeakerBackend, build_speaker_backend


@dataclass
class RewardModels:
    """The loaded models, by the `SpeechReward` argument each one fills; recognisers and likelihood models by base
    language."""

    codec: Codec
    layout: SpeechTokenLayout
    asr: dict[str, AsrBackend]
    second_asr: dict[str, AsrBackend]
    likelihood: dict[str, WhisperLikelihood]
    speaker: SpeakerBackend | None
    quality: DnsMos | None
    ear: CodeEar | None


def load_models(settings: ModelSettings) -> RewardModels:
    """Load what ``settings`` name; see `reward_settings.parse_asr_spec` for ``asr``. ``SettingsError`` names a
    missing codec or recogniser, or a layout whose codebook is not the codec's."""
    missing = [name for name in ("codec", "asr") if not getattr(settings, name)]
    if missing:
        raise SettingsError(f"reward settings lack {missing}: the codec checkpoint and the ASR per language")
    asr_spec = parse_asr_spec(settings.asr)  # type: ignore[arg-type]
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
    return RewardModels(
        codec=decoder,
        layout=layout,
        asr=by_lang,
        second_asr=second,
        likelihood=likelihood,
        speaker=build_speaker_backend(settings.speaker, settings.device) if settings.speaker else None,
        quality=build_quality_backend(settings.quality) if settings.quality else None,
        ear=CodeEar.from_pretrained(settings.ear, device=settings.device) if settings.ear else None,
    )
