"""A speech training step of veRL's trainer on CPU, this checkout against another, in alternating rounds.

Each round runs ``maspo-verl demo --task speech --method grpo --steps N --eval-samples 0`` (mini-llasa, 4 prompts x
4 responses a step, Whisper tiny.en reward) once with this checkout's code and once with ``--baseline``'s (a checkout
of an earlier commit, ``git worktree add /tmp/before <commit>``, imported first through ``PYTHONPATH`` by every
process of its run), in alternating order. Each command is the checkout's own demo, so each runs with its own
settings (threads, batching, rollout). Per run, the medians over steps 2..N of veRL's ``timing_s/*`` (step 1 holds
one-time work); per round, the ratio of this checkout's step median to the baseline's; then the median ratio over
rounds. Nothing else should run on the machine meanwhile. Usage::

    git worktree add /tmp/before a9dc7f9
    python benchmarks/bench_speech_step.py --baseline /tmp/before [--rounds 2] [--steps 8] [--out /tmp/bench_step]
    # two settings of this checkout: --baseline . and the demo's options for each side
    python benchmarks/bench_speech_step.py --baseline . --baseline-args "--batch 16" --this-args "--batch 16 --set ..."
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

PHASES = {
    "step": "timing_s/step",
    "gen": "timing_s/gen",
    "old_log_prob": "timing_s/old_log_prob",
    "update_actor": "timing_s/update_actor",
    "longest generation": "timing_s/agent_loop/generate_sequences/max",
    "wait for reward": "timing_s/agent_loop/compute_score/mean",
}
"""What each run reports: veRL's timers (``gen`` is rollout, codec decode and Whisper until the last response is
scored), the longest response's generation time and the mean time a response waited for its score."""


def run_demo(checkout: Path | None, steps: int, out: Path, extra: list[str]) -> dict[str, float]:
    """Medians over steps 2..``steps`` of `PHASES` for one demo run of ``checkout`` (None: this one) with the demo
    options ``extra``."""
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    root = checkout or Path(__file__).resolve().parents[1]
    cli = "maspo_lab.cli" if (root / "maspo_lab").is_dir() else "maspo_verl.cli"  # a checkout before the lab moved
    command = [sys.executable, "-m", cli, "demo", "--task", "speech", "--method", "grpo"]
    command += ["--steps", str(steps), "--eval-samples", "0", "--out", str(out), *extra]
    out.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".log"), "w") as log:  # cwd: not a checkout (``-m`` puts the cwd first on sys.path)
        subprocess.run(command, env=env, cwd=out, stdout=log, stderr=subprocess.STDOUT, check=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    later = [r.get("data", r) for r in records if r.get("step", 0) >= 2]
    return {name: statistics.median(r[key] for r in later if key in r) for name, key in PHASES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the code to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_speech_step"))
    parser.add_argument("--baseline-args", default="", help="demo options of the baseline's runs (one string)")
    parser.add_argument("--this-args", default="", help="demo options of this checkout's runs (one string)")
    args = parser.parse_args(argv)
    args.baseline = args.baseline.resolve()
    if not (args.baseline / "maspo_verl").is_dir():
        parser.error(f"--baseline {args.baseline}: not a checkout of this project (no maspo_verl/)")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    for round_ in range(args.rounds):
        order = [("baseline", args.baseline, args.baseline_args), ("this", None, args.this_args)]
        for name, checkout, extra in order if round_ % 2 == 0 else order[::-1]:
            figures = run_demo(checkout, args.steps, args.out / f"{name}_{round_}", shlex.split(extra))
            results[name].append(figures)
            print(f"round {round_ + 1} {name:>8}: " + "  ".join(f"{k} {v:.2f}" for k, v in figures.items()), flush=True)
    ratios = [t["step"] / b["step"] for t, b in zip(results["this"], results["baseline"], strict=True)]
    print(f"\nmedian s/step over steps 2..{args.steps}, per phase (median over {args.rounds} rounds):")
    for phase in PHASES:
        before = statistics.median(r[phase] for r in results["baseline"])
        after = statistics.median(r[phase] for r in results["this"])
        print(f"  {phase:<20} baseline {before:6.2f}  this {after:6.2f}")
    per_round = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"step time, this / baseline, per round: {per_round}; median {statistics.median(ratios):.2f}")
    (args.out / "results.json").write_text(json.dumps({**results, "ratios": ratios}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
