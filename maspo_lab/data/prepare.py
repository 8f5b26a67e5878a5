"""Text (and optional prompt speech) -> the ``train.parquet`` / ``val.parquet`` veRL's ``RLHFDataset`` reads.

Inputs, one utterance a record:

- Seed-TTS-eval lists (``.lst``): ``utt|prompt_text|prompt_wav|text`` (voice cloning; ``prompt_wav`` relative to
  the list's folder), or ``utt|text``;
- plain text (``.txt``): one utterance a line;
- CSV (``.csv``) or JSON lines (``.jsonl``) with named columns (``text``; optional ``language``, ``utt``,
  ``prompt_text``, ``prompt_wav``, ``prompt_codes``; other names through `Columns`);
- a Hugging Face dataset saved with ``save_to_disk`` (a folder), same columns.

Each row becomes a Llasa request (`maspo_base.speech_tokens.llasa_prompt.tts_messages`): the user message
``Convert the text to speech:<|TEXT_UNDERSTANDING_START|>{text}<|TEXT_UNDERSTANDING_END|>`` and, for voice cloning,
``{text} = prompt_text + " " + text`` and a final assistant message of the prompt's ``<|s_N|>`` codes, which the
recipe's chat template places right after ``<|SPEECH_GENERATION_START|>``. ``reward_model.ground_truth`` is the
target text; ``extra_info`` holds ``language`` (given, or ``zh`` when the text has Han characters, else ``en``),
``utt``, ``source``/``line`` and, for voice cloning, ``prompt_text`` and ``prompt_codes`` (the reward decodes them
as the reference voice for speaker similarity).

A bad row (no text, text with control characters or Llasa tags, nothing speakable, a prompt wav that is missing
or has no codes) is reported with its file and line and skipped; duplicates (same text and prompt) and rows outside
the length limits are dropped and counted. The split is a seeded shuffle.
"""

from __future__ import annotations

import csv
import json
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens.layouts import LLASA_1B, SpeechTokenLayout
from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids, tts_messages
from maspo_base.speech_tokens.text_frontend import reader_of

DATA_SOURCE = "llasa_tts"
CODEC_FRAMES_PER_SECOND = 50
FORMATS = ("seedtts", "text", "csv", "jsonl", "hf")
_SUFFIX_FORMATS = {".lst": "seedtts", ".txt": "text", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_SPEAKABLE = re.compile(r"\w", re.UNICODE)


@dataclass
class Columns:
    """Column names of CSV, JSONL and HF-dataset inputs."""

    text: str = "text"
    language: str = "language"
    utt: str = "utt"
    prompt_text: str = "prompt_text"
    prompt_wav: str = "prompt_wav"
    prompt_codes: str = "prompt_codes"


@dataclass
class Record:
    """One input utterance before checks; ``line`` is 1-based (the row index for an HF dataset)."""

    source: str
    line: int
    text: Any
    utt: str | None = None
    language: str | None = None
    prompt_text: str | None = None
    prompt_wav: str | None = None
    prompt_codes: list[int] | None = None


@dataclass
class BadRow:
    source: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}"


@dataclass
class Limits:
    """Length filters on the target text (characters, after stripping) and the prompt speech (seconds); each is a
    flag of ``maspo-verl prepare-data`` (`maspo_base.typed_settings.add_arguments`)."""

    min_chars: int = field(default=1, metadata={"help": "drop target texts shorter than this"})
    max_chars: int = field(default=300, metadata={"help": "drop target texts longer than this"})
    max_prompt_seconds: float = field(default=15.0, metadata={"help": "drop prompt speech longer than this"})
    max_prompt_tokens: int | None = field(
        default=None,
        metadata={
            "help": "with --tokenizer: drop rows whose rendered prompt is longer (veRL's data.max_prompt_length)"
        },
    )


@dataclass
class Summary:
    read: int = 0
    bad: int = 0
    bad_reasons: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    too_short: int = 0
    too_long: int = 0
    prompt_too_long: int = 0
    train: int = 0
    val: int = 0
    voice_cloning: int = 0
    languages: dict[str, int] = field(default_factory=dict)
    bad_rows: list[str] = field(default_factory=list)

    def table(self) -> str:
        lines = [
            f"read {self.read} rows; kept {self.train + self.val} (train {self.train}, val {self.val})",
            f"  bad rows skipped   {self.bad}" + (f"  {dict(self.bad_reasons)}" if self.bad_reasons else ""),
            f"  duplicates         {self.duplicates}",
            f"  text too short     {self.too_short}",
            f"  text too long      {self.too_long}",
            f"  prompt too long    {self.prompt_too_long}",
            f"  voice cloning rows {self.voice_cloning}",
            f"  languages          {dict(self.languages)}",
        ]
        return "\n".join(lines)


