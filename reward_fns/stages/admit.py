"""The admit stage: which requests the reward scores. A request is admitted when its fields are usable
(`score_record.ScoreRequest.checked`), its response passes the gate (`maspo_base.llasa_response`: speech tokens,
complete, codes in the codec's codebook), it has a reference text, and the reward has a recogniser for its language
(and a likelihood model, where the score needs one). Anything else fails here, before any model runs, with the
reason (``invalid_request``, the gate's, ``empty_reference``, ``no_asr_for_language``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from maspo_base.llasa_response import GateConfig, ParsedResponse, parse_response, parse_token_ids
from maspo_base.speech_tokens.layouts import SpeechTokenLayout
from maspo_base.xcodec2_decoder import HOP_LENGTH
from reward_fns.score_record import ScoreRequest, error_message
from reward_fns.stages.sample import Sample
from reward_fns.text_norm import base_language

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    """The reward's terms of admission: ``layout`` and ``gate`` read a response, a request without a language is in
    ``default_language``; ``recognised`` are the languages with a recogniser; ``ear_voice`` the code ear's voice
    when the ear is the recogniser (only its language is heard); ``likelihood`` the languages with a likelihood
    model when the score needs one (None: it does not)."""

    layout: SpeechTokenLayout
    gate: GateConfig
    default_language: str
    recognised: tuple[str, ...]
    ear_voice: str | None = None
    likelihood: tuple[str, ...] | None = None

    def request(self, raw: ScoreRequest | Mapping[str, Any]) -> Sample:
        """A live sample of a request's response codes, or one failed with why it is not scored."""
        try:
            codebook = self.layout.codebook_size
            request = raw.checked(codebook) if isinstance(raw, ScoreRequest) else ScoreRequest.from_dict(raw, codebook)
        except Exception as exc:  # noqa: BLE001 - one request's problem, reported in its result
            return Sample().failed("invalid_request", error_message(exc))
        try:
            parsed, language = self._parsed(request), self._language(request)
            sample = Sample(request, language, codes=parsed.codes)
            return self._scorable(sample) if parsed.ok else sample.failed(parsed.reason, parsed.detail)
        except Exception as exc:  # noqa: BLE001
            logger.warning("parsing a response failed: %s", exc)
            return Sample(request).failed("invalid_request", error_message(exc))

    def audio(self, audio: Any, request: ScoreRequest) -> Sample:
        """A live sample of a 16 kHz waveform to score against ``request``, or one failed with why not."""
        try:
            request = request.checked(self.layout.codebook_size)
        except ValueError as exc:
            return Sample().failed("invalid_request", error_message(exc), len(audio) // HOP_LENGTH)
        return self._scorable(Sample(request, self._language(request), audio=np.asarray(audio, dtype=np.float32)))

    def _parsed(self, req: ScoreRequest) -> ParsedResponse:
        if req.token_ids is not None:
            return parse_token_ids(req.token_ids, self.layout, prompt_codes=req.prompt_codes, config=self.gate)
        if req.solution_str is None:
            return ParsedResponse(
                np.zeros(0, np.int64), "no_speech_tokens", "request has neither solution_str nor token_ids"
            )
        return parse_response(req.solution_str, prompt_codes=req.prompt_codes, config=self.gate, layout=self.layout)

    def _language(self, req: ScoreRequest) -> str:
        return base_language(req.language) if req.language else self.default_language

    def _scorable(self, sample: Sample) -> Sample:
        """The sample, or failed when nothing can score it: no reference text, no model for its language."""
        ground_truth, lang = sample.request.ground_truth, sample.language
        if not isinstance(ground_truth, str) or not ground_truth.strip():
            return sample.failed("empty_reference", f"ground_truth={ground_truth!r}")
        if lang not in self.recognised:
            return sample.failed("no_asr_for_language", f"language {lang!r}; configured: {list(self.recognised)}")
        # the two below report no length (speech_n_codes 0), as they always have
        if self.ear_voice is not None and lang != base_language(self.ear_voice):
            why = f"language {lang!r}; the code ear hears {self.ear_voice}"
            return sample.failed("no_asr_for_language", why, n_codes=0)
        if self.likelihood is not None and lang not in self.likelihood:
            why = f"no likelihood model for {lang!r}; configured: {list(self.likelihood)}"
            return sample.failed("no_asr_for_language", why, n_codes=0)
        return sample
