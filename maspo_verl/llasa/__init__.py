"""Llasa-1B and XCodec2 facts, one home each.

- `maspo_verl.llasa.tokens`: the vocabulary layout (tags, codec offset, codebook size) and `LlasaVocabulary`, the one
  type that maps vocabulary ids to codec ids and checks a tokenizer against the layout;
- `maspo_verl.llasa.prompt`: the chat template and the rendering of a TTS prompt;
- `maspo_verl.llasa.fsq`: XCodec2's FSQ lattice (digits of a codec id, distances between codes, the zero code).
"""
