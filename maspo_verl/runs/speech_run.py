"""veRL's trainer on CPU on the speaking testbed: mini-llasa says fortune sentences, the real speech reward hears them.

The task: the shipped mini-llasa (`maspo_verl.speaking_model.SHIPPED_MODEL`) is trained with RL on sentences it
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
``trainer_config/scale/mini.yaml``; the CPU settings from `maspo_verl.runs.cpu_overrides`, added by
`maspo_verl.runs.launch`); `TASK` names the methods' refinements for this task (``trainer_config/task/speech.yaml``:
mini-llasa's layout for the segmenters and credit).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

TASK = "speech"
TRAIN_SOURCE = "mini-llasa/train"
HELDOUT_SOURCE = "mini-llasa/heldout"
LANGUAGE = "en"


def _scale() -> dict:
    import yaml

    return yaml.safe_load((files("maspo_verl.trainer_config") / "scale" / "mini.yaml").read_text())


TASK_SCALE = _scale()
_data, _actor, _rollout = (
    TASK_SCALE["data"],
    TASK_SCALE["actor_rollout_ref"]["actor"],
    TASK_SCALE["actor_rollout_ref"]["rollout"],
)
TASK_DEFAULTS = {
    "steps": TASK_SCALE["trainer"]["total_training_steps"],
    "batch": _data["train_batch_size"],
    "n": _rollout["n"],
    "mini_batches": _data["train_batch_size"] // _actor["ppo_mini_batch_size"],
    "lr": _actor["optim"]["lr"],
    "texts": 16,
    "heldout": 16,
    "response_length": _data["max_response_length"],
    "temperature": _rollout["temperature"],
    "eval_samples": 4,
}
"""The speech run's shape (the demo's and ablate's defaults): `TASK_SCALE`'s sizes; training sentences, held-out
sentences and samples per evaluation sentence are the task's own."""


@dataclass(frozen=True)
class TaskPaths:
    model: Path
    codec: Path
    train: Path
    val: Path


def training_texts() -> list[str]:
    """Sentences of the shipped model's supervised training set, in a fixed order."""
    from maspo_verl.speaking_model import SHIPPED

    return [line for line in (SHIPPED / "train_sentences.txt").read_text().splitlines() if line.strip()]


def heldout_texts() -> list[dict]:
    """The shipped held-out sentences (never trained on): ``{"id", "text", "audio", "seconds"}`` each."""
    from maspo_verl.speaking_model import SHIPPED

    path = SHIPPED / "heldout" / "sentences.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rows(texts: list[str], source: str, split: str) -> list[dict]:
    """RLHFDataset rows: Llasa prompt messages, the text as ground truth, English."""
    from reward_fns.speech_tokens.llasa_prompt import tts_messages

    return [
        {
            "data_source": source,
            "prompt": tts_messages(text),
            "ability": "tts",
            "reward_model": {"style": "rule", "ground_truth": text},
            "extra_info": {"index": i, "split": split, "text": text, "language": LANGUAGE},
        }
        for i, text in enumerate(texts)
    ]


def prepare_task(
    workdir: str | Path,
    *,
    n_train: int = TASK_DEFAULTS["texts"],
    n_heldout: int = TASK_DEFAULTS["heldout"],
    model: str | Path | None = None,
    codec: str | Path | None = None,
) -> TaskPaths:
    """Write ``train.parquet`` (the first ``n_train`` training sentences) and ``val.parquet`` (the same sentences
    and the first ``n_heldout`` held-out ones, two data sources) under ``workdir/data``. ``model``/``codec``: the
    shipped ones by default."""
    import pandas as pd

    from maspo_verl.speaking_model import SHIPPED_CODEC, SHIPPED_MODEL

    train_texts, held = training_texts(), [h["text"] for h in heldout_texts()]
    if not 1 <= n_train <= len(train_texts) or not 0 <= n_heldout <= len(held):
        raise ValueError(
            f"n_train={n_train} must be in [1, {len(train_texts)}] and n_heldout={n_heldout} in [0, {len(held)}]"
        )
    data = Path(workdir) / "data"
    data.mkdir(parents=True, exist_ok=True)
    train, val = data / "train.parquet", data / "val.parquet"
    pd.DataFrame(rows(train_texts[:n_train], TRAIN_SOURCE, "train")).to_parquet(train)
    evaluation = rows(train_texts[:n_train], TRAIN_SOURCE, "train") + rows(held[:n_heldout], HELDOUT_SOURCE, "heldout")
    pd.DataFrame(evaluation).to_parquet(val)
    return TaskPaths(Path(model or SHIPPED_MODEL), Path(codec or SHIPPED_CODEC), train, val)


