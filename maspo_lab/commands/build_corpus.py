"""``maspo-verl build-corpus``: the speaking testbed's corpus (`maspo_lab.speaking_model.corpus`), and what Whisper
tiny.en hears of each voice.

    maspo-verl build-corpus --out corpus/            # 6,000 sentences x 4 flite voices, each at 3 speeds
    maspo-verl build-corpus --out corpus/ --speeds 0.8 --reuse     # add copies at another speed to that corpus

``--speeds`` (default 0.9 1.1, the shipped build's) adds a copy of every utterance at each speed
(`maspo_lab.speaking_model.corpus.perturb_speed`: voices ``rms-sp90``, ``rms-sp110``, ...), after speaking, or, with
``--reuse``, to the corpus already in ``--out``; ``--speeds`` with no factor adds none.

Then, per voice, Whisper tiny.en transcribes the first ``--report-utterances`` held-out utterances: pooled CER and
WER go to ``corpus/report.json`` and the screen.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from maspo_lab.speaking_model.corpus import MANIFEST, SPEEDS, VOICES, build_corpus, check_speed, perturb_speed


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maspo-verl build-corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=6000)
    parser.add_argument("--voices", nargs="+", default=list(VOICES), help=f"flite voices (default: {' '.join(VOICES)})")
    parser.add_argument("--heldout-fraction", type=float, default=0.05, help="share of sentences held out")
    parser.add_argument("--seed", type=int, default=0, help="which sentences (a shuffle of the candidates)")
    parser.add_argument("--jobs", type=int, default=2, help="flite processes at a time")
    parser.add_argument(
        "--speeds",
        nargs="*",
        type=float,
        default=list(SPEEDS),
        help=f"speed-perturbed copies of every utterance (default: {' '.join(map(str, SPEEDS))}; none: no copies)",
    )
    parser.add_argument("--reuse", action="store_true", help="keep the corpus in --out; only add --speeds")
    parser.add_argument("--report-utterances", type=int, default=50, help="held-out utterances heard per voice")
    args = parser.parse_args(argv)
    if args.sentences < 1 or args.jobs < 1 or args.report_utterances < 0:
        parser.error("--sentences and --jobs must be >= 1, --report-utterances >= 0")
    if not 0 < args.heldout_fraction < 1:
        parser.error(f"--heldout-fraction must be in (0, 1), got {args.heldout_fraction}")
    for factor in args.speeds:
        try:
            check_speed(factor)
        except ValueError as error:
            parser.error(f"--speeds: {error}")
    if args.reuse and not (args.out / MANIFEST).is_file():
        parser.error(f"--reuse: {args.out} holds no corpus ({MANIFEST})")
    if args.reuse and not args.speeds:
        parser.error("--reuse only adds --speeds to a corpus: name them")
    return args


def hear_voices(corpus: Path, per_voice: int) -> dict:
    """Pooled CER/WER of the source audio of the first ``per_voice`` held-out utterances, per voice."""
    from maspo_lab.speaking_model.corpus import load_audio, read_manifest
    from maspo_lab.speaking_model.hearing import Ear, heard

    ear, rows, report = Ear(), read_manifest(corpus, split="heldout"), {}
    for voice in sorted({u.voice for u in rows}):
        chosen = [u for u in rows if u.voice == voice][:per_voice]
        result = heard([u.text for u in chosen], ear.transcribe([load_audio(corpus, u) for u in chosen]))
        report[voice] = {**result.summary(), "mean_seconds": round(sum(u.seconds for u in chosen) / len(chosen), 3)}
    return report


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    log = functools.partial(print, flush=True)
    if not args.reuse:
        log(f"[corpus] {args.sentences} sentences x {len(args.voices)} voices into {args.out}")
        build_corpus(
            args.out,
            sentences=args.sentences,
            voices=args.voices,
            heldout_fraction=args.heldout_fraction,
            seed=args.seed,
            jobs=args.jobs,
            log=log,
        )
    if args.speeds:
        perturb_speed(args.out, args.speeds, jobs=args.jobs, log=log)
    summary = json.loads((args.out / "corpus.json").read_text())
    print(f"[corpus] {summary['hours']} h kept: {json.dumps(summary['utterances'])}")
    if args.report_utterances:
        report = hear_voices(args.out, args.report_utterances)
        (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        print("voice        WER    CER    mean duration (Whisper tiny.en, held-out utterances)")
        for voice, r in report.items():
            print(f"{voice:<12} {r['wer']:.3f}  {r['cer']:.3f}  {r['mean_seconds']:.2f} s  ({r['utterances']} heard)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
