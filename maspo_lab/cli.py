"""The `maspo-verl` command. Each subcommand lives in its own module and is imported only when chosen."""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "demo": (
        "maspo_lab.commands.demo",
        "Train mini-llasa, a small model that speaks, with MASPO in veRL's real trainer on CPU, heard by Whisper.",
    ),
    "segments": (
        "maspo_lab.commands.segments",
        "Show how segmenters cut responses: table and segment-length histograms.",
    ),
    "ablate": (
        "maspo_lab.commands.ablate",
        "Compare GRPO, GSPO, MASPO (and your methods) x seeds with veRL's real trainer (speech or synthetic task).",
    ),
    "fidelity": (
        "maspo_lab.commands.fidelity",
        "How well each loss's gradient follows the on-policy gradient on stale data; log-ratio structure.",
    ),
    "reward-server": ("reward_fns.http_server", "Serve the speech reward (codec decode + ASR) over HTTP, batched."),
    "reward-serve": (
        "reward_fns.ray_serve",
        "The speech reward as a Ray Serve application: replicas in a Ray cluster, HTTP and deployment handles.",
    ),
    "prepare-data": (
        "maspo_lab.commands.prepare_data",
        "Text (and prompt speech) -> train/val parquet with Llasa prompts for veRL.",
    ),
    "eval": (
        "maspo_lab.commands.eval",
        "Evaluate checkpoints on a Seed-TTS-eval list: CER/WER, speaker similarity, table, CSV, plots.",
    ),
    "speak": ("maspo_lab.commands.speak", "Say sentences with a checkpoint: one wav each and a page to play them."),
    "recipe-settings": (
        "maspo_lab.commands.recipe_settings",
        "What a launch script adds to veRL's command line: CPU settings, the speaking testbed's, a stop config.",
    ),
    "build-corpus": (
        "maspo_lab.commands.build_corpus",
        "The speaking testbed's corpus: fortune sentences spoken by flite's voices, heard by Whisper tiny.en.",
    ),
    "build-codec": ("maspo_lab.commands.build_codec", "Train the mini codec (50 FSQ codes/s) on the corpus."),
    "build-model": (
        "maspo_lab.commands.build_model",
        "Train mini-llasa on the corpus's codes and check it against the quality bar (--ship: into the package).",
    ),
    "build-ear": (
        "maspo_lab.commands.build_ear",
        "Train the code ear, a CTC recogniser of phonemes in codec codes, on the corpus (--ship: into the package).",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: maspo-verl <command> [options]\n\ncommands:")
        for name, (_, summary) in SUBCOMMANDS.items():
            print(f"  {name:<15} {summary}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"maspo-verl: unknown command {name!r}; valid commands: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
