"""Speaking with a ``transformers`` checkpoint outside a training run: the one sampler of the lab.

`Sampler` holds a model and how to sample from it, and draws each response with the ``hf`` rollout's own batched
generation (`maspo_verl.cpu.generation.generate_responses`) from its own stream (`RequestStreams`, keyed by a seed
and the weights' version as the served rollout keys them), stopping at the checkpoint's stop ids
(`maspo_base.speech_tokens.llasa_generation.stop_ids`). Every speaker of the lab samples through it
(``maspo-verl eval`` on ``transformers`` and `maspo_lab.speaking_model.speaker.Speaker`, the fidelity
measurement, ``maspo-verl segments``, the reference cost, the rollout mismatch, ``scripts/length_preference.py``),
so all of them stop a model at the same token and draw what the served rollout draws for the same seed, weights'
version and prompts. `load_model` reads a checkpoint for it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import torch

from maspo_base.speech_tokens.llasa_generation import stop_ids
from maspo_verl.cpu.generation import SamplingKey, generate_responses, pad_id
from maspo_verl.cpu.sampling_streams import RequestStreams


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    """``(model, tokenizer)`` of the checkpoint at ``path``, the model in ``dtype`` on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device)
    return model, tokenizer


class Sampler:
    """``model``'s responses by `generate_responses`, each drawn from its own stream (`RequestStreams` keyed by
    ``seed`` and the weights' ``version``) and stopping at the checkpoint's stop ids (`stop_ids` of ``tokenizer``
    and the model's generation config); ``temperature == 0`` is greedy (top-p and top-k off, as `SamplingKey`
    says)."""

    def __init__(
        self,
        model,
        tokenizer,
        seed: int,
        temperature: float,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> None:
        self.model = model
        self.stop_ids = stop_ids(tokenizer, model.generation_config)
        self.pad_id = pad_id(model.generation_config, self.stop_ids)
        sampled = temperature > 0
        self.key = SamplingKey(temperature, top_p if sampled else 1.0, top_k if sampled else 0, 1.0, max_new_tokens)
        self.seed = seed

    def with_model(self, model) -> Sampler:
        """The same sampling from ``model``, weights of the same checkpoint (a policy trained from it): same stop
        ids, padding and streams."""
        other = copy.copy(self)
        other.model = model
        return other

    def sample(
        self,
        prompts: list[list[int]],
        version: int,
        log_probs: bool = False,
        batch_size: int | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> list:
        """One response per prompt; ``version`` keys the streams (as the served weights' version does), so the
        responses do not depend on ``batch_size`` (prompts per `generate_responses` call; default all).
        ``log_probs``: ``(ids, log-probs at the temperature)`` per response instead of the ids."""
        streams = RequestStreams(self.seed, version)
        keys = [streams.next(p) for p in prompts]
        step = batch_size or max(1, len(prompts))
        responses = []
        for start in range(0, len(prompts), step):
            responses += generate_responses(
                self.model,
                prompts[start : start + step],
                self.key,
                keys[start : start + step],
                self.stop_ids,
                self.pad_id,
            )
            if progress is not None:
                progress(f"  generated {len(responses)}/{len(prompts)}")
        return responses if log_probs else [ids for ids, _ in responses]
