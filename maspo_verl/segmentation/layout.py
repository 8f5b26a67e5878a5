"""Segment-id algebra on padded ``(B, T)`` batches, vectorised.

A segmentation is a long tensor ``segment_ids`` of shape ``(B, T)``: within each row the valid tokens carry ids
``0 .. K_i - 1`` in order, every segment is a contiguous run of valid tokens, and padding carries ``-1``. A segment
never crosses a masked token: the first valid token after a masked one always starts a new segment.

Everything here works on *segment starts* (a bool ``(B, T)`` tensor, True where a segment begins) and turns them
into ids with a cumulative sum, so no function loops over rows or tokens. The loss uses `SegmentLayout`, which
numbers the segments of the whole batch with one cumulative sum over the flattened starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SegmentLayout:
    """The segments of a batch numbered ``0 .. K-1`` across all rows, for per-segment sums and broadcasts.

    ``index[b, t]`` is the batch-wide number of token (b, t)'s segment; every padded token points at one extra
    slot ``K``, so per-segment arrays have ``K + 1`` entries and whatever padding holds (even ``nan``) lands there.
    """

    starts: torch.Tensor
    """``(B, T)`` bool, canonical segment starts (valid tokens only, every run of valid tokens opens one)."""
    index: torch.Tensor
    """``(B, T)`` long, batch-wide segment number of each token; ``K`` on padding."""
    num_segments: int
    """K, the segments of the batch."""
    lengths: torch.Tensor
    """``(K + 1,)`` float32 tokens per segment; the last entry counts padding."""
    segments_per_row: torch.Tensor
    """``(B,)`` number of segments in each response."""

    @classmethod
    def from_starts(cls, starts: torch.Tensor, response_mask: torch.Tensor) -> SegmentLayout:
        """Build from canonical starts (see `canonical_starts`) and the bool response mask."""
        numbered = torch.cumsum(starts.reshape(-1), dim=0)
        num_segments = int(numbered[-1]) if numbered.numel() else 0
        index = torch.where(response_mask.reshape(-1), numbered - 1, num_segments).view(starts.shape)
        ones = torch.ones(1, dtype=torch.float32, device=starts.device).expand(index.numel())
        lengths = torch.zeros(num_segments + 1, dtype=torch.float32, device=starts.device)
        lengths.scatter_add_(0, index.reshape(-1), ones)
        return cls(starts, index, num_segments, lengths, torch.count_nonzero(starts, dim=-1))

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-segment sums ``(K + 1,)`` of ``(B, T)`` values (padding in the last slot)."""
        sums = torch.zeros(self.num_segments + 1, dtype=values.dtype, device=values.device)
        return sums.scatter_add_(0, self.index.reshape(-1), values.reshape(-1))

    def broadcast(self, per_segment: torch.Tensor) -> torch.Tensor:
        """Give every token its segment's value: ``(K + 1, *F) -> (B, T, *F)``."""
        gathered = per_segment.index_select(0, self.index.reshape(-1))
        return gathered.view(*self.index.shape, *per_segment.shape[1:])

    def segment_ids(self, response_mask: torch.Tensor) -> torch.Tensor:
        """Per-row canonical ids (``0 .. K_i - 1``, ``-1`` on padding)."""
        return ids_from_starts(self.starts, response_mask)


