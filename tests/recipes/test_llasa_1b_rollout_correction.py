"""The Llasa-1B recipe takes the segment-level rollout correction as extra overrides (docs/rollout-correction.md):
run.sh passes them to veRL, and the driver's check gives the correction the method's own segmenter."""

from __future__ import annotations

from omegaconf import OmegaConf
from recipe_helpers import GPU_ENV, compose_recipe, run_sh_overrides

from maspo_verl.policy_loss_shorthand import normalize_policy_loss
from maspo_verl.rollout_correction_config import prepare_rollout_correction, segmentation_settings

RC = "algorithm.rollout_correction"


def test_the_recipe_corrects_over_the_methods_segments():
    extra = (f"{RC}.rollout_is=segment", f"{RC}.rollout_rs=seg_mean_k1", f"{RC}.rollout_rs_threshold=0.99_1.01")
    overrides = run_sh_overrides("maspo-fsq", *extra, **GPU_ENV)
    assert set(extra) <= set(overrides)
    config = compose_recipe(overrides)
    normalize_policy_loss(config, overrides)
    prepare_rollout_correction(config)
    block = OmegaConf.to_container(config.algorithm.rollout_correction)
    assert (block["rollout_is"], block["rollout_rs"], block["rollout_rs_threshold"]) == (
        "segment",
        "seg_mean_k1",
        "0.99_1.01",
    )
    settings = segmentation_settings(block)
    method = OmegaConf.to_container(config.actor_rollout_ref.actor.policy_loss.maspo)
    assert settings.segmenter.name == method["segmenter"]["name"] == "fsq"
    assert settings.segmenter.params.threshold == method["segmenter"]["threshold"]
    assert settings.codec.layout == method.get("codec", {}).get("layout") is None  # the model's, Llasa-1B's here
    assert settings.codec.layout_name == "llasa-1b"