def detect_language(text: str) -> str:
    """``zh`` when the text has a Han character, else ``en`` (the two languages Seed-TTS-eval scores)."""
    return "zh" if _HAN.search(text) else "en"


def text_problem(text: Any) -> str | None:
    """Why ``text`` cannot be a TTS target, or None: empty, control characters, Llasa tags, nothing speakable."""
    if text is None or (isinstance(text, float) and text != text):  # pandas NaN for an empty CSV cell
        return "empty text"
    if not isinstance(text, str):
        return f"text is {type(text).__name__}, not a string"
    if not text.strip():
        return "empty text"
    control = [c for c in text if unicodedata.category(c) in ("Cc", "Cf") and c not in "\t"]
    if control:
        return f"unsupported characters {sorted({f'U+{ord(c):04X}' for c in control})}"
    if "<|" in text or "|>" in text:
        return "unsupported characters: Llasa tag syntax '<|' or '|>' in the text"
    if not _SPEAKABLE.search(text):
        return "nothing speakable (punctuation or symbols only)"
    return None


def input_format(path: Path, fmt: str | None = None) -> str:
    if fmt:
        if fmt not in FORMATS:
            raise ValueError(f"--format {fmt!r}: valid formats are {', '.join(FORMATS)}")
        return fmt
    if path.is_dir():
        return "hf"
    if path.suffix in _SUFFIX_FORMATS:
        return _SUFFIX_FORMATS[path.suffix]
    raise ValueError(
        f"{path}: cannot tell the format from the suffix {path.suffix!r}; pass --format "
        f"({', '.join(FORMATS)}; suffixes {', '.join(_SUFFIX_FORMATS)}, or a folder for an HF dataset)"
    )


def read_records(path: str | Path, fmt: str | None = None, columns: Columns | None = None) -> Iterator[Record | BadRow]:
    """The records of one input file; a malformed line is yielded as a `BadRow`."""
    path, columns = Path(path), columns or Columns()
    fmt = input_format(path, fmt)
    src = str(path)
    if fmt in ("seedtts", "text"):
        with open(path, encoding="utf-8") as handle:
            for number, raw in enumerate(handle, start=1):
                line = raw.rstrip("\n").rstrip("\r")
                if not line.strip():
                    continue
                if fmt == "text":
                    yield Record(src, number, line.strip())
                    continue
                parts = line.split("|")
                if len(parts) == 4:
                    utt, prompt_text, prompt_wav, text = parts
                    wav = str((path.parent / prompt_wav).resolve()) if prompt_wav else None
                    yield Record(src, number, text, utt=utt, prompt_text=prompt_text or None, prompt_wav=wav)
                elif len(parts) == 2:
                    yield Record(src, number, parts[1], utt=parts[0])
                else:
                    yield BadRow(
                        src,
                        number,
                        f"{len(parts)} '|'-separated fields; expected utt|prompt_text|prompt_wav|text or utt|text",
                    )
        return
    if fmt == "csv":
        with open(path, encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            if columns.text not in (reader.fieldnames or []):
                raise ValueError(
                    f"{path}: no column {columns.text!r} (columns: {reader.fieldnames}); set --text-column"
                )
            for row in reader:
                yield _from_mapping(row, src, reader.line_num, columns, path.parent)
        return
    if fmt == "jsonl":
        with open(path, encoding="utf-8") as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw)
                except json.JSONDecodeError as error:
                    yield BadRow(src, number, f"not JSON: {error.msg}")
                    continue
                if not isinstance(row, dict):
                    yield BadRow(src, number, f"a JSON {type(row).__name__}, expected an object with {columns.text!r}")
                    continue
                yield _from_mapping(row, src, number, columns, path.parent)
        return
    from datasets import load_from_disk

    dataset = load_from_disk(str(path))
    if hasattr(dataset, "keys") and not hasattr(dataset, "column_names"):
        raise ValueError(f"{path} is a DatasetDict ({list(dataset)}); pass one split's folder")
    if columns.text not in dataset.column_names:
        raise ValueError(f"{path}: no column {columns.text!r} (columns: {dataset.column_names}); set --text-column")
    for index, row in enumerate(dataset):
        yield _from_mapping(row, src, index, columns, path)


def _from_mapping(row: dict, source: str, line: int, columns: Columns, base: Path) -> Record:
    def get(name: str):
        value = row.get(name)
        return None if value is None or (isinstance(value, str) and not value.strip()) else value

    wav = get(columns.prompt_wav)
    codes = get(columns.prompt_codes)
    if isinstance(codes, str):
        codes = json.loads(codes)
    return Record(
        source,
        line,
        row.get(columns.text),
        utt=None if get(columns.utt) is None else str(get(columns.utt)),
        language=get(columns.language),
        prompt_text=get(columns.prompt_text),
        prompt_wav=None if wav is None else str((base / str(wav)).resolve()),
        prompt_codes=None if codes is None else [int(c) for c in codes],
    )


