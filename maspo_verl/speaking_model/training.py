"""Supervised training of mini-llasa on the corpus: Llasa's prompt for the text, then the codes of its speech.

Each training example is one utterance of the chosen voice::

    input  = prompt(text) + codes + [<|SPEECH_GENERATION_END|>]       prompt: Llasa's chat template, rendered
    loss   = mean over the codes and the end tag of -log p(token | everything before it)

(the prompt is context only, as when Llasa-1B was fine-tuned for TTS; it holds what the model reads for the text,
``text_frontend``: espeak-ng's phonemes by default, `reward_fns.speech_tokens.text_frontend`). Batches hold
utterances of similar length up to ``tokens_per_batch`` tokens; AdamW with a linear warm-up and a cosine decay to a
tenth of the peak rate. Every ``eval_every`` steps (and at the last) the same loss on the held-out utterances is
printed, and the model is saved when that loss is the lowest so far: the checkpoint is the evaluated model with the
lowest held-out loss (early stopping; one voice's few thousand utterances are learnt by heart long before the
schedule ends). ``training.json``, written at every evaluation, records the history, the steps done and the step
saved (``best_step``), so an interrupted run leaves a checkpoint that can be checked and shipped as what it is.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from maspo_verl.speaking_model.corpus import Utterance, load_audio, read_manifest
from maspo_verl.speaking_model.model import ModelSize, build_model, build_tokenizer, save_checkpoint
from reward_fns.speech_tokens.llasa_prompt import render_prompt_ids
from reward_fns.speech_tokens.mini_llasa_tokens import MINI_LLASA
from reward_fns.speech_tokens.text_frontend import ESPEAK_EN_US

CODES_FILE = "codes.jsonl"


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 2400
    tokens_per_batch: int = 4096
    lr: float = 1.5e-3
    warmup_steps: int = 300
    weight_decay: float = 0.01
    eval_every: int = 200
    seed: int = 0
    voice: str = "rms"
    text_frontend: str = ESPEAK_EN_US
    threads: int = 2


def encode_corpus(corpus: str | Path, codec_dir: str | Path, out: str | Path, voice: str, log=print) -> Path:
    """Codes of every utterance of ``voice`` (both splits) by the mini codec, one JSON line each
    (``{"id", "text", "split", "codes"}``), written to ``out``; reused when it exists."""
    from reward_fns.mel_codec import MelFsqCodec

    out = Path(out)
    if out.is_file():
        return out
    codec = MelFsqCodec.from_pretrained(codec_dir)
    utterances = read_manifest(corpus, voice=voice)
    if not utterances:
        raise ValueError(f"corpus {corpus} has no utterance of voice {voice!r}")
    start = time.monotonic()
    tmp = out.with_suffix(".part")
    with open(tmp, "w") as f:
        for n, u in enumerate(utterances, 1):
            (codes,) = codec.encode_waveforms([load_audio(corpus, u)])
            f.write(json.dumps({"id": u.id, "text": u.text, "split": u.split, "codes": codes.tolist()}) + "\n")
            if n % 1000 == 0:
                log(f"[model] encoded {n}/{len(utterances)} utterances, {time.monotonic() - start:.0f}s")
    tmp.rename(out)
    return out


def read_codes(path: str | Path, split: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if split is None or r["split"] == split]


def examples(tokenizer, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, target ids)`` per row: target = the codes as vocabulary ids, then the end tag."""
    return [
        (render_prompt_ids(tokenizer, r["text"]), [MINI_LLASA.offset + c for c in r["codes"]] + [MINI_LLASA.end_id])
        for r in rows
    ]


def batches(items: list[tuple[list[int], list[int]]], tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices of ``items`` in batches of similar total length, at most ``tokens`` tokens (padded) each, shuffled."""
    order = sorted(range(len(items)), key=lambda i: (len(items[i][0]) + len(items[i][1]), rng.random()))
    out, current, width = [], [], 0
    for i in order:
        length = len(items[i][0]) + len(items[i][1])
        if current and max(width, length) * (len(current) + 1) > tokens:
            out.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, length)
    if current:
        out.append(current)
    rng.shuffle(out)
    return out


def collate(items: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask, labels)``; labels are -100 off the targets."""
    width = max(len(p) + len(t) for p, t in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    for row, (prompt, target) in enumerate(items):
        sequence = prompt + target
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        labels[row, len(prompt) : len(sequence)] = torch.tensor(target)
    return ids, mask, labels


@torch.no_grad()
def heldout_loss(model, items, pad_id: int, tokens: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for batch in batches(items, tokens, random.Random(0)):
        ids, mask, labels = collate([items[i] for i in batch], pad_id)
        n = int((labels[:, 1:] != -100).sum())
        total += float(model(input_ids=ids, attention_mask=mask, labels=labels).loss) * n
        count += n
    model.train()
    return total / max(count, 1)


def train_model(
    corpus: str | Path,
    codec_dir: str | Path,
    out: str | Path,
    settings: TrainSettings = TrainSettings(),
    size: ModelSize | None = None,
    log=print,
) -> Path:
    """Build mini-llasa and train it on ``corpus`` (the codes of ``settings.voice`` by the codec at ``codec_dir``);
    the checkpoint goes to ``out``, with ``training.json`` (settings, losses, time)."""
    from transformers import AutoModelForCausalLM

    size = size or ModelSize()
    torch.set_num_threads(settings.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    codes = encode_corpus(corpus, codec_dir, out / CODES_FILE, settings.voice, log)
    tokenizer = build_tokenizer(settings.text_frontend)
    train, held = examples(tokenizer, read_codes(codes, "train")), examples(tokenizer, read_codes(codes, "heldout"))
    log(f"[model] {len(train)} training and {len(held)} held-out utterances of voice {settings.voice}")
    build_model(out, size, seed=settings.seed, text_frontend=settings.text_frontend)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.train()
    parameters = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )

    def rate(step: int) -> float:
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    pad_id = tokenizer.pad_token_id
    history, queue, seen_tokens, best = [], [], 0, (0, math.inf)
    start = time.monotonic()
    for step in range(settings.steps):
        if not queue:
            queue = batches(train, settings.tokens_per_batch, rng)
        ids, mask, labels = collate([train[i] for i in queue.pop()], pad_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        seen_tokens += int(mask.sum())
        loss_value = loss.item()
        if (step + 1) % settings.eval_every == 0 or step + 1 == settings.steps:
            held_loss = heldout_loss(model, held, pad_id, settings.tokens_per_batch)
            elapsed = time.monotonic() - start
            history.append({"step": step + 1, "train_loss": loss_value, "heldout_loss": held_loss, "s": elapsed})
            log(
                f"[model] step {step + 1}/{settings.steps}  loss {loss_value:.3f}  held-out {held_loss:.3f}  "
                f"{seen_tokens / elapsed:.0f} tokens/s  {elapsed:.0f}s"
            )
            if held_loss < best[1]:
                best = (step + 1, held_loss)
                save_checkpoint(model, tokenizer, out, extra={"size": asdict(size), "seed": settings.seed})
            record = {
                "settings": asdict(settings),
                "size": asdict(size),
                "parameters": parameters,
                "utterances": {"train": len(train), "heldout": len(held)},
                "steps_done": step + 1,
                "best_step": best[0],
                "history": history,
                "seconds": round(time.monotonic() - start, 1),
            }
            (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return out


def utterance_frames(rows: list[Utterance]) -> np.ndarray:
    """Codes per utterance (50 per second) of manifest rows."""
    return np.array([int(u.seconds * MINI_LLASA.frame_rate) for u in rows])
