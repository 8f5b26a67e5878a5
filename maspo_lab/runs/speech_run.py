"""veRL's trainer on CPU on the speaking testbed: mini-llasa says fortune sentences, the real speech reward hears them.

The task: the shipped mini-llasa (`maspo_lab.speaking_model.SHIPPED_MODEL`) is trained with RL on sentences it
saw in supervised training (`training_texts`) and evaluated on those and on held-out sentences it never saw
(`heldout_texts`). The reward is the project's speech reward in veRL's reward workers
(``pkg://reward_fns.verl_reward``): the mini codec decodes the codes, Whisper tiny.en transcribes them, and

    score = 1 - tanh(3 * CER)                     CER in characters (``reward_config.error_unit=char``)

(the anchors' error-rate utility). veRL's validation, before the first step and after the last, samples each
evaluation sentence ``eval_samples`` times as the rollout samples; the two sets are two data sources
(`TRAIN_SOURCE`, `HELDOUT_SOURCE`) so their figures stay apart (``val-aux/<source>/...``), and `evaluations`
reads per-sample CERs from veRL's validation dumps to give each evaluation's mean and the spread over its repeated
samples.

`prepare_task` writes the data; `task_overrides` are the veRL overrides of a run (sizes from
``trainer_config/scale/mini.yaml``; the CPU settings from `maspo_lab.runs.cpu_overrides`, added by
`maspo_lab.runs.launch`). `TASK` is the task as every command reads it (`maspo_lab.runs.task.Task`): its shape and
figures, `task_paths`, `add_task_arguments`/`task_settings`/`build_task`, `task_overrides`, `step_content` and
`evaluation_figures` (per evaluation and sentence set, from veRL's logged validation metrics), and its methods as it
runs them (``TASK.method``: its refinements, ``trainer_config/task/speech.yaml``, segmenter thresholds for the mini
codec, in the layout the shipped model's checkpoint declares).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from maspo_base.speech_tokens.text_frontend import reader_of_checkpoint
from maspo_lab.runs import run_shape
from maspo_lab.runs.run_shape import read_scale, scale_defaults
from maspo_lab.runs.task import Task
from maspo_lab.speaking_model import SHIPPED_MODEL

TRAIN_SOURCE = "mini-llasa/train"
HELDOUT_SOURCE = "mini-llasa/heldout"
LANGUAGE = "en"
TIMEOUT_S = 3600
"""Seconds before ``ablate`` stops a run (its ``--timeout`` default): Whisper tiny.en hears every response on the
CPU, 32 per step and 4 per sentence in each evaluation."""
DESCRIPTION = "mini-llasa, speech reward"
"""The task in a plot's title."""
CONTENT = "1 - CER, or 1 - PER under the code ear"
"""Content: 1 - the character error rate clipped to [0, 1] (the reward's ``speech_error_rate``); on training
batches rewarded by the code ear, which hears no audio, 1 - its phoneme error rate (``speech_ear_per``)."""
VALID = "valid"
"""What an evaluation's valid rate counts: responses the reward scored (``speech_valid``: ended with the end tag,
only codes, decoded and heard)."""
EVAL_SETS = {"train": "training sentences", "heldout": "held-out sentences"}
"""What an evaluation scores: the sentences RL trains on, and held-out sentences the model never saw."""
SOURCES = {"train": TRAIN_SOURCE, "heldout": HELDOUT_SOURCE}
"""Each evaluated set's data source (veRL's validation metrics are per data source)."""


@dataclass(frozen=True)
class TaskPaths:
    model: Path
    codec: Path
    train: Path
    val: Path
    ear: Path | None = None
    """The code ear that scores the responses (`RECOGNISERS`' ``ear``); None: Whisper tiny.en hears them."""


def training_texts() -> list[str]:
    """Sentences of the shipped model's supervised training set, in a fixed order."""
    from maspo_lab.speaking_model import SHIPPED

    return [line for line in (SHIPPED / "train_sentences.txt").read_text().splitlines() if line.strip()]


def heldout_texts() -> list[dict]:
    """The shipped held-out sentences (never trained on): ``{"id", "text", "audio", "seconds"}`` each."""
    from maspo_lab.speaking_model import SHIPPED

    path = SHIPPED / "heldout" / "sentences.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


