"""The mini codec: one FSQ code per 20 ms frame of 16 kHz speech, learned over log-mel frames, decoded by Griffin-Lim.

Frames are XCodec2's: hop 320 samples (50 codes per second), an STFT of 1024 points (Hann window, centred), so ``T``
codes are ``320 T`` samples. The codec is an autoencoder over those frames::

    x_t = log max(mel(|STFT|)_t, 1e-5)                 80 mel bins, normalised per bin by the training set's mean/std
    z = Encoder(x)                                     1-D convolutions over time -> len(levels) dims per frame
    code_t = FSQ(z_t)                                  finite scalar quantisation: d_k = round(bounded z_tk) in
                                                       [0, L_k), code = sum_k d_k prod_{j<k} L_j (dimension 0 least
                                                       significant; `maspo_base.speech_tokens.fsq`)
    log |S|_t = Decoder(code values)                   1-D convolutions over time -> 513 log-magnitude bins
    wav = GriffinLim(|S|)                              ``griffin_lim_iters`` iterations of the fast variant
                                                       (momentum 0.99), from a fixed phase table

and is trained (`maspo_lab.speaking_model.codec_training`) to minimise ``|log |S| - log |S_true||_1``. Decoding is
deterministic: the initial phases are a fixed table (seed `PHASE_SEED`), so the same codes give the same samples
call after call. `MelFsqCodec.decode` decodes one sequence at a time, so that a response's audio, and the reward
Whisper gives it, do not depend on which other responses share its batch: batched, the convolutions run in other
matrix shapes and Griffin-Lim carries their rounding into differences of up to 1e-3 on the waveform, enough for
Whisper tiny.en to hear another transcript of a mumbled response. On the CPU a batch buys no speed
(docs/benchmarks.md).

A checkpoint directory holds ``config.json`` (``"model_type": "mel_fsq"`` and the sizes below) and
``model.safetensors``; `MelFsqCodec.from_pretrained` loads it strictly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

SAMPLE_RATE = 16_000
HOP_LENGTH = 320
N_FFT = 1024
N_MELS = 80
LOG_FLOOR = 1e-5
MODEL_TYPE = "mel_fsq"
PHASE_SEED = 0
MOMENTUM = 0.99


def frame_count(samples: int) -> int:
    """Codes of a waveform of ``samples`` samples: whole 20 ms frames (the remainder is dropped)."""
    return samples // HOP_LENGTH


class _Frames(nn.Module):
    """The STFT magnitudes and log-mel frames of waveforms, frame t centred on sample ``320 t``."""

    def __init__(self) -> None:
        super().__init__()
        import librosa

        mel = librosa.filters.mel(sr=SAMPLE_RATE, n_fft=N_FFT, n_mels=N_MELS)
        self.register_buffer("mel_basis", torch.from_numpy(mel).float(), persistent=False)
        self.register_buffer("window", torch.hann_window(N_FFT), persistent=False)

    def magnitude(self, wav: torch.Tensor) -> torch.Tensor:
        """``wav`` [B, N] -> |STFT| [B, N // 320, 513]."""
        frames = wav.shape[-1] // HOP_LENGTH
        spec = torch.stft(
            wav[..., : frames * HOP_LENGTH],
            N_FFT,
            HOP_LENGTH,
            window=self.window,
            center=True,
            pad_mode=_pad_mode(frames * HOP_LENGTH),
            return_complex=True,
        )
        return spec[..., :frames].abs().transpose(-1, -2)

    def log_mel(self, magnitude: torch.Tensor) -> torch.Tensor:
        return (magnitude @ self.mel_basis.T).clamp(min=LOG_FLOOR).log()


class _Residual(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, channels)
        self.conv = nn.Conv1d(channels, channels, 5, padding=2 * dilation, dilation=dilation)
        self.mix = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mix(nn.functional.gelu(self.conv(self.norm(x))))


def _stack(inputs: int, channels: int, outputs: int, dilations: Sequence[int]) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv1d(inputs, channels, 5, padding=2),
        *(_Residual(channels, d) for d in dilations),
        nn.GroupNorm(1, channels),
        nn.Conv1d(channels, outputs, 1),
    )


