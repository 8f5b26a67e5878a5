"""`benchmarks/bench_step_at_size.py` at toy size on the CPU, in a process where Ray cannot be imported (as on the GPU
machine it is written for): veRL's update path runs for every method with Ray stood in, each step computes a
gradient, MASPO's segmenters segment, and the four layouts of the agreement check give one gradient in float64."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_step_at_size.py"


def test_the_step_at_size_script_runs_verl_update_for_every_method_without_ray(tmp_path):
    no_ray = tmp_path / "no_ray" / "ray"
    no_ray.mkdir(parents=True)
    (no_ray / "__init__.py").write_text("raise ImportError('Ray is not installed on this machine')\n")
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(no_ray.parent), str(ROOT)]))
    toy = "--size toy --device cpu --weights float64 --dtype float64 --threads 1 --rounds 1 --responses 4"
    toy += " --prompt-length 4 --min-length 6 --max-length 20 --max-tokens-per-micro-batch 28 --micro-batch-size 2"
    command = [sys.executable, str(SCRIPT), *toy.split(), "--agreement", "--out", str(tmp_path / "out")]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "an inert stand-in takes its place" in done.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["ray_stood_in"] is True

    steps = {row["method"]: row for row in result["steps"]}
    assert list(steps) == ["grpo", "gspo", "maspo-fixed4", "maspo-fsq", "maspo-heard"]
    assert steps["grpo"]["ratio_to_grpo"] == 1.0
    assert all(row["steps"] == 1 and row["s_per_step"] > 0 for row in steps.values())
    assert result["tokens"] > result["response_tokens"] >= 4 * 6

    metrics = result["last_step_metrics"]
    assert all(math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0 for m in metrics.values())
    segment_length = {name: m.get("actor/maspo/mean_segment_length") for name, m in metrics.items()}
    assert segment_length["grpo"] is None and segment_length["gspo"] is None  # veRL's own losses
    assert 2 < segment_length["maspo-fixed4"] <= 4  # windows of 4, a shorter one at each response's end
    assert segment_length["maspo-heard"] > 4  # the heard words (6 to 23 frames) are the segments

    agreement = result["agreement"]
    shapes = agreement["model_input_shapes"]
    assert all(rows == 1 for rows, _ in shapes["packed, token budget"] + shapes["packed, fixed"])
    assert any(rows > 1 for rows, _ in shapes["padded, token budget"] + shapes["padded, fixed"])
    assert len(shapes["packed, token budget"]) != len(shapes["packed, fixed"])  # other micro-batches
    assert agreement["gradient_norm"] > 0
    for way, difference in agreement["gradient_relative_difference"].items():
        assert difference < 1e-10, way
    assert len(set(round(loss, 9) for loss in agreement["pg_loss"].values())) == 1
