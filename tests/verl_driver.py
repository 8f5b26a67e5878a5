"""veRL's driver's config check, in the test's own process."""

from __future__ import annotations


def driver_check(*overrides: str, config_module: str = "verl.trainer.config", config_name: str = "ppo_trainer"):
    """What veRL's driver (``python -m verl.trainer.main_ppo``) does to a config before Ray starts, in this process:
    Hydra composes it, then the ``validate_config`` that ``main_ppo`` calls (the plugin's checks wrapped around
    veRL's, `maspo_verl.verl_patches`) checks it; raises what the driver would stop with, else returns the config as
    the driver hands it to the workers. That the driver runs this check before Ray starts:
    tests/test_policy_loss_shorthand.py, in a real driver process."""
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    with initialize_config_module(config_module, version_base=None):
        config = compose(config_name, overrides=list(overrides))
    main_ppo.validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    return config
