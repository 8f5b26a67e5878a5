#!/usr/bin/env bash
# MASPO on CPU with veRL's real trainer: tiny Llasa-shaped model, synthetic TTS task. Extra arguments are veRL overrides.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python}"
WORK="${WORK:-/tmp/maspo_cpu_smoke}"
RAY_TMP="$(mktemp -d /tmp/ray_XXXXXX)"   # Ray's socket paths must stay under 108 bytes
trap 'rm -rf "$RAY_TMP"' EXIT

"$PYTHON" - "$WORK" <<'PY'
import sys
from pathlib import Path
from maspo_lab.runs.synthetic_run import TASK_DEFAULTS, prepare_task
work = Path(sys.argv[1])
if not (work / "model" / "config.json").exists():  # the demo's warm start
    prepare_task(work, warm_start_steps=TASK_DEFAULTS["warm_start_steps"], n_train=TASK_DEFAULTS["texts"])
PY

# The CPU switch, platform and settings: one home, maspo_lab/runs/cpu_overrides.py
while IFS= read -r assignment; do export "${assignment?}"; done < <("$PYTHON" -m maspo_lab.cli recipe-settings cpu-env)
mapfile -t CPU_OVERRIDES < <("$PYTHON" -m maspo_lab.cli recipe-settings cpu-overrides)
TEMPLATE="$("$PYTHON" -c 'from maspo_base.speech_tokens.llasa_prompt import SPEECH_CHAT_TEMPLATE as t; print(t)')"

exec "$PYTHON" -m verl.trainer.main_ppo --config-path="$HERE" --config-name=cpu_smoke \
    "${CPU_OVERRIDES[@]}" \
    data.train_files="$WORK/data/train.parquet" \
    data.val_files="$WORK/data/val.parquet" \
    actor_rollout_ref.model.path="$WORK/model" \
    "+actor_rollout_ref.model.custom_chat_template='$TEMPLATE'" \
    +ray_kwargs.ray_init._temp_dir="$RAY_TMP" \
    "$@"
