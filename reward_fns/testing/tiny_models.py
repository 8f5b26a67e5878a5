"""Tiny randomly initialised checkpoints, written in the real on-disk formats, for tests and CPU benchmarks.

The weights are random: the audio a tiny codec decodes is noise-like and the transcripts of a tiny Paraformer are
arbitrary characters. What is real is every class and every loading path: `XCodec2Decoder.from_pretrained` reads
the directory `write_tiny_xcodec2` writes, and FunASR's ``AutoModel(model=<dir>)`` reads the one
`write_tiny_paraformer` writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from maspo_verl.llasa.tokens import CODEBOOK_SIZE, SPEECH_GENERATION_END
from reward_fns.codec import XCodec2Decoder

TINY_CODEC = {"hidden_size": 64, "depth": 1, "heads": 4, "vq_dim": 256}
TINY_PARAFORMER_CHARS = "你好世界今天气很不错我们一起去公园散步吧"


def write_tiny_xcodec2(directory: str | Path, seed: int = 0) -> Path:
    """An XCodec2 decoder checkpoint (~0.2M parameters, random) in XCodec2's ``config.json`` + safetensors layout."""
    torch.manual_seed(seed)
    return XCodec2Decoder(**TINY_CODEC).save_pretrained(directory)


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
    config = {
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


def random_codes(n: int, seed: int) -> np.ndarray:
    """``n`` uniformly random XCodec2 ids (int64), reproducible from ``seed``."""
    return np.random.default_rng(seed).integers(0, CODEBOOK_SIZE, n)


def speech_response(codes, end: bool = True) -> str:
    """A Llasa response string as veRL decodes it: ``<|s_N|>`` tokens, closed by the stop tag unless ``end=False``."""
    return "".join(f"<|s_{int(c)}|>" for c in codes) + (SPEECH_GENERATION_END if end else "")
