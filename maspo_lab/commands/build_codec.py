"""``maspo-verl build-codec``: train the mini codec on a corpus (`maspo_lab.speaking_model.codec_training`) and
report what Whisper tiny.en hears of its resynthesis.

    maspo-verl build-codec --corpus corpus/ --out codec/

Per voice, the first ``--report-utterances`` held-out utterances are encoded and decoded; pooled CER/WER of the
source and of the resynthesis, and the decode cost (CPU seconds per second of audio), go to ``codec/report.json``
and the screen.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from maspo_base.typed_settings import add_arguments, parse_arguments_or_exit
from maspo_lab.speaking_model.codec_training import CodecSettings


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags; ``settings``: the `CodecSettings` they give."""
    parser = argparse.ArgumentParser(prog="maspo-verl build-codec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    add_arguments(parser, CodecSettings, skip=("crop_frames", "threads"), into=parser)
    parser.add_argument("--report-utterances", type=int, default=50, help="held-out utterances heard per voice")
    args = parser.parse_args(argv)
    args.settings = parse_arguments_or_exit(parser, args, CodecSettings, "build-codec")
    return args


def main(argv: list[str]) -> int:
    from maspo_base.mel_codec import MelFsqCodec
    from maspo_lab.speaking_model.codec_training import train_codec
    from maspo_lab.speaking_model.hearing import Ear, hear_codec

    args = parse_args(argv)
    train_codec(args.corpus, args.out, args.settings, log=lambda line: print(line, flush=True))
    if args.report_utterances:
        codec = MelFsqCodec.from_pretrained(args.out)
        report = hear_codec(args.corpus, codec, Ear(), args.report_utterances)
        (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        print("voice   source WER/CER   resynthesis WER/CER   decode CPU s per s of audio (Whisper tiny.en)")
        for voice, r in report.items():
            s, x = r["source"], r["resynthesis"]
            print(
                f"{voice:<7} {s['wer']:.3f} / {s['cer']:.3f}    {x['wer']:.3f} / {x['cer']:.3f}         "
                f"{r['decode_cpu_s_per_audio_s']:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
