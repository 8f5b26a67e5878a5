"""Training the code ear (`reward_fns.code_ear`) with CTC on the codes of recorded speech.

Each example is one utterance's codes (``codes.jsonl``: the corpus as the codec encodes it,
`maspo_lab.speaking_model.training.encode_corpus`) and espeak-ng's phonemes of its text (`reward_fns.phonemes`).
The ear's phonemes are those of the training utterances (sorted); a held-out utterance with a phoneme outside them is
left out of the evaluation and counted. Held-out utterances (the corpus's held-out split, by a hash of the text, so
no held-out sentence is trained on in any voice) are never trained on.

    loss = mean over a batch of CTC(-log p(phonemes | codes)) / N          N: the utterance's phonemes

Batches hold utterances of similar length up to ``frames_per_batch`` codes; a random tenth of each batch's frames,
in spans of up to ``mask_span`` codes, are replaced by the mask code (time masking, as SpecAugment does, so that the
ear reads a phoneme from its context as well as its own codes). AdamW with a linear warm-up and a cosine decay to a
tenth; every ``eval_every`` steps the held-out phoneme error rate is measured and the ear saved when it is the lowest
so far (``training.json`` records the history and ``best_step``).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from maspo_base.typed_settings import InvalidSetting
from maspo_lab.speaking_model.training import adamw_with_schedule, length_batches
from reward_fns.code_ear import CodeEar, EarConfig
from reward_fns.ctc import ctc_nll
from reward_fns.phonemes import phonemes_of


@dataclass(frozen=True)
class EarSettings:
    """How the code ear is trained (``maspo-verl build-ear`` flags)."""

    steps: int = field(default=2500, metadata={"help": "optimiser steps"})
    frames_per_batch: int = field(default=8_000, metadata={"help": "codes per batch, padding included"})
    lr: float = field(default=2e-3, metadata={"help": "peak learning rate (AdamW)"})
    warmup_steps: int = 200
    weight_decay: float = 0.01
    mask_fraction: float = field(default=0.1, metadata={"help": "share of codes masked while training"})
    mask_span: int = field(default=8, metadata={"help": "longest masked span, in codes"})
    eval_every: int = field(default=250, metadata={"help": "steps between held-out evaluations"})
    width: int = 192
    dilations: tuple[int, ...] = field(
        default=(1, 2, 4, 8, 1, 2, 4, 1), metadata={"help": "one residual convolution per entry", "cli": "json"}
    )
    kernel: int = 5
    inputs: Literal["codes", "digits"] = field(
        default="codes", metadata={"help": "codes: an embedding per code; digits: per FSQ digit (large codebooks)"}
    )
    voice: str = field(default="en-us", metadata={"help": "espeak-ng voice of the phonemes"})
    seed: int = 0
    device: str = field(default="cpu", metadata={"help": "cpu or cuda[:N]"})

    def validate(self) -> None:
        for name in ("steps", "frames_per_batch", "eval_every", "width", "kernel", "mask_span"):
            if getattr(self, name) < 1:
                raise InvalidSetting(name, f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise InvalidSetting("lr", f"lr must be > 0, got {self.lr}")
        if not 0 <= self.mask_fraction < 1:
            raise InvalidSetting("mask_fraction", f"mask_fraction must be in [0, 1), got {self.mask_fraction}")
        if self.kernel % 2 == 0:
            raise InvalidSetting("kernel", f"kernel must be odd, got {self.kernel}")
        if not self.dilations or min(self.dilations) < 1:
            raise InvalidSetting("dilations", f"dilations must be a non-empty list of ints >= 1, got {self.dilations}")


@dataclass
class Example:
    id: str
    voice: str
    codes: np.ndarray
    phonemes: tuple[str, ...]


def read_examples(codes_path: str | Path, voices: tuple[str, ...] | None, voice: str, log=print) -> dict:
    """``{"train": [...], "heldout": [...]}`` examples of ``codes.jsonl`` rows of ``voices`` (None: all)."""
    out: dict[str, list[Example]] = {"train": [], "heldout": []}
    skipped = 0
    for line in Path(codes_path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if voices is not None and row["voice"] not in voices:
            continue
        try:
            units = phonemes_of(row["text"], voice)
        except ValueError:
            skipped += 1
            continue
        out[row["split"]].append(Example(row["id"], row["voice"], np.asarray(row["codes"], dtype=np.int64), units))
    log(f"[ear] {len(out['train'])} training, {len(out['heldout'])} held-out utterances ({skipped} without phonemes)")
    return out


def inventory(examples: list[Example]) -> tuple[str, ...]:
    """The phonemes of the training examples, sorted."""
    return tuple(sorted(Counter(u for e in examples for u in e.phonemes)))


def mask_time(codes: torch.Tensor, lengths: torch.Tensor, fraction: float, span: int, mask_code: int, gen):
    """Replace about ``fraction`` of each row's codes, in spans of 1..``span``, by ``mask_code``."""
    if fraction <= 0:
        return codes
    batch, frames = codes.shape
    starts_per_row = max(1, round(fraction * frames / ((span + 1) / 2)))
    starts = (torch.rand((batch, starts_per_row), generator=gen) * lengths[:, None]).long()
    widths = torch.randint(1, span + 1, (batch, starts_per_row), generator=gen)
    t = torch.arange(frames)
    hit = ((t[None, None, :] >= starts[..., None]) & (t[None, None, :] < (starts + widths)[..., None])).any(1)
    return codes.masked_fill(hit, mask_code)


