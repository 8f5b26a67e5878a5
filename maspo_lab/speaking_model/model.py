"""mini-llasa: a small ``LlamaForCausalLM`` with Llasa-1B's prompt format and a 1,137-id vocabulary.

The tokenizer is `maspo_base.speech_tokens.mini_llasa_tokens`' vocabulary as a ``PreTrainedTokenizerFast``: a BPE
model with no merges over every token (so text splits into characters; a character outside the table is
``<|unk|>``), Llama-3.2's special tokens as special added tokens, Llasa's tags, the prompt's two fixed texts and
the ``<|s_N|>`` codes as ordinary added tokens (they survive ``skip_special_tokens=True``, as in Llasa-1B). Its chat
template renders Llasa's TTS prompt (`maspo_base.speech_tokens.llasa_prompt.SPEECH_CHAT_TEMPLATE`).

The checkpoint folder is what ``from_pretrained`` reads, plus ``speech_tokens.json`` naming its layout
(``mini-llasa``), so that tools find the layout from the checkpoint (`layout_of_checkpoint`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from maspo_base.speech_tokens import mini_llasa_tokens as mt
from maspo_base.speech_tokens.checkpoint_layout import LAYOUT_FILE, checkpoint_layout_name
from maspo_base.speech_tokens.layouts import SpeechTokenLayout, get_layout
from maspo_base.speech_tokens.llasa_prompt import SPEECH_CHAT_TEMPLATE
from maspo_base.speech_tokens.mini_llasa_tokens import MINI_LLASA
from maspo_base.speech_tokens.text_frontend import (
    PLAIN,
    SPEAKER_KEY,
    SPEAKERS_KEY,
    TEXT_FRONTEND_KEY,
    get_frontend,
    speaker_tag,
)
from maspo_lab.speech_llama import build_speech_llama


@dataclass(frozen=True)
class ModelSize:
    """The Llama's sizes (`build_model`); the shipped checkpoint's are the defaults. ``maspo-verl build-model`` has a
    flag per size but ``num_kv_heads`` (= ``num_heads``) and ``max_positions``."""

    hidden_size: int = 256
    num_layers: int = field(default=11, metadata={"flag": "--layers"})
    num_heads: int = field(default=4, metadata={"flag": "--heads"})
    num_kv_heads: int = 4
    intermediate_size: int = 768
    max_positions: int = 512


def build_tokenizer(text_frontend: str = PLAIN, speaker: str | None = None, speakers: Sequence[str] = ()):
    """The mini-llasa tokenizer (module docstring), checked against the layout, declaring ``text_frontend``
    (`maspo_base.speech_tokens.text_frontend`) when it is not the text as written, and ``speaker`` (the voice it
    speaks in) and ``speakers`` (every voice it learns) when the model learns several voices."""
    get_frontend(text_frontend)
    for voice in ([speaker] if speaker is not None else []) + list(speakers):
        speaker_tag(voice)
    if speakers and speaker not in speakers:
        raise ValueError(f"{SPEAKER_KEY} {speaker!r} is not one of its {SPEAKERS_KEY} {list(speakers)}")
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    tokens = mt.vocabulary()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], unk_token=mt.UNK))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in mt.SPECIAL_TOKENS])
    ordinary = [t for t in tokens[len(mt.SPECIAL_TOKENS) :] if t not in mt.CHARACTERS]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ordinary])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=mt.BOS,
        eos_token=mt.EOT,
        pad_token=mt.PAD,
        unk_token=mt.UNK,
        clean_up_tokenization_spaces=False,
        **({TEXT_FRONTEND_KEY: text_frontend} if text_frontend != PLAIN else {}),
        **({SPEAKER_KEY: speaker} if speaker else {}),
        **({SPEAKERS_KEY: list(speakers)} if speakers else {}),
    )
    tokenizer.chat_template = SPEECH_CHAT_TEMPLATE
    MINI_LLASA.check_tokenizer(tokenizer)
    if len(tokenizer) != mt.VOCAB_SIZE:
        raise AssertionError(f"mini-llasa tokenizer has {len(tokenizer)} ids, its layout {mt.VOCAB_SIZE}")
    return tokenizer


def build_model(
    out_dir: str | Path,
    size: ModelSize = ModelSize(),
    seed: int = 0,
    text_frontend: str = PLAIN,
    speaker: str | None = None,
    speakers: Sequence[str] = (),
) -> Path:
    """Write a randomly initialised mini-llasa (the lab's speech Llama, `maspo_lab.speech_llama`, of ``size``: model,
    tokenizer, generation config, layout file) to ``out_dir``; ``text_frontend``, ``speaker`` and ``speakers`` as
    `build_tokenizer`."""
    tokenizer = build_tokenizer(text_frontend, speaker, speakers)
    model = build_speech_llama(tokenizer, **asdict(size), rope_theta=10000.0, seed=seed)
    return save_checkpoint(model, tokenizer, out_dir, extra={"size": asdict(size), "seed": seed})


def save_checkpoint(model, tokenizer, out_dir: str | Path, extra: dict | None = None) -> Path:
    """``save_pretrained`` of model and tokenizer, and the layout file."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / LAYOUT_FILE).write_text(json.dumps({"layout": MINI_LLASA.name, **(extra or {})}, indent=1) + "\n")
    return out


def layout_of_checkpoint(model_dir: str | Path, tokenizer=None) -> SpeechTokenLayout:
    """The speech-token layout a checkpoint declares in ``speech_tokens.json`` (Llasa-1B's when it has none:
    `maspo_base.speech_tokens.checkpoint_layout`), with the ids read off its tokenizer and checked."""
    layout = get_layout(checkpoint_layout_name(model_dir))
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return layout.from_tokenizer(tokenizer)
