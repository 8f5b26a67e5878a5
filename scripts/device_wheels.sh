#!/usr/bin/env bash
# Wheels for the GPU machine (CPython 3.12, x86-64 Linux) of what veRL's update path imports that its image lacks,
# at this checkout's versions, into .device/wheels (git-ignored; about 7 MB). Ray is not among them: it is too large
# to carry, and benchmarks/bench_step_at_size.py stands in for it. On the machine (docs/benchmarks.md):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/*.whl
#   PYTHONPATH=/tmp/site:. python3 benchmarks/bench_step_at_size.py ...
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(verl tensordict pyvers omegaconf hydra-core codetiming orjson pydantic pydantic-core typing-inspection
    annotated-types fastapi starlette uvicorn datasets multiprocess dill opentelemetry-api)
SOURCE_ONLY=(antlr4-python3-runtime)  # published as a source archive only: pure Python, built here
pin() { .venv/bin/python -c 'import sys, importlib.metadata as m; print(*(f"{p}=={m.version(p)}" for p in sys.argv[1:]))' "$@"; }
rm -rf .device/wheels && mkdir -p .device/wheels
# shellcheck disable=SC2046
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --dest .device/wheels --implementation cp \
    --python-version 3.12 --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any $(pin "${PACKAGES[@]}")
# shellcheck disable=SC2046
.venv/bin/python -m pip wheel -q --no-deps --wheel-dir .device/wheels $(pin "${SOURCE_ONLY[@]}")
ls .device/wheels
du -sh .device/wheels
