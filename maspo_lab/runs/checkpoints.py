"""A run's checkpoints as Hugging Face directories: veRL's FSDP checkpoints merged by veRL's own model merger."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def is_fsdp_checkpoint(path: Path) -> bool:
    return (path / "fsdp_config.json").exists() or any(path.glob("model_world_size_*_rank_*.pt"))


def resolve_checkpoint(path: Path, work: Path) -> Path:
    """A Hugging Face directory for ``path``: itself, or veRL's FSDP checkpoint (``global_step_N`` or its
    ``actor``) merged by ``python -m verl.model_merger merge --backend fsdp`` into ``work``."""
    if (path / "actor").is_dir() and is_fsdp_checkpoint(path / "actor"):
        path = path / "actor"
    if is_fsdp_checkpoint(path):
        target = work / "merged" / "_".join(path.parts[-3:])
        if not (target / "config.json").exists():
            print(f"merging veRL FSDP checkpoint {path} -> {target}", flush=True)
            command = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
            subprocess.run([*command, "--local_dir", str(path), "--target_dir", str(target)], check=True)
        # the merger writes the weights and config; the tokenizer is saved next to them under huggingface/
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            source = path / "huggingface" / name
            if source.exists() and not (target / name).exists():
                (target / name).write_bytes(source.read_bytes())
        return target
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"checkpoint {path}: neither a Hugging Face directory (config.json) nor a veRL FSDP checkpoint "
            "(fsdp_config.json / model_world_size_*_rank_*.pt, or a global_step_N folder with actor/)"
        )
    return path
