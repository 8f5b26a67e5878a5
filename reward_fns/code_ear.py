"""The code ear: a small CTC recogniser that hears phonemes in a codec's codes, no audio decoded.

    e_t  = embed(c_t)                                     a code's embedding (or the sum of its FSQ digits')
    h    = residual dilated 1-D convolutions over e       each frame sees about a second of codes around it
    p_t  = softmax(W h_t)                                 posteriors over blank + the ear's phonemes

Trained with CTC on the codes of recorded speech (``maspo-verl build-ear``; `maspo_lab.speaking_model.ear_training`)
against espeak-ng's phonemes of the text (`reward_fns.phonemes`), it reads a response's codes the way Whisper reads
its decoded audio, at a fraction of the cost. `CodeEar.hear` gives per response:

- ``per``: the phoneme error rate of its best-path transcript against the text's phonemes, ``(S + D + I) / N``;
- ``nll``: ``-log p(phonemes | codes) / N``, the CTC likelihood of the target per phoneme;
- from the forced alignment (`reward_fns.ctc.forced_align`): which target phoneme each code says and how well
  (``frame_units``, ``unit_scores``, ``frame_scores``), the per-frame signal that credit and segmenters read.

Every row is computed as if it were alone: padding frames are zeroed after every layer and LayerNorm normalises
each frame by itself, so a response's results do not depend on its neighbours in the batch.

A built ear is a folder: ``config.json`` (`EarConfig`, the phoneme inventory among it) and ``model.safetensors``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from maspo_base.speech_tokens.fsq import FsqLattice
from reward_fns.ctc import BLANK, Alignment, ctc_nll, forced_align, greedy_units
from reward_fns.phonemes import phonemes_of

MODEL_TYPE = "code_ear"
INPUTS = ("codes", "digits")


@dataclass(frozen=True)
class EarConfig:
    """What a built ear is: its codec's codes, its phonemes, its size."""

    codebook_size: int
    phonemes: tuple[str, ...]
    """The ear's units; label ``k + 1`` is ``phonemes[k]`` (label 0 is CTC's blank)."""
    inputs: str = "codes"
    """``codes``: one embedding per code; ``digits``: the sum of one embedding per FSQ digit (for large codebooks
    such as XCodec2's 65,536: 32 rows instead of 65,536)."""
    fsq_levels: tuple[int, ...] | None = None
    width: int = 192
    dilations: tuple[int, ...] = (1, 2, 4, 8, 1, 2, 4, 1)
    kernel: int = 5
    voice: str = "en-us"
    """espeak-ng's voice for the text's phonemes."""
    model_type: str = field(default=MODEL_TYPE)

    def __post_init__(self) -> None:
        if self.inputs not in INPUTS:
            raise ValueError(f"inputs={self.inputs!r}; valid: {list(INPUTS)}")
        if self.inputs == "digits" and not self.fsq_levels:
            raise ValueError("inputs='digits' needs fsq_levels (the codec's FSQ lattice)")
        if not self.phonemes or len(set(self.phonemes)) != len(self.phonemes):
            raise ValueError("phonemes must be a non-empty list of distinct units")

    @property
    def labels(self) -> int:
        return len(self.phonemes) + 1

    @functools.cached_property
    def label_of(self) -> dict[str, int]:
        """Phoneme -> its CTC label (``k + 1`` for ``phonemes[k]``)."""
        return {unit: k + 1 for k, unit in enumerate(self.phonemes)}

    def padded(
        self, codes: list[np.ndarray], targets: list[tuple[str, ...]], device="cpu"
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A batch as CTC reads it: padded codes, their lengths, padded target labels, their lengths."""
        frames, lengths = pad_rows([np.asarray(c, dtype=np.int64) for c in codes], device)
        labels = [np.array([self.label_of[u] for u in t], dtype=np.int64) for t in targets]
        return (frames, lengths, *pad_rows(labels, device))

    @classmethod
    def from_dict(cls, values: dict) -> EarConfig:
        tuples = ("phonemes", "fsq_levels", "dilations")
        return cls(**{k: tuple(v) if k in tuples and v is not None else v for k, v in values.items()})


@dataclass
class Heard:
    """What the ear heard of one response (`CodeEar.hear`)."""

    per: float
    """Phoneme error rate, ``(S + D + I) / N``, unclipped."""
    nll: float
    """``-log p(target phonemes | codes)`` per target phoneme (inf: too few codes for the phonemes)."""
    transcript: tuple[str, ...]
    targets: tuple[str, ...]
    frame_units: np.ndarray
    """Per code: the target phoneme it is aligned to (-1: before the first phoneme, or no alignment)."""
    unit_scores: np.ndarray
    """Per target phoneme: how well its codes say it, in (0, 1] (NaN without an alignment)."""
    frame_scores: np.ndarray
    """Per code: its phoneme's score (NaN where it has none)."""
    aligned: bool


class _Block(nn.Module):
    def __init__(self, width: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.conv = nn.Conv1d(width, width, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        y = self.conv((self.norm(x) * keep).transpose(1, 2)).transpose(1, 2)  # padding reads zeros, as at an edge
        return (x + nn.functional.gelu(y)) * keep


class CodeEar(nn.Module):
    """Codes ``(B, T)`` -> log-posteriors ``(B, T, 1 + phonemes)`` (module docstring)."""

    def __init__(self, config: EarConfig) -> None:
        super().__init__()
        if config.kernel % 2 == 0:
            raise ValueError(f"kernel must be odd (centred), got {config.kernel}")
        self.config = config
        if config.inputs == "codes":
            self.embed = nn.Embedding(config.codebook_size + 1, config.width)  # the last row: a masked code
        else:
            self.lattice = FsqLattice(tuple(config.fsq_levels))
            self.embed = nn.Embedding(sum(config.fsq_levels) + 1, config.width)
            levels = torch.tensor(config.fsq_levels)
            self.register_buffer("digit_offsets", levels.cumsum(0) - levels, persistent=False)  # each digit's rows
        self.blocks = nn.ModuleList(_Block(config.width, config.kernel, d) for d in config.dilations)
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.labels)

    @property
    def mask_code(self) -> int:
        """The input id of a masked frame (training's time masking): one past the codebook."""
        return self.config.codebook_size

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        if self.config.inputs == "codes":
            return self.embed(codes)
        masked = codes == self.mask_code
        digits = self.lattice.digits(codes.clamp(max=self.mask_code - 1))
        summed = self.embed(digits + self.digit_offsets).sum(-2)
        return torch.where(masked[..., None], self.embed.weight[-1], summed)

    def forward(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        keep = (torch.arange(codes.shape[1], device=codes.device)[None, :] < lengths[:, None])[..., None].float()
        x = self.embed_codes(codes) * keep
        for block in self.blocks:
            x = block(x, keep)
        return torch.log_softmax(self.head(self.norm(x)).float(), -1)

    # --- reading responses -------------------------------------------------------------------------------------

    def targets(self, text: str) -> tuple[str, ...]:
        """The phonemes ``text`` should be heard as; ``ValueError`` naming a phoneme the ear never learnt."""
        units = phonemes_of(text, self.config.voice)
        unknown = sorted(set(units) - set(self.config.phonemes))
        if unknown:
            raise ValueError(f"phonemes {unknown} of {text!r} are not among the ear's {len(self.config.phonemes)}")
        return units

    @torch.no_grad()
    def hear(self, codes: list[np.ndarray], targets: list[tuple[str, ...]], max_batch: int = 64) -> list[Heard]:
        """What the ear hears of each response's ``codes`` against its ``targets`` (`targets` of its text), in
        batches of ``max_batch``; every response needs at least one code and one target phoneme."""
        out: list[Heard] = []
        for start in range(0, len(codes), max_batch):
            out.extend(self._hear_batch(codes[start : start + max_batch], targets[start : start + max_batch]))
        return out

    def _hear_batch(self, codes: list[np.ndarray], targets: list[tuple[str, ...]]) -> list[Heard]:
        device = self.head.weight.device
        frames, lengths, labels, label_lengths = self.config.padded(codes, targets, device)
        if bool((frames < 0).any() or (frames >= self.config.codebook_size).any()):
            raise ValueError(f"codes outside the ear's codebook [0, {self.config.codebook_size})")
        log_probs = self(frames, lengths)
        nll = ctc_nll(log_probs, lengths, labels, label_lengths) / label_lengths.clamp(min=1)
        alignment: Alignment = forced_align(log_probs, lengths, labels, label_lengths)
        heard = greedy_units(log_probs, lengths)
        return [
            Heard(
                per=phoneme_error_rate(list(t), [self.config.phonemes[k - 1] for k in h]),
                nll=float(nll[b]),
                transcript=tuple(self.config.phonemes[k - 1] for k in h),
                targets=tuple(t),
                frame_units=alignment.frame_units[b, : len(c)].cpu().numpy(),
                unit_scores=alignment.unit_scores[b, : len(t)].cpu().numpy(),
                frame_scores=alignment.frame_scores[b, : len(c)].cpu().numpy(),
                aligned=bool(alignment.feasible[b]),
            )
            for b, (c, t, h) in enumerate(zip(codes, targets, heard))
        ]

    # --- saving and loading ------------------------------------------------------------------------------------

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(asdict(self.config), indent=1) + "\n")
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, directory / "model.safetensors"
        )
        return directory

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> CodeEar:
        from safetensors.torch import load_file

        path = Path(path)
        config_path = path / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"{path} is not a built code ear: no config.json (maspo-verl build-ear)")
        values = json.loads(config_path.read_text())
        if values.get("model_type") != MODEL_TYPE:
            raise ValueError(f"{path}: model_type {values.get('model_type')!r}, expected {MODEL_TYPE!r}")
        ear = cls(EarConfig.from_dict(values))
        state = {k: v.float() for k, v in load_file(path / "model.safetensors").items()}
        ear.load_state_dict(state)
        return ear.to(device).eval()


def pad_rows(rows: list[np.ndarray], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer rows of different lengths as one zero-padded ``(B, T)`` int64 tensor, and their lengths."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    out = torch.zeros((len(rows), max(int(lengths.max()), 1) if rows else 1), dtype=torch.long)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.from_numpy(row)
    return out.to(device), lengths.to(device)


def phoneme_error_rate(reference: list[str], hypothesis: list[str]) -> float:
    """``(S + D + I) / N`` of a minimum edit alignment of two phoneme sequences (unclipped)."""
    from rapidfuzz.distance import Levenshtein

    if not reference:
        raise ValueError("no reference phonemes to score against")
    return Levenshtein.distance(reference, hypothesis) / len(reference)


__all__ = ["BLANK", "CodeEar", "EarConfig", "Heard", "phoneme_error_rate"]
