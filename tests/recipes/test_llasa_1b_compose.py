"""Every recipes/llasa_1b method, as run.sh launches it, composes and passes veRL 0.9.1's own validate_config."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from recipe_helpers import ASR, CODEC, GPU_ENV, IN_PROCESS, KW, METHODS, RECIPE, ROOT, compose_recipe, run_sh_overrides

from maspo_verl.config import MaspoConfigError


@functools.cache
def gpu_config(method: str):
    """The recipe of ``method`` as run.sh launches it on GPUs with the in-process reward (composed once)."""
    return compose_recipe(run_sh_overrides(method, *IN_PROCESS, **GPU_ENV))


@functools.cache
def tiny_config():
    """run.sh with MODEL=tiny (the CPU scale) and maspo-fixed4, as recipes/cpu_smoke runs it (composed once)."""
    return compose_recipe(run_sh_overrides("maspo-fixed4", MODEL="tiny"))


@pytest.fixture(scope="module")
def mini_config(tmp_path_factory):
    """run.sh with MODEL=mini (the speaking testbed on CPU) and maspo-credit, as the recipe's CPU smoke runs it."""
    return compose_recipe(run_sh_overrides("maspo-credit", MODEL="mini", WORK=str(tmp_path_factory.mktemp("mini"))))


def validate(config) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def test_every_method_in_the_issue_has_a_variant():
    wanted = {
        "grpo",
        "gspo",
        "sapo",
        "maspo-fixed5",
        "maspo-fixed15",
        "maspo-fixed50",
        "maspo-logprob",
        "maspo-token-jump",
        "maspo-fsq",
    }
    assert wanted <= set(METHODS)


@pytest.mark.parametrize("method", METHODS)
def test_method_composes_and_passes_verl_validate_config(method):
    config = gpu_config(method)
    validate(config)
    actor = config.actor_rollout_ref.actor
    # off-policy: several actor updates per rollout batch
    assert config.data.train_batch_size // actor.ppo_mini_batch_size == 4
    kwargs = config.reward.custom_reward_function.reward_kwargs
    assert (kwargs.backend, kwargs.codec, dict(kwargs.asr)) == ("in_process", CODEC, ASR)
    assert config.actor_rollout_ref.rollout.val_kwargs.do_sample is True
    assert config.actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config.endswith("generation_config")
    assert config.trainer.logger == ["console"]
    assert config.trainer.experiment_name == method
    OmegaConf.resolve(copy.deepcopy(config))  # as veRL does, without Hydra's resolvers: no ${hydra:...} may remain
    assert "<|SPEECH_GENERATION_START|>" in config.actor_rollout_ref.model.custom_chat_template


@pytest.mark.parametrize(
    ("method", "loss_mode", "low", "high", "agg"),
    [
        ("grpo", "vanilla", 0.2, 0.28, "token-mean"),
        ("gspo", "gspo", 3e-4, 4e-4, "seq-mean-token-mean"),
        ("sapo", "sapo", None, None, "seq-mean-token-mean"),
    ],
)
def test_baseline_loss_settings(method, loss_mode, low, high, agg):
    actor = gpu_config(method).actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == loss_mode
    assert actor.loss_agg_mode == agg
    if low is not None:
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (low, high)
    else:
        assert (actor.tau_pos, actor.tau_neg) == (1.0, 1.05)


@pytest.mark.parametrize(
    ("method", "segmenter"),
    [
        ("maspo-fixed5", {"name": "fixed", "window": 5}),
        ("maspo-fixed15", {"name": "fixed", "window": 15}),
        ("maspo-fixed50", {"name": "fixed", "window": 50}),
        ("maspo-logprob", {"name": "logprob", "mode": "zscore", "threshold": 1.0}),
        ("maspo-token-jump", {"name": "token_jump", "threshold": 4096}),
        ("maspo-fsq", {"name": "fsq", "metric": "l1", "threshold": 2}),
    ],
)
def test_maspo_variants_build_the_typed_maspo_config(method, segmenter):
    from verl.utils.config import omega_conf_to_dataclass

    config = gpu_config(method)
    loss = omega_conf_to_dataclass(config.actor_rollout_ref.actor.policy_loss)
    assert loss.loss_mode == "maspo"
    assert loss.maspo.segmenter.name == segmenter["name"]
    for key, value in segmenter.items():
        if key != "name":
            assert getattr(loss.maspo.segmenter.params, key) == value
    assert (loss.maspo.clip_ratio_low, loss.maspo.clip_ratio_high) == (0.2, 0.28)


