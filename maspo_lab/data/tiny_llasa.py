"""A tiny, randomly initialised Llama with Llasa-1B's exact vocabulary, built offline in seconds.

The tokenizer keeps every id Llasa-1B has (`maspo_base.speech_tokens.llasa_tokens`): ids 0..127999 are text (a
byte-level BPE with a few merges learned from the prompts, the rest filler entries that no text encodes to),
128000..128255 are Llama-3.2's special tokens under their Llama-3.2 names (``<|begin_of_text|>`` 128000, ``<|eot_id|>``
128009, ...), 128256..128263 Llasa's 8 tags and 128264.. ``<|s_0|>`` .. ``<|s_65535|>``. Tags and codes are ordinary
added tokens, as in Llasa-1B: they survive ``skip_special_tokens=True``.

Its chat template is Llama-3.2's; veRL renders Llasa prompts with
`maspo_base.speech_tokens.llasa_prompt.SPEECH_CHAT_TEMPLATE`. The model is the lab's speech Llama
(`maspo_lab.speech_llama`): generation stops at ``<|SPEECH_GENERATION_END|>`` or ``<|eot_id|>`` (its
``generation_config.eos_token_id``). Like Llasa-1B's, its folder declares no layout (no ``speech_tokens.json``):
it is read as Llasa-1B's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens.layouts import LLASA_1B
from maspo_base.speech_tokens.llasa_prompt import LLAMA32_CHAT_TEMPLATE, SYSTEM_HEADER_TEXT
from maspo_lab.speech_llama import build_speech_llama

_LLAMA32_SPECIALS = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    4: "<|finetune_right_pad_id|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    8: "<|eom_id|>",
    9: "<|eot_id|>",
    10: "<|python_tag|>",
}


def llama32_special_tokens() -> list[str]:
    """Llama-3.2's 256 special tokens, ids 128000..128255, named as in Llama-3.2."""
    names, reserved = [], 0
    for i in range(256):
        if i in _LLAMA32_SPECIALS:
            names.append(_LLAMA32_SPECIALS[i])
        else:
            names.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return names


def build_tokenizer(corpus: Iterable[str] = (), merges: int = 400):
    """A ``PreTrainedTokenizerFast`` with Llasa-1B's id layout.

    ``corpus``: texts whose frequent byte pairs become BPE merges (plus the fixed prompt text), so prompts stay short;
    at most ``merges`` learned entries. The text part then is filled up to 128,000 ids with entries no text produces.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    fixed = [SYSTEM_HEADER_TEXT, "Convert the text to speech:"]
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = byte_level
    learner.train_from_iterator(
        [*fixed * 8, *corpus],
        trainers.BpeTrainer(
            vocab_size=256 + merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        ),
    )
    model = json.loads(learner.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    learned = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    for i in range(len(vocab), lt.LLAMA3_VOCAB_SIZE - 256):
        vocab[f"<|text_filler_{i}|>"] = i

    tok = Tokenizer(models.BPE(vocab=vocab, merges=learned))
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in llama32_special_tokens()])
    llasa_added = [*lt.TAGS, *(lt.speech_token(c) for c in range(lt.CODEBOOK_SIZE))]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in llasa_added])

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = LLAMA32_CHAT_TEMPLATE
    LLASA_1B.check_tokenizer(tokenizer)
    if len(tokenizer) != lt.VOCAB_SIZE:
        raise AssertionError(f"tiny Llasa tokenizer has {len(tokenizer)} ids, Llasa-1B has {lt.VOCAB_SIZE}")
    return tokenizer


def build_tiny_llasa(
    out_dir: str | Path,
    *,
    corpus: Iterable[str] = (),
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 512,
    seed: int = 0,
) -> Path:
    """Build and ``save_pretrained`` a randomly initialised Llasa-shaped ``LlamaForCausalLM`` and its tokenizer.

    The lab's speech Llama (`maspo_lab.speech_llama.build_speech_llama`: tied embeddings, as in Llama-3.2-1B;
    ``vocab_size`` Llasa-1B's 193,800; generation stops at ``<|SPEECH_GENERATION_END|>`` or ``<|eot_id|>``) with
    Llama-3.2's rotary base, an MLP twice ``hidden_size`` and half as many key/value heads. Returns ``out_dir``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(corpus)
    tokenizer.save_pretrained(out)
    model = build_speech_llama(
        tokenizer,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=max(1, num_heads // 2),
        max_positions=max_positions,
        rope_theta=500000.0,
        seed=seed,
    )
    model.save_pretrained(out)
    return out
