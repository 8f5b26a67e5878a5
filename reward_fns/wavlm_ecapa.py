"""Seed-TTS-eval's speaker-similarity model: WavLM-large + ECAPA-TDNN, read from ``wavlm_large_finetune.pth``.

Seed-TTS-eval (BytedanceSpeech/seed-tts-eval, ``cal_sim.sh`` -> ``verification_pair_list_v2.py`` ->
``thirdparty/UniSpeech/downstreams/speaker_verification/verification.py``) builds
``ECAPA_TDNN_SMALL(feat_dim=1024, feat_type='wavlm_large')`` from ``models/ecapa_tdnn.py`` (Microsoft UniSpeech),
loads ``torch.load(checkpoint)['model']`` into it, embeds each 16 kHz waveform on its own (batch of one) and scores
``F.cosine_similarity(emb1, emb2)``. This module rebuilds that model without s3prl or torch.hub:

- front end: the s3prl ``wavlm_large`` upstream (``s3prl/upstream/wavlm/expert.py``): the waveform normalised
  ``F.layer_norm(wav, wav.shape)`` (WavLM-Large was pre-trained on normalised input), then WavLM, whose hidden
  states are the inputs of the 24 transformer layers and the encoder's (layer-normed) output, 25 in all. Here
  WavLM is transformers' `WavLMModel` (``do_stable_layer_norm``: the same 25 hidden states under
  ``output_hidden_states``), its weights renamed from s3prl's names by `S3PRL_TO_HF`;
- head: ECAPA-TDNN ported below with UniSpeech's module and attribute names, so the checkpoint's head keys load
  as they are; the shapes (channels, embedding size, number of WavLM layers) are read off the checkpoint.

The whole model is built from the checkpoint file only (no hub, no download) and loaded strictly: a key the
model lacks, or a parameter the checkpoint lacks, is an error naming it, where Seed-TTS-eval's
``load_state_dict(..., strict=False)`` would leave such a parameter at its initial value. Documented exceptions
(`IGNORED_CHECKPOINT_KEYS`, `OPTIONAL_MODEL_KEYS`) are tensors unused at inference.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

FRONT_END_PREFIX = "feature_extract.model."
"""Where the s3prl WavLM sits in the checkpoint: ``ECAPA_TDNN.feature_extract`` (s3prl's UpstreamExpert) ``.model``."""

S3PRL_TO_HF: list[tuple[str, str]] = [
    (r"feature_extractor\.conv_layers\.(\d+)\.0\.", r"feature_extractor.conv_layers.\1.conv."),
    (r"feature_extractor\.conv_layers\.(\d+)\.2\.1\.", r"feature_extractor.conv_layers.\1.layer_norm."),
    (r"layer_norm\.", r"feature_projection.layer_norm."),
    (r"post_extract_proj\.", r"feature_projection.projection."),
    (r"encoder\.pos_conv\.0\.weight_g", r"encoder.pos_conv_embed.conv.weight_g"),
    (r"encoder\.pos_conv\.0\.weight_v", r"encoder.pos_conv_embed.conv.weight_v"),
    (r"encoder\.pos_conv\.0\.parametrizations\.weight\.original0", r"encoder.pos_conv_embed.conv.weight_g"),
    (r"encoder\.pos_conv\.0\.parametrizations\.weight\.original1", r"encoder.pos_conv_embed.conv.weight_v"),
    (r"encoder\.pos_conv\.0\.bias", r"encoder.pos_conv_embed.conv.bias"),
    (r"encoder\.layer_norm\.", r"encoder.layer_norm."),
    (r"encoder\.layers\.(\d+)\.self_attn\.(q|k|v|out)_proj\.", r"encoder.layers.\1.attention.\2_proj."),
    (r"encoder\.layers\.(\d+)\.self_attn\.grep_linear\.", r"encoder.layers.\1.attention.gru_rel_pos_linear."),
    (r"encoder\.layers\.(\d+)\.self_attn\.grep_a$", r"encoder.layers.\1.attention.gru_rel_pos_const"),
    (
        r"encoder\.layers\.(\d+)\.self_attn\.relative_attention_bias\.",
        r"encoder.layers.\1.attention.rel_attn_embed.",
    ),
    (r"encoder\.layers\.(\d+)\.self_attn_layer_norm\.", r"encoder.layers.\1.layer_norm."),
    (r"encoder\.layers\.(\d+)\.fc1\.", r"encoder.layers.\1.feed_forward.intermediate_dense."),
    (r"encoder\.layers\.(\d+)\.fc2\.", r"encoder.layers.\1.feed_forward.output_dense."),
    (r"encoder\.layers\.(\d+)\.final_layer_norm\.", r"encoder.layers.\1.final_layer_norm."),
]
"""s3prl/UniSpeech WavLM parameter names (prefix-free, anchored at the start) -> transformers' `WavLMModel` names.
``layer_norm.`` is WavLM's norm of the conv features (``WavLM.layer_norm``), matched only at the start of a name.
The positional conv's weight norm is ``weight_g``/``weight_v`` (``nn.utils.weight_norm``) in s3prl; a file saved
with torch's parametrizations holds ``original0``/``original1`` instead, mapped the same way."""

IGNORED_CHECKPOINT_KEYS = {FRONT_END_PREFIX + "mask_emb": "the masked-frame embedding, used only in pre-training"}
OPTIONAL_MODEL_KEYS = re.compile(r".*\.num_batches_tracked$")
"""BatchNorm's step counter: unused in eval mode (running statistics with a fixed momentum)."""

CONV_STRIDE_BY_KERNEL = {10: 5, 3: 2, 2: 2}
"""WavLM's waveform encoder ``[(512,10,5)] + [(512,3,2)] * 4 + [(512,2,2)] * 2``: a stride for each kernel width."""
MAX_BUCKET_DISTANCE = 800
"""WavLM-Large's ``max_distance`` of the relative position buckets (not recorded by any tensor's shape)."""


def s3prl_to_hf(name: str) -> str | None:
    """The `WavLMModel` name of a WavLM parameter named as in s3prl's ``WavLM.py``, or None when it has none."""
    for pattern, replacement in S3PRL_TO_HF:
        renamed, n = re.subn("^" + pattern, replacement, name)
        if n:
            return renamed
    return None


# --- ECAPA-TDNN head, ported from UniSpeech downstreams/speaker_verification/models/ecapa_tdnn.py ---------------
# Module and attribute names are UniSpeech's, so that the checkpoint's head keys are this module's keys.


class Res2Conv1dReluBn(nn.Module):
    """Res2Net block over ``scale`` channel groups: ``y_1 = BN(ReLU(conv_1(x_1)))``,
    ``y_i = BN(ReLU(conv_i(x_i + y_{i-1})))`` for ``i < scale``, and the last group passed through unchanged."""

    def __init__(self, channels, kernel_size=1, stride=1, padding=0, dilation=1, bias=True, scale=4):
        super().__init__()
        if channels % scale:
            raise ValueError(f"Res2Conv1dReluBn: channels {channels} not divisible by scale {scale}")
        self.scale = scale
        self.width = channels // scale
        self.nums = scale if scale == 1 else scale - 1
        self.convs = nn.ModuleList(
            nn.Conv1d(self.width, self.width, kernel_size, stride, padding, dilation, bias=bias)
            for _ in range(self.nums)
        )
        self.bns = nn.ModuleList(nn.BatchNorm1d(self.width) for _ in range(self.nums))

    def forward(self, x):
        out = []
        groups = torch.split(x, self.width, 1)
        sp = groups[0]
        for i in range(self.nums):  # sequential by construction: group i reads group i-1's output
            if i > 0:
                sp = sp + groups[i]
            sp = self.bns[i](F.relu(self.convs[i](sp)))  # UniSpeech's order: conv -> relu -> bn
            out.append(sp)
        if self.scale != 1:
            out.append(groups[self.nums])
        return torch.cat(out, dim=1)


class Conv1dReluBn(nn.Module):
    """``BN(ReLU(conv(x)))``."""

    def __init__(self, in_channels, out_channels, kernel_size=1, stride=1, padding=0, dilation=1, bias=True):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride, padding, dilation, bias=bias)
        self.bn = nn.BatchNorm1d(out_channels)

    def forward(self, x):
        return self.bn(F.relu(self.conv(x)))