def evaluate(ear: CodeEar, examples: list[Example], max_batch: int = 64) -> dict:
    """Pooled phoneme error rate (edits / reference phonemes), mean per-utterance PER and CTC NLL per phoneme."""
    known = set(ear.config.phonemes)
    usable = [e for e in examples if set(e.phonemes) <= known]
    heard = ear.hear([e.codes for e in usable], [e.phonemes for e in usable], max_batch=max_batch)
    edits = sum(h.per * len(h.targets) for h in heard)
    units = sum(len(h.targets) for h in heard)
    finite = [h.nll for h in heard if math.isfinite(h.nll)]
    return {
        "utterances": len(usable),
        "unknown_phoneme_utterances": len(examples) - len(usable),
        "per": round(edits / max(units, 1), 4),
        "per_mean": round(float(np.mean([h.per for h in heard])), 4) if heard else None,
        "nll_per_phoneme": round(float(np.mean(finite)), 4) if finite else None,
        "aligned": round(float(np.mean([h.aligned for h in heard])), 4) if heard else None,
    }


def train_ear(examples: dict, out: str | Path, settings: EarSettings, codebook_size: int, fsq_levels=None, log=print):
    """Train an ear on ``examples`` (`read_examples`) and save the best one (lowest held-out PER) in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(settings.seed)
    rng, gen = random.Random(settings.seed), torch.Generator().manual_seed(settings.seed)
    train, heldout = examples["train"], examples["heldout"]
    config = EarConfig(
        codebook_size=codebook_size,
        phonemes=inventory(train),
        inputs=settings.inputs,
        fsq_levels=tuple(fsq_levels) if fsq_levels else None,
        width=settings.width,
        dilations=tuple(settings.dilations),
        kernel=settings.kernel,
        voice=settings.voice,
    )
    ear = CodeEar(config).to(settings.device)
    optimizer, schedule = adamw_with_schedule(ear, settings)
    history, best, step, start, queue = [], None, 0, time.monotonic(), []
    log(f"[ear] {sum(p.numel() for p in ear.parameters()):,} parameters, {len(config.phonemes)} phonemes")
    while step < settings.steps:
        if not queue:
            queue = length_batches([len(e.codes) for e in train], settings.frames_per_batch, rng)
        batch = [train[i] for i in queue.pop()]
        codes, lengths, targets, target_lengths = config.padded([e.codes for e in batch], [e.phonemes for e in batch])
        codes = mask_time(codes, lengths, settings.mask_fraction, settings.mask_span, ear.mask_code, gen)
        ear.train()
        log_probs = ear(codes.to(settings.device), lengths.to(settings.device))
        nll = ctc_nll(log_probs, lengths, targets, target_lengths)
        loss = (nll / target_lengths).masked_fill(~torch.isfinite(nll), 0.0).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ear.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        if step % settings.eval_every == 0 or step == settings.steps:
            ear.eval()
            result = {"step": step, "train_loss": round(loss.item(), 4), **evaluate(ear, heldout)}
            result["seconds"] = round(time.monotonic() - start, 1)
            history.append(result)
            if best is None or result["per"] < best["per"]:
                best = result
                ear.save_pretrained(out)
            log(
                f"[ear] step {step}/{settings.steps}: loss {loss:.3f}, held-out PER {result['per']:.3f}, "
                f"NLL/phoneme {result['nll_per_phoneme']}, {result['seconds']:.0f}s"
            )
            record = {"settings": asdict(settings), "history": history, "best_step": best["step"], "steps_done": step}
            (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return out