class CodesFile:
    """Precomputed prompt codes: JSON lines ``{"wav": path, "codes": [...]}`` (or ``"utt"`` for the key), or one
    JSON object ``{key: [codes]}``. A wav is looked up by its path, then its file name, then its stem."""

    def __init__(self, path: str | Path):
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        self.codes: dict[str, list[int]] = {}
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, dict) and "codes" not in whole:  # one JSON object {key: codes}
            entries = list(whole.items())
        else:  # JSON lines {"wav" or "utt": key, "codes": [...]}
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            entries = [(e.get("wav") or e.get("utt"), e["codes"]) for e in lines]
        for key, codes in entries:
            if key is None:
                raise ValueError(f"{path}: an entry has neither 'wav' nor 'utt'")
            self.codes[str(key)] = [int(c) for c in codes]
            self.codes.setdefault(Path(str(key)).name, self.codes[str(key)])
            self.codes.setdefault(Path(str(key)).stem, self.codes[str(key)])

    def __call__(self, wav: str, utt: str | None = None) -> list[int] | None:
        for key in (wav, Path(wav).name, Path(wav).stem, utt):
            if key is not None and key in self.codes:
                return self.codes[key]
        return None


PromptCoder = Callable[[str, "str | None"], "list[int] | None"]
"""``coder(wav_path, utt) -> codec ids`` (or None when it has none for this wav)."""


class PromptEncoder:
    """Prompt codes of a wav file from the encoder of a codec spec (`maspo_base.codecs.load_encoder`: XCodec2's, or
    the mini codec's), loaded on first use (or by `load`); None for a file that does not exist."""

    def __init__(self, codec: str, device: str = "cpu"):
        self.codec, self.device = codec, device
        self._encoder = None

    def load(self):
        if self._encoder is None:
            from maspo_base.codecs import load_encoder

            self._encoder = load_encoder(self.codec, device=self.device)
        return self._encoder

    @property
    def codebook_size(self) -> int:
        return self.load().codebook_size

    def __call__(self, wav: str, utt: str | None = None) -> list[int] | None:
        if not Path(wav).exists():
            return None
        from maspo_base.xcodec2_encoder import load_audio

        return [int(c) for c in self.load().encode(load_audio(wav))]


def prompt_codes_of(
    record: Record, coder: PromptCoder | None, codebook_size: int = lt.CODEBOOK_SIZE
) -> tuple[list[int] | None, str | None]:
    """(codes, problem) of a voice-cloning record; codes outside ``[0, codebook_size)`` are a problem."""
    if record.prompt_codes is not None:
        codes = record.prompt_codes
    elif record.prompt_wav is None:
        return None, None
    else:
        codes = coder(record.prompt_wav, record.utt) if coder is not None else None
        if codes is None:
            if not Path(record.prompt_wav).exists():
                return None, f"missing audio {record.prompt_wav}"
            return None, f"no codes for {record.prompt_wav}: pass --codec (a codec spec) or --codes-file"
    bad = [c for c in codes if not 0 <= int(c) < codebook_size]
    if bad:
        return None, f"prompt codes out of range [0, {codebook_size}): {bad[:3]}"
    if not codes:
        return None, "empty prompt codes"
    return [int(c) for c in codes], None


def spoken_text(record: Record, cloning: bool) -> str:
    """The text Llasa is asked to speak: the target, after the prompt's transcript when cloning a voice."""
    target, prompt_text = record.text.strip(), (record.prompt_text or "").strip()
    return f"{prompt_text} {target}" if cloning and prompt_text else target


def build_row(record: Record, codes: list[int] | None, language: str, read: Callable[[str], str] = str) -> dict:
    """One RLHFDataset row for ``record`` (split and index are filled in by `prepare`); the prompt holds what the
    model reads for the spoken text (``read``: its text front end, `maspo_base.speech_tokens.text_frontend`)."""
    target = record.text.strip()
    cloning = codes is not None
    extra: dict[str, Any] = {
        "language": language,
        "utt": record.utt or "",
        "source": record.source,
        "line": record.line,
        "text": target,
    }
    if cloning:
        extra["prompt_text"] = (record.prompt_text or "").strip()
        extra["prompt_codes"] = codes
    return {
        "data_source": DATA_SOURCE,
        "prompt": tts_messages(read(spoken_text(record, cloning)), codes),
        "ability": "tts",
        "reward_model": {"style": "rule", "ground_truth": target},
        "extra_info": extra,
    }


