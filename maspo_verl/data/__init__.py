"""Data for RL on speech-token LMs: the synthetic TTS task and the preparation of real TTS data."""