def reward_overrides(codec: str | Path, threads: int = 1) -> list[str]:
    """The speech reward in veRL's reward workers: the mini codec, Whisper tiny.en, CER in characters."""
    from maspo_verl.speaking_model.hearing import whisper_tiny_en

    kw = "+reward.custom_reward_function.reward_kwargs"
    return [
        "reward.custom_reward_function.path=pkg://reward_fns.verl_reward",
        "reward.custom_reward_function.name=compute_score",
        f"{kw}.codec=mel_fsq:{codec}",
        f"{kw}.asr.{LANGUAGE}=faster_whisper:{whisper_tiny_en()}",
        f"{kw}.default_language={LANGUAGE}",
        f"{kw}.num_threads={threads}",
        f"{kw}.reward_config.error_unit=char",
    ]


def task_overrides(
    task: TaskPaths,
    *,
    steps: int,
    seed: int,
    eval_samples: int = TASK_DEFAULTS["eval_samples"],
    **changes,
) -> list[str]:
    """veRL overrides of a GRPO run on the prepared ``task`` with `TASK_DEFAULTS` (``changes`` replace some):
    the legacy trainer, one micro-batch per mini-batch; the method's overrides go after these."""
    from reward_fns.speech_tokens.llasa_prompt import speech_template_override

    s = {**TASK_DEFAULTS, **changes}
    batch, n, mini_batches = s["batch"], s["n"], s["mini_batches"]
    if batch % mini_batches:
        raise ValueError(f"batch={batch} prompts do not split into mini_batches={mini_batches}")
    if eval_samples < 0:
        raise ValueError(f"eval_samples={eval_samples} must be >= 0 (0: no evaluation)")
    temperature = s["temperature"]
    validation = [
        f"data.val_files={task.val}",
        "trainer.val_before_train=True",
        f"trainer.test_freq={steps}",
        f"actor_rollout_ref.rollout.val_kwargs.n={eval_samples}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        f"actor_rollout_ref.rollout.val_kwargs.temperature={temperature}",
        "actor_rollout_ref.rollout.val_kwargs.top_p=1.0",
        "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
    ]
    no_validation = [f"data.val_files={task.val}", "trainer.val_before_train=False", "trainer.test_freq=-1"]
    micro_batch = batch * n // mini_batches
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={task.train}",
        *(validation if eval_samples else no_validation),
        f"data.train_batch_size={batch}",
        f"data.max_prompt_length={_data['max_prompt_length']}",
        f"data.max_response_length={s['response_length']}",
        f"data.seed={seed}",
        f"actor_rollout_ref.model.path={task.model}",
        speech_template_override(),
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.rollout.temperature={temperature}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch // mini_batches}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_batch}",
        f"actor_rollout_ref.actor.optim.lr={s['lr']}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        *reward_overrides(task.codec),
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        f"trainer.project_name={TASK_SCALE['trainer']['project_name']}",
        "trainer.experiment_name=speech",
        f"trainer.use_v1={s.get('v1', False)}",
    ]


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
                    "spread": statistics.stdev(replicate) if len(replicate) > 1 else 0.0,
                    "sentences": len(per_text),
                    "repeats": repeats,
                    "per_sentence": {t: statistics.fmean(v) for t, v in per_text.items()},
                }
            )
    return out
