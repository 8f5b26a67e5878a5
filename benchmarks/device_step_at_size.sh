#!/usr/bin/env bash
# The GPU machine's whole run for issue 41, in one command (docs/benchmarks.md): device `run` with command
# "bash benchmarks/device_step_at_size.sh", carry [".device"] (made here by scripts/device_wheels.sh), timeout_s 590.
# A toy-size pass first, so that a missing package fails in seconds, not after the model is built; then the step at
# Llasa-1B's size with the gradient agreement; then the loss alone, eager and with maspo.compile, kernels counted;
# last, the loss tests on the GPU (the static-size test compiles with inductor there), Ray stood in as in the script.
set -euo pipefail
OUT=${OUT:-/tmp/step-at-size}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"
python3 benchmarks/bench_step_at_size.py --size toy --rounds 1 --responses 4 --min-length 20 --max-length 60 \
    --agreement --out "$OUT/toy" 2>&1 | tail -n 20
python3 benchmarks/bench_step_at_size.py --agreement --out "$OUT/size" 2>&1 | tee "$OUT/size.log" ||
    echo "the step at size failed; the loss alone still runs"
timeout 200 python3 benchmarks/bench_maspo_loss.py --device cuda --rounds 11 --compile --kernels 2>&1 | tee "$OUT/loss.log"
MASPO_TEST_DEVICE=cuda timeout 150 python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_step_at_size as b
sys.meta_path.insert(0, b.RayStandIn()); import pytest
sys.exit(pytest.main(['-q', '-n', '0', '-p', 'no:cacheprovider', 'tests/test_loss_equivalence.py',
    'tests/test_loss_values.py', 'tests/test_aggregation.py']))" 2>&1 | tail -n 30 | tee "$OUT/tests.log"
