"""CTC read-outs of a recogniser's frame posteriors: greedy transcript, forced alignment, per-unit scores.

Frames carry log-posteriors over ``V`` labels, label 0 the blank. For a target ``y_1..y_L`` the CTC paths run over
the extended sequence ``z = (blank, y_1, blank, y_2, ..., y_L, blank)`` (``S = 2L + 1`` states): a path stays in a
state, moves to the next, or skips a blank between two different labels. `forced_align` finds the most likely path
(Viterbi) and reads from it, frame by frame, which target unit the frame says:

    unit_t  = (s_t - 1) / 2          s_t odd: the frame emits unit y_{unit_t}
    unit_t  = s_t / 2 - 1            s_t even (a blank): it belongs to the unit before it; -1 before the first unit
    score_j = mean_{t: s_t = 2j + 1} p_t(y_j)     how well the frames that emit unit j say it (in (0, 1])

The recursion runs frame after frame (each frame's best path depends on the previous frame's), vectorised over rows
and states, as torchaudio's ``forced_align`` does in C++ per row. A row whose frames are too few for its target
(``L`` plus the repeated labels) has no path: its ``feasible`` is False and its read-outs are -1 and NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLANK = 0
NEG_INF = float("-inf")


@dataclass
class Alignment:
    """A batch's forced alignment (`forced_align`): every tensor has one row per response."""

    frame_units: torch.Tensor
    """``(B, T)`` int64: the target unit each frame is aligned to, -1 before the first unit and past the length."""
    unit_scores: torch.Tensor
    """``(B, L)`` float: ``score_j`` of each target unit (NaN past the target's length)."""
    frame_scores: torch.Tensor
    """``(B, T)`` float: the score of each frame's unit (NaN where the frame has none)."""
    feasible: torch.Tensor
    """``(B,)`` bool: the row has a path (enough frames for its target)."""


def _wide(log_probs: torch.Tensor) -> torch.Tensor:
    """float64 stays float64; anything narrower (bf16, fp16) is read in float32."""
    return log_probs if log_probs.dtype == torch.float64 else log_probs.float()


