"""The one builder of the lab's speech models: a randomly initialised ``LlamaForCausalLM`` over a speech tokenizer.

Both models the lab builds are this Llama with a vocabulary of their own: mini-llasa
(`maspo_lab.speaking_model.model.build_model`, 1,137 ids) and the tiny Llasa of the synthetic task
(`maspo_lab.data.tiny_llasa.build_tiny_llasa`, Llasa-1B's 193,800 ids). What they share is built here once: the
vocabulary is the tokenizer's, the embeddings are tied (as in Llama-3.2-1B), the special ids are the tokenizer's,
and the model's config and generation config both end generation at `eos_token_ids`, the end of speech then the end
of turn. Every sampler reads those ids back by one rule (`maspo_base.speech_tokens.llasa_generation.stop_ids`).
"""

from __future__ import annotations

from maspo_base.speech_tokens import llasa_tokens as lt


def eos_token_ids(tokenizer) -> list[int]:
    """The ``eos_token_id`` a built model declares: ``<|SPEECH_GENERATION_END|>``, then the tokenizer's end of turn
    (``<|eot_id|>``, its ``eos_token``)."""
    end = tokenizer.convert_tokens_to_ids(lt.SPEECH_GENERATION_END)
    if end is None or end == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no {lt.SPEECH_GENERATION_END}: a speech model must end speech with it")
    return [end, tokenizer.eos_token_id]


def build_speech_llama(
    tokenizer,
    *,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    max_positions: int,
    rope_theta: float,
    seed: int,
):
    """A randomly initialised ``LlamaForCausalLM`` (weights from ``torch.manual_seed(seed)``) of these sizes over
    ``tokenizer``'s vocabulary, ending generation at `eos_token_ids` (module docstring); not saved."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    stops = eos_token_ids(tokenizer)
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": stops, "pad_token_id": tokenizer.pad_token_id}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        rope_theta=rope_theta,
        **special,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**special)
    return model
