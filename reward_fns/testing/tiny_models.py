"""Tiny randomly initialised checkpoints, written in the real on-disk formats, for tests and CPU benchmarks.

The weights are random: the audio a tiny codec decodes is noise-like and the transcripts of a tiny Paraformer are
arbitrary characters. What is real is every class and every loading path: `XCodec2Decoder.from_pretrained` reads
the directory `write_tiny_xcodec2` writes, FunASR's ``AutoModel(model=<dir>)`` reads the one
`write_tiny_paraformer` writes, and `WavLMEcapa.from_checkpoint` reads the file `write_tiny_wavlm_ecapa` writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from maspo_base.speech_tokens.llasa_tokens import CODEBOOK_SIZE, SPEECH_GENERATION_END
from maspo_base.xcodec2_decoder import XCodec2Decoder

TINY_CODEC = {"hidden_size": 64, "depth": 1, "heads": 4, "vq_dim": 256}
TINY_PARAFORMER_CHARS = "你好世界今天气很不错我们一起去公园散步吧"


def write_tiny_xcodec2(directory: str | Path, seed: int = 0) -> Path:
    """An XCodec2 decoder checkpoint (~0.2M parameters, random) in XCodec2's ``config.json`` + safetensors layout."""
    torch.manual_seed(seed)
    return XCodec2Decoder(**TINY_CODEC).save_pretrained(directory)


TINY_PARAFORMER_CONFIG = {
    "model": "Paraformer",
    "model_conf": {"ctc_weight": 0.0, "lsm_weight": 0.1, "predictor_weight": 1.0, "predictor_bias": 1},
    "encoder": "SANMEncoder",
    "encoder_conf": {
        "output_size": 32,
        "attention_heads": 2,
        "linear_units": 64,
        "num_blocks": 2,
        "dropout_rate": 0.0,
        "positional_dropout_rate": 0.0,
        "attention_dropout_rate": 0.0,
        "input_layer": "pe",
        "pos_enc_class": "SinusoidalPositionEncoder",
        "normalize_before": True,
        "kernel_size": 11,
        "sanm_shfit": 0,
        "selfattention_layer_type": "sanm",
    },
    "decoder": "ParaformerSANMDecoder",
    "decoder_conf": {
        "attention_heads": 2,
        "linear_units": 64,
        "num_blocks": 2,
        "dropout_rate": 0.0,
        "positional_dropout_rate": 0.0,
        "self_attention_dropout_rate": 0.0,
        "src_attention_dropout_rate": 0.0,
        "att_layer_num": 2,
        "kernel_size": 11,
        "sanm_shfit": 0,
    },
    "predictor": "CifPredictorV2",
    "predictor_conf": {"idim": 32, "threshold": 1.0, "l_order": 1, "r_order": 1, "tail_threshold": 0.45},
    "frontend": "WavFrontend",
    "frontend_conf": {
        "fs": 16000,
        "window": "hamming",
        "n_mels": 80,
        "frame_length": 25,
        "frame_shift": 10,
        "lfr_m": 7,
        "lfr_n": 6,
    },
    "tokenizer": "CharTokenizer",
    "tokenizer_conf": {"unk_symbol": "<unk>", "split_with_space": True},
}
"""paraformer-zh's ``config.yaml`` at 2 blocks of width 32 (``write_tiny_paraformer``)."""


