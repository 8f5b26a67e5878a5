"""Tiny random-weight checkpoints of the speech stack, in the real on-disk formats, for tests and benchmarks."""
