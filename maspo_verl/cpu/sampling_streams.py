"""Per-request random streams for the ``hf`` rollout: a request's sampled tokens do not depend on its batch.

HF's ``generate`` draws every row of a step from one generator together (``torch.multinomial``), so a response
depends on which requests shared its batch and in what order they arrived. Here each request owns a stream: a
64-bit key, and the uniform of its decoding step ``t`` is a counter-based hash of the two,

    u_t = splitmix64(splitmix64(key) + t) >> 11  /  2**53                                   in [0, 1)

and the token is drawn by inverse CDF: with ``p`` the row's next-token distribution after HF's own temperature,
top-k and top-p warpers, the token is the first ``i`` with ``cumsum(p)_i > u_t * sum(p)``, so token ``i`` is drawn
with probability ``p_i`` and a token the warpers removed (``p_i = 0``) never is. The softmax and the running sum are
float64: in float32 the running sum over Llasa's 193,800 ids drifts by about ``sqrt(V) * 6e-8 ~ 3e-5``, more than
a token's mass under a flat distribution, so the logits' last-bit differences between batch shapes moved draws to a
neighbouring id; in float64 a draw moves only when ``u_t`` falls within the logits' own rounding of a boundary.
`StreamSampler` is the last logits processor of a greedy ``generate``: it leaves 0 at the drawn token and -inf
elsewhere, so greedy decoding appends the draw. One cumulative sum and a binary search
per row and step instead of ``torch.multinomial``'s exponential draws over the whole vocabulary.

`request_stream` keys a request by the server's seed, the served weights' version, its prompt and how many
requests with the same prompt came before it under those weights: the ``n`` responses to a prompt draw from
different streams, and a run that sends the same prompts to the same weights gets the same responses (for each
prompt, the same set), however the requests were batched or ordered.
"""

from __future__ import annotations

import hashlib

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch stores."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` on int64 keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function on int64 tensors (arithmetic modulo 2**64, as int64 wraps)."""
    z = x + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def stream_uniforms(streams: torch.Tensor, step: int) -> torch.Tensor:
    """``u_t`` of each stream at decoding step ``step``: float64 in [0, 1), 53 random bits."""
    bits = splitmix64(splitmix64(streams) + step)
    return _shift_right(bits, 11).double() / float(1 << 53)


def request_stream(seed: int, weight_version: int, prompt_ids: list[int], occurrence: int) -> int:
    """The stream key of a request: the server's seed, the weights' version, the prompt and the prompt's
    occurrence (0 for the first request with this prompt under these weights, 1 for the next, ...)."""
    digest = hashlib.blake2b(torch.tensor(prompt_ids, dtype=torch.int64).numpy().tobytes(), digest_size=8).digest()
    key = splitmix64(torch.tensor([_signed(seed)], dtype=torch.int64))
    for part in (weight_version, int.from_bytes(digest, "little"), occurrence):  # mixed in one at a time
        key = splitmix64(key ^ _signed(part))
    return int(key.item())


class RequestStreams:
    """The streams of successive requests served by one set of weights: `request_stream` of each request, its
    prompt's occurrence counted here (0 for the first request with a prompt, 1 for the next, ...)."""

    def __init__(self, seed: int, weight_version: int) -> None:
        self.seed = seed
        self.weight_version = weight_version
        self._counts: dict[tuple[int, ...], int] = {}

    def next(self, prompt_ids: list[int]) -> int:
        """The stream of a new request for ``prompt_ids``, counting it."""
        prompt = tuple(prompt_ids)
        occurrence = self._counts.get(prompt, 0)
        self._counts[prompt] = occurrence + 1
        return request_stream(self.seed, self.weight_version, prompt_ids, occurrence)


class StreamSampler(LogitsProcessor):
    """Draws each row's next token from its own stream (module docstring); the last processor of a greedy
    ``generate``, returning 0 at the drawn token and -inf elsewhere.

    Args:
        streams: one int64 key per row (`request_stream`).
        temperature, top_k, top_p: HF's sampling warpers, applied as HF's sampling applies them (``top_k=0`` and
            ``top_p=1`` are off).
    """

    def __init__(self, streams: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> None:
        if temperature <= 0:
            raise ValueError(f"StreamSampler draws samples: temperature must be > 0, got {temperature}")
        self.streams = streams
        self.warpers = [TemperatureLogitsWarper(temperature)]
        if top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))
        self.step = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        warped = scores.double()
        for warper in self.warpers:
            warped = warper(input_ids, warped)
        cdf = torch.softmax(warped, dim=-1).cumsum(dim=-1)
        total = cdf[:, -1:]
        # u * total, kept below total, so that the first cdf entry above it exists and carries mass
        target = stream_uniforms(self.streams, self.step)[:, None] * total
        target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
        token = torch.searchsorted(cdf, target, right=True)
        self.step += 1
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)