def canonical_starts(starts: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Starts on valid tokens only, with every run of valid tokens opening a segment."""
    mask = response_mask.bool()
    return (starts.bool() & mask) | run_starts(mask)


def run_starts(response_mask: torch.Tensor) -> torch.Tensor:
    """True at every valid token whose predecessor is padding (or that opens the row): starts no segmenter may drop."""
    mask = response_mask.bool()
    previous_valid = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    return mask & ~previous_valid


def ids_from_starts(starts: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Segment ids ``cumsum(starts) - 1`` on valid tokens, ``-1`` on padding. Run starts are always starts."""
    mask = response_mask.bool()
    ids = torch.cumsum(canonical_starts(starts, mask).long(), dim=-1) - 1
    return torch.where(mask, ids, torch.full_like(ids, -1))


def starts_from_ids(segment_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Segment starts of an arbitrary labelling: where the id changes, or a run of valid tokens begins."""
    mask = response_mask.bool()
    changed = torch.ones_like(mask)
    changed[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return (changed & mask) | run_starts(mask)


def canonical_segment_ids(segment_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Renumber any labelling into canonical ids (contiguous runs, 0-based per row, -1 on padding)."""
    return ids_from_starts(starts_from_ids(segment_ids, response_mask), response_mask)


def token_segment_lengths(starts: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Length of the segment each token belongs to, ``(B, T)`` long; 0 on padding. ``starts`` must be canonical."""
    layout = SegmentLayout.from_starts(starts, response_mask)
    lengths = layout.lengths.to(torch.long)
    lengths[-1] = 0  # the padding slot
    return layout.broadcast(lengths)


def segment_lengths(segment_ids: torch.Tensor) -> torch.Tensor:
    """Length of the segment each token belongs to, ``(B, T)`` long; 0 on padding (``-1`` ids)."""
    mask = segment_ids >= 0
    return token_segment_lengths(starts_from_ids(segment_ids, mask), mask)


def split_long_starts(starts: torch.Tensor, response_mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """Split every segment longer than ``max_len`` into ``n = ceil(L / max_len)`` near-equal pieces.

    Token at offset ``p`` of a segment of length ``L`` goes to piece ``floor(p * n / L)``, so pieces differ in
    length by at most one and each holds at least ``max_len // 2`` tokens. Takes and returns canonical starts.
    """
    positions = torch.arange(starts.shape[-1], device=starts.device).expand_as(starts)
    start_position = torch.cummax(torch.where(starts, positions, 0), dim=-1).values
    offset = positions - start_position
    length = token_segment_lengths(starts, response_mask).clamp(min=1)
    pieces = torch.div(length + max_len - 1, max_len, rounding_mode="floor")
    piece = torch.div(offset * pieces, length, rounding_mode="floor")
    previous_piece = torch.nn.functional.pad(piece[:, :-1], (1, 0), value=-1)
    return starts | ((piece != previous_piece) & (offset > 0) & response_mask)


def merge_short_starts(starts: torch.Tensor, response_mask: torch.Tensor, min_len: int) -> torch.Tensor:
    """Merge segments shorter than ``min_len`` into a neighbour inside the same run of valid tokens.

    Pass 1: a short segment is merged into the one that follows it (the start after it is dropped), so a chain of
    short segments joins the first long segment after it. Pass 2: a group left short at the end of its run is
    merged into the group before it. Afterwards only a run shorter than ``min_len`` as a whole holds a short segment.
    Takes and returns canonical starts.
    """
    mask = response_mask
    protected = run_starts(mask)

    length = token_segment_lengths(starts, mask)
    previous_is_short = torch.nn.functional.pad(length[:, :-1] < min_len, (1, 0), value=False)
    starts = starts & (protected | ~previous_is_short)

    length = token_segment_lengths(starts, mask)
    next_valid = torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)
    ends_its_run = mask & ~next_valid
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(starts)
    last_token = (positions + length - 1).clamp(min=0, max=mask.shape[-1] - 1)  # read at start tokens only
    segment_ends_run = torch.gather(ends_its_run, 1, last_token)
    return starts & ~(~protected & segment_ends_run & (length < min_len))


def split_long_segments(segment_ids: torch.Tensor, response_mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """`split_long_starts` on segment ids."""
    mask = response_mask.bool()
    return ids_from_starts(split_long_starts(starts_from_ids(segment_ids, mask), mask, max_len), mask)


def merge_short_segments(segment_ids: torch.Tensor, response_mask: torch.Tensor, min_len: int) -> torch.Tensor:
    """`merge_short_starts` on segment ids."""
    mask = response_mask.bool()
    return ids_from_starts(merge_short_starts(starts_from_ids(segment_ids, mask), mask, min_len), mask)
