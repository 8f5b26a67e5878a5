"""XCodec2's encoder (audio -> codec ids) built offline from a local checkpoint, for voice-cloning prompts.

Upstream ``XCodec2Model.__init__`` downloads ``facebook/w2v-bert-2.0`` (the semantic model and its feature
extractor). Its checkpoint already holds the semantic model's weights (``semantic_model.*``), and w2v-bert-2.0's
architecture and feature extractor are transformers' defaults (``Wav2Vec2BertConfig()``,
``SeamlessM4TFeatureExtractor()``), so everything is built here from classes and loaded from ``model.safetensors``::

    feats = SeamlessM4TFeatureExtractor(pad(wav, 160))               # 80 mel bins, stride 2 -> [1, T', 160]
    s = SemanticEncoder(w2v_bert(feats).hidden_states[16])            # [1, semantic, T]
    a = CodecEncoder_Transformer(wav)                                 # [1, acoustic, T], hop 320
    codes = generator.quantizer(fc_prior(cat(s, a)))                  # FSQ ids [1, T]

which is ``XCodec2Model.encode_code``. Architecture keys in ``config.json`` beyond XCodec2's own
(``semantic_hidden_size``, ``codec_encoder_hidden_size``, ``codec_decoder_hidden_size``): ``semantic_layers`` (24),
``semantic_heads`` (16), ``semantic_intermediate_size`` (4096), ``encoder_ngf`` (48), and the decoder keys of
`XCodec2Decoder`; a tiny test checkpoint sets them (`reward_fns.testing.tiny_encoder`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from maspo_base.xcodec2_compat import import_xcodec2_module
from maspo_base.xcodec2_decoder import HOP_LENGTH, SAMPLE_RATE, XCodec2Decoder, load_part, open_checkpoint

SEMANTIC_LAYER = 16  # XCodec2 takes w2v-bert's 16th hidden state
_ENCODER_PREFIXES = ("semantic_model.", "SemanticEncoder_module.", "CodecEnc.", "fc_prior.", "generator.quantizer.")


class XCodec2Encoder(nn.Module):
    """The modules ``XCodec2Model.encode_code`` uses, with XCodec2's parameter names."""

    def __init__(self, config: dict):
        super().__init__()
        from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig, Wav2Vec2BertModel

        semantic_encoder_cls = import_xcodec2_module("xcodec2.vq.module").SemanticEncoder
        codec_encoder_cls = import_xcodec2_module("xcodec2.vq.codec_encoder").CodecEncoder_Transformer
        semantic = int(config.get("semantic_hidden_size", 1024))
        acoustic = int(config.get("codec_encoder_hidden_size", 1024))
        layers = int(config.get("semantic_layers", 24))
        if layers < SEMANTIC_LAYER:
            raise ValueError(f"semantic_layers={layers}: XCodec2 reads hidden state {SEMANTIC_LAYER}, so >= 16")
        decoder = XCodec2Decoder.from_config(config)  # checked before the (large by default) encoders are built
        vq_dim = decoder.config["vq_dim"]
        if semantic + acoustic != vq_dim:
            raise ValueError(
                f"semantic_hidden_size + codec_encoder_hidden_size = {semantic + acoustic} must equal vq_dim={vq_dim}"
            )
        w2v = Wav2Vec2BertConfig(
            hidden_size=semantic,
            num_hidden_layers=layers,
            num_attention_heads=int(config.get("semantic_heads", 16)),
            intermediate_size=int(config.get("semantic_intermediate_size", 4096)),
            output_hidden_states=True,
        )
        self.semantic_model = Wav2Vec2BertModel(w2v)
        self.SemanticEncoder_module = semantic_encoder_cls(semantic, semantic, semantic)
        self.CodecEnc = codec_encoder_cls(ngf=int(config.get("encoder_ngf", 48)), hidden_dim=acoustic)
        self.fc_prior = nn.Linear(vq_dim, vq_dim)
        self.generator = nn.Module()
        self.generator.quantizer = decoder.generator.quantizer
        self.feature_extractor = SeamlessM4TFeatureExtractor()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> XCodec2Encoder:
        """Build from ``config.json`` and load the encoder weights of ``model.safetensors`` (strict)."""
        root, config = open_checkpoint(path)
        model = cls(config)
        load_part(model, root, _ENCODER_PREFIXES, "XCodec2's encoder as its config.json describes it")
        return model.to(device).eval()

    @property
    def device(self) -> torch.device:
        return self.fc_prior.weight.device

    @torch.inference_mode()
    def encode(self, wav: np.ndarray) -> np.ndarray:
        """Mono 16 kHz float audio [N] -> codec ids [ceil((N + 1) / 320)], as ``XCodec2Model.encode_code``."""
        audio = torch.as_tensor(np.asarray(wav, dtype=np.float32))[None]
        audio = nn.functional.pad(audio, (0, HOP_LENGTH - audio.shape[1] % HOP_LENGTH))
        features = self.feature_extractor(
            nn.functional.pad(audio[0], (160, 160)).numpy(), sampling_rate=SAMPLE_RATE, return_tensors="pt"
        ).input_features.to(self.device)
        hidden = self.semantic_model(features).hidden_states[SEMANTIC_LAYER].transpose(1, 2)
        semantic = self.SemanticEncoder_module(hidden)
        acoustic = self.CodecEnc(audio.to(self.device).unsqueeze(1)).transpose(1, 2)
        frames = min(semantic.shape[-1], acoustic.shape[-1])
        joint = torch.cat([semantic[..., :frames], acoustic[..., :frames]], dim=1)
        joint = self.fc_prior(joint.transpose(1, 2))  # [1, T, vq_dim]
        _, codes = self.generator.quantizer(joint)  # ResidualFSQ: (quantized, ids [1, T, 1])
        return codes.reshape(-1).cpu().numpy().astype(np.int64)

    def codes_of_file(self, wav_path: str, utt: str | None = None) -> list[int] | None:
        """Codec ids of an audio file (resampled to 16 kHz, mixed to mono); None when the file does not exist."""
        if not Path(wav_path).exists():
            return None
        return [int(c) for c in self.encode(load_audio(wav_path))]


def load_audio(path: str | os.PathLike, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 audio at ``sample_rate`` (polyphase resampling when the file has another rate)."""
    import soundfile as sf

    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if rate != sample_rate:
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(int(rate), sample_rate)
        audio = resample_poly(audio, sample_rate // g, int(rate) // g).astype(np.float32)
    return audio
