#!/usr/bin/env bash
# Llasa-1B RL with one method:  bash recipes/llasa_1b/run.sh METHOD [Hydra overrides of veRL's config, last wins]
#
# METHOD: grpo gspo sapo maspo-fixed4 maspo-fixed5 maspo-fixed15 maspo-fixed50 maspo-logprob maspo-token-jump maspo-fsq
#         ... (maspo_verl/trainer_config/method/*.yaml).
# Every setting that is a key of the config is a Hydra override passed through as it is, among them where the speech
# reward runs: a choice of the config group maspo_verl/trainer_config/speech_reward/ and its keys (README, "Reward";
# KW=reward.custom_reward_function.reward_kwargs):
#   speech_reward=server $KW.server_url=http://HOST:8765                      a reward server on its own GPU
#   speech_reward=serve +$KW.codec=... +$KW.asr.zh=... +$KW.serve_replicas=2 +$KW.serve_gpus=1   replicas on Ray Serve
#   speech_reward=in_process +$KW.codec=... +$KW.asr.en=...                   in veRL's reward workers (no GPU: slow)
# What the script itself does, because no key of the config can:
# GPU:  MODEL=/models/Llasa-1B DATA=/data/tts (train.parquet, val.parquet from `maspo-verl prepare-data`): the model's
#       path and data, and vLLM's stop ids written from the checkpoint (generation_config.json).
# CPU:  MODEL=mini (the speaking testbed: the shipped mini-llasa says the demo's sentences, the speech reward hears them
#       in process with the mini codec, Whisper tiny.en and PocketSphinx, maspo_lab/runs/speech_run.py; data under
#       $WORK); or MODEL=tiny (tiny Llasa-shaped model + synthetic task, built under $WORK; WARM_START=N supervised
#       steps), scored by the synthetic task's reward unless a speech_reward choice is given too. Both add the CPU
#       settings (maspo_lab/runs/cpu_overrides.py).
# Logging: console; wandb too when WANDB_API_KEY is set or WANDB_MODE=offline. DRY_RUN=1 prints the command.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python}"
METHODS="$("$PYTHON" -c 'import pathlib, maspo_verl.trainer_config as c
print(" ".join(sorted(p.stem for p in (pathlib.Path(c.__file__).parent / "method").glob("*.yaml") if p.stem[0] != "_")))')"
METHOD="${1:-}"
if [[ -z "$METHOD" || " $METHODS " != *" $METHOD "* ]]; then
    echo "usage: bash $0 METHOD [overrides]; METHOD is one of: $METHODS (got '${METHOD}')" >&2
    exit 2
fi
shift
WORK="${WORK:-/tmp/maspo_llasa_1b}"
TEMPLATE="$("$PYTHON" -c 'from maspo_base.speech_tokens.llasa_prompt import SPEECH_CHAT_TEMPLATE as t; print(t)')"
ARGS=("method=$METHOD" "trainer.experiment_name=$METHOD" "+actor_rollout_ref.model.custom_chat_template='$TEMPLATE'")

CPU_MODEL=0
[[ "${MODEL:-}" != tiny && "${MODEL:-}" != mini ]] || CPU_MODEL=1
if [[ "$CPU_MODEL" == 1 ]]; then
    if [[ "$MODEL" == mini ]]; then   # the testbed's sizes, data, model, method refinement and speech reward
        mapfile -t CPU_MODEL_OVERRIDES < <("$PYTHON" -m maspo_lab.cli recipe-settings mini-overrides "$WORK/mini" "$METHOD")
        [[ ${#CPU_MODEL_OVERRIDES[@]} -gt 0 ]] || { echo "recipe-settings mini-overrides gave no overrides" >&2; exit 2; }
    else
        BUILD=--warm-start="${WARM_START:-0}"
        [[ "${DRY_RUN:-0}" != 1 ]] || BUILD=--no-build
        mapfile -t CPU_MODEL_OVERRIDES < <("$PYTHON" -m maspo_lab.cli recipe-settings tiny-overrides "$WORK/tiny" "$BUILD")
        [[ ${#CPU_MODEL_OVERRIDES[@]} -gt 0 ]] || { echo "recipe-settings tiny-overrides gave no overrides" >&2; exit 2; }
    fi
    # the CPU switch, platform and settings: one home, maspo_lab/runs/cpu_overrides.py
    while IFS= read -r assignment; do export "${assignment?}"; done < <("$PYTHON" -m maspo_lab.cli recipe-settings cpu-env)
    # only what CPU needs: the recipe's packing and activation checkpointing run too
    mapfile -t CPU_OVERRIDES < <("$PYTHON" -m maspo_lab.cli recipe-settings cpu-overrides --needed)
    if [[ -z "${RAY_TMP:-}" ]]; then
        RAY_TMP="$(mktemp -d /tmp/ray_XXXXXX)"   # Ray's socket paths must stay under 108 bytes
        trap 'rm -rf "$RAY_TMP"' EXIT
    fi
    ARGS+=("${CPU_MODEL_OVERRIDES[@]}" "${CPU_OVERRIDES[@]}" "+ray_kwargs.ray_init._temp_dir=$RAY_TMP")
else
    : "${MODEL:?set MODEL to a local Llasa-1B checkpoint (or MODEL=mini or MODEL=tiny on a CPU)}"
    : "${DATA:?set DATA to a dir with train.parquet and val.parquet (maspo-verl prepare-data)}"
    ARGS+=("data.train_files=$DATA/train.parquet" "data.val_files=$DATA/val.parquet"
        "actor_rollout_ref.model.path=$MODEL")
    # stop at <|SPEECH_GENERATION_END|>: vLLM reads its stop ids from this folder's generation_config.json
    STOP_DIR="$WORK/generation_config"
    [[ "${DRY_RUN:-0}" == 1 ]] || "$PYTHON" -m maspo_lab.cli recipe-settings stop-config "$MODEL" "$STOP_DIR" >/dev/null
    ARGS+=("+actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config=$STOP_DIR")
fi

if [[ -n "${WANDB_API_KEY:-}" || "${WANDB_MODE:-}" == offline ]]; then
    ARGS+=("trainer.logger=[console,wandb]")
else
    ARGS+=("trainer.logger=[console]")
    export WANDB_MODE="${WANDB_MODE:-disabled}"
fi

COMMAND=("$PYTHON" -m verl.trainer.main_ppo --config-path="$HERE" --config-name=llasa_1b "${ARGS[@]}" "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%s\n' "${COMMAND[@]}"
    exit 0
fi
"$PYTHON" -c "import maspo_verl, verl" || { echo "install maspo-verl (pip install -e .) into $PYTHON" >&2; exit 2; }
"${COMMAND[@]}"
