"""maspo-verl: segment-level importance sampling (MASPO) for veRL.

Importing this package is light (torch only). veRL loads ``maspo_verl.verl_plugin`` by itself in every process,
which registers ``loss_mode=maspo`` and the worker hooks.
"""

from maspo_verl.segmenters import SegmentationInput, register_segmenter

__version__ = "0.1.0"
__all__ = ["SegmentationInput", "register_segmenter", "__version__"]
