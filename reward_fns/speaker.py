"""Speaker-similarity backends behind one registry: ``@register_speaker_backend(name)``.

A backend embeds 16 kHz waveforms; similarity is the cosine of two embeddings, ``sim = <e_a, e_b> / (|e_a| |e_b|)``.
Registered:

- ``wavlm_ecapa``: Seed-TTS-eval's SIM model, WavLM-large + ECAPA-TDNN, from a local ``wavlm_large_finetune.pth``
  (`reward_fns.wavlm_ecapa`); spec ``wavlm_ecapa:/path/to/wavlm_large_finetune.pth``;
- ``resemblyzer``: the GE2E speaker encoder that ships inside PyPI ``resemblyzer`` (17 MB, offline), the fallback
  when no such checkpoint is at hand; its numbers are not Seed-TTS-eval's SIM.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np

from maspo_verl.registry import Registry

SPEAKER_BACKEND_REGISTRY = Registry("speaker backend")
register_speaker_backend = SPEAKER_BACKEND_REGISTRY.register
get_speaker_backend_cls = SPEAKER_BACKEND_REGISTRY.lookup


class SpeakerBackend(abc.ABC):
    label: str = ""
    """Which model computed the similarity, as tables and summaries print it."""

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


def build_speaker_backend(spec: str, device: str = "cpu") -> SpeakerBackend:
    """The backend of ``NAME`` or ``NAME:CHECKPOINT``: ``resemblyzer``, ``wavlm_ecapa:/m/wavlm_large_finetune.pth``."""
    name, _, checkpoint = spec.partition(":")
    options = {"checkpoint": checkpoint} if checkpoint else {}
    return get_speaker_backend_cls(name)(device=device, **options)


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


from . import wavlm_ecapa  # noqa: E402,F401  (registers "wavlm_ecapa"; it imports this module's registry)
