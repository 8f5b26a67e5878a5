"""Saying sentences with a checkpoint: Llasa's prompt, sampled generation, the response parsed by its layout.

`Speaker` loads any checkpoint that speaks in Llasa's format, the shipped mini-llasa or Llasa-1B itself (a local
folder or a hub id), reads its speech-token layout (`maspo_verl.speaking_model.model.layout_of_checkpoint`) and
generates with ``transformers``' sampling: temperature (Llasa's model card: 0.8), top-p 1, no top-k, until
``<|SPEECH_GENERATION_END|>`` or ``max_seconds`` of codes. A response that does not end with the end tag, or holds
anything but codes, yields no codes (the reward's gate would score it so too).
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
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from maspo_verl.speaking_model.model import layout_of_checkpoint

        if threads:
            torch.set_num_threads(threads)
        self.checkpoint = str(checkpoint)
        self.tokenizer = AutoTokenizer.from_pretrained(self.checkpoint)
        self.layout = layout_of_checkpoint(self.checkpoint, self.tokenizer)
        self.model = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=torch.float32).to(device).eval()
        eot = self.tokenizer.convert_tokens_to_ids("<|eot_id|>")
        self.stop_ids = [self.layout.end_id] + ([eot] if isinstance(eot, int) and eot >= 0 else [])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]

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
        """Codec ids said for each text (empty where the response is not well formed), sampled batch by batch
        from ``torch.manual_seed(seed + batch index)``; ``speaker``: another voice of a checkpoint of several."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (sampled speech), got {temperature}")
        prompts = [render_prompt_ids(self.tokenizer, text, speaker=speaker) for text in texts]
        budget = int(max_seconds * self.layout.frame_rate) + 1
        gate = GateConfig(max_codes=None)
        out: list[np.ndarray] = []
        device = self.model.device
        for b, start in enumerate(range(0, len(prompts), batch)):
            chunk = prompts[start : start + batch]
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, prompt in enumerate(chunk):  # left padding: every response starts at column `width`
                ids[row, width - len(prompt) :] = torch.tensor(prompt)
                mask[row, width - len(prompt) :] = 1
            torch.manual_seed(seed + b)
            generated = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                do_sample=True,
                temperature=temperature,
                top_p=1.0,
                top_k=0,
                max_new_tokens=budget,
                eos_token_id=self.stop_ids,
                pad_token_id=self.pad_id,
            )[:, width:].cpu()
            for row in generated.tolist():
                parsed = parse_token_ids(_until_stop(row, self.stop_ids), self.layout, config=gate)
                out.append(parsed.codes if parsed.ok else np.zeros(0, dtype=np.int64))
        return out


def _until_stop(tokens: list[int], stop_ids: list[int]) -> list[int]:
    """The response up to and including its first stop id (generate pads finished rows after it)."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: i + 1]
    return tokens
