"""The trainer runs that several end-to-end tests assert on, each started once per session (fixtures in conftest).

A trainer run is most of an end-to-end test's time, so tests whose settings do not conflict share one: each test
asserts its own part of the run (the loss's segment statistics, the estimator's trace, the trainer's metrics). Runs
stay apart where a test needs a trainer (legacy or v1), a reward or a loss of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from maspo_lab.runs.synthetic_run import method_overrides

OFF_POLICY = {"steps": 2, "batch": 4, "n": 2, "mini_batches": 2, "lr": 1e-2, "response_length": 16}
"""Two actor updates per rollout batch: the second one sees ratios != 1. Responses are 16 tokens (the untrained
model never stops early); a mini-batch holds 4 * 2 / 2 = 4 of them."""

WINDOW = 4
"""MASPO's fixed window in the runs that use one: 16 / 4 = 4 segments of exactly 4 tokens per response."""

CREDIT_WEIGHT = 0.5
CREDIT = ["algorithm.adv_estimator=maspo", f"+algorithm.maspo.credit_weight={CREDIT_WEIGHT}"]
"""adv_estimator=maspo: GRPO plus segment credit from each reward's frame errors."""

PROBE_REWARD = Path(__file__).with_name("credit_probe_reward.py")
"""The synthetic score with frame k flagged iff its codec id is odd (``credit_probe_reward.py``)."""

MASPO_KEY = "actor_rollout_ref.actor.policy_loss.maspo"

SHORTHAND_TOKEN_JUMP = (
    "actor_rollout_ref.actor.policy_loss=maspo",
    f"+{MASPO_KEY}.segmenter.name=token_jump",
    f"+{MASPO_KEY}.segmenter.threshold=1000",
)
"""MASPO by the one-line switch, then the segmenter by block keys (the plugin expands the switch in the driver)."""

RC = "algorithm.rollout_correction"
SEGMENT_CORRECTION = (f"{RC}.rollout_is=segment", f"{RC}.rollout_rs=seg_mean_k1", f"{RC}.rollout_rs_threshold=0.5_2.0")
"""veRL's rollout correction at the segment level (docs/rollout-correction.md), in decoupled mode: over the MASPO
loss's own segments; the CPU rollout's log-probs differ from the trainer's by round-off, so the weights sit near 1
and these bounds drop nothing (the values are checked against veRL's functions in tests/test_rollout_correction.py)."""

V1_SAMPLES = ("trainer.rollout_data_dir=rollouts", "+trainer.samples.dir=samples", "+trainer.samples.train_every=1")
"""The listening page of every training step's rollouts (`maspo_verl.listening`), in the run's folder."""


@dataclass(frozen=True)
class SharedRun:
    overrides: tuple[str, ...]
    """veRL overrides on top of the synthetic task's (`maspo_lab.runs.synthetic_run.run_overrides`)."""
    settings: dict = field(default_factory=lambda: dict(OFF_POLICY))
    """`run_overrides` settings (steps, batch, ...)."""


SHARED_RUNS: dict[str, SharedRun] = {
    # test_cpu_credit (the probe's frame k reaches token k), test_cpu_maspo (fixed windows, off-policy ratios) and
    # test_cpu_maspo_seg_mean (the mini-batch's segments counted before veRL cuts it into micro-batches of one
    # response)
    "legacy_probe_seg_mean": SharedRun(
        (
            "trainer.use_v1=False",
            *CREDIT,
            f"reward.custom_reward_function.path={PROBE_REWARD}",
            f"+{MASPO_KEY}.loss_agg_mode=seg-mean",
            *method_overrides(f"maspo-fixed{WINDOW}"),
        ),
        {**OFF_POLICY, "micro_batch": 1},
    ),
    # test_cpu_credit (the probe's frame k reaches token k), test_cpu_maspo (token ids reach token_jump through
    # the v1 trainer's nested micro-batches; MASPO selected by the one-line switch, its segmenter by block keys),
    # test_cpu_samples_page (the v1 trainer's rollout dumps reach the listening page; paths relative to the run's
    # folder) and test_cpu_rollout_correction (the segment level over the loss's token_jump segments, the ids fetched
    # once for the correction and the credit)
    "v1_probe_token_jump": SharedRun(
        (
            "trainer.use_v1=True",
            *CREDIT,
            f"reward.custom_reward_function.path={PROBE_REWARD}",
            *SHORTHAND_TOKEN_JUMP,
            *V1_SAMPLES,
            *SEGMENT_CORRECTION,
        )
    ),
}
