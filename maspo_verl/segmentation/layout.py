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
    """``(B, T)`` int64, batch-wide segment number of each token; ``K`` on padding."""
    num_segments: int
    """K, the segments of the batch."""
    lengths: torch.Tensor
    """``(K + 1,)`` float32 tokens per segment; the last entry counts padding."""
    segments_per_row: torch.Tensor
    """``(B,)`` number of segments in each response."""

    @classmethod
    def from_starts(cls, starts: torch.Tensor, response_mask: torch.Tensor) -> SegmentLayout:
        """Build from canonical starts (see `canonical_starts`) and the bool response mask."""
        index = torch.cumsum(starts.reshape(-1), dim=0)
        num_segments = int(index[-1]) if index.numel() else 0
        index = index.sub_(1).masked_fill_(~response_mask.reshape(-1), num_segments).view(starts.shape)
        lengths = torch.bincount(index.reshape(-1), minlength=num_segments + 1).to(torch.float32)
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


@dataclass(frozen=True)
class CompactStarts:
    """Canonical starts as ``K`` flat positions (row-major) with each segment's length and whether it opens a run of
    valid tokens (a start that is never dropped): the form in which ``min_len`` and ``max_len`` cost K operations,
    not B x T."""

    positions: torch.Tensor
    """``(K,)`` int64 flat positions of the starts, ascending."""
    lengths: torch.Tensor
    """``(K,)`` int64 tokens per segment: the valid tokens from its start up to the next start."""
    opens_run: torch.Tensor
    """``(K,)`` bool: the start is a row's first token or follows padding."""

    @classmethod
    def from_starts(cls, starts: torch.Tensor, response_mask: torch.Tensor) -> CompactStarts:
        flat_mask = response_mask.reshape(-1).bool()
        positions = torch.nonzero(starts.reshape(-1)).squeeze(1)
        # every run of valid tokens opens with a start, so a segment holds exactly the valid tokens before the next
        valid_before = torch.nn.functional.pad(torch.cumsum(flat_mask, 0), (1, 0))
        ends = torch.cat([positions[1:], positions.new_full((1,), flat_mask.numel())])
        lengths = valid_before[ends] - valid_before[positions]
        opens_run = (positions % starts.shape[-1] == 0) | ~flat_mask[(positions - 1).clamp(min=0)]
        return cls(positions, lengths, opens_run)

    def merge_short(self, min_len: int) -> CompactStarts:
        """Pass 1: drop the start after a short segment (unless it opens a run), so a chain of short segments joins
        the first long one after it. Pass 2: a group still short at the end of its run joins the group before it."""
        if self.positions.numel() == 0:
            return self
        keep = self.opens_run.clone()
        keep[1:] |= self.lengths[:-1] >= min_len
        groups = _regroup(self, keep)
        # a group ends its run exactly when the next group opens one (every run opens with a start), or it is last
        ends_run = torch.cat([groups.opens_run[1:], groups.opens_run.new_ones(1)])
        return _regroup(groups, groups.opens_run | ~ends_run | (groups.lengths >= min_len))

    def split_long(self, max_len: int) -> torch.Tensor:
        """Positions of the extra starts that cut every segment longer than ``max_len`` into ``n = ceil(L / max_len)``
        near-equal pieces: piece ``j`` starts at offset ``ceil(j L / n)``."""
        pieces = torch.div(self.lengths + max_len - 1, max_len, rounding_mode="floor")
        extra = (pieces - 1).clamp(min=0)
        cumulative = torch.cumsum(extra, 0)
        total = int(cumulative[-1]) if cumulative.numel() else 0
        segment = torch.repeat_interleave(torch.arange(extra.numel(), device=extra.device), extra, output_size=total)
        first_of_segment = torch.repeat_interleave(cumulative - extra, extra, output_size=total)
        piece = torch.arange(total, device=extra.device) - first_of_segment + 1  # 1 .. n - 1
        length, count = self.lengths[segment], pieces[segment]
        return self.positions[segment] + torch.div(piece * length + count - 1, count, rounding_mode="floor")


def _regroup(compact: CompactStarts, keep: torch.Tensor) -> CompactStarts:
    """Keep the starts flagged in ``keep``; a dropped start's segment joins the kept one before it."""
    kept = torch.nonzero(keep).squeeze(1)
    group = torch.cumsum(keep, 0) - 1
    lengths = torch.zeros(kept.numel(), dtype=compact.lengths.dtype, device=group.device)
    lengths.index_add_(0, group, compact.lengths)
    return CompactStarts(compact.positions.index_select(0, kept), lengths, compact.opens_run.index_select(0, kept))


def bound_segment_lengths(
    starts: torch.Tensor, response_mask: torch.Tensor, min_len: int | None = None, max_len: int | None = None
) -> torch.Tensor:
    """Apply ``min_len`` (`merge_short_starts`) and then ``max_len`` (`split_long_starts`) to canonical starts.

    One pass over the batch to find the starts; the merging and splitting are per segment."""
    compact = CompactStarts.from_starts(starts, response_mask)
    if min_len is not None and min_len > 1:
        compact = compact.merge_short(min_len)
    positions = compact.positions
    if max_len is not None:
        positions = torch.cat([positions, compact.split_long(max_len)])
    bounded = torch.zeros(starts.numel(), dtype=torch.bool, device=starts.device)
    bounded[positions] = True
    return bounded.view(starts.shape)


def split_long_starts(starts: torch.Tensor, response_mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """Split every segment longer than ``max_len`` into ``n = ceil(L / max_len)`` near-equal pieces.

    Token at offset ``p`` of a segment of length ``L`` goes to piece ``floor(p * n / L)``, so pieces differ in
    length by at most one and each holds at least ``max_len // 2`` tokens. Takes and returns canonical starts.
    """
    return bound_segment_lengths(starts, response_mask, max_len=max_len)


def merge_short_starts(starts: torch.Tensor, response_mask: torch.Tensor, min_len: int) -> torch.Tensor:
    """Merge segments shorter than ``min_len`` into a neighbour inside the same run of valid tokens.

    Pass 1: a short segment is merged into the one that follows it (the start after it is dropped), so a chain of
    short segments joins the first long segment after it. Pass 2: a group left short at the end of its run is
    merged into the group before it. Afterwards only a run shorter than ``min_len`` as a whole holds a short segment.
    Takes and returns canonical starts.
    """
    return bound_segment_lengths(starts, response_mask, min_len=min_len)


def split_long_segments(segment_ids: torch.Tensor, response_mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """`split_long_starts` on segment ids."""
    mask = response_mask.bool()
    return ids_from_starts(split_long_starts(starts_from_ids(segment_ids, mask), mask, max_len), mask)


def merge_short_segments(segment_ids: torch.Tensor, response_mask: torch.Tensor, min_len: int) -> torch.Tensor:
    """`merge_short_starts` on segment ids."""
    mask = response_mask.bool()
    return ids_from_starts(merge_short_starts(starts_from_ids(segment_ids, mask), mask, min_len), mask)
