"""Data for RL on speech-token LMs: the synthetic TTS task (its texts, listener and tiny Llasa-shaped model) and the
preparation of real TTS data."""
