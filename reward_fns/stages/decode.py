"""The decode stage: a response's codes, and a voice prompt's, into 16 kHz audio by the reward's codec
(`maspo_base.codecs`)."""

from __future__ import annotations

from maspo_base.codecs import Codec
from reward_fns.stages.sample import Sample, batched, through


def decode_responses(samples: list[Sample], codec: Codec, max_batch: int, pad_multiple: int = 1) -> list[Sample]:
    """Each sample's ``audio`` from its ``codes`` (``max_batch`` responses per codec call, lengths padded to a
    multiple of ``pad_multiple``); one the codec fails on alone is ``decode_error``."""
    return batched(
        samples,
        lambda batch: codec.decode([s.codes for s in batch], max_batch=max_batch, pad_multiple=pad_multiple),
        "codec decode",
        "decode_error",
        lambda sample, audio: sample.learnt(audio=audio),
    )


def decode_prompts(samples: list[Sample], codec: Codec, max_batch: int) -> list[Sample]:
    """Each sample's voice ``prompt``: the request's ``prompt_audio``, else its ``prompt_codes`` decoded (none when
    it has neither); a prompt the codec fails on alone is ``similarity_error``."""
    given = [s.learnt(prompt=s.request.prompt_audio) if s.request.prompt_audio is not None else s for s in samples]

    def decode(batch: list[Sample]) -> list[Sample]:
        return batched(
            batch,
            lambda items: codec.decode([s.request.prompt_codes for s in items], max_batch=max_batch),
            "prompt decode",
            "similarity_error",
            lambda sample, audio: sample.learnt(prompt=audio),
            detail="decoding prompt_codes failed: {}",
        )

    return through(decode, given, where=_has_prompt_codes_only)


def _has_prompt_codes_only(sample: Sample) -> bool:
    codes = sample.request.prompt_codes
    return sample.prompt is None and codes is not None and len(codes) > 0
