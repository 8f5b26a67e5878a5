"""Llasa-1B's TTS prompt: the user message, the chat template, and the rendered prompt ids.

Prompts are rendered as Llasa expects (``SPEECH_CHAT_TEMPLATE``): Llama-3.2's chat format with the date pinned, the
user message ``Convert the text to speech:<|TEXT_UNDERSTANDING_START|>{text}<|TEXT_UNDERSTANDING_END|>`` and the
assistant turn already opened with ``<|SPEECH_GENERATION_START|>``, so that generation continues it. Pass the template
to veRL as ``actor_rollout_ref.model.custom_chat_template`` (see `speech_template_override`); generation stops at
``<|SPEECH_GENERATION_END|>``.
"""

from __future__ import annotations

from maspo_verl.llasa.tokens import SPEECH_GENERATION_START, TEXT_UNDERSTANDING_END, TEXT_UNDERSTANDING_START

USER_PROMPT = "Convert the text to speech:" + TEXT_UNDERSTANDING_START + "{text}" + TEXT_UNDERSTANDING_END
"""Llasa's user message; ``USER_PROMPT.format(text=...)``."""

PINNED_DATE = "26 Jul 2024"
"""Llama-3.2's template prints today's date; pinned (Llama-3.2's own fallback) for reproducible prompts."""

SYSTEM_HEADER_TEXT = f"Cutting Knowledge Date: December 2023\nToday Date: {PINNED_DATE}\n\n"
"""The fixed text of the system block every rendered prompt starts with."""

_HEADER = (
    '{{- bos_token }}{%- if messages[0]["role"] == "system" %}{%- set system_message = messages[0]["content"] | trim %}'
    '{%- set messages = messages[1:] %}{%- else %}{%- set system_message = "" %}{%- endif %}'
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\nToday Date: '
    + PINNED_DATE
    + '\\n\\n" + system_message + "<|eot_id|>" }}'
    '{%- for message in messages %}{{- "<|start_header_id|>" + message["role"] + "<|end_header_id|>\\n\\n"'
    ' + message["content"] | trim + "<|eot_id|>" }}{%- endfor %}'
)

LLAMA32_CHAT_TEMPLATE = (
    _HEADER + '{%- if add_generation_prompt %}{{- "<|start_header_id|>assistant<|end_header_id|>\\n\\n" }}{%- endif %}'
)
"""Llama-3.2's chat format (system block with the pinned date, then the turns), without tool support."""

SPEECH_CHAT_TEMPLATE = (
    _HEADER
    + '{%- if add_generation_prompt %}{{- "<|start_header_id|>assistant<|end_header_id|>\\n\\n'
    + SPEECH_GENERATION_START
    + '" }}{%- endif %}'
)
"""`LLAMA32_CHAT_TEMPLATE` whose generation prompt opens the assistant turn with ``<|SPEECH_GENERATION_START|>``.

It has no single quote, so it passes through a Hydra command line as ``key='<template>'`` unchanged."""


def speech_template_override() -> str:
    """The Hydra override that makes veRL render Llasa prompts (`SPEECH_CHAT_TEMPLATE`)."""
    return f"+actor_rollout_ref.model.custom_chat_template='{SPEECH_CHAT_TEMPLATE}'"


def tts_messages(text: str) -> list[dict[str, str]]:
    """The chat messages of a Llasa TTS request for ``text`` (RLHFDataset's ``prompt`` column)."""
    return [{"role": "user", "content": USER_PROMPT.format(text=text)}]


def render_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of the Llasa prompt for ``text``, as veRL's agent loop renders it with `SPEECH_CHAT_TEMPLATE`."""
    ids = tokenizer.apply_chat_template(
        tts_messages(text), chat_template=SPEECH_CHAT_TEMPLATE, add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
