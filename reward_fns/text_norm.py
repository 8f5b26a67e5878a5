"""Text normalisation of Seed-TTS-eval (BytedanceSpeech/seed-tts-eval), the protocol TTS papers report against.

For a reference or transcript ``s`` in language ``lang``:

1. (Chinese) convert to simplified script: ``zhconv.convert(s, "zh-cn")``;
2. delete every character of ``zhon.hanzi.punctuation + string.punctuation`` except the apostrophe;
3. Chinese is scored per character (``" ".join(chars)``, whitespace dropped); other languages are lower-cased
   and scored per whitespace-separated word.

Seed-TTS-eval converts only the transcript to simplified script; converting the reference as well changes nothing for
a simplified reference and keeps a traditional one from scoring as all errors.
"""

from __future__ import annotations

import string

import zhconv
from zhon.hanzi import punctuation as _hanzi_punctuation

PUNCTUATION = "".join(sorted(set(_hanzi_punctuation + string.punctuation) - {"'"}))
_DELETE_PUNCTUATION = str.maketrans("", "", PUNCTUATION)

CHARACTER_LANGUAGES = frozenset({"zh", "yue", "ja"})
"""Languages scored per character (CER); every other language is scored per word (WER)."""


def base_language(lang: str) -> str:
    """``"zh-CN"``, ``"zh_cn"``, ``"ZH"`` -> ``"zh"``; ``"en-US"`` -> ``"en"``."""
    if not isinstance(lang, str) or not lang.strip():
        raise ValueError(f"language must be a non-empty code such as 'zh' or 'en', got {lang!r}")
    return lang.strip().lower().replace("_", "-").split("-")[0]


def scoring_units(text: str, lang: str) -> list[str]:
    """The units the error rate counts: characters for `CHARACTER_LANGUAGES`, lower-cased words otherwise."""
    lang = base_language(lang)
    if lang == "zh":
        text = zhconv.convert(text, "zh-cn")
    text = text.translate(_DELETE_PUNCTUATION)
    if lang in CHARACTER_LANGUAGES:
        return [c for c in text if not c.isspace()]
    return text.lower().split()
