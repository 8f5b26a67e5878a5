"""Saying sentences with a checkpoint: Llasa's prompt, sampled generation, the response parsed by its layout.

`Speaker` loads any checkpoint that speaks in Llasa's format, the shipped mini-llasa or Llasa-1B itself (a local
folder or a hub id), reads its speech-token layout (`maspo_verl.speaking_model.model.layout_of_checkpoint`) and
samples with the rollout's sampler (`maspo_verl.cpu.generation.Sampler`): temperature (Llasa's model card: 0.8),
top-p 1, no top-k, until the checkpoint's stop ids (``<|SPEECH_GENERATION_END|>``, its own end of turn) or
``max_seconds`` of codes. A response that does not end with the end tag, or holds anything but codes, yields no
codes (the reward's gate would score it so too).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from reward_fns.llasa_response import GateConfig, parse_token_ids
from reward_fns.speech_tokens.llasa_prompt import render_prompt_ids


class Speaker:
    """A checkpoint ready to say texts (module docstring)."""

    def __init__(self, checkpoint: str | Path, device: str = "cpu", threads: int | None = None) -> None:
        from maspo_verl.cpu.generation import load_model
        from maspo_verl.speaking_model.model import layout_of_checkpoint

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
        own stream keyed by ``seed`` and its text (`maspo_verl.cpu.generation.Sampler`; ``batch`` texts at a time,
        which does not change what is said); ``speaker``: another voice of a checkpoint of several."""
        from maspo_verl.cpu.generation import Sampler

        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (sampled speech), got {temperature}")
        prompts = [render_prompt_ids(self.tokenizer, text, speaker=speaker) for text in texts]
        budget = int(max_seconds * self.layout.frame_rate) + 1
        sampler = Sampler(self.model, self.tokenizer, seed, temperature, budget)
        responses = sampler.sample(self.model, prompts, version=0, batch_size=batch)
        gate = GateConfig(max_codes=None)
        parsed = [parse_token_ids(response, self.layout, config=gate) for response in responses]
        return [p.codes if p.ok else np.zeros(0, dtype=np.int64) for p in parsed]