def test_command_line_overrides_win_over_the_method():
    extra = "actor_rollout_ref.actor.policy_loss.maspo.segmenter.window=7"  # set by the method: no +
    config = compose_recipe(run_sh_overrides("maspo-fixed5", *IN_PROCESS, extra, **GPU_ENV))
    assert config.actor_rollout_ref.actor.policy_loss.maspo.segmenter.window == 7


def test_the_reward_server_is_a_group_choice_with_its_address():
    server = ("speech_reward=server", f"{KW}.server_url=http://10.0.0.2:8765")
    config = compose_recipe(run_sh_overrides("grpo", *server, **GPU_ENV))
    validate(config)
    kwargs = dict(config.reward.custom_reward_function.reward_kwargs)
    assert kwargs == {"backend": "server", "server_url": "http://10.0.0.2:8765"}
    assert "samples" not in config.trainer  # no codec here: the listening page has no decoder, so no players
    # a codec for the listening page, next to the server: the reward stays served
    config = compose_recipe(run_sh_overrides("grpo", *server, f"+trainer.samples.codec={CODEC}", **GPU_ENV))
    assert dict(config.reward.custom_reward_function.reward_kwargs) == kwargs
    assert config.trainer.samples.codec == CODEC


def test_run_sh_maps_no_setting_and_a_gpu_run_without_a_reward_choice_stops_in_the_driver():
    """The reward's settings are Hydra overrides, never environment variables run.sh maps; a GPU run that chooses no
    backend and gives no in-process models stops before Ray, naming what to set (veRL's reward workers hold no GPU:
    the in-process reward is a choice, its cost named)."""
    env = {"REWARD_URL": "http://h:1", "CODEC": "/c", "ASR_EN": "faster_whisper:/w", "REWARD_SERVE": "2"}
    overrides = run_sh_overrides("grpo", **env, **GPU_ENV)
    assert not [o for o in overrides if "reward" in o or "/c" in o.split("=")[-1]], overrides
    needs = r"reward_kwargs.codec is not set: .*'in_process' needs \['codec', 'asr'\]. Choose where it runs: "
    with pytest.raises(MaspoConfigError, match=needs + r"speech_reward=server .*speech_reward=in_process .*CPUs"):
        validate(compose_recipe(overrides))


def test_the_listening_page_is_on_by_default_in_the_runs_folder():
    from maspo_verl.listening import sample_settings

    config = gpu_config("maspo-fsq")
    run_folder = "checkpoints/maspo_llasa_1b/maspo-fsq"
    assert config.trainer.default_local_dir == run_folder
    assert config.trainer.validation_data_dir == f"{run_folder}/validation"  # veRL dumps what the page is made from
    settings = sample_settings(config)  # the decoder: the reward's codec
    assert (settings.dir, settings.codec, settings.count) == (f"{run_folder}/samples", CODEC, 8)


def test_wandb_only_with_a_key_or_offline_mode():
    assert compose_recipe(run_sh_overrides("grpo", WANDB_MODE="offline", **GPU_ENV)).trainer.logger == [
        "console",
        "wandb",
    ]
    assert compose_recipe(run_sh_overrides("grpo", WANDB_API_KEY="x", **GPU_ENV)).trainer.logger == ["console", "wandb"]