class MelFsqCodec(nn.Module):
    """Encoder, FSQ and decoder of the mini codec (module docstring); `decode` has `XCodec2Decoder.decode`'s shape."""

    def __init__(
        self,
        levels: Sequence[int] = (4, 4, 4, 4, 4),
        channels: int = 128,
        encoder_dilations: Sequence[int] = (1, 2, 1),
        decoder_dilations: Sequence[int] = (1, 2, 4, 1),
        griffin_lim_iters: int = 32,
    ) -> None:
        super().__init__()
        from vector_quantize_pytorch import FSQ

        self.levels = tuple(int(n) for n in levels)
        self.griffin_lim_iters = int(griffin_lim_iters)
        self.frames = _Frames()
        self.encoder = _stack(N_MELS, channels, len(self.levels), encoder_dilations)
        self.fsq = FSQ(list(self.levels), dim=len(self.levels))
        self.decoder = _stack(len(self.levels), channels, N_FFT // 2 + 1, decoder_dilations)
        self.register_buffer("mel_mean", torch.zeros(N_MELS))
        self.register_buffer("mel_std", torch.ones(N_MELS))
        self.config = {
            "levels": list(self.levels),
            "channels": channels,
            "encoder_dilations": list(encoder_dilations),
            "decoder_dilations": list(decoder_dilations),
            "griffin_lim_iters": self.griffin_lim_iters,
        }

    codebook_size = property(lambda self: math.prod(self.levels))
    sample_rate = SAMPLE_RATE
    hop_length = HOP_LENGTH

    @property
    def device(self) -> torch.device:
        return self.mel_mean.device

    # ------------------------------------------------------------------------------------------ the autoencoder

    def normalised_log_mel(self, magnitude: torch.Tensor) -> torch.Tensor:
        return (self.frames.log_mel(magnitude) - self.mel_mean) / self.mel_std

    def quantise(self, log_mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised log-mel [B, T, 80] -> (code values [B, T, dims] with straight-through gradients, ids [B, T])."""
        z = self.encoder(log_mel.transpose(1, 2)).transpose(1, 2)
        values, ids = self.fsq(z)
        return values, ids

    def log_magnitude(self, values: torch.Tensor) -> torch.Tensor:
        """Code values [B, T, dims] -> predicted log |STFT| [B, T, 513]."""
        return self.decoder(values.transpose(1, 2)).transpose(1, 2)

    @torch.inference_mode()
    def encode_waveforms(self, wavs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """16 kHz mono waveforms -> codec ids (int64, ``len(wav) // 320`` each), one at a time."""
        out = []
        for wav in wavs:
            if frame_count(len(wav)) == 0:  # under 20 ms: no whole frame, no code
                out.append(np.zeros(0, dtype=np.int64))
                continue
            signal = torch.as_tensor(np.asarray(wav, dtype=np.float32), device=self.device)[None]
            _, ids = self.quantise(self.normalised_log_mel(self.frames.magnitude(signal)))
            out.append(ids[0].long().cpu().numpy())
        return out

    # ------------------------------------------------------------------------------------------------ decoding

    @torch.inference_mode()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes`` int [B, T] -> waveform float32 [B, 320 T]."""
        values = self.fsq.indices_to_codes(codes.long())
        return griffin_lim(self.log_magnitude(values).exp(), self.griffin_lim_iters)

    def decode(self, codes: Sequence[np.ndarray], max_batch: int = 16, pad_multiple: int = 1) -> list[np.ndarray]:
        """Decode sequences of codec ids in input order, each alone (the module docstring says why). ``max_batch``
        and ``pad_multiple`` are the reward's codec interface: checked (``pad_multiple`` must be 1: Griffin-Lim
        over padding changes the audio), not used for batching."""
        if max_batch < 1 or pad_multiple != 1:
            raise ValueError(f"max_batch must be >= 1 and pad_multiple 1, got {max_batch}, {pad_multiple}")
        for i, c in enumerate(codes):
            if len(c) == 0:
                raise ValueError(f"codes[{i}] is empty: gate empty responses before decoding")
        return [
            self.decode_codes(torch.as_tensor(np.asarray(c, dtype=np.int64))[None].to(self.device))[0].cpu().numpy()
            for c in codes
        ]

    # ---------------------------------------------------------------------------------------------- checkpoints

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` + ``model.safetensors``."""
        from safetensors.torch import save_file

        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.json").write_text(json.dumps({"model_type": MODEL_TYPE, **self.config}, indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(root / "model.safetensors"))
        return root

    @classmethod
    def from_config(cls, config: dict) -> MelFsqCodec:
        if config.get("model_type") != MODEL_TYPE:
            raise ValueError(
                f"config.json has model_type {config.get('model_type')!r}; a mini codec's is {MODEL_TYPE!r}"
            )
        sizes = {k: v for k, v in config.items() if k != "model_type"}
        return cls(**sizes)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str | torch.device = "cpu", **_) -> MelFsqCodec:
        """Load a checkpoint directory strictly (a missing or unexpected weight raises, naming it)."""
        from safetensors.torch import load_file

        root = Path(path).expanduser()
        missing = [n for n in ("config.json", "model.safetensors") if not (root / n).is_file()]
        if missing:
            raise FileNotFoundError(f"mini codec checkpoint {root} lacks {', '.join(missing)}")
        model = cls.from_config(json.loads((root / "config.json").read_text()))
        result = model.load_state_dict(load_file(str(root / "model.safetensors")), strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f"mini codec checkpoint {root} does not match its config.json: missing {result.missing_keys[:5]}, "
                f"unexpected {result.unexpected_keys[:5]}"
            )
        return model.to(device).eval()


def _pad_mode(samples: int) -> str:
    """The STFT's edge padding: reflection, as librosa; zeros for one frame (320 samples), which cannot reflect half
    a window (512 samples)."""
    return "reflect" if samples > N_FFT // 2 else "constant"


_PHASES: dict[tuple[int, str], torch.Tensor] = {}


def _initial_phases(frames: int, device: torch.device) -> torch.Tensor:
    """Unit phasors [513, frames] from a fixed table (seed `PHASE_SEED`), the same prefix for every length."""
    key = (N_FFT // 2 + 1, str(device))
    table = _PHASES.get(key)
    if table is None or table.shape[1] < frames:
        width = max(frames, 2 * (table.shape[1] if table is not None else 512))
        generator = torch.Generator().manual_seed(PHASE_SEED)
        angle = 2 * math.pi * torch.rand(N_FFT // 2 + 1, width, generator=generator)
        table = _PHASES[key] = torch.polar(torch.ones_like(angle), angle).to(device)
    return table[:, :frames]


def griffin_lim(magnitude: torch.Tensor, iterations: int = 32, momentum: float = MOMENTUM) -> torch.Tensor:
    """Fast Griffin-Lim (Perraudin et al. 2013): magnitudes [B, T, 513] -> waveforms [B, 320 T].

    Each iteration projects on consistent spectrograms (iSTFT then STFT) and extrapolates the phase with
    ``momentum``; the phases start from `_initial_phases`."""
    window = torch.hann_window(N_FFT, device=magnitude.device)
    mag = magnitude.transpose(1, 2).float()  # [B, 513, T]
    frames = mag.shape[-1]
    length = frames * HOP_LENGTH

    def istft(spec: torch.Tensor) -> torch.Tensor:
        return torch.istft(spec, N_FFT, HOP_LENGTH, window=window, center=True, length=length)

    def stft(wav: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(
            wav, N_FFT, HOP_LENGTH, window=window, center=True, pad_mode=_pad_mode(length), return_complex=True
        )
        return spec[..., :frames]

    angles = _initial_phases(frames, mag.device).expand_as(mag)
    previous = torch.zeros_like(angles)
    for _ in range(iterations):
        rebuilt = stft(istft(mag * angles))
        angles = rebuilt - (momentum / (1 + momentum)) * previous
        angles = angles / angles.abs().clamp(min=1e-8)
        previous = rebuilt
    return istft(mag * angles)
