"""What the fidelity measurement samples and scores: the task's prompts (`load_prompts`), its scorers (the synthetic
task's reward on decoded text, `SyntheticScorer`; the speech reward in process, `SpeechTaskScorer`, built as every
measurement builds the testbed's reward, `speech_task_reward`) and `ScoreMeter`, which times every scoring call and
prints the time left.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from maspo_lab.data import synthetic_tts


@dataclass
class Prompt:
    """A prompt of the measurement: its token ids and what the reward needs."""

    ids: list[int]
    data_source: str
    ground_truth: str


def load_prompts(data: str | Path, tokenizer, sources: Sequence[str] = (synthetic_tts.DATA_SOURCE,)) -> list[Prompt]:
    """The rows of a veRL parquet (``prompt`` messages, ``data_source``, ``reward_model.ground_truth``), rendered as
    veRL's agent loop renders them with Llasa's chat template; only rows of the task's ``sources`` (its
    `Scorer`'s) can be scored here."""
    import pandas as pd

    from maspo_base.speech_tokens.llasa_prompt import SPEECH_CHAT_TEMPLATE

    frame = pd.read_parquet(data)
    missing = sorted({"prompt", "data_source", "reward_model"} - set(frame.columns))
    if missing:
        raise ValueError(f"--data {data}: no column(s) {missing} (write it with `maspo-verl prepare-data`)")
    prompts = []
    for row in frame.itertuples():
        if row.data_source not in sources:
            raise ValueError(
                f"--data {data}: data_source {row.data_source!r}; this task's reward scores "
                f"{', '.join(map(repr, sources))} rows only"
            )
        messages = [dict(m) for m in row.prompt]
        continues = messages[-1]["role"] == "assistant"
        ids = tokenizer.apply_chat_template(
            messages,
            chat_template=SPEECH_CHAT_TEMPLATE,
            add_generation_prompt=not continues,
            continue_final_message=continues,
            tokenize=True,
        )
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        prompts.append(Prompt(ids, row.data_source, str(row.reward_model["ground_truth"])))
    if not prompts:
        raise ValueError(f"--data {data}: no rows")
    return prompts


class SyntheticScorer:
    """The synthetic task's reward (`maspo_lab.data.synthetic_tts.compute_score`) on veRL's decoded text."""

    sources = (synthetic_tts.DATA_SOURCE,)

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def score(self, prompts: Sequence[Prompt], responses: Sequence[list[int]]) -> list[float]:
        return [
            synthetic_tts.compute_score(
                prompt.data_source, self.tokenizer.decode(response, skip_special_tokens=True), prompt.ground_truth
            )["score"]
            for prompt, response in zip(prompts, responses, strict=True)
        ]


def speech_task_reward(
    codec: str | Path,
    layout: str,
    *,
    ear: str | Path | None = None,
    second_ear: bool = False,
    reward_config: dict | None = None,
    **settings,
):
    """The speech task's reward in this process for a measurement (`reward_fns.pipeline.SpeechReward`): the testbed's
    (`maspo_lab.runs.speech_run.reward_settings`, its one definition; ``ear``: scored by the code ear) with the
    measurement's changes applied to it: the second ear only with ``second_ear`` (for requests that ask for it; else
    it is not loaded), ``reward_config`` entries over the testbed's, the checkpoint's ``layout`` and ``settings``
    (`reward_fns.reward_settings.ModelSettings` fields: threads, device, a likelihood model)."""
    from maspo_lab.runs import speech_run
    from reward_fns.pipeline import SpeechReward

    values = speech_run.reward_settings(codec, ear)
    if not second_ear:
        del values["second_asr"]
    values["reward_config"].update(reward_config or {})
    return SpeechReward.from_spec(**values, layout=layout, **settings)


class SpeechTaskScorer:
    """The speech task's reward in process (`reward_fns.pipeline.SpeechReward`, as veRL's reward workers run it for
    `maspo_lab.runs.speech_run`): a whole batch per call (``score_batch``), the responses' token ids read with the
    task's layout, decoded by the mini codec, heard by Whisper tiny.en, ``score = 1 - tanh(3 CER)``."""

    def __init__(self, reward, language: str = "en", sources: Sequence[str] = ()) -> None:
        self.reward, self.language = reward, language
        self.sources = tuple(sources)

    @classmethod
    def load(cls, codec: str | Path, *, threads: int | None = None, device: str = "cpu") -> SpeechTaskScorer:
        """The reward of `maspo_lab.runs.speech_run` (`speech_task_reward`) with the codec checkpoint ``codec`` (the
        mini codec) in the task's layout, on ``device`` with ``threads`` CPU threads."""
        from maspo_lab.runs import speech_run

        reward = speech_task_reward(codec, speech_run.TASK.model_layout(), num_threads=threads, device=device)
        return cls(reward, speech_run.LANGUAGE, tuple(speech_run.SOURCES.values()))

    def score(self, prompts: Sequence[Prompt], responses: Sequence[list[int]]) -> list[float]:
        requests = [
            {"ground_truth": prompt.ground_truth, "token_ids": list(response), "language": self.language}
            for prompt, response in zip(prompts, responses, strict=True)
        ]
        return [float(result["score"]) for result in self.reward.score_batch(requests)]


class ScoreMeter:
    """Scores responses through a scorer (``score(prompts, responses) -> scores``) ``chunk`` at a time, timing every
    call: its totals give the seconds per scored response, and with the ``planned`` number of responses of the
    measurement, the time left (reported through ``progress`` after each call of a batch larger than ``chunk``)."""

    def __init__(self, scorer, chunk: int = 64, planned: int = 0, progress: Callable[[str], None] | None = None):
        self.scorer, self.chunk, self.planned, self.progress = scorer, chunk, planned, progress
        self.responses, self.seconds = 0, 0.0
        self.start = time.monotonic()

    @property
    def seconds_per_response(self) -> float:
        return self.seconds / self.responses if self.responses else float("nan")

    def eta_seconds(self) -> float:
        """Wall time left if the rest goes as fast as what was done (every part of a repeat grows with the
        responses it scores); NaN before the first call."""
        if not self.responses or not self.planned:
            return float("nan")
        elapsed = time.monotonic() - self.start
        return elapsed * max(self.planned - self.responses, 0) / self.responses

    def status(self) -> str:
        eta = self.eta_seconds()
        left = f", ~{eta / 60:.1f} min left" if math.isfinite(eta) else ""
        planned = f"/{self.planned}" if self.planned else ""
        return f"scored {self.responses}{planned} ({self.seconds_per_response:.3g} s each){left}"

    def __call__(self, prompts: Sequence[Prompt], responses: Sequence[list[int]], what: str = "") -> list[float]:
        scores: list[float] = []
        for start in range(0, len(responses), self.chunk):
            began = time.monotonic()
            scores += self.scorer.score(prompts[start : start + self.chunk], responses[start : start + self.chunk])
            self.seconds += time.monotonic() - began
            self.responses += len(responses[start : start + self.chunk])
            if self.progress is not None and len(responses) > self.chunk:
                done = min(start + self.chunk, len(responses))
                self.progress(f"    {what} {done}/{len(responses)}: {self.status()}")
        return scores
