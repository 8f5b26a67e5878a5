"""Training the mini codec (`maspo_base.mel_codec.MelFsqCodec`) on the corpus's training utterances.

Every step takes ``batch`` random crops of ``crop_frames`` frames (2.56 s) from the training utterances of the
chosen voices, computes their STFT magnitudes and log-mel frames on the fly, and minimises

    L = mean_{t, f} | Decoder(FSQ(Encoder(x)))_{t,f} - log max(|S|_{t,f}, 1e-5) |

with AdamW and a one-cycle learning rate. The log-mel normalisation (per-bin mean and std) is measured first on up
to 200 utterances. The crops of a padded utterance end are masked out of the loss.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from maspo_base.mel_codec import HOP_LENGTH, LOG_FLOOR, MelFsqCodec
from maspo_base.typed_settings import InvalidSetting
from maspo_lab.speaking_model.corpus import VOICES, load_audio, read_manifest


@dataclass(frozen=True)
class CodecSettings:
    """How the mini codec is trained; its fields but ``crop_frames`` and ``threads`` are ``maspo-verl build-codec``'s
    flags (`maspo_base.typed_settings.add_arguments`)."""

    steps: int = 5000
    batch: int = field(default=16, metadata={"help": "crops of 2.56 s per step"})
    crop_frames: int = 128
    lr: float = 2e-3
    channels: int = field(default=128, metadata={"help": "width of the convolutions"})
    levels: tuple[int, ...] = field(
        default=(4, 4, 4, 4, 4), metadata={"help": "FSQ levels per dimension (their product: codes)"}
    )
    voices: tuple[str, ...] = field(default=VOICES, metadata={"help": "voices trained on", "nargs": "+"})
    seed: int = 0
    threads: int = 2

    def validate(self) -> None:
        for name in ("steps", "batch", "channels", "crop_frames", "threads"):
            if getattr(self, name) < 1:
                raise InvalidSetting(name, f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.levels or min(self.levels) < 2:
            raise InvalidSetting("levels", f"every FSQ level must be >= 2, got {list(self.levels)}")
        if not self.lr > 0:
            raise InvalidSetting("lr", f"lr must be > 0, got {self.lr}")


def train_codec(corpus: str | Path, out: str | Path, settings: CodecSettings = CodecSettings(), log=print) -> Path:
    """Train a mini codec on ``corpus`` and save it to ``out`` (with ``training.json``: settings, losses, time)."""
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    utterances = [u for u in read_manifest(corpus, split="train") if u.voice in settings.voices]
    if not utterances:
        raise ValueError(f"corpus {corpus} has no training utterance of the voices {list(settings.voices)}")
    audio = [load_audio(corpus, u) for u in utterances]
    log(f"[codec] {len(audio)} training utterances ({sum(map(len, audio)) / 16000 / 3600:.2f} h) of {settings.voices}")
    codec = MelFsqCodec(levels=settings.levels, channels=settings.channels)
    with torch.no_grad():
        sample = [codec.frames.log_mel(codec.frames.magnitude(torch.from_numpy(a)[None]))[0] for a in audio[:200]]
        frames = torch.cat(sample)
        codec.mel_mean.copy_(frames.mean(0))
        codec.mel_std.copy_(frames.std(0).clamp(min=1e-3))
    optimizer = torch.optim.AdamW(
        [p for n, p in codec.named_parameters() if not n.startswith("mel_")], lr=settings.lr, weight_decay=0.01
    )
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, settings.lr, total_steps=settings.steps, pct_start=0.05)
    width = settings.crop_frames * HOP_LENGTH
    history, start = [], time.monotonic()
    for step in range(settings.steps):
        crops, valid = [], []
        for i in rng.integers(0, len(audio), settings.batch):
            wav = audio[i]
            offset = int(rng.integers(0, max(1, len(wav) - width)))
            piece = wav[offset : offset + width]
            valid.append(len(piece) // HOP_LENGTH)
            crops.append(np.pad(piece, (0, width - len(piece))))
        with torch.no_grad():
            magnitude = codec.frames.magnitude(torch.from_numpy(np.stack(crops)))
            target = magnitude.clamp(min=LOG_FLOOR).log()
            mask = (torch.arange(settings.crop_frames)[None] < torch.tensor(valid)[:, None]).float()[..., None]
        values, ids = codec.quantise(codec.normalised_log_mel(magnitude))
        loss = ((codec.log_magnitude(values) - target).abs() * mask).sum() / (mask.sum() * target.shape[-1])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if (step + 1) % 250 == 0 or step + 1 == settings.steps:
            loss_value, used = loss.item(), int(ids.unique().numel())
            elapsed = time.monotonic() - start
            history.append({"step": step + 1, "loss": loss_value, "codes_in_batch": used, "s": round(elapsed, 1)})
            log(f"[codec] step {step + 1}/{settings.steps}  L1 {loss_value:.4f}  codes {used}  {elapsed:.0f}s")
    codec.eval()
    codec.save_pretrained(out)
    record = {
        "settings": {**asdict(settings), "levels": list(settings.levels), "voices": list(settings.voices)},
        "codebook_size": math.prod(settings.levels),
        "history": history,
        "seconds": round(time.monotonic() - start, 1),
    }
    (Path(out) / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return Path(out)
