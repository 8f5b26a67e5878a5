"""``maspo-verl speak``: say sentences with a checkpoint and write one wav per sentence, plus a page to play them.

    maspo-verl speak "The birch canoe slid on the smooth planks." "Glue the sheet to the dark blue background." \\
        --out heard/

writes ``heard/01_the-birch-canoe-slid-on-the-smooth.wav``, ``heard/02_...`` (16 kHz mono, named so that they sort
in the order given), ``heard/index.html`` (a player, the text and the duration per sentence) and ``heard/speak.json``.
The checkpoint defaults to the shipped mini-llasa and its codec (`maspo_lab.speaking_model.SHIPPED_MODEL`);
``--checkpoint`` takes any other that speaks in Llasa's format (a training run's ``global_step_N/actor/huggingface``,
or Llasa-1B by folder or hub id) and ``--codec`` the codec its codes need (XCodec2 for Llasa-1B). Sampling is
Llasa's (temperature 0.8, top-p 1); a sentence whose response never reaches the end tag gets no wav, and the page
says so. ``--speaker slt`` says them in another voice of a checkpoint that learnt several (its tokenizer declares
``speaker``; `maspo_base.speech_tokens.text_frontend`).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
import time
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maspo-verl speak", description=__doc__.split("\n\n")[0])
    parser.add_argument("sentences", nargs="+", help="the sentences to say, in order")
    parser.add_argument("--out", type=Path, required=True, help="folder for the wavs and index.html")
    parser.add_argument("--checkpoint", default=None, help="model folder or hub id (default: the shipped mini-llasa)")
    parser.add_argument(
        "--codec",
        default=None,
        help="codec spec, NAME:PATH or PATH (default: the shipped mini codec for a mini-llasa checkpoint; "
        "Llasa-1B needs its XCodec2)",
    )
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=8.0, help="longest response, in seconds of codes")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--speaker", default=None, help="another voice of a checkpoint that learnt several (default: its own)"
    )
    args = parser.parse_args(argv)
    if args.temperature <= 0:
        parser.error(f"--temperature must be > 0, got {args.temperature}")
    if args.max_seconds <= 0:
        parser.error(f"--max-seconds must be > 0, got {args.max_seconds}")
    if any(not s.strip() for s in args.sentences):
        parser.error("a sentence is blank")
    return args


def file_names(sentences: list[str]) -> list[str]:
    """``NN_first-words.wav`` per sentence: a zero-padded position first, so that the files sort in order."""
    digits = len(str(len(sentences)))
    names = []
    for i, sentence in enumerate(sentences, 1):
        slug = "-".join(re.findall(r"[a-z0-9]+", sentence.lower())[:6])[:40] or "sentence"
        names.append(f"{i:0{digits}d}_{slug}.wav")
    return names


def default_codec(layout_name: str) -> str:
    from maspo_lab.speaking_model import SHIPPED_CODEC

    if layout_name == "mini-llasa":
        return str(SHIPPED_CODEC)
    raise SystemExit(
        f"maspo-verl speak: the checkpoint's layout is {layout_name!r}; give --codec with the codec its codes need "
        "(for Llasa-1B: an XCodec2 folder or hub id, e.g. --codec HKUSTAudio/xcodec2)"
    )


def write_page(out: Path, rows: list[dict], title: str) -> Path:
    cells = []
    for row in rows:
        player = (
            f'<audio controls preload="metadata" src="{html.escape(row["wav"])}"></audio>'
            if row["wav"]
            else f"<em>{html.escape(row['note'])}</em>"
        )
        seconds = f"{row['seconds']:.2f} s" if row["wav"] else ""
        cells.append(
            f"<tr><td>{row['index']}</td><td>{html.escape(row['text'])}</td><td>{player}</td><td>{seconds}</td></tr>"
        )
    page = (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:4px 10px;border-bottom:1px solid #ddd}</style>"
        f"<h1>{html.escape(title)}</h1><table><tr><th>#</th><th>text</th><th>speech</th><th>length</th></tr>"
        + "".join(cells)
        + "</table>"
    )
    path = out / "index.html"
    path.write_text(page)
    return path


def main(argv: list[str]) -> int:
    import soundfile as sf

    from maspo_base.codecs import load_codec
    from maspo_base.speech_tokens.text_frontend import check_speaker, speaker_of
    from maspo_lab.speaking_model import SHIPPED_MODEL
    from maspo_lab.speaking_model.speaker import Speaker

    args = parse_args(argv)
    checkpoint = args.checkpoint or str(SHIPPED_MODEL)
    start = time.monotonic()
    speaker = Speaker(checkpoint, device=args.device)
    if args.speaker is not None:
        try:
            check_speaker(speaker.tokenizer, args.speaker)
        except ValueError as error:
            raise SystemExit(f"maspo-verl speak: --speaker: {error}") from None
    codec_spec = args.codec or default_codec(speaker.layout.name)
    codec = load_codec(codec_spec, device=args.device)
    print(f"[speak] {len(args.sentences)} sentences with {checkpoint} ({speaker.layout.name}), codec {codec_spec}")
    codes = speaker.codes(
        args.sentences, temperature=args.temperature, seed=args.seed, max_seconds=args.max_seconds, speaker=args.speaker
    )
    spoken = [i for i, c in enumerate(codes) if len(c)]
    audio = dict(zip(spoken, codec.decode([codes[i] for i in spoken]))) if spoken else {}
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (sentence, name) in enumerate(zip(args.sentences, file_names(args.sentences))):
        row = {"index": i + 1, "text": sentence, "wav": None, "seconds": 0.0, "codes": len(codes[i]), "note": ""}
        if i in audio:
            sf.write(args.out / name, audio[i], codec.sample_rate)
            row.update(wav=name, seconds=len(audio[i]) / codec.sample_rate)
        else:
            row["note"] = "no speech: the response did not end with <|SPEECH_GENERATION_END|> in time"
        rows.append(row)
        print(f"  {row['index']:>3}  {row['seconds']:5.2f} s  {row['wav'] or row['note']}")
    page = write_page(args.out, rows, f"maspo-verl speak: {Path(checkpoint).name or checkpoint}")
    (args.out / "speak.json").write_text(
        json.dumps(
            {
                "checkpoint": checkpoint,
                "codec": codec_spec,
                "temperature": args.temperature,
                "seed": args.seed,
                "speaker": args.speaker or speaker_of(speaker.tokenizer),
                "sentences": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"[speak] {len(spoken)}/{len(rows)} said in {time.monotonic() - start:.0f}s; page: {page}")
    return 0 if spoken else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