TASK_SCALE = read_scale("mini")
"""``trainer_config/scale/mini.yaml``, the home of the speech run's veRL sizes (the recipe's ``MODEL=mini`` too)."""
LEARNING_SETTING = {"n": 16, "mini_batches": 2, "lr": 1e-4, "kl_coef": 0.1}
"""What the speech task's runs change of `TASK_SCALE`: the setting in which RL made mini-llasa speak better by both
audio ears (docs/learning.md, the code ear's learning run): groups of 16 responses (per-phoneme credit's gradient
is most signal there: the gate), 2 actor updates per rollout batch, lr 1e-4, and a KL term to the shipped model
(``low_var_kl``, coefficient 0.1) that keeps the policy near the model that speaks."""
TASK_DEFAULTS = {
    **scale_defaults(TASK_SCALE),
    **LEARNING_SETTING,
    "texts": len(training_texts()),
    "heldout": len(heldout_texts()),
    "eval_texts": 16,
    "eval_samples": 4,
}
"""The speech run's shape (the demo's and ablate's defaults): `TASK_SCALE`'s sizes with `LEARNING_SETTING`; RL
draws new sentences every step from all the shipped training sentences, and an evaluation samples every shipped
held-out sentence and the first 16 training sentences 4 times each."""
RECOGNISER = "ear"
"""What rewards a speech run's training responses by default (`RECOGNISERS`): the code ear, which reads the codes
without decoding them; Whisper tiny.en and PocketSphinx hear the evaluations."""
DEMO_SHAPES = {
    "ear": {"steps": 8, "texts": 8, "heldout": 8, "eval_samples": 6, "kl_coef": 0.0},
    "audio": {
        "steps": 12,
        "batch": 4,
        "n": 4,
        "mini_batches": 4,
        "lr": 2e-5,
        "kl_coef": 0.0,
        "texts": 8,
        "heldout": 8,
        "eval_samples": 6,
    },
}
"""What the demo changes of `TASK_DEFAULTS` per recogniser, to fit a short run on 2 cores (what it costs:
docs/cpu-trainer.md, docs/benchmarks.md), with 8 training and 8 held-out sentences evaluated 6 times each (a paired
change has 48 responses per set behind it) and no KL term (its reference log-probs would cost 10 s a step). Under
the code ear, which reads a step's responses in a fraction of what Whisper takes, every step has all 8 sentences x
16 responses in 2 mini-batches at lr 1e-4, as the task's runs; under Whisper 4 prompts x 4 responses, 4
mini-batches, lr 2e-5."""
DEMO_SHAPE = DEMO_SHAPES[RECOGNISER]


def rows(
    texts: list[str], source: str, split: str, read: Callable[[str], str] = str, evaluation: bool = False
) -> list[dict]:
    """RLHFDataset rows: Llasa prompt messages for what the model reads (``read``: its text front end, the text as
    written by default), the text as ground truth, English. ``evaluation``: rows of the validation file, which ask
    the reward's second ear to hear them too (``extra_info.second_ear``)."""
    from maspo_base.speech_tokens.llasa_prompt import tts_messages

    return [
        {
            "data_source": source,
            "prompt": tts_messages(read(text)),
            "ability": "tts",
            "reward_model": {"style": "rule", "ground_truth": text},
            "extra_info": {
                "index": i,
                "split": split,
                "text": text,
                "language": LANGUAGE,
                **({"second_ear": True} if evaluation else {}),
            },
        }
        for i, text in enumerate(texts)
    ]


def task_paths(workdir: str | Path, model: str | Path | None = None, codec: str | Path | None = None) -> TaskPaths:
    """Where `prepare_task` puts the data under ``workdir`` (nothing is written); ``model``/``codec``: the shipped
    ones by default."""
    from maspo_lab.speaking_model import SHIPPED_CODEC

    data = Path(workdir) / "data"
    return TaskPaths(
        Path(model or SHIPPED_MODEL), Path(codec or SHIPPED_CODEC), data / "train.parquet", data / "val.parquet"
    )


def check_counts(n_train: int, n_heldout: int, n_eval_train: int = 1) -> None:
    """``ValueError`` unless ``n_train`` training and ``n_heldout`` held-out sentences are shipped and
    ``n_eval_train`` >= 1."""
    available = (len(training_texts()), len(heldout_texts()))
    if not 1 <= n_train <= available[0] or not 0 <= n_heldout <= available[1]:
        raise ValueError(
            f"n_train={n_train} must be in [1, {available[0]}] and n_heldout={n_heldout} in [0, {available[1]}] "
            "(the shipped sentences)"
        )
    if n_eval_train < 1:
        raise ValueError(f"n_eval_train={n_eval_train} must be >= 1 (training sentences evaluated)")


