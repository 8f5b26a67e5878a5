"""Speech-token layouts: how a TTS language model's vocabulary holds codec codes, one module per fact.

Llasa-1B with XCodec2 is the layout here; another model's layout sits beside it with its own prefix.

- `reward_fns.speech_tokens.llasa_tokens`: Llasa-1B's vocabulary layout (tags, codec offset, codebook size) and
  `LlasaVocabulary`, the one type that maps vocabulary ids to codec ids and checks a tokenizer against the layout;
- `reward_fns.speech_tokens.llasa_prompt`: Llasa's chat template and the rendering of a TTS prompt;
- `reward_fns.speech_tokens.llasa_generation`: stopping generation at ``<|SPEECH_GENERATION_END|>``;
- `reward_fns.speech_tokens.xcodec2_fsq`: XCodec2's FSQ lattice (digits of a codec id, distances between codes, the
  zero code).
"""
