"""XCodec2 decoding, decoder only: codec ids -> 16 kHz waveform, 320 samples per token.

The decode path of ``XCodec2Model.decode_code`` (xcodec2 0.1.5) is

    e = project_out(fsq_code(id))            # [T, 2048]  FSQ id -> 8-dim code -> Linear 8 -> 2048
    h = fc_post_a(e)                         # [T, hidden]
    wav = ISTFTHead(VocosBackbone(h))        # [320 * T]

and needs neither the semantic encoder (w2v-bert, 580M parameters) nor the acoustic encoder, so `XCodec2Decoder`
builds only ``generator`` (`CodecDecoderVocos`) and ``fc_post_a`` and loads their weights from the checkpoint's
safetensors. A checkpoint directory holds ``config.json`` and ``model.safetensors`` (the layout of HKUSTAudio/xcodec2);
a hub id is fetched with ``huggingface_hub.snapshot_download`` restricted to those two files.

Batching: the backbone attends over the whole sequence and normalises with GroupNorm, so padding a short sequence
changes its audio. `decode` therefore batches only sequences of the same length (``pad_multiple=1``, exact: equal to
decoding one by one); ``pad_multiple=k`` pads to a multiple of k tokens with the all-zero code to form larger batches
at the price of slightly different audio.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from maspo_base.speech_tokens.xcodec2_fsq import XCODEC2_FSQ, ZERO_CODE
from maspo_base.xcodec2_compat import import_xcodec2_module

SAMPLE_RATE = 16_000
HOP_LENGTH = 320  # samples per codec token: 50 tokens per second
CHECKPOINT_FILES = ("config.json", "model.safetensors")
_DECODER_PREFIXES = ("generator.", "fc_post_a.")


def resolve_checkpoint_dir(path_or_hub_id: str) -> Path:
    """A local directory as is; otherwise download ``config.json`` + ``model.safetensors`` of the hub repo."""
    path = Path(path_or_hub_id).expanduser()
    if path.is_dir():
        return path
    if path.exists() or path_or_hub_id.startswith((".", "/", "~")) or path_or_hub_id.count("/") != 1:
        raise FileNotFoundError(
            f"codec checkpoint {path_or_hub_id!r} is neither a directory nor a hub id 'owner/name'; "
            f"a directory must hold {', '.join(CHECKPOINT_FILES)}"
        )
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path_or_hub_id, allow_patterns=list(CHECKPOINT_FILES)))


def open_checkpoint(path_or_hub_id: str | os.PathLike) -> tuple[Path, dict]:
    """The checkpoint directory (see `resolve_checkpoint_dir`) and its ``config.json``; both files must be there."""
    root = resolve_checkpoint_dir(str(path_or_hub_id))
    missing = [name for name in CHECKPOINT_FILES if not (root / name).is_file()]
    if missing:
        raise FileNotFoundError(f"codec checkpoint {root} lacks {', '.join(missing)}; it must hold {CHECKPOINT_FILES}")
    return root, json.loads((root / "config.json").read_text())


def load_part(model: nn.Module, root: Path, prefixes: tuple[str, ...], what: str) -> None:
    """Load the weights of ``model.safetensors`` whose names start with ``prefixes`` into ``model``, strictly: a
    missing or unexpected weight raises, naming the checkpoint and ``what`` it should hold. Other weights are never
    read."""
    from safetensors import safe_open

    with safe_open(str(root / "model.safetensors"), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefixes)}
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"codec checkpoint {root} does not match {what}: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )


class XCodec2Decoder(nn.Module):
    """XCodec2's generator and ``fc_post_a``, built directly from `CodecDecoderVocos` (no encoder, no w2v-bert).

    Architecture keys in ``config.json``: ``codec_decoder_hidden_size`` (XCodec2's own, 1024) and the optional
    ``decoder_depth`` (12), ``decoder_heads`` (16) and ``vq_dim`` (2048), which XCodec2 hard-codes and a smaller
    test checkpoint overrides.
    """

    codebook_size = XCODEC2_FSQ.codebook_size  # 65,536: the codec interface of `maspo_base.codecs`
    sample_rate = SAMPLE_RATE
    hop_length = HOP_LENGTH

    def __init__(self, hidden_size: int = 1024, depth: int = 12, heads: int = 16, vq_dim: int = 2048):
        super().__init__()
        if hidden_size % heads:
            raise ValueError(f"codec_decoder_hidden_size={hidden_size} must be divisible by decoder_heads={heads}")
        decoder_cls = import_xcodec2_module().CodecDecoderVocos
        # XCodec2 applies RoPE with pos_meb_dim == head dim (64 = 1024 / 16).
        self.generator = decoder_cls(
            hidden_dim=hidden_size, depth=depth, heads=heads, pos_meb_dim=hidden_size // heads, vq_dim=vq_dim
        )
        self.fc_post_a = nn.Linear(vq_dim, hidden_size)
        self.compute_dtype = torch.float32
        self.config = {
            "codec_decoder_hidden_size": hidden_size,
            "decoder_depth": depth,
            "decoder_heads": heads,
            "vq_dim": vq_dim,
        }

    @classmethod
    def from_config(cls, config: dict) -> XCodec2Decoder:
        return cls(
            hidden_size=int(config.get("codec_decoder_hidden_size", 1024)),
            depth=int(config.get("decoder_depth", 12)),
            heads=int(config.get("decoder_heads", 16)),
            vq_dim=int(config.get("vq_dim", 2048)),
        )

    @classmethod
    def from_pretrained(
        cls, path_or_hub_id: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> XCodec2Decoder:
        """Load the decoder weights of an XCodec2 checkpoint; other weights in the file are never read.

        ``dtype`` is the compute dtype of the backbone (float32 or bfloat16 under autocast); weights stay float32.
        """
        root, config = open_checkpoint(path_or_hub_id)
        model = cls.from_config(config)
        load_part(model, root, _DECODER_PREFIXES, f"the decoder built from its config.json ({model.config})")
        model.compute_dtype = dtype
        return model.to(device).eval()

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` + ``model.safetensors`` with XCodec2's parameter names."""
        from safetensors.torch import save_file

        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.json").write_text(json.dumps({"model_type": "xcodec", **self.config}, indent=2))
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(root / "model.safetensors"))
        return root

    @property
    def device(self) -> torch.device:
        return self.fc_post_a.weight.device

    @torch.inference_mode()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes`` int [B, T] -> waveform float32 [B, 320 * T]; what ``XCodec2Model.decode_code`` computes."""
        emb = self.generator.quantizer.get_output_from_indices(codes.unsqueeze(-1))  # [B, T, vq_dim]
        hidden = self.fc_post_a(emb)
        dtype = self.compute_dtype
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32):
            hidden = self.generator.backbone(hidden)
        audio, _ = self.generator.head(hidden.float())  # the ISTFT stays in float32
        return audio[:, 0, :].float()

    def decode(self, codes: Sequence[np.ndarray], max_batch: int = 16, pad_multiple: int = 1) -> list[np.ndarray]:
        """Decode sequences of codec ids, batched, in input order. Output ``i`` has ``320 * len(codes[i])`` samples.

        Sequences are grouped by length rounded up to ``pad_multiple`` tokens (1: exact lengths) and decoded
        ``max_batch`` at a time.
        """
        if max_batch < 1 or pad_multiple < 1:
            raise ValueError(f"max_batch and pad_multiple must be >= 1, got {max_batch}, {pad_multiple}")
        groups: dict[int, list[int]] = defaultdict(list)
        for i, c in enumerate(codes):
            if len(c) == 0:
                raise ValueError(f"codes[{i}] is empty: gate empty responses before decoding")
            groups[-(-len(c) // pad_multiple) * pad_multiple].append(i)
        out: list[np.ndarray | None] = [None] * len(codes)
        for length, members in groups.items():
            for start in range(0, len(members), max_batch):
                chunk = members[start : start + max_batch]
                batch = np.full((len(chunk), length), ZERO_CODE, dtype=np.int64)
                for row, i in enumerate(chunk):
                    batch[row, : len(codes[i])] = codes[i]
                audio = self.decode_codes(torch.from_numpy(batch).to(self.device)).cpu().numpy()
                for row, i in enumerate(chunk):
                    out[i] = audio[row, : HOP_LENGTH * len(codes[i])]
        return out  # type: ignore[return-value]
