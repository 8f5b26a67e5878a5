"""The names under which veRL's trainer logs the figures our analyses read, one home for them, and the records of
training steps among a run's logged records."""

from __future__ import annotations

REWARD = "critic/score/mean"
BATCH_CER = "reward/speech_error_rate/mean"
"""The clipped CER (Whisper) of a step's own rollouts, logged by the speech reward."""
BATCH_PER = "reward/speech_ear_per/mean"
"""The clipped phoneme error rate of a step's own rollouts by the code ear, logged when the ear is the reward."""
KL_LOSS = "actor/kl_loss"
"""The KL term to the reference (shipped) model, logged when the run has one (``actor.use_kl_loss``)."""
LENGTH = "response_length/mean"
CLIP = "actor/pg_clipfrac"
KL = "actor/ppo_kl"
ENTROPY = "actor/entropy"
STEP_TIME = "timing_s/step"


def training_steps(records: list[dict[str, float]]) -> list[dict[str, float]]:
    """veRL's logged records of training steps (those with `REWARD`; an evaluation-only record has none)."""
    return [r for r in records if REWARD in r]