def evaluated_training_texts(n_train: int, n_eval_train: int) -> list[str]:
    """The training sentences an evaluation scores: the first ``min(n_train, n_eval_train)`` of RL's."""
    return training_texts()[: min(n_train, n_eval_train)]


def prepare_task(
    workdir: str | Path,
    *,
    n_train: int = TASK_DEFAULTS["texts"],
    n_heldout: int = TASK_DEFAULTS["heldout"],
    model: str | Path | None = None,
    codec: str | Path | None = None,
    reuse: bool = False,
    n_eval_train: int = TASK_DEFAULTS["eval_texts"],
) -> TaskPaths:
    """Write ``train.parquet`` (the first ``n_train`` training sentences) and ``val.parquet`` (the first
    ``n_eval_train`` of those, `evaluated_training_texts`, and the first ``n_heldout`` held-out ones, two data
    sources, each row asking for the second ear) under ``workdir/data``. ``model``/``codec``: the shipped ones by
    default. ``reuse``: keep the files an earlier call wrote (written again where missing)."""
    import pandas as pd

    paths = task_paths(workdir, model, codec)
    if reuse and paths.train.exists() and paths.val.exists():
        return paths
    check_counts(n_train, n_heldout, n_eval_train)
    held = [h["text"] for h in heldout_texts()]
    read = reader_of_checkpoint(paths.model)
    paths.train.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows(training_texts()[:n_train], TRAIN_SOURCE, "train", read)).to_parquet(paths.train)
    evaluated = rows(evaluated_training_texts(n_train, n_eval_train), TRAIN_SOURCE, "train", read, evaluation=True)
    held_rows = rows(held[:n_heldout], HELDOUT_SOURCE, "heldout", read, evaluation=True)
    pd.DataFrame(evaluated + held_rows).to_parquet(paths.val)
    return paths


def add_task_arguments(parser) -> None:
    """A command's options that build the task (`task_settings`)."""
    parser.add_argument(
        "--texts", type=int, default=TASK_DEFAULTS["texts"], help="training sentences of RL (the first N shipped)"
    )
    parser.add_argument(
        "--heldout", type=int, default=TASK_DEFAULTS["heldout"], help="held-out sentences evaluated (the first N)"
    )
    parser.add_argument(
        "--eval-texts",
        type=int,
        default=TASK_DEFAULTS["eval_texts"],
        help="training sentences evaluated (the first N of --texts)",
    )
    parser.add_argument(
        "--recogniser",
        choices=RECOGNISERS,
        default=RECOGNISER,
        help="what hears the responses for the reward: ear (the shipped code ear reads the codes; the default) or "
        "audio (decoded, Whisper tiny.en); evaluations are heard by Whisper and PocketSphinx either way",
    )


def task_settings(args) -> dict:
    """What builds the task (recorded beside it): the numbers of training, evaluated training and held-out
    sentences (checked: ``ValueError`` beyond the shipped ones), and the recogniser when it is the ear."""
    check_counts(args.texts, args.heldout, args.eval_texts)
    settings = {"texts": args.texts, "heldout": args.heldout, "eval_texts": args.eval_texts}
    if getattr(args, "recogniser", "audio") == "ear":
        settings["recogniser"] = "ear"
    return settings


def build_task(workdir: str | Path, settings: dict, *, reuse: bool = False) -> TaskPaths:
    """`prepare_task` with `task_settings`' ``settings``, the shipped model and codec (and ear)."""
    paths = prepare_task(
        workdir,
        n_train=settings["texts"],
        n_heldout=settings["heldout"],
        n_eval_train=settings.get("eval_texts", settings["texts"]),
        reuse=reuse,
    )
    return heard_by(paths, settings.get("recogniser", "audio"))


def heard_by(paths: TaskPaths, recogniser: str) -> TaskPaths:
    """``paths`` with the shipped code ear when ``recogniser`` (`RECOGNISERS`) is the ear; unchanged otherwise."""
    from maspo_lab.speaking_model import SHIPPED_EAR

    return dataclasses.replace(paths, ear=SHIPPED_EAR) if recogniser == "ear" else paths


RECOGNISERS = ("audio", "ear")
"""What hears a training response for its reward (``reward_config.recogniser``, `reward_fns.reward`)."""

SECOND_EAR = "pocketsphinx"
"""The recogniser evaluations are heard by beside the reward's Whisper tiny.en, never used in training
(`reward_fns.asr.PocketSphinxBackend`): a gain it does not share is Whisper's alone."""


