"""The one-line switch on the recipe: ``run.sh grpo actor_rollout_ref.actor.policy_loss=maspo`` trains MASPO."""

from __future__ import annotations

from recipe_helpers import GPU_ENV, compose_recipe, run_sh_overrides
from verl.utils.config import omega_conf_to_dataclass

from maspo_verl.config import MaspoConfig, MaspoPolicyLossConfig, maspo_settings
from maspo_verl.policy_loss_shorthand import normalize_policy_loss


def test_switching_the_grpo_recipe_to_maspo_with_one_line():
    overrides = run_sh_overrides("grpo", "actor_rollout_ref.actor.policy_loss=maspo", **GPU_ENV)
    config = compose_recipe(overrides)
    assert config.actor_rollout_ref.actor.policy_loss == "maspo"  # what Hydra alone hands veRL's driver
    normalize_policy_loss(config, overrides)  # what the plugin's driver hook does with it
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, MaspoPolicyLossConfig) and actor.policy_loss.loss_mode == "maspo"
    assert maspo_settings(actor.policy_loss) == MaspoConfig.from_mapping({})
    assert config.algorithm.adv_estimator == "grpo"  # the rest of the recipe's grpo run stays
