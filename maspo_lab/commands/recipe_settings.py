"""``maspo-verl recipe-settings``: what a launch script adds to veRL's command line, one per line.

The recipes (``recipes/cpu_smoke/run.sh``, ``recipes/llasa_1b/run.sh``) read their CPU settings, the speaking
testbed's data and models, and the stop ids of a checkpoint from here, so that each fact keeps its one home in
Python:

    maspo-verl recipe-settings cpu-env                     # KEY=VALUE: the environment of a CPU run
    maspo-verl recipe-settings cpu-overrides [--needed]    # Hydra overrides of a CPU run (--needed: only what a
                                                           # CPU cannot run without, not the run's sizes)
    maspo-verl recipe-settings mini-overrides WORKDIR METHOD   # the testbed's sizes, data (written once under
                                                           # WORKDIR), model, the task's refinement of METHOD
                                                           # and its speech reward (in process)
    maspo-verl recipe-settings tiny-overrides WORKDIR [--warm-start N] [--no-build]   # the synthetic task's sizes,
                                                           # model and data (built once under WORKDIR)
    maspo-verl recipe-settings stop-config MODEL_DIR OUT_DIR   # OUT_DIR/generation_config.json whose eos ids are
                                                           # the one stop rule's; prints OUT_DIR

Homes: `maspo_lab.runs.cpu_overrides` (CPU), `maspo_lab.runs.speech_run` (the testbed), `maspo_lab.runs.synthetic_run`,
`maspo_base.speech_tokens.llasa_generation` (when generation stops).
"""

from __future__ import annotations

import argparse


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maspo-verl recipe-settings", description=__doc__.split("\n\n")[0])
    what = parser.add_subparsers(dest="what", required=True, metavar="WHAT")
    what.add_parser("cpu-env", help="the environment of a CPU run (KEY=VALUE)")
    overrides = what.add_parser("cpu-overrides", help="the Hydra overrides of a CPU run")
    overrides.add_argument("--needed", action="store_true", help="only what a CPU cannot run without")
    mini = what.add_parser(
        "mini-overrides", help="the speaking testbed's sizes, data, model, method refinement and speech reward"
    )
    mini.add_argument("workdir", help="where the task's data is written (once)")
    mini.add_argument("method", help="a method of maspo_verl/trainer_config/method/")
    tiny = what.add_parser("tiny-overrides", help="the synthetic task's sizes, model and data")
    tiny.add_argument("workdir", help="where the tiny model and the data are built (once)")
    tiny.add_argument("--warm-start", type=int, default=0, help="supervised steps before RL (default 0)")
    tiny.add_argument("--no-build", action="store_true", help="print the overrides only (a dry run)")
    stop = what.add_parser("stop-config", help="a generation_config.json with the one stop rule's eos ids")
    stop.add_argument("model_dir")
    stop.add_argument("out_dir")
    return parser.parse_args(argv)


def settings(args: argparse.Namespace) -> list[str]:
    """The lines `main` prints for ``args``."""
    if args.what == "cpu-env":
        from maspo_lab.runs.cpu_overrides import cpu_environment

        return [f"{key}={value}" for key, value in cpu_environment().items()]
    if args.what == "cpu-overrides":
        from maspo_lab.runs.cpu_overrides import CPU_NEEDS, CPU_OVERRIDES

        return list(CPU_NEEDS if args.needed else CPU_OVERRIDES)
    if args.what == "mini-overrides":
        from maspo_lab.methods import MethodError, parse_method
        from maspo_lab.runs.speech_run import recipe_overrides

        try:
            parse_method(args.method)
        except MethodError as error:
            raise SystemExit(f"maspo-verl recipe-settings mini-overrides: {error}") from None
        return recipe_overrides(args.workdir, args.method)
    if args.what == "tiny-overrides":
        from maspo_lab.runs.synthetic_run import recipe_overrides as tiny_overrides

        if args.warm_start < 0:
            raise SystemExit(
                f"maspo-verl recipe-settings tiny-overrides: --warm-start must be >= 0, got {args.warm_start}"
            )
        return tiny_overrides(args.workdir, args.warm_start, build=not args.no_build)
    from maspo_base.speech_tokens.llasa_generation import write_stop_config

    return [str(write_stop_config(args.model_dir, args.out_dir))]


def main(argv: list[str]) -> int:
    print("\n".join(settings(parse_args(argv))))
    return 0
