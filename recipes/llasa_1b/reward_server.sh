#!/usr/bin/env bash
# The speech reward on its own GPU: `maspo-verl reward-server` holding XCodec2 and the ASR models, batching the
# concurrent requests of veRL's reward workers. Start it, then point the trainer at it:
#   MODEL=... DATA=... bash recipes/llasa_1b/run.sh METHOD speech_reward=server \
#       reward.custom_reward_function.reward_kwargs.server_url=http://THIS_HOST:8765
# Needs: CODEC (local XCodec2), ASR_ZH and/or ASR_EN (BACKEND:MODEL, e.g. paraformer:/models/paraformer-zh). REWARD_GPU (default 0) is the
# GPU it uses: keep it out of the trainer's GPUs (e.g. trainer.n_gpus_per_node=7 with CUDA_VISIBLE_DEVICES=0-6).
# SERVE_REPLICAS=N: the same HTTP contract from N replicas on Ray Serve (`maspo-verl reward-serve`, a Ray instance on
# this node; docs/reward-serve.md), SERVE_GPUS (default 1; fractions share a GPU) each, on the GPUs in REWARD_GPU
# (e.g. REWARD_GPU=4,5,6,7 SERVE_REPLICAS=4).
set -euo pipefail
: "${CODEC:?set CODEC to a local XCodec2 checkpoint}"
if [[ -z "${ASR_ZH:-}" && -z "${ASR_EN:-}" ]]; then
    echo "set ASR_ZH (e.g. paraformer:/models/paraformer-zh) and/or ASR_EN (e.g. faster_whisper:/models/whisper-large-v3-ct2)" >&2
    exit 2
fi
ASR=()
[[ -z "${ASR_ZH:-}" ]] || ASR+=(--asr "zh=$ASR_ZH")
[[ -z "${ASR_EN:-}" ]] || ASR+=(--asr "en=$ASR_EN")
export CUDA_VISIBLE_DEVICES="${REWARD_GPU:-0}"
COMMAND=(reward-server)
[[ -z "${SERVE_REPLICAS:-}" ]] || COMMAND=(reward-serve --serve-replicas "$SERVE_REPLICAS" --serve-gpus "${SERVE_GPUS:-1}")
exec "${PYTHON:-python}" -m maspo_lab.cli "${COMMAND[@]}" --codec "$CODEC" "${ASR[@]}" \
    --device "${REWARD_DEVICE:-cuda}" --dtype "${REWARD_DTYPE:-bfloat16}" --host "${HOST:-0.0.0.0}" --port "${PORT:-8765}" \
    --max-batch "${MAX_BATCH:-64}" --max-wait-ms "${MAX_WAIT_MS:-20}" "$@"
