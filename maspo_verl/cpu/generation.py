"""Sampling speech from a ``transformers`` model: the one batched generation every sampler of this project runs.

`generate_responses` samples one response per prompt in a left-padded batch, each row from its own random stream
(`maspo_verl.cpu.sampling_streams`), stopping at the first of the checkpoint's stop ids
(`maspo_base.speech_tokens.llasa_generation.stop_ids`). The ``hf`` rollout serves it
(`maspo_verl.cpu.hf_rollout.HFRolloutServer`); the lab's `maspo_lab.sampler.Sampler` runs it, seeded, for everything
outside a training run, so all of them stop a model at the same token and draw what the served rollout draws for
the same seed, weights' version and prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from transformers import LogitsProcessor
from transformers.cache_utils import Cache, DynamicLayer

from maspo_verl.cpu.sampling_streams import StreamSampler


class SamplingKey(NamedTuple):
    """What a batch shares: requests are batched together only when all of these are equal.

    Greedy requests (``temperature == 0``) ignore ``top_p`` and ``top_k``; those are normalised to 1.0 and 0 (off).
    """

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    max_new_tokens: int


class RowRepetitionPenalty(LogitsProcessor):
    """HF's repetition penalty (CTRL: a seen token's logit ``z`` becomes ``z / p`` if ``z > 0``, else ``z * p``),
    over each row's own tokens: a row's left padding is not part of it, so the pad id is not penalised.

    Equal to ``transformers.RepetitionPenaltyLogitsProcessor`` on a row without padding.
    """

    def __init__(self, penalty: float, pad_widths: torch.Tensor) -> None:
        self.penalty = penalty
        self.pad_widths = pad_widths

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        # each padded position repeats its row's first real token, which is penalised anyway
        first_token = input_ids.gather(1, self.pad_widths[:, None])
        padded = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :] < self.pad_widths[:, None]
        seen = torch.where(padded, first_token, input_ids)
        score = scores.gather(1, seen)
        score = torch.where(score < 0, score * self.penalty, score / self.penalty)
        return scores.scatter(1, seen, score)


class RowCache(DynamicLayer):
    """One layer's key/value cache in buffers allocated once for the whole generation (``capacity`` positions):
    a step writes its keys and values in place and attention reads the filled prefix, where HF's dynamic cache
    copies the whole cache every step and its static cache attends over every allocated position. Rows leave the
    batch when their response has ended (`batch_select_indices`)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        rows, heads, _, dim = key_states.shape
        self._keys = key_states.new_empty(rows, heads, self.capacity, dim)
        self._values = value_states.new_empty(rows, heads, self.capacity, dim)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._view()
        return self.keys, self.values

    def _view(self) -> None:
        self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._view()


