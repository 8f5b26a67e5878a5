"""Helpers of the recipe tests: run.sh's own arguments (DRY_RUN=1) composed by Hydra as veRL's main does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

import maspo_verl.trainer_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "llasa_1b"
METHOD_DIR = Path(maspo_verl.trainer_config.__file__).parent / "method"
METHODS = sorted(p.stem for p in METHOD_DIR.glob("*.yaml") if not p.stem.startswith("_"))
GPU_ENV = {"MODEL": "/models/Llasa-1B", "DATA": "/data/tts"}
"""What run.sh itself reads on a GPU: the model (its stop ids are written from it) and the data."""
KW = "reward.custom_reward_function.reward_kwargs"
CODEC = "/models/xcodec2"
ASR = {"zh": "paraformer:/models/paraformer-zh", "en": "faster_whisper:/models/whisper-large-v3-ct2"}
IN_PROCESS = ("speech_reward=in_process", f"+{KW}.codec={CODEC}", *(f"+{KW}.asr.{k}={v}" for k, v in ASR.items()))
"""The speech reward in veRL's reward workers, as the recipe's README chooses it: Hydra overrides run.sh passes on."""


def run_sh_overrides(method: str, *extra: str, **env: str) -> list[str]:
    """The Hydra overrides run.sh passes (DRY_RUN=1 prints its command, one argument a line)."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    run_env.update(PYTHON=sys.executable, DRY_RUN="1", **env)
    out = subprocess.run(
        ["bash", str(RECIPE / "run.sh"), method, *extra], env=run_env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    name = out.index("--config-name=llasa_1b")
    return out[name + 1 :]  # as veRL's Hydra main receives them (the quoted template included)


def compose_recipe(overrides: list[str]):
    with initialize_config_dir(config_dir=str(RECIPE), version_base=None):
        return compose(config_name="llasa_1b", overrides=overrides, return_hydra_config=False)