def test_missing_reward_settings_fail_before_launch():
    no_asr = compose_recipe(run_sh_overrides("grpo", "speech_reward=in_process", f"+{KW}.codec=/c", **GPU_ENV))
    with pytest.raises(MaspoConfigError, match=rf"{KW}.asr is not set"):
        validate(no_asr)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env.update(PYTHON=sys.executable, DRY_RUN="1", MODEL="/m", DATA="/d")
    result = subprocess.run(["bash", str(RECIPE / "run.sh"), "grpo-typo"], env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "maspo-fsq" in result.stderr


def test_tiny_scale_composes_with_the_cpu_settings():
    config = tiny_config()
    validate(config)
    assert config.actor_rollout_ref.rollout.name == "hf" and config.trainer.device == "cpu"
    assert config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size == 4
    assert config.reward.custom_reward_function.path == "pkg://maspo_lab.data.synthetic_tts"
    print(OmegaConf.to_yaml(config.trainer))


def test_cpu_smoke_recipe_is_the_tiny_scale_with_maspo_windows_of_4():
    from maspo_lab.runs.cpu_overrides import CPU_OVERRIDES, CPU_SHORTCUTS

    with initialize_config_dir(config_dir=str(ROOT / "recipes" / "cpu_smoke"), version_base=None):
        config = compose(config_name="cpu_smoke", overrides=list(CPU_OVERRIDES))
    validate(config)
    tiny = tiny_config()
    sizes = ("data.train_batch_size", "data.max_prompt_length", "data.max_response_length")
    for key in (*sizes, "actor_rollout_ref.rollout.n", "reward", "algorithm"):
        assert OmegaConf.select(config, key) == OmegaConf.select(tiny, key), key
    # the actor too, but for the shortcuts recipes/cpu_smoke takes and the Llasa-1B recipe's smoke does not
    shortcuts = {override_key(o).rsplit(".", 1)[-1] for o in CPU_SHORTCUTS}
    actors = [OmegaConf.to_container(c.actor_rollout_ref.actor, resolve=True) for c in (config, tiny)]
    assert [{k: v for k, v in actor.items() if k not in shortcuts} for actor in actors][0] == {
        k: v for k, v in actors[1].items() if k not in shortcuts
    }


def override_key(override: str) -> str:
    return override.lstrip("+").split("=", 1)[0]


def leaf_keys(node, prefix: str = "") -> list[str]:
    """Dotted keys of a config file's values (a list is one value)."""
    if not isinstance(node, dict):
        return [prefix]
    return [key for name, child in node.items() for key in leaf_keys(child, f"{prefix}.{name}" if prefix else name)]


def written(config, key: str):
    """A setting as the config writes it: an interpolation's expression, not what it resolves to."""
    parent, _, leaf = key.rpartition(".")
    node = (OmegaConf.select(config, parent) if parent else config)._get_node(leaf)
    return node._value() if node is not None else None


@pytest.mark.parametrize(("model", "method"), [("tiny", "maspo-fixed4"), ("mini", "maspo-credit")])
def test_cpu_smoke_keeps_every_recipe_setting_cpu_can_run(model, method, mini_config):
    """run.sh with MODEL=tiny or MODEL=mini changes a setting of llasa_1b.yaml only where the CPU scale
    (scale/tiny.yaml, scale/mini.yaml) sizes the run or CPU needs it (`maspo_lab.runs.cpu_overrides.CPU_NEEDS`);
    packing, activation checkpointing and dynamic micro-batches stay as on a GPU (recipes/llasa_1b/README.md lists
    what CPU changes, and why)."""
    from maspo_lab.runs.cpu_overrides import CPU_NEEDS

    recipe = OmegaConf.to_container(OmegaConf.load(RECIPE / "llasa_1b.yaml"))
    scale_file = ROOT / "maspo_verl" / "trainer_config" / "scale" / f"{model}.yaml"
    scale = OmegaConf.to_container(OmegaConf.load(scale_file))
    changed = set(leaf_keys(scale)) | {override_key(o) for o in CPU_NEEDS}
    recipe_keys = [key for key in leaf_keys(recipe) if key.split(".")[0] not in ("hydra", "defaults")]
    kept = [key for key in recipe_keys if key not in changed]
    cpu, gpu = (tiny_config() if model == "tiny" else mini_config), gpu_config(method)
    for key in kept:  # as written: an interpolation (e.g. of the run's folder) is kept when its expression is
        assert written(cpu, key) == written(gpu, key), key
    for key in (
        "actor_rollout_ref.model.use_remove_padding",
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "actor_rollout_ref.actor.use_dynamic_bsz",
    ):
        assert OmegaConf.select(cpu, key) is True and OmegaConf.select(gpu, key) is True, key
    assert OmegaConf.select(cpu, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu") >= sum(
        OmegaConf.select(cpu, f"data.max_{part}_length") for part in ("prompt", "response")
    )
    print("changed on CPU:", sorted(set(recipe_keys) - set(kept)))


def test_mini_runs_the_recipe_on_the_speaking_testbed_in_its_layout(mini_config):
    """MODEL=mini: the shipped model, the testbed's speech reward as its run module defines it (the mini codec,
    Whisper tiny.en, CER in characters, PocketSphinx as the evaluations' second ear; the listening page decodes with
    the same codec), the method refined for the mini codec (trainer_config/task/speech.yaml), and mini-llasa's
    layout from the model's own speech_tokens.json, filled in by the driver."""
    from pathlib import Path

    from maspo_lab.runs.speech_run import SECOND_EAR
    from maspo_lab.speaking_model import SHIPPED_CODEC, SHIPPED_MODEL
    from maspo_verl.listening import sample_settings

    maspo = mini_config.actor_rollout_ref.actor.policy_loss.maspo
    assert maspo.get("codec", None) is None  # no config states the layout
    validate(mini_config)  # the driver's check: the model's layout is filled in
    assert maspo.codec.layout == "mini-llasa" == mini_config.algorithm.maspo.codec.layout
    assert mini_config.actor_rollout_ref.model.path == str(SHIPPED_MODEL)
    assert Path(mini_config.data.train_files).is_file() and Path(mini_config.data.val_files).is_file()
    kwargs = mini_config.reward.custom_reward_function.reward_kwargs
    assert kwargs.backend == "in_process" and kwargs.codec == f"mel_fsq:{SHIPPED_CODEC}"
    assert sample_settings(mini_config).codec == kwargs.codec
    assert list(kwargs.asr) == ["en"] and kwargs.asr.en.startswith("faster_whisper:")
    assert kwargs.second_asr.en == SECOND_EAR and kwargs.reward_config.error_unit == "char"
    assert kwargs.default_language == "en" and kwargs.reward_config.frame_errors is True
    assert maspo.segmenter.name == "fsq" and maspo.segmenter.threshold == 4  # speech.yaml's refinement of maspo-fsq
    assert mini_config.algorithm.adv_estimator == "maspo"


def test_credit_variant_selects_the_maspo_estimator_and_frame_errors():
    from maspo_verl.credit_config import credit_settings

    config = gpu_config("maspo-credit")
    assert config.algorithm.adv_estimator == "maspo"
    assert credit_settings(config.algorithm).credit_weight == 0.5
    assert config.reward.custom_reward_function.reward_kwargs.reward_config.frame_errors is True
    assert config.actor_rollout_ref.actor.policy_loss.maspo.segmenter.name == "fsq"  # maspo-fsq's loss


def test_the_reward_backend_is_a_config_group_and_its_mandatory_keys_are_checked_in_the_driver():
    """``speech_reward=server`` without its address stops the driver naming the key, before Ray; given, the reward
    reads the server backend from the group's choice, and a key of another backend stops the driver naming both."""
    import verl.trainer.main_ppo as main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    from maspo_base.reward_backend import reward_backend

    def driver_check(config):
        main_ppo.validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )

    base = [
        "method=grpo",
        "data.train_files=/d/t.parquet",
        "data.val_files=/d/v.parquet",
        "actor_rollout_ref.model.path=/m",
    ]
    with pytest.raises(MaspoConfigError, match=r"reward_kwargs.server_url is not set"):
        driver_check(compose_recipe([*base, "speech_reward=server"]))
    url = f"{KW}.server_url=http://h:8765"
    config = compose_recipe([*base, "speech_reward=server", url])
    assert config.reward.custom_reward_function.path == "pkg://reward_fns.verl_reward"
    assert reward_backend(config.reward.custom_reward_function.reward_kwargs).name == "server"
    serve = compose_recipe([*base, "speech_reward=serve"]).reward.custom_reward_function.reward_kwargs
    assert (reward_backend(serve).name, serve.serve_app) == ("serve", "speech_reward")
    # the one rule for conflicting settings: an error naming both keys, before Ray
    with pytest.raises(MaspoConfigError, match=rf"{KW}.backend='server' chooses .*{KW}.serve_app \(backend 'serve'\)"):
        driver_check(compose_recipe([*base, "speech_reward=server", url, f"+{KW}.serve_app=speech_reward"]))
    # the choice decides, not the keys: a server address next to the in-process choice is refused, not followed
    in_process = [*base, *IN_PROCESS, f"+{KW}.server_url=http://h:8765"]
    with pytest.raises(MaspoConfigError, match=rf"{KW}.backend='in_process' chooses .*{KW}.server_url"):
        driver_check(compose_recipe(in_process))
