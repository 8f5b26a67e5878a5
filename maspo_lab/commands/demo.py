"""``maspo-verl demo``: train mini-llasa, a small model that really speaks, with MASPO in veRL's real trainer, on CPU.

What it does (``--task speech``, the default):

1. writes the task's data (`maspo_lab.runs.speech_run`): the shipped mini-llasa (`maspo_lab.speaking_model`),
   ``--texts`` sentences it was trained on by supervised learning, and ``--heldout`` sentences it never saw;
2. runs ``python -m verl.trainer.main_ppo`` with ``MASPO_VERL_CPU=1`` (`maspo_verl.cpu`): the chosen method (by
   default ``maspo-phoneme-credit``: segment ratios over the phonemes the code ear aligned, each phoneme's codes
   credited with its own group-relative advantage), several mini-batches per rollout batch (off-policy: with one
   mini-batch every ratio is 1), rewarded by the speech reward in veRL's reward workers: by default the shipped code
   ear reads the codes (``score = 1 - tanh(3 PER)``, no audio decoded; `reward_fns.code_ear`), with
   ``--recogniser audio`` the mini codec decodes them and Whisper tiny.en hears them (``1 - tanh(3 CER)``); each
   step is shown as it finishes; veRL's validation samples every training and held-out sentence ``--eval-samples``
   times before the first step and after the last, heard by Whisper tiny.en and PocketSphinx (and read by the ear);
3. writes ``<out>/samples.html`` (`maspo_verl.listening`: a player per response of each evaluation, with its text,
   what Whisper heard and every reward part), prints a summary table per step, writes ``<out>/demo.png`` and
   ``<out>/metrics.jsonl`` (every metric veRL logged), and ends with the lines to read first: CER and score on the
   training and held-out sentences before and after training by each ear, and the paired change with its 95 %
   interval over sentences.

``--task synthetic`` runs the former demo: a tiny Llasa-shaped model warm-started on a synthetic TTS task with no
audio (`maspo_lab.runs.synthetic_run`), in a few minutes.

``--method NAME`` picks the method (a name of ``maspo_verl/trainer_config/method/``, as ``ablate`` and the recipes
use it; `maspo_lab.methods`), ``--set KEY=VALUE`` refines it with Hydra overrides: methods compare on the same task.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from maspo_lab.figures import pyplot, save
from maspo_lab.runs.launch import run_folder
from maspo_lab.runs.synthetic_run import split_evaluations
from maspo_lab.runs.tasks import TASK_NAMES
from maspo_verl.listening import PAGE, SETS

DEFAULT_METHODS = {"ear": "maspo-phoneme-credit", "audio": "maspo-fsq", "synthetic": "maspo-fixed4"}
"""The default method per reward: on the speech task rewarded by the code ear, MASPO over the phonemes it aligned with
per-phoneme credit; rewarded by Whisper, boundaries where the codes jump on the mini codec's FSQ lattice; the
synthetic task's fixed windows (its units are 2-4 frames long)."""
DEFAULT_METHOD = DEFAULT_METHODS["synthetic"]
SPEECH_COLUMNS = {
    "reward": "critic/score/mean",
    "CER": "reward/speech_error_rate/mean",  # clipped to 1: one response that never ends does not swamp a step
    "PER": "reward/speech_ear_per/mean",  # the code ear's, when it is the reward (then no CER on training batches)
    "valid": "reward/speech_valid/mean",
    "sec": "reward/speech_duration_s/mean",
    "len": "response_length/mean",
    "ppo_kl": "actor/ppo_kl",
    "clipfrac": "actor/pg_clipfrac",
    "seg/resp": "actor/maspo/segments_per_response",
    "seg_len": "actor/maspo/mean_segment_length",
    "l_k std": "actor/maspo/segment_log_ratio_std",
    "s/step": "timing_s/step",
}
SPEECH_PANELS = (
    ("reward (1 - tanh(3 PER) or 1 - tanh(3 CER))", ("critic/score/mean",)),
    ("character error rate, each clipped to 1 (Whisper tiny.en)", ("reward/speech_error_rate/mean",)),
    ("phoneme error rate, each clipped to 1 (the code ear)", ("reward/speech_ear_per/mean",)),
    ("responses scored (ended, decodable)", ("reward/speech_valid/mean",)),
    ("seconds of speech", ("reward/speech_duration_s/mean",)),
    ("actor/ppo_kl", ("actor/ppo_kl",)),
    ("clip fractions", ("actor/pg_clipfrac", "actor/maspo/clipfrac_high", "actor/maspo/clipfrac_low")),
    ("MASPO segments", ("actor/maspo/mean_segment_length", "actor/maspo/segments_per_response")),
    ("segment log-ratio std", ("actor/maspo/segment_log_ratio_std",)),
)
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


