"""maspo-verl: segment-level importance sampling (MASPO) for veRL."""

__version__ = "0.1.0"