def reward_overrides(codec: str | Path, ear: str | Path | None = None) -> list[str]:
    """The speech reward of a run of this task on veRL's own config (`task_overrides`): veRL's reward function block
    pointing at it, with the testbed's settings (`reward_settings_overrides`)."""
    return [
        "reward.custom_reward_function.path=pkg://reward_fns.verl_reward",
        "reward.custom_reward_function.name=compute_score",
        *reward_settings_overrides(codec, ear),
    ]


def reward_settings(codec: str | Path, ear: str | Path | None = None) -> dict:
    """The testbed's speech reward, its one definition (``reward_kwargs``: `reward_fns.reward_settings.ModelSettings`
    fields), scored in process (the default backend): the mini codec, Whisper tiny.en, CER in characters; evaluation
    rows are heard by the second ear too (`SECOND_EAR`). With ``ear`` the code ear scores every response from its
    codes (``reward_config.recogniser=ear``) and Whisper only hears the evaluation rows. The runs add it as
    `reward_settings_overrides`; the measurements that score as the testbed does build it in process
    (`maspo_lab.analysis.fidelity_scoring.speech_task_reward`, `maspo_lab.analysis.ear_check`)."""
    from maspo_lab.speaking_model.hearing import whisper_tiny_en

    settings = {
        "codec": f"mel_fsq:{codec}",
        "asr": {LANGUAGE: f"faster_whisper:{whisper_tiny_en()}"},
        "second_asr": {LANGUAGE: SECOND_EAR},
        "default_language": LANGUAGE,
        "reward_config": {"error_unit": "char"},
    }
    if ear is not None:
        settings["ear"] = str(ear)
        settings["reward_config"]["recogniser"] = "ear"
    return settings


def reward_settings_overrides(codec: str | Path, ear: str | Path | None = None) -> list[str]:
    """`reward_settings` as the ``reward_kwargs`` the runs of `task_overrides` and the recipe's ``MODEL=mini``
    (`recipe_overrides`) add. Its threads are the run's (``OMP_NUM_THREADS``,
    `maspo_lab.runs.cpu_overrides.cpu_environment`)."""

    def dotted(key: str, value) -> list[str]:
        if isinstance(value, dict):
            return [item for name, inner in value.items() for item in dotted(f"{key}.{name}", inner)]
        return [f"{key}={value}"]

    return dotted("+reward.custom_reward_function.reward_kwargs", reward_settings(codec, ear))


def task_overrides(
    task: TaskPaths,
    *,
    steps: int,
    seed: int,
    eval_samples: int = TASK_DEFAULTS["eval_samples"],
    eval_every: int | None = None,
    **changes,
) -> list[str]:
    """veRL overrides of a GRPO run on the prepared ``task`` with `TASK_DEFAULTS` (``changes`` replace some):
    the legacy trainer, one micro-batch per mini-batch, an evaluation before the first step, after the last and
    every ``eval_every`` steps; the method's overrides go after these."""
    from maspo_lab.runs.run_shape import grpo_overrides

    s = {**TASK_DEFAULTS, **changes}
    return grpo_overrides(
        train=task.train,
        validation=task.val,
        model=task.model,
        steps=steps,
        seed=seed,
        batch=s["batch"],
        n=s["n"],
        mini_batches=s["mini_batches"],
        micro_batch=s["batch"] * s["n"] // s["mini_batches"],
        prompt_length=TASK_SCALE["data"]["max_prompt_length"],
        response_length=s["response_length"],
        lr=s["lr"],
        temperature=s["temperature"],
        eval_samples=eval_samples,
        eval_every=eval_every,
        kl_coef=s["kl_coef"],
        reward=reward_overrides(task.codec, task.ear),
        project=TASK_SCALE["trainer"]["project_name"],
        experiment="speech",
        v1=s.get("v1", False),
    )


def evaluated_sources(task: TaskPaths) -> dict[str, str]:
    """Each evaluated sentence of ``task`` (its ``val.parquet``) -> its data source (`SOURCES`)."""
    import pandas as pd

    frame = pd.read_parquet(task.val, columns=["data_source", "reward_model"])
    return {row["ground_truth"]: source for source, row in zip(frame["data_source"], frame["reward_model"])}