def greedy_units(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best-path transcripts: each frame's most likely label, repeats merged, blanks dropped (labels >= 1)."""
    best = log_probs.argmax(-1)
    frames = torch.arange(best.shape[1], device=best.device)
    previous = torch.nn.functional.pad(best[:, :-1], (1, 0), value=BLANK)
    keep = (best != BLANK) & (best != previous) & (frames < lengths[:, None])
    counts = keep.sum(1).tolist()
    return [part.tolist() for part in torch.split(best[keep], counts)]


def ctc_nll(
    log_probs: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor, target_lengths: torch.Tensor
) -> torch.Tensor:
    """``-log p(y | frames)`` summed over CTC paths, per row: ``(B,)`` (inf where a row has no path)."""
    return torch.nn.functional.ctc_loss(
        _wide(log_probs).transpose(0, 1),
        targets,
        lengths,
        target_lengths,
        blank=BLANK,
        reduction="none",
        zero_infinity=False,
    )


def _extended(targets: torch.Tensor, target_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The extended label sequence ``z`` of each row ``(B, S)`` and whether a state may skip the blank before it."""
    batch, max_len = targets.shape
    ext = torch.full((batch, 2 * max_len + 1), BLANK, dtype=torch.long, device=targets.device)
    ext[:, 1::2] = targets
    previous_label = torch.nn.functional.pad(ext[:, :-2], (2, 0), value=BLANK)
    can_skip = (ext != BLANK) & (ext != previous_label)
    states = torch.arange(ext.shape[1], device=targets.device)
    ext[states[None, :] > 2 * target_lengths[:, None]] = BLANK
    return ext, can_skip


def forced_align(
    log_probs: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor, target_lengths: torch.Tensor
) -> Alignment:
    """Viterbi alignment of each row's frames ``log_probs (B, T, V)`` (first ``lengths`` frames) to its target
    ``targets (B, L)`` (first ``target_lengths`` labels, each >= 1): the module docstring's read-outs."""
    batch, frames, _ = log_probs.shape
    device = log_probs.device
    ext, can_skip = _extended(targets, target_lengths)
    n_states = ext.shape[1]
    emit = _wide(log_probs).gather(2, ext[:, None, :].expand(batch, frames, n_states))
    states = torch.arange(n_states, device=device)
    valid_state = states[None, :] <= 2 * target_lengths[:, None]
    alpha = torch.full((batch, n_states), NEG_INF, dtype=emit.dtype, device=device)
    alpha[:, :2] = emit[:, 0, :2]
    alpha = alpha.masked_fill(~valid_state, NEG_INF)
    back = torch.zeros((batch, frames, n_states), dtype=torch.uint8, device=device)
    for t in range(1, frames):
        stay = alpha
        step = torch.nn.functional.pad(alpha[:, :-1], (1, 0), value=NEG_INF)
        skip = torch.nn.functional.pad(alpha[:, :-2], (2, 0), value=NEG_INF).masked_fill(~can_skip, NEG_INF)
        best, move = torch.stack((stay, step, skip), -1).max(-1)
        running = (t < lengths)[:, None]
        alpha = torch.where(running, (best + emit[:, t]).masked_fill(~valid_state, NEG_INF), alpha)
        back[:, t] = torch.where(running, move, 0).to(torch.uint8)
    last = (2 * target_lengths)[:, None]
    ends = torch.cat((alpha.gather(1, last), alpha.gather(1, (last - 1).clamp(min=0))), 1)
    end_score, end_pick = ends.max(1)
    feasible = torch.isfinite(end_score) & (lengths > 0) & (target_lengths > 0)
    state = (2 * target_lengths - end_pick).clamp(min=0)
    path = torch.full((batch, frames), -1, dtype=torch.long, device=device)
    frame_index = torch.arange(frames, device=device)
    for t in range(frames - 1, -1, -1):
        inside = t < lengths
        path[:, t] = torch.where(inside, state, -1)
        state = torch.where(inside, state - back[:, t].gather(1, state[:, None]).squeeze(1).long(), state)
    inside = (frame_index[None, :] < lengths[:, None]) & feasible[:, None]
    path = path.masked_fill(~inside, -1)
    return _read_out(log_probs, path, ext, target_lengths, feasible)


def _read_out(
    log_probs: torch.Tensor, path: torch.Tensor, ext: torch.Tensor, target_lengths: torch.Tensor, feasible
) -> Alignment:
    """Frame units, unit scores and frame scores from a Viterbi path of extended states (-1: no frame)."""
    batch, max_len = ext.shape[0], (ext.shape[1] - 1) // 2
    emitting = (path >= 0) & (path % 2 == 1)
    frame_units = torch.where(path % 2 == 1, (path - 1) // 2, path // 2 - 1).masked_fill(path < 0, -1)
    label = ext.gather(1, path.clamp(min=0))
    prob = _wide(log_probs).gather(2, label[..., None]).squeeze(-1).exp()
    unit_index = frame_units.clamp(min=0)
    sums = torch.zeros((batch, max(max_len, 1)), dtype=prob.dtype, device=log_probs.device)
    counts = torch.zeros_like(sums)
    sums.scatter_add_(1, unit_index, torch.where(emitting, prob, 0.0))
    counts.scatter_add_(1, unit_index, emitting.to(counts.dtype))
    unit_scores = (sums / counts)[:, :max_len]
    real_unit = torch.arange(max_len, device=log_probs.device)[None, :] < target_lengths[:, None]
    unit_scores = unit_scores.masked_fill(~(real_unit & feasible[:, None]), float("nan"))
    frame_scores = unit_scores.gather(1, unit_index.clamp(max=max(max_len - 1, 0))) if max_len else prob * 0
    frame_scores = frame_scores.masked_fill(frame_units < 0, float("nan"))
    return Alignment(frame_units, unit_scores, frame_scores, feasible)
