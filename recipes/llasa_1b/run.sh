#!/usr/bin/env bash
# Llasa-1B RL with one method:  bash recipes/llasa_1b/run.sh METHOD [veRL overrides, last wins]
#
# METHOD: grpo gspo sapo maspo-fixed4 maspo-fixed5 maspo-fixed15 maspo-fixed50 maspo-logprob maspo-token-jump maspo-fsq
#         (maspo_verl/trainer_config/method/*.yaml).
# GPU:  MODEL=/models/Llasa-1B DATA=/data/tts (train.parquet, val.parquet from `maspo-verl prepare-data`) and the
#       reward on a reward server with its own GPU (reward_server.sh): REWARD_URL=http://HOST:8765 [CODEC=... to hear
#       the validation samples, README "Listening"]; or, knowingly, in veRL's CPU-only reward workers (README: hours
#       per step): REWARD_IN_PROCESS=1 CODEC=/models/xcodec2 ASR_ZH=paraformer:/models/paraformer-zh
#       ASR_EN=faster_whisper:/models/whisper-large-v3-ct2 [DEFAULT_LANGUAGE=en]
# Reward on Ray Serve (docs/reward-serve.md): REWARD_SERVE=N with CODEC and ASR_*: N replicas of the reward in the
#       trainer's own Ray cluster, deployed by the first reward call, REWARD_SERVE_GPUS each (default 1; 0 with
#       MODEL=mini or tiny; fractions share a GPU) and REWARD_SERVE_CPUS (default 1); leave their GPUs out of the trainer's
#       (trainer.n_gpus_per_node). REWARD_SERVE_APP=NAME attaches to a running application instead (`maspo-verl
#       reward-serve --address ...` on the cluster the trainer joins with RAY_ADDRESS); both name it (default
#       speech_reward). REWARD_SERVE_MIN/REWARD_SERVE_MAX: autoscale between them rather than N fixed replicas.
# CPU: MODEL=mini (the speaking testbed: the shipped mini-llasa says the demo's sentences, the speech reward hears
#       them with the mini codec and Whisper tiny.en unless CODEC/ASR_EN say otherwise; the method refined for its
#       layout, maspo_verl/trainer_config/task/speech.yaml; data under $WORK); or MODEL=tiny (tiny Llasa-shaped
#       model + synthetic task, built under $WORK; WARM_START=N supervised steps), scored by the synthetic task's
#       reward, or by the speech reward when CODEC/ASR_* or REWARD_URL are set too
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
    if [[ "$MODEL" == mini ]]; then
        while IFS= read -r assignment; do   # the speech reward's models, unless given
            key="${assignment%%=*}"
            [[ -n "${!key:-}" ]] || export "${assignment?}"
        done < <("$PYTHON" -m maspo_lab.cli recipe-settings mini-reward-env)
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

# the speech reward: always on a GPU and with MODEL=mini; with MODEL=tiny when its models, server or Serve
# application are given
if [[ "$CPU_MODEL" == 0 || -n "${CODEC:-}${REWARD_URL:-}${REWARD_SERVE_APP:-}" ]]; then
    KW=+reward.custom_reward_function.reward_kwargs
    SERVE="${REWARD_SERVE:-}${REWARD_SERVE_APP:-}${REWARD_SERVE_MAX:-}"
    if [[ "$CPU_MODEL" == 0 && -z "${REWARD_URL:-}$SERVE" && "${REWARD_IN_PROCESS:-0}" != 1 ]]; then
        echo "set REWARD_SERVE=N for N reward replicas on Ray Serve (docs/reward-serve.md), REWARD_URL to a" \
            "reward server on its own GPU (recipes/llasa_1b/reward_server.sh), or" \
            "REWARD_IN_PROCESS=1 to score in veRL's reward workers, which hold no GPU: codec and ASR on CPU," \
            "hours per step at 2048 responses (recipes/llasa_1b/README.md, 'The reward on a GPU run')" >&2
        exit 2
    fi
    [[ -z "${CODEC:-}" ]] || ARGS+=("+trainer.samples.codec=$CODEC")   # the listening page's decoder
    # the backend is a config group (maspo_verl/trainer_config/speech_reward/); the rest maps variables to its keys
    if [[ -n "${REWARD_URL:-}" ]]; then
        ARGS+=("speech_reward=server" "${KW#+}.server_url=$REWARD_URL")
    elif [[ -n "$SERVE" ]]; then
        ARGS+=("speech_reward=serve" "${KW#+}.serve_app=${REWARD_SERVE_APP:-speech_reward}")
    else
        ARGS+=("speech_reward=in_process")
    fi
    if [[ -n "${REWARD_URL:-}" ]]; then
        :   # the server's models are its own flags
    elif [[ -n "${REWARD_SERVE_APP:-}" && -z "${CODEC:-}" ]]; then
        :   # attach to the running application: its models are its own
    else
        : "${CODEC:?set CODEC to a local XCodec2 checkpoint (or REWARD_URL for a reward server)}"
        if [[ -z "${ASR_ZH:-}" && -z "${ASR_EN:-}" ]]; then
            echo "set ASR_ZH (e.g. paraformer:/models/paraformer-zh) and/or ASR_EN (e.g." \
                "faster_whisper:/models/whisper-large-v3-ct2), or REWARD_URL for a reward server" >&2
            exit 2
        fi
        ARGS+=("$KW.codec=$CODEC" "$KW.default_language=${DEFAULT_LANGUAGE:-en}")
        [[ -z "${ASR_ZH:-}" ]] || ARGS+=("$KW.asr.zh=$ASR_ZH")
        [[ -z "${ASR_EN:-}" ]] || ARGS+=("$KW.asr.en=$ASR_EN")
        if [[ -n "$SERVE" ]]; then   # deployed by the first reward call: its replicas and their resources
            GPUS="${REWARD_SERVE_GPUS:-$([[ "$CPU_MODEL" == 1 ]] && echo 0 || echo 1)}"
            ARGS+=("$KW.serve_gpus=$GPUS" "$KW.serve_cpus=${REWARD_SERVE_CPUS:-1}")
            if [[ -n "${REWARD_SERVE_MAX:-}" ]]; then
                ARGS+=("$KW.serve_min_replicas=${REWARD_SERVE_MIN:-1}" "$KW.serve_max_replicas=$REWARD_SERVE_MAX")
            else
                ARGS+=("$KW.serve_replicas=${REWARD_SERVE:-1}")
            fi
            [[ "$GPUS" == 0 ]] || ARGS+=("$KW.device=cuda" "$KW.dtype=bfloat16")
        fi
    fi
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
