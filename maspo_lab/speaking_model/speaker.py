"""Saying sentences with a checkpoint: Llasa's prompt, sampled generation, the response parsed by its layout.

`generate_hf` and `generate_vllm` say prompts with a checkpoint's folder (``maspo-verl eval``'s generation);
`Speaker` loads any checkpoint that speaks in Llasa's format, the shipped mini-llasa or Llasa-1B itself (a local
folder or a hub id), reads its speech-token layout (`maspo_lab.speaking_model.model.layout_of_checkpoint`) and
samples with the lab's sampler (`maspo_lab.sampler.Sampler`): temperature (Llasa's model card: 0.8),
top-p 1, no top-k, until the checkpoint's stop ids (``<|SPEECH_GENERATION_END|>``, its own end of turn) or
``max_seconds`` of codes. A response that does not end with the end tag, or holds anything but codes, yields no
codes (the reward's gate would score it so too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from maspo_base.llasa_response import GateConfig, parse_token_ids
from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
from maspo_base.typed_settings import InvalidSetting


@dataclass
class Sampling:
    """How ``maspo-verl eval`` samples (Llasa's model card: temperature 0.8); its flags are these fields
    (`maspo_base.typed_settings.add_arguments`)."""

    temperature: float = field(default=0.8, metadata={"help": "sampling temperature, > 0"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling: the smallest set of ids with this mass"})
    max_new_tokens: int = field(default=1500, metadata={"help": "longest response, in tokens"})
    seed: int = field(default=0, metadata={"help": "each response's stream is keyed by this seed and its prompt"})

    def validate(self) -> None:
        if not self.temperature > 0:
            raise InvalidSetting("temperature", f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidSetting("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise InvalidSetting("max_new_tokens", f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def generate_hf(
    model_dir: Path,
    tokenizer,
    prompts: Sequence[list[int]],
    sampling: Sampling,
    device: str,
    batch_size: int = 8,
    progress: Callable[[str], None] | None = None,
) -> list[list[int]]:
    """Response ids with the lab's sampler (`maspo_lab.sampler.Sampler`: each response from its own
    stream keyed by ``sampling.seed`` and its prompt, stopping at the checkpoint's stop ids), ``batch_size`` prompts
    per batch."""
    from maspo_lab.sampler import Sampler, load_model

    model, _ = load_model(model_dir, "float32", device)
    model.eval()
    sampler = Sampler(
        model, tokenizer, sampling.seed, sampling.temperature, sampling.max_new_tokens, top_p=sampling.top_p
    )
    return sampler.sample(list(prompts), version=0, batch_size=batch_size, progress=progress)


def generate_vllm(model_dir: Path, prompts: Sequence[list[int]], sampling: Sampling) -> list[list[int]]:
    """Response ids with vLLM (GPU), the checkpoint's stop ids passed explicitly, one seed per prompt."""
    from vllm import LLM, SamplingParams

    from maspo_base.speech_tokens.llasa_generation import checkpoint_stop_ids

    eos = checkpoint_stop_ids(model_dir)
    llm = LLM(model=str(model_dir), seed=sampling.seed)
    params = [
        SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=eos,
            seed=sampling.seed + i,
        )
        for i in range(len(prompts))
    ]
    results = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    del llm
    return [list(r.outputs[0].token_ids) for r in results]


class Speaker:
    """A checkpoint ready to say texts (module docstring)."""

    def __init__(self, checkpoint: str | Path, device: str = "cpu", threads: int | None = None) -> None:
        from maspo_lab.sampler import load_model
        from maspo_lab.speaking_model.model import layout_of_checkpoint

        if threads:
            torch.set_num_threads(threads)
        self.checkpoint = str(checkpoint)
        self.model, self.tokenizer = load_model(self.checkpoint, "float32", device)
        self.model.eval()
        self.layout = layout_of_checkpoint(self.checkpoint, self.tokenizer)

    @torch.inference_mode()
    def codes(
        self,
        texts: Sequence[str],
        temperature: float = 0.8,
        seed: int = 0,
        batch: int = 16,
        max_seconds: float = 8.0,
        speaker: str | None = None,
    ) -> list[np.ndarray]:
        """Codec ids said for each text (empty where the response is not well formed), each response drawn from its
        own stream keyed by ``seed`` and its text (`maspo_lab.sampler.Sampler`; ``batch`` texts at a time,
        which does not change what is said); ``speaker``: another voice of a checkpoint of several."""
        from maspo_lab.sampler import Sampler

        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (sampled speech), got {temperature}")
        prompts = [render_prompt_ids(self.tokenizer, text, speaker=speaker) for text in texts]
        budget = int(max_seconds * self.layout.frame_rate) + 1
        sampler = Sampler(self.model, self.tokenizer, seed, temperature, budget)
        responses = sampler.sample(prompts, version=0, batch_size=batch)
        gate = GateConfig(max_codes=None)
        parsed = [parse_token_ids(response, self.layout, config=gate) for response in responses]
        return [p.codes if p.ok else np.zeros(0, dtype=np.int64) for p in parsed]