def evaluations(validation_dir: str | Path, sources: dict[str, str], key: str = "speech_error_rate_raw") -> list[dict]:
    """Per evaluation (veRL's ``<validation_dir>/<step>.jsonl``) and data source (``sources``: sentence -> source;
    veRL's dump keeps the ground truth, not the source): the mean of ``key`` over the samples, the spread (std) of the
    per-repeat means (repeat r: the r-th sample of every sentence), the numbers of sentences and repeats, and the
    per-sentence means (for paired comparisons); sorted by step, then source."""
    out = []
    for path in sorted(Path(validation_dir).glob("*.jsonl"), key=lambda p: int(p.stem)):
        by_source: dict[str, dict[str, list[float]]] = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            source = sources.get(record["gts"], "unknown")
            by_source.setdefault(source, {}).setdefault(record["gts"], []).append(float(record[key]))
        for source, per_text in sorted(by_source.items()):
            repeats = min(map(len, per_text.values()))
            replicate = [statistics.fmean(v[r] for v in per_text.values()) for r in range(repeats)]
            out.append(
                {
                    "step": int(path.stem),
                    "source": source,
                    "mean": statistics.fmean(x for v in per_text.values() for x in v),
                    "spread": _spread(replicate),
                    "sentences": len(per_text),
                    "repeats": repeats,
                    "per_sentence": {t: statistics.fmean(v) for t, v in per_text.items()},
                }
            )
    return out


def _spread(values: list[float]) -> float:
    """The standard deviation of ``values`` (0 for one; NaN where one is NaN, which `statistics.stdev` refuses)."""
    if len(values) < 2:
        return 0.0
    return statistics.stdev(values) if all(math.isfinite(v) for v in values) else math.nan


def step_content(record: dict[str, float]) -> float:
    """A training step's content: 1 - its batch's mean clipped CER, or 1 - its mean clipped PER where the code ear is
    the reward and no training response is heard as audio (NaN when neither is logged)."""
    cer = record.get("reward/speech_error_rate/mean", math.nan)
    return 1.0 - (cer if math.isfinite(cer) else record.get("reward/speech_ear_per/mean", math.nan))


EVAL_METRICS = {
    "content": "speech_error_rate",
    "valid": "speech_valid",
    "cer": "speech_error_rate_raw",
    "score": "reward",
}
"""Per figure of `evaluation_figures`, the reward key whose mean veRL logs per data source in validation (``reward``:
veRL's own name for the score)."""


def evaluation_figures(records: list[dict[str, float]], samples: int) -> list[dict]:
    """Per evaluation (a logged record with validation metrics: step 0 before training, the last step after) and
    evaluated set (`EVAL_SETS`, `SOURCES`), from veRL's ``val-{aux,core}/<data source>/<key>/mean@<samples>``:
    ``content`` (1 - the mean clipped CER), ``valid`` (the share of responses scored), ``cer`` (the mean raw CER)
    and ``score``; a figure veRL did not log is left out, a set with no content is skipped."""
    out = []
    for record in records:
        for name, source in SOURCES.items():
            found = {}
            for figure, key in EVAL_METRICS.items():
                for section in ("val-aux", "val-core"):
                    value = record.get(f"{section}/{source}/{key}/mean@{samples}")
                    if value is not None:
                        found[figure] = 1.0 - value if figure == "content" else value
            if "content" in found:
                out.append({"step": int(record["step"]), "set": name, **found})
    return out


def recipe_overrides(workdir: str | Path, method: str) -> list[str]:
    """What ``recipes/llasa_1b/run.sh`` adds with ``MODEL=mini`` (the recipe on the speaking testbed, on a CPU):
    the task's sizes (``scale=mini``), its data (the demo's sentences, `DEMO_SHAPE`; written under ``workdir``
    once), the shipped model (whose checkpoint gives the layout), the task's refinement of ``method``, and the
    testbed's speech reward in process (``speech_reward=in_process`` with `reward_settings_overrides`: a later
    ``speech_reward=...`` choice on the command line wins; the driver refuses keys of another backend)."""
    from maspo_lab.methods import task_refinement_overrides

    paths = prepare_task(workdir, n_train=DEMO_SHAPE["texts"], n_heldout=DEMO_SHAPE["heldout"], reuse=True)
    return [
        *run_shape.recipe_overrides("mini", paths.train, paths.val, paths.model),
        *task_refinement_overrides(method, TASK.name),
        "speech_reward=in_process",
        *reward_settings_overrides(paths.codec),
    ]


TASK = Task(
    name="speech",
    model=SHIPPED_MODEL,
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
"""The speech task as every command reads it (`maspo_lab.runs.tasks.task_named`): the shipped mini-llasa, whose
checkpoint declares the layout its methods read; its refinements of the methods: ``trainer_config/task/speech.yaml``."""
