"""Parse and gate a Llasa-1B response before any model sees it.

A Llasa-1B response is a run of speech tokens closed by the stop tag::

    <|s_812|><|s_40117|> ... <|s_9|><|SPEECH_GENERATION_END|>

veRL hands the reward the response decoded with ``skip_special_tokens=True``; Llasa's tags and ``<|s_N|>`` are
ordinary added tokens and survive it. Token ids can be parsed too (`parse_token_ids`), with the id layout of a
`maspo_base.speech_tokens.layouts.SpeechTokenLayout` (Llasa-1B's by default, another model's by name, or read off a
tokenizer with ``SpeechTokenLayout.from_tokenizer``). Codes are checked against the layout's codebook.

The gate turns every malformed response into a `ParsedResponse` with ``ok=False`` and a ``reason`` from `GATE_REASONS`
instead of an exception, so one bad sample never stops a training step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from maspo_base.speech_tokens.layouts import LLASA_1B, SpeechTokenLayout
from maspo_base.speech_tokens.llasa_tokens import SPEECH_GENERATION_END, SPEECH_GENERATION_START, SPEECH_TOKEN_RE
from maspo_base.xcodec2_decoder import HOP_LENGTH, SAMPLE_RATE

DEFAULT_MAX_SECONDS = 30
DEFAULT_MAX_CODES = DEFAULT_MAX_SECONDS * SAMPLE_RATE // HOP_LENGTH
"""1500: 30 s of speech at XCodec2's 50 codes per second; a longer response scores ``too_long`` undecoded."""

GATE_REASONS = {
    "ok": "parsed: speech codes closed by the stop tag",
    "no_speech_tokens": "the response holds no <|s_N|> token",
    "truncated": f"the response does not end with {SPEECH_GENERATION_END} (cut at the length limit)",
    "code_out_of_range": "a code outside the layout's codebook [0, codebook_size)",
    "text_in_speech": "something other than speech tokens between the first speech token and the stop tag",
    "too_short": "fewer speech tokens than the configured minimum",
    "too_long": "more speech tokens than the configured maximum",
}
"""Every ``reason`` a parse can return, with what it means."""


@dataclass(frozen=True)
class ParsedResponse:
    """Codec ids of the scored speech (prompt codes removed) and the gate's verdict."""

    codes: np.ndarray  # int64 [T]
    reason: str = "ok"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


@dataclass(frozen=True)
class GateConfig:
    """Limits the gate applies. ``max_codes=None`` means no upper bound (the default bounds the work per response)."""

    min_codes: int = 1
    max_codes: int | None = DEFAULT_MAX_CODES
    require_end: bool = True


def _strip_prompt(codes: np.ndarray, prompt_codes: Sequence[int] | None) -> np.ndarray:
    """Drop the voice-cloning prompt's codes when the response repeats them at its start."""
    if prompt_codes is None or len(prompt_codes) == 0 or len(codes) < len(prompt_codes):
        return codes
    prompt = np.asarray(prompt_codes, dtype=np.int64)
    return codes[len(prompt) :] if np.array_equal(codes[: len(prompt)], prompt) else codes


def _gate(codes: np.ndarray, ended: bool, config: GateConfig, codebook_size: int) -> ParsedResponse:
    if codes.size == 0:
        return ParsedResponse(codes, "no_speech_tokens")
    if config.require_end and not ended:
        return ParsedResponse(codes, "truncated", f"{codes.size} speech tokens and no {SPEECH_GENERATION_END}")
    bad = (codes < 0) | (codes >= codebook_size)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        return ParsedResponse(
            codes,
            "code_out_of_range",
            f"code {int(codes[first])} at position {first}; valid: [0, {codebook_size})",
        )
    if codes.size < config.min_codes:
        return ParsedResponse(codes, "too_short", f"{codes.size} < min_codes={config.min_codes}")
    if config.max_codes is not None and codes.size > config.max_codes:
        return ParsedResponse(codes, "too_long", f"{codes.size} > max_codes={config.max_codes}")
    return ParsedResponse(codes)


def parse_response(
    text: str,
    prompt_codes: Sequence[int] | None = None,
    config: GateConfig | None = None,
    layout: SpeechTokenLayout = LLASA_1B,
) -> ParsedResponse:
    """Parse a decoded response string.

    Speech runs from the first ``<|s_N|>`` (or from just after a ``<|SPEECH_GENERATION_START|>`` echoed in the text)
    to ``<|SPEECH_GENERATION_END|>``; text after the stop tag is ignored, whitespace between tokens is allowed,
    anything else between them gates the response as ``text_in_speech``.
    """
    config = config or GateConfig()
    start = text.rfind(SPEECH_GENERATION_START)
    body = text[start + len(SPEECH_GENERATION_START) :] if start >= 0 else text
    end = body.find(SPEECH_GENERATION_END)
    ended = end >= 0
    if ended:
        body = body[:end]
    matches = list(SPEECH_TOKEN_RE.finditer(body))
    digits = [m.group(1) for m in matches]
    # a code beyond int64 (more than 18 digits) is out of range anyway: report it before numpy would overflow
    wide = next((i for i, d in enumerate(digits) if len(d.lstrip("0")) > 18), None)
    codes = np.fromiter((int(d) if len(d.lstrip("0")) <= 18 else -1 for d in digits), np.int64, count=len(digits))
    if matches:
        between = SPEECH_TOKEN_RE.sub("", body[matches[0].start() :])
        if between.strip():
            snippet = between.strip()[:40]
            return ParsedResponse(codes, "text_in_speech", f"found {snippet!r} among the speech tokens")
    if wide is not None:
        return ParsedResponse(
            codes,
            "code_out_of_range",
            f"code {digits[wide][:30]}... at position {wide}; valid: [0, {layout.codebook_size})",
        )
    return _gate(_strip_prompt(codes, prompt_codes), ended, config, layout.codebook_size)


def parse_token_ids(
    token_ids: Sequence[int] | np.ndarray,
    layout: SpeechTokenLayout = LLASA_1B,
    prompt_codes: Sequence[int] | None = None,
    config: GateConfig | None = None,
) -> ParsedResponse:
    """Parse response token ids (padding removed) with the same gate as `parse_response`."""
    config = config or GateConfig()
    ids = np.asarray(token_ids, dtype=np.int64)
    starts = np.flatnonzero(ids == layout.start_id)
    if starts.size:
        ids = ids[starts[-1] + 1 :]
    ends = np.flatnonzero(ids == layout.end_id)
    ended = ends.size > 0
    if ended:
        ids = ids[: ends[0]]
    is_code = ids >= layout.offset
    if is_code.any():
        first = int(np.argmax(is_code))
        if not is_code[first:].all():
            stray = int(ids[first:][~is_code[first:]][0])
            return ParsedResponse(ids[is_code] - layout.offset, "text_in_speech", f"token id {stray}")
    codes = _strip_prompt(ids[is_code] - layout.offset, prompt_codes)
    return _gate(codes, ended, config, layout.codebook_size)
