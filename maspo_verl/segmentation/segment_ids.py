"""Segment-id algebra on padded ``(B, T)`` batches, vectorised.

A segmentation is a long tensor ``segment_ids`` of shape ``(B, T)``: within each row the valid tokens carry ids
``0 .. K_i - 1`` in order, every segment is a contiguous run of valid tokens, and padding carries ``-1``. A segment
never crosses a masked token: the first valid token after a masked one always starts a new segment.

Everything here works on *segment starts* (a bool ``(B, T)`` tensor, True where a segment begins) and turns them
into ids with a cumulative sum, so no function loops over rows or tokens. The loss uses `SegmentLayout`, which
numbers the segments of the whole batch with one cumulative sum over the flattened starts. ``min_len`` and
``max_len`` (`bound_segment_lengths`) work on the flattened starts too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _position_dtype(numel: int) -> torch.dtype:
    """int32 where it holds every flat position (cheaper to write, add and gather with than int64)."""
    return torch.int32 if numel < 2**31 - 1 else torch.int64


def host_reads_are_free(device: torch.device) -> bool:
    """Whether reading a value back to the host costs nothing on ``device`` (the CPU) or is a sync (a GPU).

    Where it is free, per-segment tables are sized by the batch's segment count ``K`` (``K + 1`` entries) and
    ``max_len`` / pass 2 of ``min_len`` visit only the long segments and the run ends they list. Elsewhere reading
    ``K`` or listing positions waits for the device and drains the launch queue, so the tables take the static bound
    ``B T + 1`` (every segment holds a token; the extra slots stay empty: length 0, sum 0), padding scatters into
    the segment before it with weight 0 (`SegmentLayout`) and the bounds work in whole-batch passes of fixed shape.
    Both give the same segments, values and gradients."""
    return device.type == "cpu"


@dataclass(frozen=True)
class SegmentLayout:
    """The segments of a batch numbered ``1 .. K`` across all rows, for per-segment sums and broadcasts.

    ``index[b, t]`` is the batch-wide number of token (b, t)'s segment; every padded token points at slot ``0``, so
    per-segment arrays have ``num_slots`` entries: the padding slot first, then segments ``1 .. K``, then (where
    `host_reads_are_free` says no) empty slots up to the static bound ``B T + 1``. Padding never reaches a segment's
    sum or count: on the CPU it lands in slot 0 (even ``nan``); off the CPU sums and counts scatter by the running
    start count, so that a padded token adds 0 into the segment before it instead of every padded token adding into
    slot 0 (atomic adds to one address serialise on a GPU; docs/benchmarks.md).
    """

    starts: torch.Tensor
    """``(B, T)`` bool, canonical segment starts (valid tokens only, every run of valid tokens opens one)."""
    index: torch.Tensor
    """``(B, T)`` int32 (int64 beyond 2**31 tokens), batch-wide segment number ``1 .. K`` of each token; ``0`` on
    padding."""
    num_slots: int
    """Entries of every per-segment array: ``K + 1`` on the CPU, ``B T + 1`` on a GPU (`host_reads_are_free`)."""
    segment_count: torch.Tensor
    """0-dim integer tensor on the batch's device: K, the segments of the batch."""
    lengths: torch.Tensor
    """``(num_slots,)`` float32 tokens per segment; the first entry counts padding on the CPU (0 elsewhere), empty
    slots 0."""
    segments_per_row: torch.Tensor
    """``(B,)`` int64 number of segments in each response."""
    scatter_index: torch.Tensor
    """Flat index that sums and counts scatter by: ``index`` on the CPU, the running start count elsewhere."""
    scatter_mask: torch.Tensor | None
    """None on the CPU; elsewhere the flat bool response mask, the weight (0 or 1) of each token in sums and counts."""

    @property
    def num_segments(self) -> int:
        """K as a Python int (reads it back from the device: for callers outside the loss's hot path)."""
        return int(self.segment_count)

    @classmethod
    def from_starts(cls, starts: torch.Tensor, response_mask: torch.Tensor) -> SegmentLayout:
        """Build from canonical starts (see `canonical_starts`) and the bool response mask.

        ``index = cumsum(starts) * mask`` over the flattened batch; the running count at each row's last token gives
        the segments per row, and one count of the index (a scatter-add, which needs no host sync) the lengths."""
        numel = starts.numel()
        flat_mask = response_mask.reshape(-1).bool()
        count = torch.cumsum(starts.reshape(-1), dim=0, dtype=_position_dtype(numel))
        segment_count = count[-1] if numel else count.new_zeros(())
        index = count * flat_mask
        if host_reads_are_free(starts.device):
            num_slots, scatter_index, scatter_mask = int(segment_count) + 1, index, None
        else:
            num_slots, scatter_index, scatter_mask = numel + 1, count, flat_mask
        if starts.shape[-1]:
            row_totals = count.view(starts.shape)[:, -1]
            segments_per_row = row_totals.long()
            segments_per_row[1:].sub_(row_totals[:-1])
        else:
            segments_per_row = torch.zeros(starts.shape[0], dtype=torch.long, device=starts.device)
        lengths = count_per_slot(scatter_index, num_slots, torch.float32, scatter_mask)
        return cls(
            starts,
            index.view(starts.shape),
            num_slots,
            segment_count,
            lengths,
            segments_per_row,
            scatter_index,
            scatter_mask,
        )

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-segment sums ``(num_slots,)`` of ``(B, T)`` values (padding in slot 0 on the CPU, nowhere elsewhere)."""
        values = values.reshape(-1)
        if self.scatter_mask is not None:
            values = torch.where(self.scatter_mask, values, values.new_zeros(()))
        sums = torch.zeros(self.num_slots, dtype=values.dtype, device=values.device)
        return sums.index_add_(0, self.scatter_index, values)

    def broadcast(self, per_segment: torch.Tensor) -> torch.Tensor:
        """Give every token its segment's value: ``(num_slots, *F) -> (B, T, *F)``."""
        gathered = per_segment.index_select(0, self.index.reshape(-1))
        return gathered.view(*self.index.shape, *per_segment.shape[1:])

    def segment_ids(self, response_mask: torch.Tensor) -> torch.Tensor:
        """Per-row canonical ids (``0 .. K_i - 1``, ``-1`` on padding)."""
        return ids_from_starts(self.starts, response_mask)


