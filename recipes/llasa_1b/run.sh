#!/usr/bin/env bash
# MASPO on Llasa-1B (GPU). Needs: pip install "maspo-verl[gpu,speech]"; local model, codec and ASR weights.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python}"
: "${MODEL:?set MODEL to a local Llasa-1B checkpoint}" "${DATA:?set DATA to a dir with train.parquet and val.parquet}"
: "${CODEC:?set CODEC to a local XCodec2 checkpoint}"
TEMPLATE="$("$PYTHON" -c 'from maspo_verl.llasa.prompt import SPEECH_CHAT_TEMPLATE as t; print(t)')"

exec "$PYTHON" -m verl.trainer.main_ppo --config-path="$HERE" --config-name=llasa_1b \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/val.parquet" \
    actor_rollout_ref.model.path="$MODEL" \
    "+actor_rollout_ref.model.custom_chat_template='$TEMPLATE'" \
    +reward.custom_reward_function.reward_kwargs.codec="$CODEC" \
    "$@"
