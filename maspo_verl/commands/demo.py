"""``maspo-verl demo``: train a tiny Llasa-shaped model with MASPO in veRL's real trainer, on CPU, in a few minutes.

What it does:

1. builds the tiny Llasa model (`maspo_verl.testing.tiny_llasa`) and gives it a supervised warm start on the
   synthetic TTS task's training texts (`maspo_verl.data.synthetic_tts`; 100 steps, so that content is within
   reach of RL), then writes the task's parquet files (`maspo_verl.runs.synthetic_run`);
2. runs ``python -m verl.trainer.main_ppo`` with ``MASPO_VERL_CPU=1`` (`maspo_verl.cpu`): GRPO advantages, the
   chosen policy loss, several mini-batches per rollout batch (off-policy: with one mini-batch every ratio is 1
   and MASPO equals GRPO), showing each step as it finishes; veRL's validation scores the training texts before
   the first step and after the last (``--eval-samples`` responses per text, sampled as the rollout samples);
3. writes ``<out>/samples.html`` (`maspo_verl.listening`: responses of each evaluation with the units heard and
   every reward part; the synthetic task has no audio, so no players), prints a summary table (reward and its
   parts, length, MASPO metrics per step), writes ``<out>/demo.png`` and ``<out>/metrics.jsonl`` (every metric veRL
   logged), and ends with the lines to read first: content and length on the training texts before and after
   training, and reward, content and length at the first and last steps.

``--method NAME`` picks the method (a name of ``maspo_verl/trainer_config/method/``, as ``ablate`` and the recipes
use it; `maspo_verl.methods`), ``--set KEY=VALUE`` refines it with Hydra overrides: methods compare on the same task.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from maspo_verl.figures import pyplot, save
from maspo_verl.listening import PAGE
from maspo_verl.runs.synthetic_run import split_evaluations

DEFAULT_METHOD = "maspo-fixed4"
"""The synthetic task's fixed-window MASPO (its units are 2-4 frames long)."""
SUMMARY_COLUMNS = {
    "reward": "critic/score/mean",
    "content": "reward/content/mean",
    "duration": "reward/duration/mean",
    "end": "reward/end/mean",
    "UER": "reward/unit_error_rate/mean",
    "len": "response_length/mean",
    "ppo_kl": "actor/ppo_kl",
    "clipfrac": "actor/pg_clipfrac",
    "seg/resp": "actor/maspo/segments_per_response",
    "seg_len": "actor/maspo/mean_segment_length",
    "clip_hi": "actor/maspo/clipfrac_high",
    "clip_lo": "actor/maspo/clipfrac_low",
    "l_k std": "actor/maspo/segment_log_ratio_std",
    "s/step": "timing_s/step",
}
PLOT_PANELS = (
    ("reward (synthetic TTS score)", ("critic/score/mean",)),
    ("content: step batches and the training texts", ("reward/content/mean", "eval/content")),
    ("reward parts", ("reward/content/mean", "reward/duration/mean", "reward/end/mean")),
    ("unit error rate", ("reward/unit_error_rate/mean",)),
    ("response length (tokens: codec frames + end)", ("response_length/mean",)),
    ("codec frames: spoken and expected", ("reward/frames/mean", "reward/expected_frames/mean")),
    ("actor/ppo_kl", ("actor/ppo_kl",)),
    ("clip fractions", ("actor/pg_clipfrac", "actor/maspo/clipfrac_high", "actor/maspo/clipfrac_low")),
    ("MASPO segments", ("actor/maspo/mean_segment_length", "actor/maspo/segments_per_response")),
    ("segment log-ratio std", ("actor/maspo/segment_log_ratio_std",)),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    from maspo_verl.methods import MASPO_KEY, MethodError, add_set_argument, method_help, task_method, validate_methods
    from maspo_verl.runs.synthetic_run import (
        TASK,
        TASK_DEFAULTS,
        add_eval_samples_argument,
        check_run_shape,
        task_paths,
    )

    parser = argparse.ArgumentParser(
        prog="maspo-verl demo",
        description="Train a tiny Llasa-shaped model on a synthetic TTS task with veRL's real trainer, on CPU.",
    )
    parser.add_argument(
        "--method", default=DEFAULT_METHOD, metavar="NAME[:OVERRIDES]", help=method_help(DEFAULT_METHOD)
    )
    add_set_argument(parser, f"{MASPO_KEY}.segmenter.window=8")
    d = TASK_DEFAULTS
    parser.add_argument("--steps", type=int, default=d["steps"], help="training steps (rollout batches)")
    parser.add_argument("--batch", type=int, default=d["batch"], help="prompts per step")
    parser.add_argument("--n", type=int, default=d["n"], help="responses per prompt (GRPO group)")
    parser.add_argument(
        "--mini-batches", type=int, default=d["mini_batches"], help="actor updates per step (off-policy when > 1)"
    )
    parser.add_argument("--lr", type=float, default=d["lr"])
    parser.add_argument("--texts", type=int, default=d["texts"], help="training texts (warm start and RL)")
    add_eval_samples_argument(parser)
    parser.add_argument("--temperature", type=float, default=d["temperature"], help="rollout sampling temperature")
    parser.add_argument(
        "--warm-start-steps", type=int, default=d["warm_start_steps"], help="supervised steps before RL (0: none)"
    )
    parser.add_argument(
        "--v1", action="store_true", help="veRL's default (v1) trainer instead of the faster legacy one"
    )
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: a new temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    check_run_shape(parser, args)
    if args.texts < 1:
        parser.error(f"--texts must be >= 1, got {args.texts}")
    try:
        args.method = task_method(args.method, TASK, args.refinements)
        # a bad key or value fails here, in seconds, not in the trainer after the task is built
        validate_methods([args.method], run_overrides(args, task_paths(args.out or Path("task"))))
    except MethodError as error:
        parser.error(str(error))
    return args


def run_overrides(args: argparse.Namespace, task) -> list[str]:
    """veRL overrides of the demo's run on the prepared ``task``: its shape, then the method (refined)."""
    from maspo_verl.runs.synthetic_run import task_overrides

    shape = {key: getattr(args, key) for key in ("batch", "n", "mini_batches", "lr", "temperature", "eval_samples")}
    overrides = task_overrides(task, steps=args.steps, seed=args.seed, v1=args.v1, **shape)
    return overrides + list(args.method.overrides)


def _progress(total: int, start: float, eval_samples: int):
    """An ``on_line`` callback: one line per finished step and per evaluation, plus the trainer's errors."""
    from maspo_verl.runs.launch import is_error_line, parse_step_line

    def on_line(line: str) -> None:
        parsed = parse_step_line(line)
        if parsed is not None:
            step, metrics = parsed
            elapsed = f"[{time.monotonic() - start:5.0f}s]"
            shown = [f"{name} {metrics[key]:.4g}" for name, key in SUMMARY_COLUMNS.items() if key in metrics]
            if shown:
                print(f"  step {step}/{total} {elapsed}  " + "  ".join(shown), flush=True)
            for evaluation in split_evaluations([{"step": step, **metrics}], eval_samples)[1]:
                parts = [
                    f"{key.removeprefix('eval/')} {value:.4g}" for key, value in evaluation.items() if key != "step"
                ]
                when = "before step 1" if step == 0 else f"after step {step}"
                print(f"  evaluation {when} {elapsed}  " + "  ".join(parts), flush=True)
        elif is_error_line(line):
            print("  " + line, flush=True)

    return on_line


def evaluation_line(evaluations: list[dict[str, float]], texts: int, samples: int, temperature: float) -> str:
    """Content, length (codec frames over the frames the texts need) and end-tag rate on the training texts, first
    evaluation (before training) -> last (after)."""
    if len(evaluations) < 2:
        return "no evaluation before and after training (--eval-samples 0 or the run ended early)"
    first, last = evaluations[0], evaluations[-1]
    before, after = first["eval/content"], last["eval/content"]

    def ratio(e: dict[str, float]) -> float:
        return e["eval/frames"] / e["eval/expected_frames"]

    return (
        f"content on the {texts} training texts ({samples} samples each at temperature {temperature:g}) "
        f"{before:.3f} -> {after:.3f} ({after - before:+.3f}); "
        f"frames / expected frames {ratio(first):.2f} -> {ratio(last):.2f}; end tag {first['eval/end']:.2f} -> "
        f"{last['eval/end']:.2f}; before step 1 -> after step {int(last['step'])}"
    )


def learning_line(steps: list[dict[str, float]], window: int = 3) -> str:
    """What a person reads first: reward, content and length at the first and last steps, the means over the first
    and last ``window`` steps (a single step moves with the texts it drew), and the expected length
    (`maspo_verl.data.synthetic_tts.FRAMES_PER_UNIT` frames per target unit, + the end tag) over the same steps."""
    window = max(1, min(window, len(steps) // 2))
    head, tail = steps[:window], steps[-window:]

    def mean(rows: list[dict[str, float]], key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    def change(key: str, digits: int = 3) -> str:
        if any(key not in s for s in (*head, *tail)):
            return "-"
        first, last = steps[0][key], steps[-1][key]
        return (
            f"{first:.{digits}f} -> {last:.{digits}f} "
            f"(first/last {window} steps {mean(head, key):.{digits}f} -> {mean(tail, key):.{digits}f})"
        )

    frames = "reward/expected_frames/mean"
    expected = ""
    if all(frames in s for s in (*head, *tail)):
        expected = f"; expected {mean(head, frames) + 1:.1f} -> {mean(tail, frames) + 1:.1f} (frames + end)"
    return (
        f"reward {change('critic/score/mean')}; content (1 - unit error rate) {change('reward/content/mean')}; "
        f"length {change('response_length/mean', 1)} tokens{expected}; first -> last step"
    )


def summary_table(steps: list[dict[str, float]]) -> str:
    """The per-step table the demo prints: the `SUMMARY_COLUMNS` present in the run."""
    columns = {name: key for name, key in SUMMARY_COLUMNS.items() if any(key in s for s in steps)}
    header = "step " + " ".join(f"{name:>9}" for name in columns)
    lines = [header, "-" * len(header)]
    for s in steps:
        cells = [f"{s[key]:9.4g}" if key in s else f"{'-':>9}" for key in columns.values()]
        lines.append(f"{int(s['step']):4d} " + " ".join(cells))
    return "\n".join(lines)


def _series_label(key: str) -> str:
    """A metric's name in a legend: ``reward/content/mean`` -> ``content``, ``actor/pg_clipfrac`` -> ``pg_clipfrac``,
    ``eval/content`` -> ``content, training texts``."""
    if key.startswith("eval/"):
        return f"{key.removeprefix('eval/')}, training texts"
    parts = key.split("/")
    return parts[-2] if parts[-1] == "mean" and len(parts) > 1 else parts[-1]


def plot(steps: list[dict[str, float]], path: Path, title: str) -> Path:
    """Reward and MASPO metrics per step, one panel each (`PLOT_PANELS`), saved as a PNG."""
    plt = pyplot()

    panels = [(name, [k for k in keys if any(k in s for s in steps)]) for name, keys in PLOT_PANELS]
    panels = [(name, keys) for name, keys in panels if keys]
    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels):
        for key in keys:
            xs = [s["step"] for s in steps if key in s]
            ax.plot(xs, [s[key] for s in steps if key in s], marker="o", label=_series_label(key))
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        if len(keys) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    save(fig, path, title)
    return path


def main(argv: list[str]) -> int:
    from maspo_verl.runs.launch import run_trainer
    from maspo_verl.runs.synthetic_run import prepare_task

    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="maspo_demo_"))
    out.mkdir(parents=True, exist_ok=True)
    method = args.method.name + "".join(f" {r}" for r in args.refinements)
    start = time.monotonic()
    print(f"[demo] building the tiny Llasa model and the synthetic TTS task in {out}", flush=True)
    task = prepare_task(
        out / "task", warm_start_steps=args.warm_start_steps, n_train=args.texts, n_val=16, seed=args.seed
    )
    print(f"[demo] ready in {time.monotonic() - start:.0f}s; training with {method} in veRL's trainer", flush=True)
    overrides = run_overrides(args, task)
    if args.eval_samples:  # the listening page (maspo_verl.listening): the evaluations' responses, no audio here
        overrides += [f"trainer.validation_data_dir={out / 'run' / 'validation'}", f"+trainer.samples.dir={out}"]
    run = run_trainer(overrides, out / "run", timeout=1800, on_line=_progress(args.steps, start, args.eval_samples))
    if not run.ok:
        print(run.log_tail(40), file=sys.stderr)
        print(f"[demo] veRL's trainer failed (exit {run.returncode}); full log: {run.log_path}", file=sys.stderr)
        return 1
    (out / "metrics.jsonl").write_text((out / "run" / "metrics.jsonl").read_text())
    steps, evaluations = split_evaluations(run.steps, args.eval_samples)
    print()
    print(summary_table(steps))
    png = plot(steps + evaluations, out / "demo.png", f"maspo-verl demo: {method}, synthetic TTS, tiny Llasa on CPU")
    print()
    print(f"[demo] {method}: {evaluation_line(evaluations, args.texts, args.eval_samples, args.temperature)}")
    print(f"[demo] {method}, per step: {learning_line(steps)}")
    print(
        f"[demo] {len(steps)} steps, {time.monotonic() - start:.0f}s wall, "
        f"peak memory {run.peak_rss_bytes / 2**30:.1f} GiB"
    )
    print(f"[demo] plot: {png}\n[demo] metrics: {out / 'metrics.jsonl'}\n[demo] trainer log: {run.log_path}")
    page = out / PAGE
    if page.exists():
        print(f"[demo] samples (text, units heard, reward parts per evaluation; docs/listening.md): {page}")
    return 0
