"""Import XCodec2's decoder classes (PyPI `xcodec2` 0.1.5) next to a current torch.

`xcodec2` is installed without its dependencies (it pins torch 2.5). Its decoder modules import two packages the
decode path does not otherwise need:

- ``torchaudio``: imported by ``xcodec2.vq.bs_roformer5`` and never used; no build exists for current torch.
- ``torchtune.modules.RotaryPositionalEmbeddings``: the only torchtune class used. torchtune 0.6 itself does not import
  next to current torchao, so `RotaryPositionalEmbeddings` below is torchtune 0.6.1's class, verbatim in behaviour
  (BSD-3-Clause, Meta Platforms, Inc.).

Both are provided as module stand-ins only while the xcodec2 modules import; ``sys.modules`` is restored afterwards,
so other libraries (FunASR checks for torchaudio) see the environment as it is.
"""

from __future__ import annotations

import importlib
import sys
import types

import torch
from torch import nn


class RotaryPositionalEmbeddings(nn.Module):
    """RoPE as torchtune 0.6.1 computes it, on inputs ``[b, s, n_h, h_d]`` (position = dim 1).

    ``theta_i = base^(-2i/dim)``; the pair ``(x_2i, x_2i+1)`` at position ``p`` is rotated by ``p * theta_i``.
    XCodec2 calls it on ``[b, heads, t, head_dim]``, so its rotation runs over the head index: the trained weights
    expect exactly that, which is why this is a copy and not a "fixed" RoPE.
    """

    def __init__(self, dim: int, max_seq_len: int = 4096, base: int = 10_000) -> None:
        super().__init__()
        self.dim, self.base, self.max_seq_len = dim, base, max_seq_len
        theta = 1.0 / (base ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        self.register_buffer("theta", theta, persistent=False)
        self.build_rope_cache(max_seq_len)

    def build_rope_cache(self, max_seq_len: int = 4096) -> None:
        seq_idx = torch.arange(max_seq_len, dtype=self.theta.dtype, device=self.theta.device)
        idx_theta = torch.einsum("i, j -> ij", seq_idx, self.theta).float()
        cache = torch.stack([torch.cos(idx_theta), torch.sin(idx_theta)], dim=-1)
        self.register_buffer("cache", cache, persistent=False)

    def forward(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        seq_len = x.size(1)
        rope_cache = self.cache[:seq_len] if input_pos is None else self.cache[input_pos]
        xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
        rope_cache = rope_cache.view(-1, xshaped.size(1), 1, xshaped.size(3), 2)
        x_out = torch.stack(
            [
                xshaped[..., 0] * rope_cache[..., 0] - xshaped[..., 1] * rope_cache[..., 1],
                xshaped[..., 1] * rope_cache[..., 0] + xshaped[..., 0] * rope_cache[..., 1],
            ],
            -1,
        )
        return x_out.flatten(3).type_as(x)


def _stand_ins() -> dict[str, types.ModuleType]:
    torchaudio = types.ModuleType("torchaudio")
    torchaudio.__doc__ = "stand-in: imported by xcodec2.vq.bs_roformer5, never used on the decode path"
    torchtune = types.ModuleType("torchtune")
    modules = types.ModuleType("torchtune.modules")
    modules.RotaryPositionalEmbeddings = RotaryPositionalEmbeddings
    torchtune.modules = modules
    return {"torchaudio": torchaudio, "torchtune": torchtune, "torchtune.modules": modules}


def import_xcodec2_module(name: str = "xcodec2.vq.codec_decoder_vocos") -> types.ModuleType:
    """Import an xcodec2 module (default: the one holding ``CodecDecoderVocos``, the generator) with the stand-ins."""
    if name in sys.modules:
        return sys.modules[name]
    if name == "xcodec2.modeling_xcodec2":
        # transformers probes for torchaudio when first imported and caches the answer: let it see the real one.
        import transformers  # noqa: F401
    stand_ins = _stand_ins()
    saved = {key: sys.modules.get(key) for key in stand_ins}
    sys.modules.update({key: mod for key, mod in stand_ins.items() if saved[key] is None})
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"cannot import XCodec2's decoder ({exc}). Install it without its pinned dependencies: "
            "pip install --no-deps xcodec2==0.1.5 && pip install 'vector-quantize-pytorch==1.17.8' einops"
        ) from exc
    finally:
        for key, previous in saved.items():
            if previous is None:
                sys.modules.pop(key, None)
    return module
