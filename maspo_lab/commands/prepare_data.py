"""``maspo-verl prepare-data``: text (and optional prompt speech) -> veRL parquet in Llasa's format.

See `maspo_lab.data.prepare` for the inputs, the row format and the checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from maspo_base.codecs import codec_layout
from maspo_base.speech_tokens.layouts import LLASA_1B
from maspo_base.typed_settings import add_arguments, parse_arguments_or_exit
from maspo_lab.data.prepare import FORMATS, CodesFile, Columns, Limits, PromptEncoder, prepare


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="maspo-verl prepare-data",
        description="Write train.parquet and val.parquet (veRL RLHFDataset rows with Llasa prompts) from text lists.",
    )
    parser.add_argument(
        "inputs", nargs="+", type=Path, help="Seed-TTS-eval .lst, .txt, .csv, .jsonl, or an HF dataset folder"
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--format", choices=FORMATS, default=None, help="input format (default: from the suffix)")
    parser.add_argument(
        "--language", default=None, help="language of rows that give none (default: detected: Han -> zh, else en)"
    )
    parser.add_argument("--val-size", type=float, default=0.05, help="validation rows: a fraction (< 1) or a count")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split")
    add_arguments(parser, Limits, into=parser)
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="the model's checkpoint (Llasa-1B, or mini-llasa by its speech_tokens.json): check its speech tokens, "
        "measure prompts, and write prompts in what its model reads (its text front end, when it declares one)",
    )
    codes = parser.add_mutually_exclusive_group()
    codes.add_argument(
        "--codec",
        default=None,
        help="codec spec NAME:PATH or PATH, xcodec2 (a local XCodec2 checkpoint with its encoder) or mel_fsq (the "
        "mini codec): encode prompt wavs with its encoder",
    )
    codes.add_argument(
        "--codes-file", type=Path, default=None, help='precomputed prompt codes: JSONL {"wav"|"utt", "codes"}'
    )
    parser.add_argument("--device", default="cpu", help="device of the codec encoder")
    for name in ("text", "language", "utt", "prompt_text", "prompt_wav", "prompt_codes"):
        parser.add_argument(f"--{name.replace('_', '-')}-column", default=name, help=f"CSV/JSONL/HF column of {name}")
    args = parser.parse_args(argv)
    args.limits = parse_arguments_or_exit(parser, args, Limits, "prepare-data")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.limits.max_prompt_tokens is not None and args.tokenizer is None:
        print("maspo-verl prepare-data: --max-prompt-tokens needs --tokenizer", file=sys.stderr)
        return 2
    coder = None
    if args.codes_file is not None:
        coder = CodesFile(args.codes_file)
    elif args.codec is not None:
        coder = PromptEncoder(args.codec, device=args.device)
        coder.load()
    tokenizer, layout = None, None
    try:
        if args.tokenizer is not None:
            from transformers import AutoTokenizer

            from maspo_lab.speaking_model.model import layout_of_checkpoint

            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
            layout = layout_of_checkpoint(args.tokenizer, tokenizer)
        if isinstance(coder, PromptEncoder):  # prompt codes must be codes of the model's codebook
            layout = codec_layout(coder, layout)
    except ValueError as error:
        print(f"maspo-verl prepare-data: --tokenizer {args.tokenizer} / --codec {args.codec}: {error}", file=sys.stderr)
        return 2
    columns = Columns(**{name: getattr(args, f"{name}_column") for name in Columns.__dataclass_fields__})
    try:
        summary = prepare(
            args.inputs,
            args.out,
            fmt=args.format,
            columns=columns,
            language=args.language,
            coder=coder,
            limits=args.limits,
            val_size=args.val_size,
            seed=args.seed,
            tokenizer=tokenizer,
            report=lambda line: print(line, file=sys.stderr),
            layout=layout or LLASA_1B,
        )
    except (ValueError, FileNotFoundError) as error:
        print(f"maspo-verl prepare-data: {error}", file=sys.stderr)
        return 2
    print(summary.table())
    print(json.dumps({"train": str(args.out / "train.parquet"), "val": str(args.out / "val.parquet")}))
    return 0
