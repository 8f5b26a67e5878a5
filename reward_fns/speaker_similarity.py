"""Speaker-similarity backends behind one registry: ``@register_speaker_backend(name)``.

A backend embeds 16 kHz waveforms; similarity is the cosine of two embeddings, ``sim = <e_a, e_b> / (|e_a| |e_b|)``.
Registered:

- ``wavlm_ecapa``: Seed-TTS-eval's SIM model, WavLM-large + ECAPA-TDNN, from a local ``wavlm_large_finetune.pth``
  (the model: `reward_fns.wavlm_ecapa`); spec ``wavlm_ecapa:/path/to/wavlm_large_finetune.pth``;
- ``resemblyzer``: the GE2E speaker encoder that ships inside PyPI ``resemblyzer`` (17 MB, offline), the fallback
  when no such checkpoint is at hand; its numbers are not Seed-TTS-eval's SIM.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from maspo_base.registry import Registry
from reward_fns.wavlm_ecapa import WavLMEcapa

SPEAKER_BACKEND_REGISTRY = Registry("speaker backend")
register_speaker_backend = SPEAKER_BACKEND_REGISTRY.register
get_speaker_backend_cls = SPEAKER_BACKEND_REGISTRY.lookup


class SpeakerBackend(abc.ABC):
    label: str = ""
    """Which model computed the similarity, as tables and summaries print it."""
    checkpoint_help: str = ""
    """What checkpoint file the backend reads (``NAME:PATH``); empty when it ships its model."""

    def __init__(self, device: str = "cpu", **options):
        self.device = device
        self.options = options

    @abc.abstractmethod
    def embed(self, audio: Sequence[np.ndarray]) -> np.ndarray:
        """Embeddings [N, D] of 16 kHz mono float32 waveforms."""

    def similarity(self, audio: Sequence[np.ndarray], prompts: Sequence[np.ndarray]) -> np.ndarray:
        """Cosine similarity of ``audio[i]`` and ``prompts[i]``, all embedded in one batch."""
        emb = self.embed([*audio, *prompts])
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        n = len(audio)
        return np.einsum("id,id->i", emb[:n], emb[n:])


def parse_speaker_spec(spec: str) -> tuple[type[SpeakerBackend], str | None]:
    """``NAME`` or ``NAME:CHECKPOINT`` (``resemblyzer``, ``wavlm_ecapa:/m/wavlm_large_finetune.pth``) -> the backend
    class and the checkpoint path; a ValueError names an unknown backend, or a checkpoint missing, absent or unused."""
    name, _, checkpoint = spec.partition(":")
    cls = get_speaker_backend_cls(name)
    if cls.checkpoint_help and not checkpoint:
        raise ValueError(f"speaker {name!r} needs a checkpoint, {name}:PATH ({cls.checkpoint_help})")
    if checkpoint and not cls.checkpoint_help:
        raise ValueError(f"speaker {name!r} takes no checkpoint (it ships its model); got {spec!r}")
    if checkpoint and not Path(checkpoint).is_file():
        raise ValueError(f"speaker checkpoint {checkpoint}: no such file ({cls.checkpoint_help})")
    return cls, checkpoint or None


def build_speaker_backend(spec: str, device: str = "cpu") -> SpeakerBackend:
    """The backend of ``NAME`` or ``NAME:CHECKPOINT`` (`parse_speaker_spec`)."""
    cls, checkpoint = parse_speaker_spec(spec)
    return cls(device=device, **({"checkpoint": checkpoint} if checkpoint else {}))


@register_speaker_backend("resemblyzer")
class ResemblyzerBackend(SpeakerBackend):
    label = "resemblyzer GE2E (not Seed-TTS-eval's WavLM-ECAPA)"

    def __init__(self, device: str = "cpu", **options):
        super().__init__(device, **options)
        from resemblyzer import VoiceEncoder

        self.encoder = VoiceEncoder(device=device, verbose=False)

    def embed(self, audio: Sequence[np.ndarray]) -> np.ndarray:
        from resemblyzer import preprocess_wav

        return np.stack([self.encoder.embed_utterance(preprocess_wav(np.asarray(a, np.float32))) for a in audio])


@register_speaker_backend("wavlm_ecapa")
class WavLMEcapaBackend(SpeakerBackend):
    """Seed-TTS-eval's SIM model from a local ``wavlm_large_finetune.pth`` (``checkpoint=``, required)."""

    label = "WavLM-large + ECAPA-TDNN (Seed-TTS-eval's SIM model)"
    checkpoint_help = "Seed-TTS-eval's wavlm_large_finetune.pth"

    def __init__(self, device: str = "cpu", checkpoint: str | None = None, **options):
        super().__init__(device, **options)
        if not checkpoint:
            raise ValueError(
                "speaker backend 'wavlm_ecapa' needs checkpoint=PATH: Seed-TTS-eval's wavlm_large_finetune.pth"
            )
        self.checkpoint = str(checkpoint)
        self.label = f"{type(self).label}, {Path(checkpoint).name}"
        self.model = WavLMEcapa.from_checkpoint(checkpoint).to(device)

    def embed(self, audio: Sequence[np.ndarray]) -> np.ndarray:
        waves = [np.asarray(a, np.float32).reshape(-1) for a in audio]
        for i, wave in enumerate(waves):
            frames = max(0, int(self.model.wavlm._get_feat_extract_output_lengths(torch.tensor(len(wave)))))
            if frames < 2:
                raise ValueError(f"audio[{i}]: {len(wave)} samples give {frames} WavLM frames; 2 or more needed")
            if not np.isfinite(wave).all():
                raise ValueError(f"audio[{i}]: NaN or inf samples")
        # one forward per waveform, as Seed-TTS-eval: instance norm, SE means and pooling run over the whole length,
        # so padding a batch would change the embeddings
        with torch.inference_mode():
            return np.stack([self.model(torch.from_numpy(w).to(self.device)).float().cpu().numpy() for w in waves])