class SE_Connect(nn.Module):
    """Squeeze-excitation: ``x * sigmoid(W_2 ReLU(W_1 mean_t(x)))`` per channel."""

    def __init__(self, channels, se_bottleneck_dim=128):
        super().__init__()
        self.linear1 = nn.Linear(channels, se_bottleneck_dim)
        self.linear2 = nn.Linear(se_bottleneck_dim, channels)

    def forward(self, x):
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))
        return x * gate.unsqueeze(2)


class SE_Res2Block(nn.Module):
    """``SE(Conv1dReluBn_2(Res2(Conv1dReluBn_1(x)))) + shortcut(x)`` (shortcut: 1x1 conv when widths differ)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, scale, se_bottleneck_dim):
        super().__init__()
        self.Conv1dReluBn1 = Conv1dReluBn(in_channels, out_channels, kernel_size=1, stride=1, padding=0)
        self.Res2Conv1dReluBn = Res2Conv1dReluBn(out_channels, kernel_size, stride, padding, dilation, scale=scale)
        self.Conv1dReluBn2 = Conv1dReluBn(out_channels, out_channels, kernel_size=1, stride=1, padding=0)
        self.SE_Connect = SE_Connect(out_channels, se_bottleneck_dim)
        self.shortcut = None
        if in_channels != out_channels:
            self.shortcut = nn.Conv1d(in_channels, out_channels, kernel_size=1)

    def forward(self, x):
        residual = x if self.shortcut is None else self.shortcut(x)
        x = self.Conv1dReluBn2(self.Res2Conv1dReluBn(self.Conv1dReluBn1(x)))
        return self.SE_Connect(x) + residual


class AttentiveStatsPool(nn.Module):
    """Attentive statistics pooling over time (no global context, as ECAPA_TDNN_SMALL):

    ``alpha = softmax_t(W_2 tanh(W_1 x + b_1) + b_2)`` (one weight per channel and frame),
    ``mu = sum_t alpha * x``, ``sigma = sqrt(max(sum_t alpha * x^2 - mu^2, 1e-9))``, output ``[mu; sigma]``.
    """

    def __init__(self, in_dim, attention_channels=128):
        super().__init__()
        self.linear1 = nn.Conv1d(in_dim, attention_channels, kernel_size=1)
        self.linear2 = nn.Conv1d(attention_channels, in_dim, kernel_size=1)

    def forward(self, x):
        alpha = torch.softmax(self.linear2(torch.tanh(self.linear1(x))), dim=2)
        mean = torch.sum(alpha * x, dim=2)
        var = torch.sum(alpha * x**2, dim=2) - mean**2
        return torch.cat([mean, torch.sqrt(var.clamp(min=1e-9))], dim=1)


@dataclass(frozen=True)
class EcapaShape:
    """ECAPA_TDNN_SMALL's sizes; the defaults are Seed-TTS-eval's (``feat_dim=1024``, WavLM-large's 25 states)."""

    feat_dim: int = 1024
    n_layers: int = 25
    channels: int = 512
    pooled_channels: int = 1536
    attention_channels: int = 128
    se_bottleneck_dim: int = 128
    scale: int = 8
    emb_dim: int = 256


class EcapaTdnnHead(nn.Module):
    """ECAPA_TDNN on the hidden states of a self-supervised front end (UniSpeech ``ECAPA_TDNN.get_feat`` + forward):

    ``h = InstanceNorm_t(sum_l softmax(w)_l H_l + 1e-6)`` over the front end's L hidden states ``H_l`` [T, D],
    ``o_1 = layer1(h)``, ``o_k = layer_k(o_{k-1})`` for k = 2, 3, 4 (SE-Res2 blocks with dilations 2, 3, 4),
    ``e = linear(BN(pool(ReLU(conv([o_2; o_3; o_4])))))``.
    """

    def __init__(self, shape: EcapaShape = EcapaShape()):
        super().__init__()
        c = shape.channels
        self.feature_weight = nn.Parameter(torch.zeros(shape.n_layers))
        self.instance_norm = nn.InstanceNorm1d(shape.feat_dim)
        self.layer1 = Conv1dReluBn(shape.feat_dim, c, kernel_size=5, padding=2)
        blocks = {"scale": shape.scale, "se_bottleneck_dim": shape.se_bottleneck_dim}
        self.layer2 = SE_Res2Block(c, c, kernel_size=3, stride=1, padding=2, dilation=2, **blocks)
        self.layer3 = SE_Res2Block(c, c, kernel_size=3, stride=1, padding=3, dilation=3, **blocks)
        self.layer4 = SE_Res2Block(c, c, kernel_size=3, stride=1, padding=4, dilation=4, **blocks)
        self.conv = nn.Conv1d(3 * c, shape.pooled_channels, kernel_size=1)
        self.pooling = AttentiveStatsPool(shape.pooled_channels, attention_channels=shape.attention_channels)
        self.bn = nn.BatchNorm1d(shape.pooled_channels * 2)
        self.linear = nn.Linear(shape.pooled_channels * 2, shape.emb_dim)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Embeddings [B, emb_dim] of hidden states [L, B, T, D]."""
        weights = F.softmax(self.feature_weight, dim=-1)
        x = torch.einsum("l,lbtd->bdt", weights, hidden_states) + 1e-6
        x = self.instance_norm(x)
        out2 = self.layer2(self.layer1(x))
        out3 = self.layer3(out2)
        out4 = self.layer4(out3)
        out = F.relu(self.conv(torch.cat([out2, out3, out4], dim=1)))
        return self.linear(self.bn(self.pooling(out)))


def ecapa_shape_of(head_state: Mapping[str, torch.Tensor]) -> EcapaShape:
    """The head's sizes read off its checkpoint tensors."""
    need = ["feature_weight", "layer1.conv.weight", "conv.weight", "pooling.linear1.weight"]
    need += ["layer2.SE_Connect.linear1.weight", "layer2.Res2Conv1dReluBn.convs.0.weight", "linear.weight"]
    absent = [k for k in need if k not in head_state]
    if absent:
        raise KeyError(f"speaker checkpoint: the ECAPA-TDNN head lacks {absent} (not an ECAPA_TDNN state dict?)")
    channels, feat_dim = head_state["layer1.conv.weight"].shape[:2]
    return EcapaShape(
        feat_dim=int(feat_dim),
        n_layers=int(head_state["feature_weight"].shape[0]),
        channels=int(channels),
        pooled_channels=int(head_state["conv.weight"].shape[0]),
        attention_channels=int(head_state["pooling.linear1.weight"].shape[0]),
        se_bottleneck_dim=int(head_state["layer2.SE_Connect.linear1.weight"].shape[0]),
        scale=int(channels) // int(head_state["layer2.Res2Conv1dReluBn.convs.0.weight"].shape[0]),
        emb_dim=int(head_state["linear.weight"].shape[0]),
    )


def _count(state: Mapping[str, torch.Tensor], indexed: str) -> int:
    """1 + the largest index ``(\\d+)`` of the names matching ``indexed``; 0 when none does."""
    found = [int(m.group(1)) for k in state if (m := re.match(indexed, k))]
    return 1 + max(found) if found else 0


def wavlm_config_of(wavlm_state: Mapping[str, torch.Tensor]):
    """transformers' `WavLMConfig` of a WavLM-Large-style model (layer-norm conv stack, pre-LN transformer, gated
    relative position bias) read off its s3prl-named tensors; the strides follow WavLM's conv stack."""
    from transformers import WavLMConfig

    def tensor(name):
        if name not in wavlm_state:
            raise KeyError(f"speaker checkpoint: {FRONT_END_PREFIX}{name} missing (not a WavLM-Large front end?)")
        return wavlm_state[name]

    n_conv = max(_count(wavlm_state, r"feature_extractor\.conv_layers\.(\d+)\."), 1)
    conv = [tensor(f"feature_extractor.conv_layers.{i}.0.weight") for i in range(n_conv)]
    if f"feature_extractor.conv_layers.{n_conv - 1}.2.1.weight" not in wavlm_state:
        raise KeyError(
            f"speaker checkpoint: {FRONT_END_PREFIX}feature_extractor.conv_layers.N.2.1.weight missing: "
            "WavLM-Large's layer-norm conv stack expected (a group-norm 'default' extractor is WavLM Base)"
        )
    kernels = [int(w.shape[2]) for w in conv]
    unknown = sorted(set(kernels) - set(CONV_STRIDE_BY_KERNEL))
    if unknown:
        raise ValueError(
            f"speaker checkpoint: conv kernel widths {unknown}; WavLM uses {sorted(CONV_STRIDE_BY_KERNEL)}"
        )
    pos_v = "encoder.pos_conv.0.parametrizations.weight.original1"
    hidden, conv_groups_width, pos_kernel = tensor(
        pos_v if pos_v in wavlm_state else "encoder.pos_conv.0.weight_v"
    ).shape
    n_layers = _count(wavlm_state, r"encoder\.layers\.(\d+)\.")
    return WavLMConfig(
        hidden_size=int(hidden),
        num_hidden_layers=n_layers,
        num_attention_heads=int(tensor("encoder.layers.0.self_attn.grep_a").shape[1]),
        intermediate_size=int(tensor("encoder.layers.0.fc1.weight").shape[0]),
        conv_dim=[int(w.shape[0]) for w in conv],
        conv_kernel=kernels,
        conv_stride=[CONV_STRIDE_BY_KERNEL[k] for k in kernels],
        conv_bias="feature_extractor.conv_layers.0.0.bias" in wavlm_state,
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
        num_conv_pos_embeddings=int(pos_kernel),
        num_conv_pos_embedding_groups=int(hidden) // int(conv_groups_width),
        num_buckets=int(tensor("encoder.layers.0.self_attn.relative_attention_bias.weight").shape[0]),
        max_bucket_distance=MAX_BUCKET_DISTANCE,
        mask_time_prob=0.0,  # no masked_spec_embed parameter: s3prl's mask_emb is unused at inference
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        feat_proj_dropout=0.0,
        layerdrop=0.0,
    )


def _hf_pos_conv_names(model_keys: Sequence[str]) -> dict[str, str]:
    """transformers keeps the positional conv's weight norm as ``weight_g``/``weight_v`` or, with torch's
    parametrizations, ``parametrizations.weight.original0``/``original1``: whichever this model has."""
    base = "encoder.pos_conv_embed.conv."
    if base + "parametrizations.weight.original0" in model_keys:
        return {
            base + "weight_g": base + "parametrizations.weight.original0",
            base + "weight_v": base + "parametrizations.weight.original1",
        }
    return {}


def read_checkpoint_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The ``model`` state dict of a UniSpeech/Seed-TTS-eval speaker-verification checkpoint (or a bare state dict)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"speaker checkpoint {path}: no such file (Seed-TTS-eval's wavlm_large_finetune.pth)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        logger.warning("%s holds more than tensors; loading it with pickle (a local file you named)", path)
        payload = torch.load(path, map_location="cpu", weights_only=False)
    state = payload.get("model", payload) if isinstance(payload, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"speaker checkpoint {path}: expected a dict with a 'model' state dict (UniSpeech's layout)")
    return state


class WavLMEcapa(nn.Module):
    """WavLM (transformers) -> ECAPA-TDNN head; ``forward`` embeds one 16 kHz waveform [T] into [emb_dim]."""

    def __init__(self, wavlm_config, shape: EcapaShape):
        super().__init__()
        from transformers import WavLMModel

        if shape.n_layers != wavlm_config.num_hidden_layers + 1:
            raise ValueError(
                f"speaker checkpoint: feature_weight has {shape.n_layers} entries but WavLM has "
                f"{wavlm_config.num_hidden_layers} layers ({wavlm_config.num_hidden_layers + 1} hidden states)"
            )
        if shape.feat_dim != wavlm_config.hidden_size:
            raise ValueError(
                f"speaker checkpoint: ECAPA feat_dim {shape.feat_dim} != WavLM width {wavlm_config.hidden_size}"
            )
        self.wavlm = WavLMModel(wavlm_config)
        self.head = EcapaTdnnHead(shape)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        wav = F.layer_norm(wav, wav.shape)  # s3prl's wavlm expert with WavLM-Large's cfg.normalize = True
        hidden = self.wavlm(wav[None], output_hidden_states=True).hidden_states
        return self.head(torch.stack(hidden))[0]

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> WavLMEcapa:
        return cls.from_state_dict(read_checkpoint_state(path), source=str(path))

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor], source: str = "state dict") -> WavLMEcapa:
        """The model with every tensor of ``state`` (UniSpeech names) in place; strict, up to the documented
        exceptions: unknown or missing keys and shape mismatches are an error naming them."""
        state = {k: v for k, v in state.items() if k not in IGNORED_CHECKPOINT_KEYS}
        wavlm_state = {k[len(FRONT_END_PREFIX) :]: v for k, v in state.items() if k.startswith(FRONT_END_PREFIX)}
        head_state = {k: v for k, v in state.items() if not k.startswith(FRONT_END_PREFIX)}
        model = cls(wavlm_config_of(wavlm_state), ecapa_shape_of(head_state))

        expected = model.state_dict()
        pos_conv = _hf_pos_conv_names(list(model.wavlm.state_dict()))
        mapped: dict[str, tuple[str, torch.Tensor]] = {}  # model name -> (checkpoint name, tensor)
        unexpected = []
        for name, value in wavlm_state.items():
            hf = s3prl_to_hf(name)
            if hf is None:
                unexpected.append(FRONT_END_PREFIX + name)
            else:
                mapped["wavlm." + pos_conv.get(hf, hf)] = (FRONT_END_PREFIX + name, value)
        mapped.update({"head." + k: (k, v) for k, v in head_state.items()})

        unexpected += [origin for k, (origin, _) in mapped.items() if k not in expected]
        missing = [k for k in expected if k not in mapped and not OPTIONAL_MODEL_KEYS.match(k)]
        shapes = [
            f"{origin} {tuple(v.shape)} (model {tuple(expected[k].shape)})"
            for k, (origin, v) in mapped.items()
            if k in expected and v.shape != expected[k].shape
        ]
        problems = []
        if unexpected:
            problems.append(f"unexpected keys {sorted(unexpected)}")
        if missing:
            problems.append(f"missing keys {sorted(missing)} (model names: wavlm.* transformers, head.* UniSpeech)")
        if shapes:
            problems.append(f"shape mismatches {shapes}")
        if problems:
            raise KeyError(f"speaker checkpoint {source}: " + "; ".join(problems))
        model.load_state_dict({k: v for k, (_, v) in mapped.items()}, strict=False)
        return model.eval()
