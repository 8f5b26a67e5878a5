"""veRL's trainer on CPU on the synthetic TTS task: the task's files and the overrides of a run.

`prepare_task` builds the tiny Llasa-shaped model (optionally warm-started) and writes the task's parquet files;
`run_overrides` are the veRL overrides of a GRPO run on them (the CPU settings themselves come from
`maspo_lab.runs.cpu_overrides`, added by `maspo_lab.runs.launch`); `method_overrides` select the method (a name of
`maspo_lab.methods`, as this task runs it). `TASK` is the task as every command reads it (`maspo_lab.runs.task`).
The demo, the end-to-end tests and `recipes/cpu_smoke` all start from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from maspo_lab.data import synthetic_tts
from maspo_lab.runs import run_shape
from maspo_lab.runs.run_shape import read_scale, scale_defaults
from maspo_lab.runs.task import Task

if TYPE_CHECKING:
    from maspo_lab.methods import Method


@dataclass(frozen=True)
class TaskPaths:
    model: Path
    train: Path
    val: Path


def task_paths(workdir: str | Path) -> TaskPaths:
    """Where `prepare_task` puts the model and the data under ``workdir``."""
    workdir = Path(workdir)
    return TaskPaths(
        model=workdir / "model", train=workdir / "data" / "train.parquet", val=workdir / "data" / "val.parquet"
    )


def prepare_task(
    workdir: str | Path,
    *,
    warm_start_steps: int = 0,
    n_train: int = 64,
    n_val: int = 16,
    seed: int = 0,
    reuse: bool = False,
    text_length: str = "default",
) -> TaskPaths:
    """Build the tiny Llasa model (optionally warm-started on the task) and the dataset under ``workdir``.

    ``text_length``: a key of `synthetic_tts.WORDS_PER_TEXT` (``long``: texts about 4x longer).
    ``reuse``: return the files an earlier call left in ``workdir`` instead of building them again."""
    from maspo_lab.data.tiny_llasa import build_tiny_llasa

    workdir = Path(workdir)
    if reuse:
        paths = task_paths(workdir)
        missing = [str(p) for p in (paths.model / "config.json", paths.train, paths.val) if not p.exists()]
        if missing:
            raise FileNotFoundError(f"prepare_task(reuse=True): {workdir} lacks {missing}")
        return paths
    words = synthetic_tts.WORDS_PER_TEXT[text_length]
    train, val = synthetic_tts.write_dataset(workdir / "data", n_train=n_train, n_val=n_val, seed=seed, words=words)
    model = build_tiny_llasa(
        workdir / "model", corpus=synthetic_tts.make_texts(n_train + n_val, seed=seed, words=words)
    )
    if warm_start_steps:
        synthetic_tts.warm_start(model, steps=warm_start_steps, n_texts=n_train, seed=seed, words=words)
    return TaskPaths(model=model, train=train, val=val)


def recipe_overrides(workdir: str | Path, warm_start_steps: int = 0, build: bool = True) -> list[str]:
    """What ``recipes/llasa_1b/run.sh`` adds with ``MODEL=tiny``: the tiny scale, and the task's model and data under
    ``workdir`` (32 training and 8 validation texts), built once unless ``build`` is false (a dry run)."""
    paths = task_paths(workdir)
    if build and not (paths.model / "config.json").exists():
        paths = prepare_task(workdir, warm_start_steps=warm_start_steps, n_train=32, n_val=8)
    return run_shape.recipe_overrides("tiny", paths.train, paths.val, paths.model)


def run_overrides(
    task: TaskPaths,
    *,
    steps: int,
    batch: int,
    n: int,
    mini_batches: int,
    micro_batch: int,
    response_length: int,
    lr: float,
    temperature: float,
    seed: int,
    eval_samples: int,
    eval_every: int | None = None,
    kl_coef: float = 0.0,
) -> list[str]:
    """veRL overrides for GRPO on the synthetic TTS task (the CPU settings come from `maspo_lab.runs.cpu_overrides`); a
    run of the demo's shape is `task_overrides`.

    ``batch`` prompts per step, ``n`` responses each, split into ``mini_batches`` actor updates per step.
    ``eval_samples`` > 0: veRL's validation runs before the first step and after the last on the *training* texts,
    ``eval_samples`` responses per text sampled as the rollout samples (a fixed set of prompts, so the two figures
    differ by what training changed and by sampling noise only; the held-out texts are not what RL optimises), and
    every ``eval_every`` steps when given.
    """
    from maspo_lab.runs.run_shape import grpo_overrides

    return grpo_overrides(
        train=task.train,
        validation=task.train if eval_samples else task.val,
        model=task.model,
        steps=steps,
        seed=seed,
        batch=batch,
        n=n,
        mini_batches=mini_batches,
        micro_batch=micro_batch,
        prompt_length=TASK_SCALE["data"]["max_prompt_length"],
        response_length=response_length,
        lr=lr,
        temperature=temperature,
        eval_samples=eval_samples,
        eval_every=eval_every,
        kl_coef=kl_coef,
        reward=[
            "reward.custom_reward_function.path=pkg://maspo_lab.data.synthetic_tts",
            "reward.custom_reward_function.name=compute_score",
        ],
        project="maspo_verl_demo",
        experiment="synthetic_tts",
    )


def method_overrides(method: str | Method, *refinements: str) -> list[str]:
    """The overrides of ``method`` (a built-in name of `maspo_lab.methods` or ``NAME:key=value,...``) as this task
    runs it (`TASK`'s `~maspo_lab.runs.task.Task.method`): the method's own, the task's refinement of it, then
    ``refinements`` (``key=value``, a run's ``--set``)."""
    return list(TASK.method(method, refinements).overrides)


TASK_SCALE = read_scale("tiny")
"""``trainer_config/scale/tiny.yaml``, the home of the run's veRL sizes (the recipes' CPU scale, ``scale=tiny``)."""

TASK_DEFAULTS = {
    **scale_defaults(TASK_SCALE),
    "texts": 16,
    "warm_start_steps": 100,
    "eval_samples": 8,
}
"""The demo's run on the synthetic task, shared with ``maspo-verl ablate`` (their arguments' defaults): steps,
prompts per step, responses per prompt, actor updates per step, learning rate, response budget and sampling
temperature (Llasa-1B's model card samples at 0.8) are `TASK_SCALE`'s; training texts (the warm start's and RL's; 16
held-out texts are the validation file), supervised warm-start steps, and responses per training text in the
evaluation before the first step and after the last are the task's own."""
DEMO_SHAPE: dict = {}
"""The demo runs `TASK_DEFAULTS` as they are (a few minutes on 2 cores)."""


def task_overrides(task, *, steps: int, seed: int, **changes) -> list[str]:
    """veRL overrides of a run on the prepared ``task`` with `TASK_DEFAULTS` (``changes`` replace some); the
    legacy trainer, one micro-batch per mini-batch."""
    settings = {**TASK_DEFAULTS, **changes}
    batch, n, mini_batches = settings["batch"], settings["n"], settings["mini_batches"]
    return [
        *run_overrides(
            task,
            steps=steps,
            batch=batch,
            n=n,
            mini_batches=mini_batches,
            micro_batch=batch * n // mini_batches,
            response_length=settings["response_length"],
            lr=settings["lr"],
            temperature=settings["temperature"],
            seed=seed,
            eval_samples=settings["eval_samples"],
            eval_every=settings.get("eval_every"),
            kl_coef=settings["kl_coef"],
        ),
        f"trainer.use_v1={settings.get('v1', False)}",
    ]


EVAL_PARTS = ("content", "frames", "expected_frames", "end")
"""The reward parts read from veRL's validation of a run with ``eval_samples`` (before the first step, after the
last)."""


def split_evaluations(records: list[dict[str, float]], samples: int) -> tuple[list[dict], list[dict]]:
    """veRL's logged records as (training steps, evaluations): a training step has ``critic/score/mean``; an
    evaluation is a record with validation metrics (step 0 before training; the last step's record holds both),
    its parts renamed ``eval/<part>`` from veRL's ``val-aux/<data source>/<part>/mean@<samples>``."""
    steps = [r for r in records if "critic/score/mean" in r]
    evaluations = []
    for record in records:
        parts = {
            f"eval/{p}": record[k]
            for p in EVAL_PARTS
            if (k := f"val-aux/{synthetic_tts.DATA_SOURCE}/{p}/mean@{samples}") in record
        }
        if parts:
            evaluations.append({"step": record["step"], **parts})
    return steps, evaluations


TIMEOUT_S = 1800
"""Seconds before ``ablate`` stops a run (its ``--timeout`` default), several times what a run of the default shape
takes on 2 cores (docs/evidence.md)."""
DESCRIPTION = "synthetic TTS, tiny Llasa"
"""The task in a plot's title."""
CONTENT = "1 - unit error rate"
VALID = "end tag"
"""What an evaluation's valid rate counts: responses that end with ``<|SPEECH_GENERATION_END|>``."""
EVAL_SETS = {"train": "training texts"}
"""What an evaluation scores: the training texts (`run_overrides`: the held-out ones are not what RL optimises)."""


def add_task_arguments(parser) -> None:
    """A command's options that build the task (`task_settings`)."""
    parser.add_argument("--task-seed", type=int, default=0, help="seed of the task data and the warm start")
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=TASK_DEFAULTS["warm_start_steps"],
        help="supervised steps before RL",
    )


def task_settings(args) -> dict:
    """What builds the task (recorded beside it): the task seed, the warm start and the training texts."""
    return {"task_seed": args.task_seed, "warm_start_steps": args.warm_start_steps, "texts": TASK_DEFAULTS["texts"]}


def build_task(workdir: str | Path, settings: dict, *, reuse: bool = False) -> TaskPaths:
    """`prepare_task` with `task_settings`' ``settings``."""
    return prepare_task(
        workdir,
        warm_start_steps=settings["warm_start_steps"],
        n_train=settings["texts"],
        seed=settings["task_seed"],
        reuse=reuse,
    )


def step_content(record: dict[str, float]) -> float:
    """A training step's content, 1 - unit error rate of its batch (NaN when not logged)."""
    return record.get("reward/content/mean", float("nan"))


def evaluation_figures(records: list[dict[str, float]], samples: int) -> list[dict]:
    """Per evaluation (`split_evaluations`) of the training texts: ``content``, and where logged ``valid`` (the
    end-tag rate), ``frames`` and ``expected_frames``."""
    names = {"eval/content": "content", "eval/end": "valid", "eval/frames": "frames"}
    names["eval/expected_frames"] = "expected_frames"
    return [
        {"step": e["step"], "set": "train", **{name: e[key] for key, name in names.items() if key in e}}
        for e in split_evaluations(records, samples)[1]
        if "eval/content" in e
    ]


TASK = Task(
    name="synthetic",
    model=None,
    defaults=TASK_DEFAULTS,
    demo_shape=DEMO_SHAPE,
    description=DESCRIPTION,
    content=CONTENT,
    valid=VALID,
    timeout_s=TIMEOUT_S,
    eval_sets=EVAL_SETS,
    paths=task_paths,
    add_build_arguments=add_task_arguments,
    build_settings=task_settings,
    build=build_task,
    overrides=task_overrides,
    step_content=step_content,
    evaluation_figures=evaluation_figures,
)
"""The synthetic task as every command reads it (`maspo_lab.runs.tasks.task_named`); its refinements of the
methods: ``maspo_verl/trainer_config/task/synthetic.yaml``; the tiny Llasa each run builds declares no layout."""
