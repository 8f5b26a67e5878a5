"""The measure stages, each run when the reward has its model: the recogniser's likelihood of the reference
(`reward_fns.likelihood`), DNSMOS quality (`reward_fns.quality`) and speaker similarity to the voice prompt
(`reward_fns.speaker_similarity`). A sample a model fails on alone is not scored (``likelihood_error``,
``quality_error``, ``similarity_error``)."""

from __future__ import annotations

from collections.abc import Mapping

from reward_fns.likelihood import WhisperLikelihood
from reward_fns.quality import DnsMos
from reward_fns.speaker_similarity import SpeakerBackend
from reward_fns.stages.sample import Sample, batched, per_model, through


def measure_likelihood(samples: list[Sample], models: Mapping[str, WhisperLikelihood]) -> list[Sample]:
    """The reference's ``likelihood`` of each sample whose language has a model, one batch per model."""

    def score(model: WhisperLikelihood, batch: list[Sample]) -> list[Sample]:
        return batched(
            batch,
            lambda items: model.score(
                [s.audio for s in items], [s.request.ground_truth for s in items], [s.language for s in items]
            ),
            "likelihood",
            "likelihood_error",
            lambda sample, likelihood: sample.learnt(likelihood=likelihood),
        )

    return per_model(score, samples, [models.get(s.language) for s in samples])


def measure_quality(samples: list[Sample], backend: DnsMos) -> list[Sample]:
    """Each sample's ``quality``: DNSMOS overall MOS of its audio."""
    return batched(
        samples,
        lambda items: backend.score([s.audio for s in items]),
        "quality",
        "quality_error",
        lambda sample, value: sample.learnt(quality=value.ovrl_mos),
    )


def measure_similarity(samples: list[Sample], speaker: SpeakerBackend) -> list[Sample]:
    """The ``similarity`` of each sample's audio to its voice ``prompt`` (`reward_fns.stages.decode.decode_prompts`);
    a sample without a prompt keeps none (scored 0)."""

    def compare(batch: list[Sample]) -> list[Sample]:
        return batched(
            batch,
            lambda items: list(speaker.similarity([s.audio for s in items], [s.prompt for s in items])),
            "speaker similarity",
            "similarity_error",
            lambda sample, similarity: sample.learnt(similarity=float(similarity)),
            detail="similarity failed: {}",
        )

    return through(compare, samples, where=lambda s: s.prompt is not None)