def prepare(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    fmt: str | None = None,
    columns: Columns | None = None,
    language: str | None = None,
    coder: PromptCoder | None = None,
    limits: Limits | None = None,
    val_size: float = 0.05,
    seed: int = 0,
    tokenizer=None,
    report: Callable[[str], None] = print,
    layout: SpeechTokenLayout = LLASA_1B,
) -> Summary:
    """Read ``inputs``, check, dedup, filter, split and write ``out_dir/{train,val}.parquet`` + ``summary.json``.

    ``language``: used where a row gives none (else detected). ``val_size``: a fraction (< 1) or a row count.
    ``tokenizer``: checked against ``layout`` (the model's speech tokens; Llasa-1B's by default, whose codebook also
    bounds prompt codes); with ``limits.max_prompt_tokens`` prompts are measured with it. Prompts hold what the
    tokenizer's model reads (its text front end; the text as written without a tokenizer).
    """

    limits, summary = limits or Limits(), Summary()
    read: Callable[[str], str] = str
    if tokenizer is not None:
        layout.check_tokenizer(tokenizer)
        read = reader_of(tokenizer)
    rows, seen = [], set()
    max_codes = int(limits.max_prompt_seconds * CODEC_FRAMES_PER_SECOND)
    for record in _all_records(inputs, fmt, columns):
        summary.read += 1
        if isinstance(record, BadRow):
            _bad(summary, record, report)
            continue
        problem = text_problem(record.text)
        if problem is None and record.prompt_text is not None:
            problem = text_problem(record.prompt_text)
            problem = problem and f"prompt text: {problem}"
        codes = None
        if problem is None:
            codes, problem = prompt_codes_of(record, coder, layout.codebook_size)
        if problem is not None:
            _bad(summary, BadRow(record.source, record.line, problem), report)
            continue
        target = record.text.strip()
        key = (" ".join(target.split()), tuple(codes) if codes else None)
        if key in seen:
            summary.duplicates += 1
            continue
        seen.add(key)
        if len(target) < limits.min_chars:
            summary.too_short += 1
            continue
        if len(target) > limits.max_chars:
            summary.too_long += 1
            continue
        if codes is not None and len(codes) > max_codes:
            summary.prompt_too_long += 1
            continue
        lang = str(record.language or language or detect_language(target)).strip().lower()
        row = build_row(record, codes, lang, read)
        if tokenizer is not None and limits.max_prompt_tokens is not None:
            spoken = spoken_text(record, codes is not None)
            if len(render_prompt_ids(tokenizer, spoken, codes)) > limits.max_prompt_tokens:
                summary.prompt_too_long += 1
                continue
        rows.append(row)

    _write_splits(rows, summary, Path(out_dir), val_size, seed)
    return summary


def _write_splits(rows: list[dict], summary: Summary, out: Path, val_size: float, seed: int) -> None:
    """Shuffle ``rows`` (``seed``), split off the validation rows (``val_size``: a fraction < 1 or a count), write
    ``out/{train,val}.parquet`` and ``out/summary.json`` with the split's counts in ``summary``."""
    import pandas as pd

    random.Random(seed).shuffle(rows)
    n_val = int(round(val_size * len(rows))) if val_size < 1 else int(val_size)
    n_val = min(n_val, len(rows))
    splits = {"val": rows[:n_val], "train": rows[n_val:]}
    out.mkdir(parents=True, exist_ok=True)
    for split, split_rows in splits.items():
        for index, row in enumerate(split_rows):
            row["extra_info"] = {**row["extra_info"], "index": index, "split": split}
        frame = pd.DataFrame(split_rows, columns=["data_source", "prompt", "ability", "reward_model", "extra_info"])
        frame.to_parquet(out / f"{split}.parquet")
    summary.train, summary.val = len(splits["train"]), len(splits["val"])
    summary.voice_cloning = sum("prompt_codes" in r["extra_info"] for r in rows)
    summary.languages = dict(Counter(r["extra_info"]["language"] for r in rows))
    (out / "summary.json").write_text(json.dumps(asdict(summary), indent=2, ensure_ascii=False) + "\n")


def _all_records(inputs: Iterable[str | Path], fmt: str | None, columns: Columns | None) -> Iterator[Record | BadRow]:
    for path in inputs:
        if not Path(path).exists():
            raise FileNotFoundError(f"input {path} does not exist")
        yield from read_records(path, fmt, columns)


def _bad(summary: Summary, bad: BadRow, report: Callable[[str], None]) -> None:
    summary.bad += 1
    reason = bad.reason.split(" /")[0].split(":")[0]
    summary.bad_reasons[reason] = summary.bad_reasons.get(reason, 0) + 1
    summary.bad_rows.append(str(bad))
    report(f"skipped {bad}")