def count_per_slot(
    index: torch.Tensor, num_slots: int, dtype: torch.dtype = torch.int32, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``bincount(index, minlength=num_slots)`` of a 1-d index below ``num_slots`` as ``dtype``, counting only where
    ``mask`` (if given) holds. Off the CPU an ``index_add_``: ``bincount`` there reads the largest index back to the
    host to size its output."""
    if host_reads_are_free(index.device):  # on the CPU bincount is the faster count
        weights = None if mask is None else mask.to(torch.float64)
        return torch.bincount(index, weights, minlength=num_slots).to(dtype)
    if mask is None:
        mask = torch.ones((), dtype=dtype, device=index.device).expand(index.shape)
    return torch.zeros(num_slots, dtype=dtype, device=index.device).index_add_(0, index, mask.to(dtype))


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


def bound_segment_lengths(
    starts: torch.Tensor, response_mask: torch.Tensor, min_len: int | None = None, max_len: int | None = None
) -> torch.Tensor:
    """Apply ``min_len`` and then ``max_len`` to canonical starts; returns canonical starts.

    ``min_len``: a segment shorter than ``min_len`` is merged into a neighbour inside its run of valid tokens. Pass 1
    merges a short segment into the one that follows it (the start after it is dropped), so a chain of short
    segments joins the first long segment after it; pass 2 merges a group left short at the end of its run into the
    group before it. Afterwards only a run shorter than ``min_len`` as a whole holds a short segment.

    ``max_len``: every segment longer than ``max_len`` is split into ``n = ceil(L / max_len)`` near-equal pieces; the
    token at offset ``p`` of a segment of length ``L`` goes to piece ``floor(p * n / L)``, so pieces differ in length
    by at most one and each holds at least ``max_len // 2`` tokens.

    Works on the flattened batch with whole-batch passes and no list of segment positions: ``min_len`` looks for
    another start among the ``min_len - 1`` tokens before each start and before each run end (`_merge_short_flat`),
    ``max_len`` finds the long segments from one count of the segment lengths (`_split_long_flat`). Rows need no
    special care because every run of valid tokens (so every row with a valid token) opens with a start."""
    shape = starts.shape
    flat_starts = starts.reshape(-1).clone()
    if flat_starts.numel() == 0:
        return flat_starts.view(shape)
    mask = response_mask.bool()
    if min_len is not None and min_len > 1:
        opens_run = run_starts(mask).reshape(-1)
        _merge_short_flat(flat_starts, opens_run, _run_ends(mask).reshape(-1), min_len)
    if max_len is not None:
        _split_long_flat(flat_starts, mask.reshape(-1), max_len, shape[-1])
    return flat_starts.view(shape)


_MAX_SHIFTED_WINDOW = 8
"""Up to this ``min_len``, pass 1 of `_merge_short_flat` ORs ``min_len - 1`` shifted copies of the starts."""


def _run_ends(response_mask: torch.Tensor) -> torch.Tensor:
    """True at every valid token whose successor is padding (or that closes the row)."""
    next_valid = torch.nn.functional.pad(response_mask[:, 1:], (0, 1), value=False)
    return response_mask & ~next_valid


def _flat_positions(flat_starts: torch.Tensor) -> torch.Tensor:
    return torch.arange(flat_starts.numel(), dtype=_position_dtype(flat_starts.numel()), device=flat_starts.device)


def _segment_start_of(flat_starts: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """For each flat position, the position of the last start at or before it (0 before the first start)."""
    return torch.cummax(positions * flat_starts, dim=0).values


def _merge_short_flat(flat_starts: torch.Tensor, opens_run: torch.Tensor, run_ends: torch.Tensor, min_len: int) -> None:
    """``min_len`` of `bound_segment_lengths` in place on flattened canonical starts.

    Pass 1: a start ``t`` that does not open a run is dropped when the segment before it, ``start_of(t - 1) .. t - 1``,
    is short: ``t - start_of(t - 1) < min_len``, i.e. when another start lies among the ``min_len - 1`` tokens before
    ``t`` (for small ``min_len`` that is how it is computed, by shifted ORs).

    Pass 2: at each run end ``e``, the group ``start_of(e) .. e`` is the last of its run; it joins the group before it
    when ``e - start_of(e) + 1 < min_len`` and its start does not open the run. Pass 2 looks only at the
    ``min_len - 1`` tokens before each run end (a nearer start is a short group) while that is fewer positions than
    the batch has, else it takes a second running maximum."""
    if min_len <= _MAX_SHIFTED_WINDOW:  # a few shifted ORs cost less than a running maximum
        start_shortly_before = torch.zeros_like(flat_starts)
        for shift in range(1, min_len):
            start_shortly_before[shift:].logical_or_(flat_starts[:-shift])
        flat_starts &= start_shortly_before.logical_not_().logical_or_(opens_run)
    else:
        positions = _flat_positions(flat_starts)
        start_of = _segment_start_of(flat_starts, positions)
        long_before = (positions[1:] - start_of[:-1]) >= min_len
        flat_starts[1:] &= long_before | opens_run[1:]
    if not host_reads_are_free(flat_starts.device):
        flat_starts &= _short_tail_starts(flat_starts, run_ends, min_len).logical_not_().logical_or_(opens_run)
        return
    ends = torch.nonzero(run_ends).squeeze(1)
    if ends.numel() * (min_len - 1) <= flat_starts.numel():
        window = (ends.unsqueeze(1) - torch.arange(min_len - 1, device=ends.device)).clamp_(min=0)  # e, e - 1, ...
        hits = flat_starts[window]
        nearest = hits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first start looking back from e
        tail_starts = window.gather(1, nearest).squeeze(1)[hits.any(dim=1)]
    else:
        start_of = _segment_start_of(flat_starts, _flat_positions(flat_starts))
        tail_starts = start_of.index_select(0, ends)[(ends - start_of.index_select(0, ends)) < min_len - 1].long()
    flat_starts[tail_starts] = opens_run[tail_starts]


def _short_tail_starts(flat_starts: torch.Tensor, run_ends: torch.Tensor, min_len: int) -> torch.Tensor:
    """Pass 2's starts in fixed shape: True at a start ``s`` whose group is the last of its run and shorter than
    ``min_len``, i.e. a run end ``e`` lies in ``s .. s + min_len - 2`` with no other start in ``s + 1 .. e``.

    Up to ``_MAX_SHIFTED_WINDOW`` by shifted ANDs looking ahead from every start; beyond it, every run end marks
    ``start_of(e)`` (a running maximum of start positions) by an ``index_add_``."""
    if min_len <= _MAX_SHIFTED_WINDOW:
        short_tail = flat_starts & run_ends
        if min_len > 2:
            start_ahead = torch.zeros_like(flat_starts)  # a start in s + 1 .. s + shift
        for shift in range(1, min_len - 1):
            start_ahead[:-shift].logical_or_(flat_starts[shift:])
            short_tail[:-shift].logical_or_(run_ends[shift:] & ~start_ahead[:-shift] & flat_starts[:-shift])
        return short_tail
    positions = _flat_positions(flat_starts)
    start_of = _segment_start_of(flat_starts, positions)
    marks = run_ends & ((positions - start_of) < min_len - 1)
    hits = torch.zeros(flat_starts.numel(), dtype=torch.int32, device=flat_starts.device)
    return hits.index_add_(0, start_of, marks.to(torch.int32)).bool()


def _split_long_flat(flat_starts: torch.Tensor, flat_mask: torch.Tensor, max_len: int, width: int) -> None:
    """``max_len`` of `bound_segment_lengths` in place on flattened canonical starts.

    Segment lengths come from one ``bincount`` of the running start count ``c``; ``c`` never decreases, so the start
    of segment ``k`` is ``searchsorted(c, k)`` and only the segments longer than ``max_len`` are visited further.
    Piece ``j`` of a segment of length ``L`` in ``n = ceil(L / max_len)`` pieces starts at offset ``ceil(j L / n)``."""
    count = torch.cumsum(flat_starts, dim=0, dtype=_position_dtype(flat_starts.numel()))
    if not host_reads_are_free(flat_starts.device):
        _split_long_flat_fixed_shape(flat_starts, flat_mask, count, max_len, width)
        return
    lengths = torch.bincount(count * flat_mask)
    lengths[0] = 0  # padding
    long_segments = torch.nonzero(lengths > max_len).squeeze(1)
    if long_segments.numel() == 0:
        return
    first = torch.searchsorted(count, long_segments.to(count.dtype))
    length = lengths.index_select(0, long_segments)
    pieces = torch.div(length + (max_len - 1), max_len, rounding_mode="floor")
    extra = pieces - 1
    segment = torch.repeat_interleave(extra)  # each long segment's number, once per extra start
    # per extra start: its segment's length, piece count, start, and the first extra start of that segment
    length, piece_count, first, first_extra = torch.stack(
        [length, pieces, first, torch.cumsum(extra, 0) - extra]
    ).index_select(1, segment)
    piece = torch.arange(segment.numel(), device=segment.device) - first_extra + 1  # 1 .. n - 1
    offset = torch.div(piece * length + piece_count - 1, piece_count, rounding_mode="floor")
    flat_starts[first + offset] = True


def _split_long_flat_fixed_shape(
    flat_starts: torch.Tensor, flat_mask: torch.Tensor, count: torch.Tensor, max_len: int, width: int
) -> None:
    """`_split_long_flat` in whole-batch passes of fixed shape (no listing of the long segments).

    Token at offset ``p`` of a segment of length ``L`` in ``n = ceil(L / max_len)`` pieces opens piece
    ``floor(p n / L)``; it starts a piece when that differs from ``floor((p - 1) n / L)``, i.e. when a multiple of
    ``L`` lies in ``(p n - n, p n]``: ``(p n) mod L < n`` (``n <= L``). A segment of at most ``max_len`` tokens has
    ``n = 1`` and only ``p = 0``, already a start, passes."""
    numel = flat_starts.numel()
    # padding counts 0 into the segment before it (see `SegmentLayout`); its cuts are masked out below
    lengths = count_per_slot(count, numel + 1, torch.int32, flat_mask)
    lengths[:1].fill_(1)  # before the first start: only padding, kept off a division by 0
    dtype = torch.int32 if width * width < 2**31 else torch.int64  # p n < L**2 <= width**2 on valid tokens
    length = lengths.index_select(0, count).to(dtype)
    # each segment's first position, written by its start (every other token writes a spare last slot); a GPU's
    # running maximum over the flattened batch would run in one block
    positions = _flat_positions(flat_starts)
    first = torch.zeros(numel + 2, dtype=positions.dtype, device=positions.device)
    first.scatter_(0, torch.where(flat_starts, count, numel + 1).long(), positions)
    offset = (positions - first.index_select(0, count)).to(dtype)
    pieces = torch.div(length + (max_len - 1), max_len, rounding_mode="floor")
    flat_starts |= torch.lt(offset.mul_(pieces).remainder_(length), pieces).logical_and_(flat_mask)
