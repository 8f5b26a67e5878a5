"""``maspo-verl build-ear``: the code ear, a CTC recogniser of phonemes in codec codes (`reward_fns.code_ear`).

    maspo-verl build-ear --corpus corpus/ --out ear/                  # the shipped codec's codes of the corpus
    maspo-verl build-ear --corpus corpus/ --out ear/ --ship           # and copy the ear into the package
    maspo-verl build-ear --codes xcodec2-codes.jsonl --layout llasa-1b --inputs digits --device cuda --out ear/

With ``--corpus``, the corpus's utterances of ``--voices`` are encoded by ``--codec`` (the shipped mini codec by
default; any codec spec, ``xcodec2:/models/xcodec2`` included) into ``--out/codes.jsonl`` (kept and reused when it
is there); with ``--codes``, a file of that format (one JSON line per utterance: ``id``, ``voice``, ``text``,
``split`` train/heldout, ``codes``) from any codec. The ear then trains on the training split
(`maspo_lab.speaking_model.ear_training`), is evaluated on the held-out split every ``--eval-every`` steps, and the
best is kept in ``--out`` with ``training.json`` and ``report.json`` (held-out phoneme error rate).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
from pathlib import Path

from maspo_base.typed_settings import add_arguments, parse_arguments_or_exit
from maspo_lab.speaking_model.ear_training import EarSettings, evaluate, read_examples, train_ear


def parse_args(argv: list[str]) -> argparse.Namespace:
    from maspo_lab.speaking_model.corpus import SPEEDS, VOICES, with_speeds

    parser = argparse.ArgumentParser(prog="maspo-verl build-ear", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, help="the corpus (maspo-verl build-corpus), encoded by --codec")
    parser.add_argument("--codec", help="codec spec that encodes --corpus (default: the shipped mini codec)")
    parser.add_argument("--codes", type=Path, help="a codes.jsonl of any codec instead of --corpus")
    voices = with_speeds(VOICES, SPEEDS)
    parser.add_argument(
        "--voices", nargs="+", default=list(voices), help=f"voices trained on (default: {' '.join(voices)})"
    )
    parser.add_argument("--layout", default="mini-llasa", help="speech-token layout of the codes (its codebook)")
    parser.add_argument("--ship", action="store_true", help="copy the built ear into the package")
    parser.add_argument("--reuse", action="store_true", help="check (and ship) the ear already built in --out")
    parser.add_argument(
        "--check-sentences",
        type=int,
        default=48,
        help="held-out sentences the shipped model says for the check (0: none)",
    )
    parser.add_argument("--check-samples", type=int, default=8, help="samples of each check sentence")
    add_arguments(parser, EarSettings)
    args = parser.parse_args(argv)
    if args.reuse:
        if not (args.out / "config.json").is_file():
            parser.error(f"--reuse: {args.out} holds no built ear (config.json)")
    elif (args.corpus is None) == (args.codes is None):
        parser.error("give --corpus (encoded here) or --codes (encoded already), not both")
    if args.check_sentences < 0 or args.check_samples < 2:
        parser.error("--check-sentences must be >= 0 and --check-samples >= 2 (agreement is within a sentence)")
    if args.codes is not None and not args.codes.is_file():
        parser.error(f"--codes {args.codes}: no such file")
    args.settings = parse_arguments_or_exit(parser, args, EarSettings, "build-ear")
    from maspo_base.speech_tokens.layouts import get_layout

    try:
        args.layout = get_layout(args.layout)
    except ValueError as error:
        parser.error(str(error))
    if args.settings.inputs == "digits" and args.layout.fsq_levels is None:
        parser.error(f"--inputs digits: layout {args.layout.name!r} has no FSQ lattice")
    return args


SHIPPED_FILES = ("config.json", "model.safetensors", "training.json", "report.json", "check.json")
"""What ``--ship`` copies into the package (the check's when it ran)."""


def main(argv: list[str]) -> int:
    from maspo_lab.speaking_model import SHIPPED_CODEC, SHIPPED_EAR
    from maspo_lab.speaking_model.training import encode_corpus
    from reward_fns.code_ear import CodeEar

    args = parse_args(argv)
    log = functools.partial(print, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.reuse:
        codes = args.codes
        if codes is None:
            codec = args.codec or SHIPPED_CODEC
            codes = encode_corpus(args.corpus, codec, args.out / "codes.jsonl", tuple(args.voices), log)
        examples = read_examples(codes, tuple(args.voices), args.settings.voice, log)
        if not examples["train"] or not examples["heldout"]:
            print(f"[ear] {codes} needs utterances of both splits for voices {args.voices}", file=sys.stderr)
            return 2
        train_ear(examples, args.out, args.settings, args.layout.codebook_size, args.layout.fsq_levels, log)
        report_held_out(CodeEar.from_pretrained(args.out), examples["heldout"], args.voices, args.out, log)
    if args.check_sentences:
        check(args, log)
    if args.ship:
        SHIPPED_EAR.mkdir(parents=True, exist_ok=True)
        for name in SHIPPED_FILES:
            if (args.out / name).is_file():
                shutil.copy(args.out / name, SHIPPED_EAR / name)
        log(f"[ear] shipped to {SHIPPED_EAR}")
    return 0


def report_held_out(ear, heldout: list, voices: list[str], out: Path, log) -> dict:
    """The held-out phoneme error rate per voice and over all, into ``out/report.json``."""
    report = {voice: evaluate(ear, [e for e in heldout if e.voice == voice]) for voice in voices}
    report["all"] = evaluate(ear, heldout)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    for name, result in report.items():
        log(f"[ear] held-out {name:<12} PER {result['per']:.3f} ({result['utterances']} utterances)")
    return report


def check(args: argparse.Namespace, log) -> dict:
    """The ear against both audio ears on the shipped model's responses, and its cost (`ear_check`)."""
    from maspo_lab.analysis.ear_check import hear_responses, read_recordings, write_check
    from maspo_lab.runs.speech_run import heldout_texts
    from maspo_lab.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_MODEL

    sentences = heldout_texts()[: args.check_sentences]
    codec = args.codec or SHIPPED_CODEC
    recordings = read_recordings(args.out, codec, sentences, SHIPPED / "heldout")
    log(f"[ear] the shipped held-out recordings ({recordings['utterances']}): PER {recordings['per']:.3f}")
    rows, cost = hear_responses(
        SHIPPED_MODEL, codec, args.out, [s["text"] for s in sentences], args.check_samples, log=log
    )
    report = write_check(args.out, rows, cost, recordings)
    for name, value in report["agreement"].items():
        if name != "means":
            low, high = value["ci95"]
            log(f"[ear] within-sentence r {name:<22} {value['r']:+.3f} ({low:+.3f} .. {high:+.3f})")
    log(
        f"[ear] cost per response: audio {cost['audio_s_per_response'] * 1000:.1f} ms, ear "
        f"{cost['ear_s_per_response'] * 1000:.2f} ms ({cost['audio_over_ear']}x)"
    )
    return report


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