def _left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, pad_widths)`` of the prompts, left-padded with ``pad_id``."""
    width = max(len(p) for p in prompts)
    pad_widths = torch.tensor([width - len(p) for p in prompts])
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = (torch.arange(width)[None, :] >= pad_widths[:, None]).long()
    input_ids[attention_mask.bool()] = torch.tensor([t for p in prompts for t in p], dtype=torch.long)
    return input_ids, attention_mask, pad_widths


@torch.no_grad()
def generate_responses(
    model: torch.nn.Module,
    prompts: list[list[int]],
    key: SamplingKey,
    streams: list[int],
    stop_ids: list[int],
    pad_id: int,
    on_finished: Callable[[int, list[int], list[float]], None] | None = None,
) -> list[tuple[list[int], list[float]]]:
    """One response per prompt, all with ``key``'s sampling, prompt ``i`` drawing from ``streams[i]`` (unused when
    greedy), each ending at its first of ``stop_ids`` or at the budget; ``(token ids, log-probs)`` each. The ``hf``
    rollout's generation (`HFRolloutServer`), and what the fidelity measurement samples with.

    The batch is left-padded with ``pad_id`` under an attention mask, positions counted from each row's first
    prompt token, so a row's tokens are those of the row alone up to float rounding. The log-prob of a token is the
    one the actor recomputes, ``log softmax(z_t / T)[y_t]`` of the raw logits ``z_t`` (before repetition penalty,
    top-k or top-p; ``T = 1`` when greedy). A row whose response has ended leaves the batch (`RowCache`), so the
    steps after it cost only the rows still speaking; ``on_finished(i, token_ids, log_probs)``, called from the
    generating thread as soon as prompt ``i``'s response samples a stop id, hands that response on while the others
    are generated (responses cut by the budget are only returned).
    """
    device = next(model.parameters()).device
    input_ids, attention_mask, pad_widths = (t.to(device) for t in _left_padded(prompts, pad_id))
    rows, budget = len(prompts), key.max_new_tokens
    do_sample = key.temperature > 0
    penalty = RowRepetitionPenalty(key.repetition_penalty, pad_widths) if key.repetition_penalty != 1.0 else None
    sampler = (
        StreamSampler(torch.tensor(streams, dtype=torch.int64, device=device), key.temperature, key.top_k, key.top_p)
        if do_sample
        else None
    )
    scale = key.temperature if do_sample else 1.0
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    tokens = torch.full((rows, budget), pad_id, dtype=torch.long, device=device)
    log_probs = torch.zeros((rows, budget), dtype=torch.float32, device=device)
    lengths = torch.full((rows,), budget, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # the prompt index of each row still in the batch
    history = input_ids  # what the repetition penalty looks back on
    out, cache, position = _prefill(model, input_ids, attention_mask, budget)
    for step in range(budget):
        logits = out.logits[:, -1, :].float()
        scores = penalty(history, logits) if penalty is not None else logits
        token = sampler(history, scores).argmax(dim=-1) if sampler is not None else scores.argmax(dim=-1)
        scaled = logits / scale
        tokens[live, step] = token
        log_probs[live, step] = scaled.gather(1, token[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
        ended = torch.isin(token, stops)
        if ended.any():
            lengths[live[ended]] = step + 1
            if on_finished is not None:
                _hand_on(live[ended], step + 1, tokens, log_probs, on_finished)
            if ended.all():
                break
            keep = (~ended).nonzero().flatten()
            cache.batch_select_indices(keep)
            live, token, attention_mask, position = live[keep], token[keep], attention_mask[keep], position[keep]
            history = history[keep]
            if penalty is not None:
                penalty.pad_widths = penalty.pad_widths[keep]
            if sampler is not None:
                sampler.streams = sampler.streams[keep]
        if step + 1 == budget:
            break
        if penalty is not None:
            history = torch.cat([history, token[:, None]], dim=1)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(live), 1))], dim=1)
        position = position + 1
        out = model(
            input_ids=token[:, None],
            attention_mask=attention_mask,
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
        )
    return [
        (row[:n], lps[:n]) for row, lps, n in zip(tokens.tolist(), log_probs.tolist(), lengths.tolist(), strict=True)
    ]


def _prefill(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, budget: int):
    """The prompts' forward pass into a `RowCache` with room for ``budget`` more tokens, positions counted from each
    row's first prompt token; ``(output, cache, position of the last prompt token)``."""
    positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    cache = Cache(layers=[RowCache(input_ids.shape[1] + budget) for _ in range(model.config.num_hidden_layers)])
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out, cache, positions[:, -1:]


def _hand_on(rows: torch.Tensor, length: int, tokens: torch.Tensor, log_probs: torch.Tensor, on_finished) -> None:
    """``on_finished(i, token_ids, log_probs)`` for each prompt ``i`` in ``rows`` whose response just ended, once per
    response (not per token)."""
    for row in rows.tolist():
        on_finished(row, tokens[row, :length].tolist(), log_probs[row, :length].tolist())


def pad_id(generation_config: Any, stop_ids: list[int]) -> int:
    """The id a batch is left-padded with: the generation config's ``pad_token_id``, else the first stop id."""
    pad = getattr(generation_config, "pad_token_id", None)
    return pad if pad is not None else stop_ids[0]
