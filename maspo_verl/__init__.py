"""maspo-verl: segment-level importance sampling (MASPO) for veRL.

veRL imports ``maspo_verl.verl_plugin`` by itself in every process (entry point group ``verl.plugins``), which
registers ``loss_mode=maspo`` and the worker hooks. This package's own import is empty, so that a failure in the
plugin is reported by the plugin and not swallowed on the way to it.
"""

__version__ = "0.1.0"
__all__ = ["SegmentationInput", "register_segmenter", "__version__"]


def __getattr__(name: str):
    if name in ("SegmentationInput", "register_segmenter"):
        from maspo_verl import segmentation

        return getattr(segmentation, name)
    raise AttributeError(f"module 'maspo_verl' has no attribute {name!r}")
