"""Llasa-1B's TTS prompt: the user message, the chat template, and the rendered prompt ids.

Prompts are rendered as Llasa expects (``SPEECH_CHAT_TEMPLATE``): Llama-3.2's chat format with the date pinned, the
user message ``Convert the text to speech:<|TEXT_UNDERSTANDING_START|>{text}<|TEXT_UNDERSTANDING_END|>`` and the
assistant turn already opened with ``<|SPEECH_GENERATION_START|>``, so that generation continues it. Pass the template
to veRL as ``actor_rollout_ref.model.custom_chat_template`` (see `speech_template_override`); generation stops at
``<|SPEECH_GENERATION_END|>``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .llasa_tokens import (
    SPEECH_GENERATION_START,
    TEXT_UNDERSTANDING_END,
    TEXT_UNDERSTANDING_START,
    speech_token,
)
from .text_frontend import model_text

USER_PROMPT = "Convert the text to speech:" + TEXT_UNDERSTANDING_START + "{text}" + TEXT_UNDERSTANDING_END
"""Llasa's user message; ``USER_PROMPT.format(text=...)``."""

PINNED_DATE = "26 Jul 2024"
"""Llama-3.2's template prints today's date; pinned (Llama-3.2's own fallback) for reproducible prompts."""

SYSTEM_HEADER_TEXT = f"Cutting Knowledge Date: December 2023\nToday Date: {PINNED_DATE}\n\n"
"""The fixed text of the system block every rendered prompt starts with."""

_SYSTEM = (
    '{{- bos_token }}{%- if messages[0]["role"] == "system" %}{%- set system_message = messages[0]["content"] | trim %}'
    '{%- set messages = messages[1:] %}{%- else %}{%- set system_message = "" %}{%- endif %}'
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\nToday Date: '
    + PINNED_DATE
    + '\\n\\n" + system_message + "<|eot_id|>" }}'
)
_TURN = (
    '{{- "<|start_header_id|>" + message["role"] + "<|end_header_id|>\\n\\n"'
    ' + message["content"] | trim + "<|eot_id|>" }}'
)
_HEADER = _SYSTEM + "{%- for message in messages %}" + _TURN + "{%- endfor %}"

LLAMA32_CHAT_TEMPLATE = (
    _HEADER + '{%- if add_generation_prompt %}{{- "<|start_header_id|>assistant<|end_header_id|>\\n\\n" }}{%- endif %}'
)
"""Llama-3.2's chat format (system block with the pinned date, then the turns), without tool support."""

_SPEECH_TURN = '{{- "<|start_header_id|>assistant<|end_header_id|>\\n\\n' + SPEECH_GENERATION_START + '" }}'
SPEECH_CHAT_TEMPLATE = (
    _SYSTEM
    + '{%- for message in messages %}{%- if loop.last and message["role"] == "assistant" %}'
    + _SPEECH_TURN
    + '{{- message["content"] | trim }}{%- else %}'
    + _TURN
    + "{%- endif %}{%- endfor %}"
    + '{%- if add_generation_prompt and messages[-1]["role"] != "assistant" %}'
    + _SPEECH_TURN
    + "{%- endif %}"
)
"""`LLAMA32_CHAT_TEMPLATE` whose generation prompt opens the assistant turn with ``<|SPEECH_GENERATION_START|>``.

A final assistant message is the voice-cloning prefix (`tts_messages` with ``prompt_codes``): its content, the
prompt speech's ``<|s_N|>`` tokens, follows ``<|SPEECH_GENERATION_START|>`` in the open assistant turn, and
generation continues it (Llasa's ``continue_final_message``). It has no single quote, so it passes through a Hydra
command line as ``key='<template>'`` unchanged."""


def speech_template_override() -> str:
    """The Hydra override that makes veRL render Llasa prompts (`SPEECH_CHAT_TEMPLATE`)."""
    return f"+actor_rollout_ref.model.custom_chat_template='{SPEECH_CHAT_TEMPLATE}'"


def tts_messages(text: str, prompt_codes: Sequence[int] | None = None) -> list[dict[str, str]]:
    """The chat messages of a Llasa TTS request for ``text`` (RLHFDataset's ``prompt`` column).

    Voice cloning: ``text`` is the prompt's transcript and the target text (``prompt_text + " " + text``), and
    ``prompt_codes`` (the prompt speech's codec ids) become a final assistant message of ``<|s_N|>`` tokens.
    """
    messages = [{"role": "user", "content": USER_PROMPT.format(text=text)}]
    if prompt_codes is not None and len(prompt_codes):
        messages.append({"role": "assistant", "content": "".join(speech_token(int(c)) for c in prompt_codes)})
    return messages


def render_prompt_ids(
    tokenizer, text: str, prompt_codes: Sequence[int] | None = None, speaker: str | None = None
) -> list[int]:
    """Token ids of the Llasa prompt for ``text``, as veRL's agent loop renders it with `SPEECH_CHAT_TEMPLATE`, after
    the text front end and speaker tag the tokenizer declares (`maspo_base.speech_tokens.text_frontend`; the text as
    written unless it declares one). ``speaker``: another voice of a checkpoint of several."""
    ids = tokenizer.apply_chat_template(
        tts_messages(model_text(tokenizer, text, speaker), prompt_codes),
        chat_template=SPEECH_CHAT_TEMPLATE,
        add_generation_prompt=True,
        tokenize=True,
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