def _task_of(argv: list[str]) -> tuple[str, str]:
    """The ``--task`` and ``--recogniser`` of ``argv`` (defaults ``speech`` and the demo's recogniser otherwise), read
    first: the other defaults depend on them."""
    from maspo_lab.runs.speech_run import RECOGNISER, RECOGNISERS

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", choices=TASK_NAMES, default=TASK_NAMES[0])
    pre.add_argument("--recogniser", choices=RECOGNISERS, default=RECOGNISER)
    known = pre.parse_known_args(argv)[0]
    return known.task, known.recogniser


def parse_args(argv: list[str]) -> argparse.Namespace:
    from maspo_lab.methods import MASPO_KEY, MethodError, add_set_argument, method_help, validate_methods
    from maspo_lab.runs import speech_run
    from maspo_lab.runs.tasks import add_eval_samples_argument, check_run_shape, task_named

    name, recogniser = _task_of(argv)
    task = task_named(name)
    d = {**task.defaults, **(speech_run.DEMO_SHAPES[recogniser] if name == "speech" else task.demo_shape)}
    parser = argparse.ArgumentParser(
        prog="maspo-verl demo",
        description="Train mini-llasa, a small model that speaks, with MASPO in veRL's real trainer, on CPU "
        "(--task synthetic: the tiny Llasa-shaped model on a synthetic TTS task).",
    )
    parser.add_argument("--task", choices=TASK_NAMES, default=TASK_NAMES[0], help="speech (default) or synthetic")
    method = DEFAULT_METHODS[recogniser if name == "speech" else name]
    parser.add_argument("--method", default=method, metavar="NAME[:OVERRIDES]", help=method_help(method))
    add_set_argument(parser, f"{MASPO_KEY}.segmenter.threshold=3")
    parser.add_argument("--steps", type=int, default=d["steps"], help="training steps (rollout batches)")
    parser.add_argument("--batch", type=int, default=d["batch"], help="prompts per step")
    parser.add_argument("--n", type=int, default=d["n"], help="responses per prompt (GRPO group)")
    parser.add_argument(
        "--mini-batches", type=int, default=d["mini_batches"], help="actor updates per step (off-policy when > 1)"
    )
    parser.add_argument("--lr", type=float, default=d["lr"])
    parser.add_argument(
        "--kl-coef",
        type=float,
        default=d["kl_coef"],
        help="coefficient of a low_var_kl term to the starting model in the actor's loss (0: none, no reference "
        "log-probs computed)",
    )
    parser.add_argument("--texts", type=int, default=d["texts"], help="training sentences (texts) of RL")
    if name == "speech":
        parser.add_argument("--heldout", type=int, default=d["heldout"], help="held-out sentences evaluated")
        parser.add_argument(
            "--recogniser",
            choices=speech_run.RECOGNISERS,
            default=speech_run.RECOGNISER,
            help=f"what hears a training response for its reward: ear (the shipped code ear reads the codes) or audio "
            f"(decoded, Whisper tiny.en); evaluations are heard by Whisper and PocketSphinx either way (default "
            f"{speech_run.RECOGNISER})",
        )
    add_eval_samples_argument(parser, d["eval_samples"])
    parser.add_argument("--temperature", type=float, default=d["temperature"], help="rollout sampling temperature")
    if name == "synthetic":
        parser.add_argument(
            "--warm-start-steps", type=int, default=d["warm_start_steps"], help="supervised steps before RL (0: none)"
        )
    parser.add_argument(
        "--v1", action="store_true", help="veRL's default (v1) trainer instead of the faster legacy one"
    )
    parser.add_argument("--out", type=run_folder, default=None, help="output directory (default: a new temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    check_run_shape(parser, args)
    if args.texts < 1:
        parser.error(f"--texts must be >= 1, got {args.texts}")
    if name == "speech":
        available = (len(speech_run.training_texts()), len(speech_run.heldout_texts()))
        if args.texts > available[0] or not 0 <= args.heldout <= available[1]:
            parser.error(
                f"--texts must be at most {available[0]} and --heldout in [0, {available[1]}] (the shipped sentences)"
            )
    try:
        args.method = task.method(args.method, args.refinements)
        # a bad key or value fails here, in seconds, not in the trainer after the task is built
        validate_methods([args.method], run_overrides(args, planned_paths(args)))
    except MethodError as error:
        parser.error(str(error))
    return args


def planned_paths(args: argparse.Namespace):
    """Where the task's files will be (nothing is written): for validating the run's overrides."""
    from maspo_lab.runs.tasks import task_named

    paths = task_named(args.task).paths((args.out or Path("demo")) / "task")
    if args.task != "speech":
        return paths
    from maspo_lab.runs.speech_run import heard_by

    return heard_by(paths, args.recogniser)


def run_overrides(args: argparse.Namespace, files) -> list[str]:
    """veRL overrides of the demo's run on the prepared task (``files``): its shape, then the method (refined)."""
    from maspo_lab.runs.tasks import task_named

    keys = ("batch", "n", "mini_batches", "lr", "kl_coef", "temperature", "eval_samples")
    shape = {key: getattr(args, key) for key in keys}
    overrides = task_named(args.task).overrides(files, steps=args.steps, seed=args.seed, v1=args.v1, **shape)
    return overrides + list(args.method.overrides)


def _finite(value) -> bool:
    """A metric worth showing: logged and finite (under the code ear a training batch's CER is NaN: none heard)."""
    return value is not None and math.isfinite(value)


def _progress(total: int, start: float, columns: dict[str, str], evaluation_of):
    """An ``on_line`` callback: one line per finished step (``columns``) and per evaluation (``evaluation_of(step,
    metrics)``: its figures by name, empty when the record holds none), plus the trainer's errors."""
    from maspo_lab.runs.launch import is_error_line, parse_step_line

    def on_line(line: str) -> None:
        parsed = parse_step_line(line)
        if parsed is not None:
            step, metrics = parsed
            elapsed = f"[{time.monotonic() - start:5.0f}s]"
            shown = [f"{name} {metrics[key]:.4g}" for name, key in columns.items() if _finite(metrics.get(key))]
            if shown:
                print(f"  step {step}/{total} {elapsed}  " + "  ".join(shown), flush=True)
            figures = evaluation_of(step, metrics)
            if figures:
                when = "before step 1" if step == 0 else f"after step {step}"
                parts = [f"{name} {value:.4g}" for name, value in figures.items()]
                print(f"  evaluation {when} {elapsed}  " + "  ".join(parts), flush=True)
        elif is_error_line(line):
            print("  " + line, flush=True)

    return on_line


def synthetic_evaluation(samples: int):
    """`_progress`'s ``evaluation_of`` on the synthetic task: its parts on the training texts."""

    def evaluation_of(step: int, metrics: dict[str, float]) -> dict[str, float]:
        found = split_evaluations([{"step": step, **metrics}], samples)[1]
        return {k.removeprefix("eval/"): v for k, v in found[0].items() if k != "step"} if found else {}

    return evaluation_of


def speech_evaluation(samples: int):
    """`_progress`'s ``evaluation_of`` on the speech task: CER and score on the training and held-out sentences, read
    by `speech_run.evaluation_figures` as the closing lines are. The CER is clipped to [0, 1] per response: one
    response that never ends has a raw CER of several (every word inserted) and would swamp the mean of 48."""
    from maspo_lab.runs.speech_run import evaluation_figures

    def evaluation_of(step: int, metrics: dict[str, float]) -> dict[str, float]:
        figures = {}
        for row in evaluation_figures([{**metrics, "step": step}], samples):
            name = {"heldout": "held-out"}.get(row["set"], row["set"])
            figures[f"{name} CER"] = 1.0 - row["content"]
            if "score" in row:
                figures[f"{name} score"] = row["score"]
        return figures

    return evaluation_of


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
    (`maspo_lab.data.synthetic_tts.FRAMES_PER_UNIT` frames per target unit, + the end tag) over the same steps."""
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


def summary_table(steps: list[dict[str, float]], columns: dict[str, str] = SUMMARY_COLUMNS) -> str:
    """The per-step table the demo prints: the ``columns`` present in the run."""
    columns = {name: key for name, key in columns.items() if any(_finite(s.get(key)) for s in steps)}
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


def plot(
    steps: list[dict[str, float]], path: Path, title: str, panels=PLOT_PANELS, evaluated: list[dict] | None = None
) -> Path:
    """Reward and MASPO metrics per step, one panel each (``panels``: title and metric keys), and the evaluations
    before and after training first (`evaluation_panel` of ``evaluated``), saved as a PNG."""
    plt = pyplot()

    panels = [(name, [k for k in keys if any(k in s for s in steps)]) for name, keys in panels]
    panels = [(name, keys) for name, keys in panels if keys]
    cols = 3
    first = 1 if evaluated else 0
    rows = -(-(len(panels) + first) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    if evaluated:
        evaluation_panel(axes.flat[0], evaluated)
    for ax, (name, keys) in zip(list(axes.flat)[first:], panels):
        for key in keys:
            xs = [s["step"] for s in steps if key in s]
            ax.plot(xs, [s[key] for s in steps if key in s], marker="o", label=_series_label(key))
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        if len(keys) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) + first :]:
        ax.axis("off")
    save(fig, path, title)
    return path


EAR_LABELS = {
    "whisper": "Whisper tiny.en",
    "second": "PocketSphinx (never trained on)",
    "ear": "the code ear (phoneme error rate)",
}
REWARDED_BY = {
    "ear": "the code ear reading the codes (phoneme error rate, no audio)",
    "audio": "Whisper tiny.en hearing the mini codec",
}
REWARD_TITLE = {"ear": "code-ear reward", "audio": "Whisper tiny.en reward"}
SET_LABELS = {"train": "training", "heldout": "held-out"}


def evaluation_panel(ax, evaluated: list[dict]) -> None:
    """CER before and after training per sentence set and ear, each the mean over sentences with its 95 % interval
    (``evaluated``: `maspo_lab.analysis.evaluations.heard` rows, the first and last step of each set and ear)."""
    from maspo_lab.analysis.summary import mean_interval

    groups: dict[tuple[str, str], list[dict]] = {}
    for row in evaluated:
        groups.setdefault((row["source"], row["ear"]), []).append(row)
    labels = []
    for x, ((source, ear), found) in enumerate(sorted(groups.items())):
        found.sort(key=lambda r: r["step"])
        for offset, row, color in ((-0.15, found[0], "tab:gray"), (0.15, found[-1], "tab:blue")):
            mean, half, _ = mean_interval(row["per_sentence"].values())
            ax.errorbar(x + offset, mean, yerr=0 if math.isnan(half) else half, fmt="o", color=color, capsize=3)
        labels.append(f"{SET_LABELS.get(source.rpartition('/')[2], source)}\n{ear}")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("CER (clipped at 1)")
    ax.set_title("evaluation: before (grey) and after (blue), 95 % interval", fontsize=9)


def speech_evaluation_lines(changes: list[dict]) -> list[str]:
    """The lines to read first: per sentence set and ear, the CER before -> after training (mean over sentences of
    each sentence's mean over its samples) and the paired change with its 95 % interval over sentences, the
    training sentences first; ``changes``: `maspo_lab.analysis.evaluations.changes`, the last step of each."""
    last: dict[tuple[str, str], dict] = {}
    for row in changes:
        if row["step"] >= last.get((row["source"], row["ear"]), {"step": -1})["step"]:
            last[(row["source"], row["ear"])] = row

    def order(key: tuple[str, str]) -> tuple[int, int]:
        return list(SET_LABELS).index(key[0].rpartition("/")[2]), list(EAR_LABELS).index(key[1])

    lines = []
    for (source, ear), row in sorted(last.items(), key=lambda kv: order(kv[0])):
        lo, hi = row["change"] - row["ci95"], row["change"] + row["ci95"]
        where = SET_LABELS.get(source.rpartition("/")[2], source)
        verdict = "lower" if hi < 0 else "higher" if lo > 0 else "no change told from 0"
        lines.append(
            f"{'PER' if ear == 'ear' else 'CER'} on the {where} sentences heard by {EAR_LABELS[ear]} "
            f"({row['sentences']} sentences x "
            f"{row['repeats']} samples): {row['before']:.3f} -> {row['after']:.3f}; paired change {row['change']:+.3f} "
            f"(95 % interval {lo:+.3f} .. {hi:+.3f}: {verdict}); before step 1 -> after step {row['step']}"
        )
    return lines or ["no evaluation before and after training (--eval-samples 0 or the run ended early)"]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="maspo_demo_"))
    out.mkdir(parents=True, exist_ok=True)
    return speech_demo(args, out) if args.task == "speech" else synthetic_demo(args, out)


def _finish(run, out: Path, start: float) -> bool:
    if not run.ok:
        print(run.log_tail(40), file=sys.stderr)
        print(f"[demo] veRL's trainer failed (exit {run.returncode}); full log: {run.log_path}", file=sys.stderr)
        return False
    (out / "metrics.jsonl").write_text((out / "run" / "metrics.jsonl").read_text())
    return True


def speech_demo(args: argparse.Namespace, out: Path) -> int:
    from maspo_lab.analysis.evaluations import changes, heard
    from maspo_lab.runs import speech_run
    from maspo_lab.runs.cpu_overrides import threads_per_run
    from maspo_lab.runs.launch import run_trainer

    method = args.method.name + "".join(f" {r}" for r in args.refinements)
    start = time.monotonic()
    settings = {"texts": args.texts, "heldout": args.heldout, "recogniser": args.recogniser}
    task = speech_run.build_task(out / "task", settings)
    print(
        f"[demo] mini-llasa ({task.model}) says {args.texts} training and {args.heldout} held-out sentences; "
        f"training with {method} in veRL's trainer, rewarded by {REWARDED_BY[args.recogniser]}; Whisper tiny.en "
        "and PocketSphinx hear the evaluations",
        flush=True,
    )
    overrides = run_overrides(args, task)
    validation = out / "run" / "validation"
    sources = speech_run.evaluated_sources(task)
    if args.eval_samples:  # the listening page (maspo_verl.listening): one response per evaluated sentence
        (out / SETS).write_text(json.dumps({t: SET_LABELS[s.rpartition("/")[2]] for t, s in sources.items()}))
        overrides += [f"trainer.validation_data_dir={validation}", f"+trainer.samples.dir={out}"]
        overrides += [f"+trainer.samples.count={len(sources)}"]
    progress = _progress(args.steps, start, SPEECH_COLUMNS, speech_evaluation(args.eval_samples))
    run = run_trainer(overrides, out / "run", timeout=3600, on_line=progress, threads=threads_per_run())
    if not _finish(run, out, start):
        return 1
    steps = [r for r in run.steps if "critic/score/mean" in r]
    print()
    print(summary_table(steps, SPEECH_COLUMNS))
    title = f"maspo-verl demo: {method}, mini-llasa on CPU ({REWARD_TITLE[args.recogniser]})"
    evaluated = heard(validation, sources) if args.eval_samples else []
    png = plot(steps, out / "demo.png", title, SPEECH_PANELS, evaluated)
    print()
    if args.eval_samples:
        paired = changes(evaluated)
        (out / "evaluations.json").write_text(json.dumps({"heard": evaluated, "changes": paired}, indent=1) + "\n")
        for line in speech_evaluation_lines(paired):
            print(f"[demo] {method}: {line}")
    return _closing_lines(
        run, out, png, len(steps), start, "listen (each evaluation's speech, transcript and reward parts"
    )


def _closing_lines(run, out: Path, png: Path, steps: int, start: float, page_says: str) -> int:
    """The demo's last lines: steps, wall time and peak memory, where the plot, metrics and log are, and the page."""
    print(
        f"[demo] {steps} steps, {time.monotonic() - start:.0f}s wall, peak memory {run.peak_rss_bytes / 2**30:.1f} GiB"
    )
    print(f"[demo] plot: {png}\n[demo] metrics: {out / 'metrics.jsonl'}\n[demo] trainer log: {run.log_path}")
    page = out / PAGE
    if page.exists():
        print(f"[demo] {page_says}; docs/listening.md): {page}")
    return 0


def synthetic_demo(args: argparse.Namespace, out: Path) -> int:
    from maspo_lab.runs.cpu_overrides import threads_per_run
    from maspo_lab.runs.launch import run_trainer
    from maspo_lab.runs.synthetic_run import prepare_task

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
    progress = _progress(args.steps, start, SUMMARY_COLUMNS, synthetic_evaluation(args.eval_samples))
    run = run_trainer(overrides, out / "run", timeout=1800, on_line=progress, threads=threads_per_run())
    if not _finish(run, out, start):
        return 1
    steps, evaluations = split_evaluations(run.steps, args.eval_samples)
    print()
    print(summary_table(steps))
    png = plot(steps + evaluations, out / "demo.png", f"maspo-verl demo: {method}, synthetic TTS, tiny Llasa on CPU")
    print()
    print(f"[demo] {method}: {evaluation_line(evaluations, args.texts, args.eval_samples, args.temperature)}")
    print(f"[demo] {method}, per step: {learning_line(steps)}")
    return _closing_lines(run, out, png, len(steps), start, "samples (text, units heard, reward parts per evaluation")
