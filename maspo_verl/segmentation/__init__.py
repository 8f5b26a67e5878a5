"""Segmentation: cut each response into segments of adjacent tokens that share one importance ratio.

- `maspo_verl.segmentation.registry`: `register_segmenter`, `SegmentationInput`, `segment_layout`;
- `maspo_verl.segmentation.segment_ids`: `SegmentLayout` and the vectorised algebra of segment starts and ids;
- `maspo_verl.segmentation.segmenters`: the built-in segmenters ``fixed``, ``logprob``, ``token_jump``, ``fsq``,
  ``heard_words`` (registered when this package is imported).
"""

from maspo_verl.segmentation import segmenters as _builtin  # noqa: F401 - registers the built-in segmenters
from maspo_verl.segmentation.registry import (
    SEGMENTER_REGISTRY,
    MissingResponseIdsError,
    SegmentationInput,
    Segmenter,
    get_segmenter,
    register_segmenter,
    segment_layout,
    segment_responses,
)
from maspo_verl.segmentation.segment_ids import SegmentLayout

__all__ = [
    "SEGMENTER_REGISTRY",
    "MissingResponseIdsError",
    "SegmentLayout",
    "SegmentationInput",
    "Segmenter",
    "get_segmenter",
    "register_segmenter",
    "segment_layout",
    "segment_responses",
]
