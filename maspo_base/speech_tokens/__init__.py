"""Speech-token layouts: how a TTS language model's vocabulary holds codec codes, one module per fact.

Each model's layout is a `SpeechTokenLayout`, registered by name; Llasa-1B with XCodec2 and mini-llasa with the
mini codec are the layouts here, each model's modules with its own prefix.

- `maspo_base.speech_tokens.layouts`: the registered layouts (`LLASA_1B`, `MINI_LLASA`, `get_layout`); the type that
  maps vocabulary ids to codec ids and checks a tokenizer against a layout, and the registry, are
  `maspo_base.speech_tokens.speech_token_layout`;
- `maspo_base.speech_tokens.llasa_tokens`: Llasa-1B's vocabulary (tags, codec offset, codebook size);
- `maspo_base.speech_tokens.mini_llasa_tokens`: mini-llasa's vocabulary (1,137 ids) and its layout;
- `maspo_base.speech_tokens.llasa_prompt`: Llasa's chat template and the rendering of a TTS prompt;
- `maspo_base.speech_tokens.text_frontend`: what a checkpoint's model reads for the text (the text as written, or
  espeak-ng's phonemes), declared by its tokenizer;
- `maspo_base.speech_tokens.llasa_generation`: the ids speech generation stops at (one rule for every sampler);
- `maspo_base.speech_tokens.fsq`: an FSQ lattice in general (digits of a codec id, distances between codes, the zero
  code);
- `maspo_base.speech_tokens.xcodec2_fsq`: XCodec2's 8 x 4 lattice and its fused fast path.
"""
