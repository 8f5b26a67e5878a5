"""``maspo-verl build-model``: train mini-llasa on a corpus's codes (`maspo_lab.speaking_model.training`) and check
it against the quality bar.

    maspo-verl build-model --corpus corpus/ --codec codec/ --out model/

The check, on the first ``--check-sentences`` held-out sentences of the (first) voice, each said once at temperature 0.8
(Llasa's setting) and heard by Whisper tiny.en: the model's pooled CER must be at most twice the codec's
resynthesis CER of the same sentences, and its median duration within 20 % of the corpus recordings'. The figures
go to ``model/report.json``. ``--ship`` copies the model (weights in bfloat16), the codec and the checked sentences
with their recordings into the package (`maspo_lab.speaking_model.SHIPPED`) and checks what it copied; a model that
fails the bar is taken out again unless ``--ship-below-bar`` is given, and ``build.json`` records the command, the
machine, both trainings and the check, passed or not. The test suite hears the shipped checkpoint again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import sys
import time
from pathlib import Path

from maspo_base.typed_settings import add_arguments, parse_arguments_or_exit
from maspo_lab.speaking_model.model import ModelSize
from maspo_lab.speaking_model.training import TrainSettings

CER_RATIO_BAR = 2.0
DURATION_BAR = 0.2


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags; ``settings``: the `TrainSettings` they give, ``size``: the `ModelSize`."""
    parser = argparse.ArgumentParser(prog="maspo-verl build-model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, help="the corpus (maspo-verl build-corpus)")
    parser.add_argument("--codec", type=Path, help="the mini codec folder (maspo-verl build-codec)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--examples",
        type=Path,
        help="train from this examples.json (written beside every trained model) instead of --corpus and --codec: "
        "what a machine without espeak-ng or the corpus needs; its voices and front end are the model's",
    )
    add_arguments(parser, TrainSettings, skip=("warmup_steps", "weight_decay", "threads"), into=parser)
    add_arguments(parser, ModelSize, skip=("num_kv_heads", "max_positions"), into=parser)
    parser.add_argument("--check-sentences", type=int, default=48, help="held-out sentences of the check (0: none)")
    parser.add_argument(
        "--ship", action="store_true", help="copy the model and codec into the package, check what was copied"
    )
    parser.add_argument(
        "--ship-below-bar",
        action="store_true",
        help="with --ship: keep a model that fails the bar in the package (build.json records that it fails)",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="check (and ship) the model already trained in --out instead of training"
    )
    args = parser.parse_args(argv)
    if args.check_sentences < 0:
        parser.error(f"--check-sentences must be >= 0, got {args.check_sentences}")
    if args.examples is None and not args.reuse and (args.corpus is None or args.codec is None):
        parser.error("training needs --corpus and --codec, or --examples")
    if args.check_sentences and (args.corpus is None or args.codec is None):
        parser.error("the check needs --corpus and --codec (or --check-sentences 0)")
    if args.examples is not None and not args.examples.is_file():
        parser.error(f"--examples {args.examples}: no such file")
    args.settings = train_settings(parser, args)
    size = parse_arguments_or_exit(parser, args, ModelSize, "build-model")
    args.size = dataclasses.replace(size, num_kv_heads=size.num_heads)
    _check_sizes(parser, args.settings, args.size)
    if args.ship and not args.check_sentences:
        parser.error("--ship needs the check (--check-sentences > 0)")
    if args.ship_below_bar and not args.ship:
        parser.error("--ship-below-bar goes with --ship")
    return args


def _check_sizes(parser: argparse.ArgumentParser, t: TrainSettings, size: ModelSize) -> None:
    counts = {"--steps": t.steps, "--tokens-per-batch": t.tokens_per_batch, "--eval-every": t.eval_every}
    counts |= {"--hidden-size": size.hidden_size, "--layers": size.num_layers, "--heads": size.num_heads}
    counts |= {"--intermediate-size": size.intermediate_size}
    for flag, value in counts.items():
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if size.hidden_size % size.num_heads:
        parser.error(f"--hidden-size {size.hidden_size} must be a multiple of --heads {size.num_heads}")
    if not t.lr > 0:
        parser.error(f"--lr must be > 0, got {t.lr}")


def train_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TrainSettings:
    """The command's training settings (its flags over `TrainSettings`'s defaults); with ``--examples``, the voices
    and front end are the file's. A bad value or examples file is reported through ``parser``."""
    settings = parse_arguments_or_exit(parser, args, TrainSettings, "build-model")
    if args.examples is not None:
        from maspo_lab.speaking_model.training import read_examples

        try:
            record = read_examples(args.examples)
            voices, frontend = tuple(record["voices"]), record["text_frontend"]
            settings = dataclasses.replace(settings, voices=voices, text_frontend=frontend)  # checked again
        except ValueError as error:
            parser.error(str(error))
    return settings


def check_sentences(corpus: Path, voice: str, count: int):
    """The first ``count`` held-out utterances of ``voice``."""
    from maspo_lab.speaking_model.corpus import read_manifest

    rows = read_manifest(corpus, voice=voice, split="heldout")[:count]
    if len(rows) < count:
        raise ValueError(f"corpus {corpus} has {len(rows)} held-out utterances of {voice!r}; the check asks {count}")
    return rows


def check_model(
    model_dir: Path, codec_dir: Path, texts, source_audio, seconds, seed: int = 0, hear_source: bool = True
) -> dict:
    """The bar of the module docstring: the model's CER and durations against the codec's resynthesis CER.

    ``hear_source``: also hear the recordings themselves (the report's ``source``, the floor the bar does not use;
    None when skipped)."""
    from maspo_base.mel_codec import MelFsqCodec
    from maspo_lab.speaking_model.hearing import Ear, hear_model, heard

    codec, ear = MelFsqCodec.from_pretrained(codec_dir), Ear()
    resynthesis = heard(texts, ear.transcribe(codec.decode(codec.encode_waveforms(source_audio))))
    source = heard(texts, ear.transcribe(source_audio)).summary() if hear_source else None
    model = hear_model(model_dir, codec, ear, texts, seconds, temperature=0.8, seed=seed)
    return {
        "sentences": len(texts),
        "source": source,
        "codec_resynthesis": resynthesis.summary(),
        "model": model,
        "cer_ratio": round(model["cer"] / max(resynthesis.cer, 1e-9), 3),
        "passes": model["cer"] <= CER_RATIO_BAR * resynthesis.cer
        and model["duration_ratio_median"] is not None
        and abs(model["duration_ratio_median"] - 1) <= DURATION_BAR,
    }


def ship(model_dir: Path, codec_dir: Path, corpus: Path, rows) -> Path:
    """Copy into the package the model (bfloat16 weights), the codec, the training sentences (RL's prompts) and the
    check's held-out sentences with their recordings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maspo_lab.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_MODEL
    from maspo_lab.speaking_model.model import save_checkpoint
    from maspo_lab.speaking_model.training import EXAMPLES_FILE, read_examples

    if SHIPPED.exists():
        shutil.rmtree(SHIPPED)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    extra = json.loads((model_dir / "speech_tokens.json").read_text())
    extra.pop("layout", None)
    save_checkpoint(model, AutoTokenizer.from_pretrained(model_dir), SHIPPED_MODEL, extra=extra)
    shutil.copytree(codec_dir, SHIPPED_CODEC, ignore=shutil.ignore_patterns("report.json"))
    train = list(dict.fromkeys(read_examples(model_dir / EXAMPLES_FILE)["texts"]["train"]))  # once per voice
    (SHIPPED / "train_sentences.txt").write_text("\n".join(train) + "\n")
    heldout = SHIPPED / "heldout"
    heldout.mkdir()
    with open(heldout / "sentences.jsonl", "w") as f:
        for u in rows:
            shutil.copy(corpus / u.audio, heldout / f"{u.id}.flac")
            f.write(json.dumps({"id": u.id, "text": u.text, "audio": f"{u.id}.flac", "seconds": u.seconds}) + "\n")
    return SHIPPED


def record_build(model_dir: Path, codec_dir: Path, report: dict, command: str) -> Path:
    """``build.json`` beside the shipped model: the command, the machine, the date, both trainings and the check."""
    from maspo_lab.speaking_model import SHIPPED

    build = {
        "command": command,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, {__import__('os').cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "training": json.loads((model_dir / "training.json").read_text()),
        "codec_training": json.loads((codec_dir / "training.json").read_text()),
        "check": report,
    }
    (SHIPPED / "build.json").write_text(json.dumps(build, indent=1) + "\n")
    return SHIPPED


def main(argv: list[str]) -> int:
    from maspo_lab.speaking_model.corpus import load_audio
    from maspo_lab.speaking_model.training import train_from_examples, train_model

    args = parse_args(argv)
    settings, size = args.settings, args.size
    from maspo_lab.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_MODEL

    rows = check_sentences(args.corpus, settings.voices[0], args.check_sentences) if args.check_sentences else []
    if args.reuse:
        if not (args.out / "training.json").is_file():
            print(f"[model] --reuse: {args.out} holds no trained model (training.json)", file=sys.stderr)
            return 2
    elif args.examples is not None:
        train_from_examples(args.examples, args.out, settings, size, log=lambda line: print(line, flush=True))
    else:
        train_model(args.corpus, args.codec, args.out, settings, size, log=lambda line: print(line, flush=True))
    if not rows:
        return 0
    if args.ship:  # the check hears what ships: the bfloat16 weights in the package
        ship(args.out, args.codec, args.corpus, rows)
    report = check_model(
        SHIPPED_MODEL if args.ship else args.out,
        SHIPPED_CODEC if args.ship else args.codec,
        [u.text for u in rows],
        [load_audio(args.corpus, u) for u in rows],
        [u.seconds for u in rows],
        seed=settings.seed,
    )
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    m, c = report["model"], report["codec_resynthesis"]
    print(
        f"[model] held-out, T=0.8: CER {m['cer']:.3f} (codec resynthesis {c['cer']:.3f}, "
        f"ratio {report['cer_ratio']:.2f}, bar {CER_RATIO_BAR:g}), WER {m['wer']:.3f}, "
        f"duration ratio {m['duration_ratio_median']}, ended {m['ended']:.2f}: "
        f"{'passes' if report['passes'] else 'FAILS'} the bar"
    )
    if args.ship:
        if not report["passes"] and not args.ship_below_bar:
            shutil.rmtree(SHIPPED)
            print(
                "[model] not shipped: the checkpoint fails the bar (--ship-below-bar ships it anyway)", file=sys.stderr
            )
            return 1
        record_build(args.out, args.codec, report, " ".join(["maspo-verl build-model", *argv]))
        print(f"[model] shipped to {SHIPPED}{'' if report['passes'] else ', below the bar (build.json says so)'}")
        return 0
    return 0 if report["passes"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