def write_tiny_paraformer(directory: str | Path, seed: int = 0) -> Path:
    """A FunASR Paraformer directory (``config.yaml``, ``model.pt``, ``tokens.json``, ``am.mvn``), random weights.

    Same classes as ``paraformer-zh`` (SANM encoder, SANM decoder, CIF predictor, WavFrontend with LFR 7/6), with
    2 blocks of width 32 instead of 50 + 16 blocks of width 512.
    """
    import yaml
    from funasr.models.paraformer.model import Paraformer

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tokens = ["<blank>", "<s>", "</s>", *TINY_PARAFORMER_CHARS, "<unk>"]
    feat_dim = 80 * 7  # n_mels * lfr_m
    config = TINY_PARAFORMER_CONFIG
    (root / "config.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
    (root / "tokens.json").write_text(json.dumps(tokens, ensure_ascii=False))
    # Kaldi nnet text format that funasr.frontends.wav_frontend.load_cmvn reads: x' = (x + shift) * scale.
    shift, scale = " ".join(["-8.0"] * feat_dim), " ".join(["0.3"] * feat_dim)
    (root / "am.mvn").write_text(
        f"<Nnet>\n<Splice> {feat_dim} {feat_dim}\n[ 0 ]\n"
        f"<AddShift> {feat_dim} {feat_dim}\n<LearnRateCoef> 0 [ {shift} ]\n"
        f"<Rescale> {feat_dim} {feat_dim}\n<LearnRateCoef> 0 [ {scale} ]\n</Nnet>\n"
    )
    torch.manual_seed(seed)
    model = Paraformer(
        encoder=config["encoder"],
        encoder_conf=config["encoder_conf"],
        decoder=config["decoder"],
        decoder_conf=config["decoder_conf"],
        predictor=config["predictor"],
        predictor_conf=config["predictor_conf"],
        input_size=feat_dim,
        vocab_size=len(tokens),
        **config["model_conf"],
    )
    torch.save(model.state_dict(), root / "model.pt")
    return root


TINY_WAVLM = {
    "conv": [(16, 10, 5), (16, 3, 2), (16, 3, 2), (16, 2, 2)],  # (dim, kernel, stride); WavLM-Large: [(512,10,5)] + ...
    "hidden": 32,
    "layers": 2,
    "heads": 2,
    "ffn": 64,
    "pos_kernel": 16,
    "pos_groups": 4,
    "buckets": 32,
}
TINY_ECAPA = {"channels": 16, "pooled_channels": 24, "attention_channels": 8, "se_bottleneck_dim": 8, "emb_dim": 12}


def s3prl_wavlm_shapes(conv, hidden, layers, heads, ffn, pos_kernel, pos_groups, buckets) -> dict[str, tuple]:
    """Names and shapes of a WavLM-Large-style model's tensors as s3prl's ``upstream/wavlm/WavLM.py`` names them
    (``extractor_mode='layer_norm'``, ``relative_position_embedding`` and ``gru_rel_pos`` on), written out from that
    file, independently of the renaming in `reward_fns.wavlm_ecapa`."""
    shapes: dict[str, tuple] = {}
    in_dim = 1
    for i, (dim, kernel, _) in enumerate(conv):
        shapes[f"feature_extractor.conv_layers.{i}.0.weight"] = (dim, in_dim, kernel)  # conv, bias=False
        shapes[f"feature_extractor.conv_layers.{i}.2.1.weight"] = (dim,)  # Sequential(TransposeLast, LayerNorm, ..)
        shapes[f"feature_extractor.conv_layers.{i}.2.1.bias"] = (dim,)
        in_dim = dim
    shapes |= {"layer_norm.weight": (in_dim,), "layer_norm.bias": (in_dim,)}
    shapes |= {"post_extract_proj.weight": (hidden, in_dim), "post_extract_proj.bias": (hidden,)}
    shapes["mask_emb"] = (hidden,)
    shapes["encoder.pos_conv.0.weight_g"] = (1, 1, pos_kernel)  # weight_norm(dim=2)
    shapes["encoder.pos_conv.0.weight_v"] = (hidden, hidden // pos_groups, pos_kernel)
    shapes["encoder.pos_conv.0.bias"] = (hidden,)
    for i in range(layers):
        layer = f"encoder.layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            shapes |= {f"{layer}self_attn.{proj}.weight": (hidden, hidden), f"{layer}self_attn.{proj}.bias": (hidden,)}
        shapes |= {
            f"{layer}self_attn.grep_linear.weight": (8, hidden // heads),
            f"{layer}self_attn.grep_linear.bias": (8,),
        }
        shapes[f"{layer}self_attn.grep_a"] = (1, heads, 1, 1)
        if i == 0:  # has_relative_attention_bias only in the first layer
            shapes[f"{layer}self_attn.relative_attention_bias.weight"] = (buckets, heads)
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            shapes |= {f"{layer}{norm}.weight": (hidden,), f"{layer}{norm}.bias": (hidden,)}
        shapes |= {f"{layer}fc1.weight": (ffn, hidden), f"{layer}fc1.bias": (ffn,)}
        shapes |= {f"{layer}fc2.weight": (hidden, ffn), f"{layer}fc2.bias": (hidden,)}
    shapes |= {"encoder.layer_norm.weight": (hidden,), "encoder.layer_norm.bias": (hidden,)}
    return shapes


def write_tiny_wavlm_ecapa(path: str | Path, seed: int = 0) -> Path:
    """A speaker-verification checkpoint in UniSpeech's / Seed-TTS-eval's ``wavlm_large_finetune.pth`` layout,
    ``{"model": state_dict}`` with the s3prl front end under ``feature_extract.model.``, tiny and random: every
    tensor drawn independently (BatchNorm variances positive), so no two are equal."""
    from reward_fns.wavlm_ecapa import FRONT_END_PREFIX, EcapaShape, EcapaTdnnHead

    generator = torch.Generator().manual_seed(seed)
    wavlm = s3prl_wavlm_shapes(**TINY_WAVLM)
    head = EcapaTdnnHead(EcapaShape(feat_dim=TINY_WAVLM["hidden"], n_layers=TINY_WAVLM["layers"] + 1, **TINY_ECAPA))
    shapes = {FRONT_END_PREFIX + k: v for k, v in wavlm.items()}
    shapes |= {k: tuple(v.shape) for k, v in head.state_dict().items() if not k.endswith("num_batches_tracked")}
    state = {}
    for name, shape in shapes.items():
        if name.endswith("running_var"):
            state[name] = 0.5 + torch.rand(shape, generator=generator)
        else:
            state[name] = 0.3 * torch.randn(shape, generator=generator)
    state |= {k: torch.tensor(100) for k in head.state_dict() if k.endswith("num_batches_tracked")}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state}, path)
    return path


def random_codes(n: int, seed: int) -> np.ndarray:
    """``n`` uniformly random XCodec2 ids (int64), reproducible from ``seed``."""
    return np.random.default_rng(seed).integers(0, CODEBOOK_SIZE, n)


def speech_response(codes, end: bool = True) -> str:
    """A Llasa response string as veRL decodes it: ``<|s_N|>`` tokens, closed by the stop tag unless ``end=False``."""
    return "".join(f"<|s_{int(c)}|>" for c in codes) + (SPEECH_GENERATION_END if end else "")
