"""Train several mini-llasa variants at once on one GPU from an examples file, for a machine that has only torch
and transformers (no espeak-ng, corpus or codec): each variant is ``maspo-verl build-model --examples`` in its own
process; what comes back is, per variant, its best checkpoint's weights in bfloat16 (``NAME.safetensors``), and
every variant's ``training.json`` in ``summary.json``.

    python3 scripts/train_variants.py --examples model/examples.json --out OUT --device cuda \\
        --variant w256-l6-d0.1:256,6,4,768,0.1 --variant w320-l6-d0.1:320,6,5,864,0.1 [-- build-model options]

A variant is ``NAME:hidden,layers,heads,intermediate,dropout``; options after ``--`` go to every build-model.
`assemble` turns a returned variant back into a checkpoint folder that ``build-model --reuse`` checks and ships.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, sizes = text.partition(":")
    try:
        hidden, layers, heads, intermediate, dropout = sizes.split(",")
        spec = {
            "hidden_size": int(hidden),
            "layers": int(layers),
            "heads": int(heads),
            "intermediate_size": int(intermediate),
            "dropout": float(dropout),
        }
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--variant {text!r}: want NAME:hidden,layers,heads,intermediate,dropout"
        ) from None
    return name, spec


def run_variant(name: str, spec: dict, examples: Path, runs: Path, device: str, extra: list[str], log) -> int:
    command = [sys.executable, "-m", "maspo_lab.cli", "build-model", "--examples", str(examples)]
    command += ["--out", str(runs / name), "--device", device, "--check-sentences", "0"]
    command += [f"--{key.replace('_', '-')}={value}" for key, value in spec.items()] + extra
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:
        if line.strip() and "Writing model shards" not in line:
            log(f"[{name}] {line.rstrip()}")
    return process.wait()


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    own, extra = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--variant", type=parse_variant, action="append", required=True)
    args = parser.parse_args(own)
    import torch
    from safetensors.torch import load_file, save_file

    runs = args.out.parent / f"{args.out.name}-runs"
    args.out.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    with open(args.out / "runs.log", "w") as log_file:

        def log(line: str) -> None:
            with lock:
                print(line, flush=True)
                log_file.write(line + "\n")
                log_file.flush()

        with ThreadPoolExecutor(len(args.variant)) as pool:
            exits = pool.map(lambda v: run_variant(*v, args.examples, runs, args.device, extra, log), args.variant)
            codes = dict(zip((name for name, _ in args.variant), exits))
    summary = {}
    for name, spec in args.variant:
        record_path = runs / name / "training.json"
        summary[name] = {"spec": spec, "exit": codes[name]}
        if record_path.is_file():
            summary[name]["training"] = json.loads(record_path.read_text())
            weights = load_file(runs / name / "model.safetensors")
            save_file(
                {k: v.to(torch.bfloat16) for k, v in weights.items()},
                args.out / f"{name}.safetensors",
                {"format": "pt"},
            )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if all(code == 0 for code in codes.values()) else 1


def assemble(summary: Path, name: str, weights: Path, examples: Path, out: Path) -> Path:
    """A checkpoint folder for variant ``name`` of a returned ``summary.json``: built as its training built it, with
    the returned weights, its ``training.json`` and the examples it learnt from."""
    import shutil

    from maspo_lab.speaking_model.model import ModelSize, build_model

    record = json.loads(summary.read_text())[name]["training"]
    settings = record["settings"]
    voices = settings["voices"]
    build_model(
        out,
        ModelSize(**record["size"]),
        seed=settings["seed"],
        text_frontend=settings["text_frontend"],
        speaker=voices[0] if len(voices) > 1 else None,
    )
    shutil.copy(weights, out / "model.safetensors")
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.copy(examples, out / "examples.json")
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
