"""Supervised training of mini-llasa on the corpus: Llasa's prompt for the text, then the codes of its speech.

Each training example is one utterance of one of the chosen voices::

    input  = prompt(text) + codes + [<|SPEECH_GENERATION_END|>]       prompt: Llasa's chat template, rendered
    loss   = mean over the codes and the end tag of -log p(token | everything before it)

(the prompt is context only, as when Llasa-1B was fine-tuned for TTS; it holds what the model reads for the text,
``text_frontend``: espeak-ng's phonemes by default, `maspo_base.speech_tokens.text_frontend`). A model of several
``voices`` reads each prompt with its recording's speaker tag, and its tokenizer declares the first voice as the
one it speaks in elsewhere. Batches hold utterances of similar length up to ``tokens_per_batch`` tokens; AdamW with
a linear warm-up and a cosine decay to a tenth of the peak rate. Every ``eval_every`` steps (and at the last) the
same loss on the held-out utterances is printed, and the model is saved when that loss is the lowest so far: the
checkpoint is the evaluated model with the lowest held-out loss (early stopping: one voice's few thousand
utterances are learnt by heart long before the schedule ends). ``training.json``, written at every evaluation,
records the history, the steps done and the step saved (``best_step``), so an interrupted run leaves a checkpoint
that can be checked and shipped as what it is.

``dropout`` (Llama has none of its own) drops units of the embeddings and of every attention and MLP output
before it joins the residual stream, while training only; it is applied by forward hooks, so the saved model is a
plain ``LlamaForCausalLM``. ``device`` trains on a GPU (``cuda``, TF32 matrix products) as well as on the CPU.

Training reads ``examples.json`` (`write_examples`): every utterance as its rendered prompt ids and target ids,
with the front end and voices that made them. It is all a training needs, so a GPU machine without espeak-ng, the
corpus or the codec trains from it alone (`train_from_examples`, ``build-model --examples``).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
from maspo_base.speech_tokens.mini_llasa_tokens import MINI_LLASA
from maspo_base.speech_tokens.text_frontend import ESPEAK_EN_US, FRONTENDS, frontend_of, speaker_of
from maspo_lab.speaking_model.corpus import (
    SPEEDS,
    VOICES,
    Utterance,
    is_perturbed,
    load_audio,
    read_manifest,
    with_speeds,
)
from maspo_lab.speaking_model.model import ModelSize, build_model, build_tokenizer, save_checkpoint

CODES_FILE = "codes.jsonl"
EXAMPLES_FILE = "examples.json"


@dataclass(frozen=True)
class TrainSettings:
    """The shipped build's recipe by default (docs/speaking-model.md): all four voices and their copies at 0.9 and
    1.1 times the speed, dropout 0.1, 3,000 batches of 32,768 tokens (what it costs: docs/speaking-model.md). Its
    fields but ``warmup_steps``, ``weight_decay`` and ``threads`` are ``maspo-verl build-model``'s flags
    (`maspo_base.typed_settings.add_arguments`)."""

    steps: int = 3000
    tokens_per_batch: int = 32768
    lr: float = 2e-3
    warmup_steps: int = 300
    weight_decay: float = 0.01
    eval_every: int = 200
    seed: int = 0
    voices: tuple[str, ...] = field(default=with_speeds(VOICES, SPEEDS), metadata={"nargs": "+"})
    """The voices learnt; the first is the one the checkpoint speaks in (tagged prompts only when several)."""
    text_frontend: str = field(
        default=ESPEAK_EN_US,
        metadata={
            "help": "what the model reads for the text (maspo_base.speech_tokens.text_frontend)",
            "choices": sorted(FRONTENDS),
        },
    )
    threads: int = 2
    dropout: float = field(default=0.1, metadata={"help": "residual dropout while training"})
    device: str = field(default="cpu", metadata={"help": "cpu or cuda[:N]"})
    max_minutes: float | None = None
    """Stop at the first evaluation after this many minutes of training (None: run every step)."""

    def __post_init__(self):
        if not self.voices or len(set(self.voices)) != len(self.voices):
            raise ValueError(f"TrainSettings.voices must name one voice or more, each once, got {self.voices}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"TrainSettings.dropout must be in [0, 1), got {self.dropout}")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"TrainSettings.device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"TrainSettings.max_minutes must be > 0 or None, got {self.max_minutes}")

    @property
    def speaker(self) -> str | None:
        """The speaker the tokenizer declares: the first voice, when there are several."""
        return self.voices[0] if len(self.voices) > 1 else None

    @property
    def speakers(self) -> tuple[str, ...]:
        """The voices the tokenizer declares: all of them, when there are several."""
        return self.voices if len(self.voices) > 1 else ()


def encode_corpus(
    corpus: str | Path, codec_dir: str | Path, out: str | Path, voices: tuple[str, ...], log=print
) -> Path:
    """Codes of every utterance of ``voices`` (both splits) by the codec ``codec_dir`` names (the mini codec's
    folder, or any codec spec of `maspo_base.codecs`: ``xcodec2:/models/xcodec2``), one JSON line each
    (``{"id", "voice", "text", "split", "codes"}``), written to ``out``; the voices it already holds are kept."""
    from maspo_base.codecs import load_encoder

    out = Path(out)
    held = {row["voice"] for row in read_codes(out)} if out.is_file() else set()
    missing = [v for v in voices if v not in held]
    if not missing:
        return out
    encoder = load_encoder(str(codec_dir))
    utterances = [u for v in missing for u in read_manifest(corpus, voice=v)]
    for voice in missing:
        if not any(u.voice == voice for u in utterances):
            raise ValueError(f"corpus {corpus} has no utterance of voice {voice!r}")
    start = time.monotonic()
    tmp = out.with_suffix(".part")
    with open(tmp, "w") as f:
        if out.is_file():
            f.write(out.read_text())
        for n, u in enumerate(utterances, 1):
            codes = encoder.encode(load_audio(corpus, u))
            record = {"id": u.id, "voice": u.voice, "text": u.text, "split": u.split, "codes": codes.tolist()}
            f.write(json.dumps(record) + "\n")
            if n % 1000 == 0:
                log(f"[model] encoded {n}/{len(utterances)} utterances, {time.monotonic() - start:.0f}s")
    tmp.rename(out)
    return out


def read_codes(path: str | Path, split: str | None = None, voices: tuple[str, ...] | None = None) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if (split is None or r["split"] == split) and (voices is None or r["voice"] in voices)]


def examples(tokenizer, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, target ids)`` per row: target = the codes as vocabulary ids, then the end tag. A tokenizer that
    declares a speaker (a model of several voices) reads each row with its own voice's tag."""
    tagged = speaker_of(tokenizer) is not None
    return [
        (
            render_prompt_ids(tokenizer, r["text"], speaker=r["voice"] if tagged else None),
            [MINI_LLASA.offset + c for c in r["codes"]] + [MINI_LLASA.end_id],
        )
        for r in rows
    ]


def write_examples(path: str | Path, tokenizer, codes: str | Path, voices: tuple[str, ...]) -> Path:
    """``examples.json``: the training and held-out utterances of ``codes`` as ``[prompt ids, target ids]`` pairs
    (`examples`) and their texts, with the text front end and voices they were rendered for. Speed-perturbed voices
    (`corpus.perturb_speed`) are training data only: the held-out loss is the recorded voices'."""
    rows = {split: read_codes(codes, split, voices) for split in ("train", "heldout")}
    rows["heldout"] = [r for r in rows["heldout"] if not is_perturbed(r["voice"])]
    record = {
        "text_frontend": frontend_of(tokenizer),
        "voices": list(voices),
        "texts": {split: [r["text"] for r in split_rows] for split, split_rows in rows.items()},
        **{split: examples(tokenizer, split_rows) for split, split_rows in rows.items()},
    }
    Path(path).write_text(json.dumps(record, separators=(",", ":")) + "\n")
    return Path(path)


def read_examples(path: str | Path) -> dict:
    record = json.loads(Path(path).read_text())
    missing = {"text_frontend", "voices", "texts", "train", "heldout"} - set(record)
    if missing:
        raise ValueError(f"{path} is not an examples file (write_examples): it lacks {sorted(missing)}")
    return record


def batches(items: list[tuple[list[int], list[int]]], tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices of ``items`` in batches of similar total length, at most ``tokens`` tokens (padded) each, shuffled."""
    return length_batches([len(prompt) + len(target) for prompt, target in items], tokens, rng)


def length_batches(lengths: list[int], budget: int, rng: random.Random) -> list[list[int]]:
    """Indices of items of ``lengths`` in batches of similar length, at most ``budget`` (padded) each, shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    out, current, width = [], [], 0
    for i in order:
        length = lengths[i]
        if current and max(width, length) * (len(current) + 1) > budget:
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
        ids, mask, labels = (t.to(model.device) for t in collate([items[i] for i in batch], pad_id))
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
    """Build mini-llasa and train it on ``corpus`` (the codes of ``settings.voices`` by the codec at ``codec_dir``);
    the checkpoint goes to ``out``, with ``codes.jsonl``, ``examples.json`` and ``training.json`` (settings,
    losses, time)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    codes = encode_corpus(corpus, codec_dir, out / CODES_FILE, settings.voices, log)
    tokenizer = build_tokenizer(settings.text_frontend, settings.speaker, settings.speakers)
    return train_from_examples(
        write_examples(out / EXAMPLES_FILE, tokenizer, codes, settings.voices), out, settings, size, log
    )


def residual_dropout(model, p: float) -> list:
    """Dropout with rate ``p`` on the embeddings and on every attention and MLP output (the branches that join the
    residual stream), active in training mode only; returns the hooks' handles."""

    def drop(module, args, output):
        if isinstance(output, tuple):
            return (torch.nn.functional.dropout(output[0], p, module.training), *output[1:])
        return torch.nn.functional.dropout(output, p, module.training)

    branches = [model.model.embed_tokens, *(m for layer in model.model.layers for m in (layer.self_attn, layer.mlp))]
    return [m.register_forward_hook(drop) for m in branches]


def train_from_examples(
    examples_file: str | Path,
    out: str | Path,
    settings: TrainSettings = TrainSettings(),
    size: ModelSize | None = None,
    log=print,
) -> Path:
    """Build mini-llasa in ``out`` and train it on an examples file (`write_examples`, copied into ``out``);
    ``settings.text_frontend`` and ``settings.voices`` must be those the examples were rendered for."""

    record = read_examples(examples_file)
    for key in ("text_frontend", "voices"):
        if record[key] != (list if key == "voices" else str)(getattr(settings, key)):
            raise ValueError(
                f"{examples_file} was rendered for {key} {record[key]!r}, "
                f"TrainSettings.{key} is {getattr(settings, key)!r}"
            )
    size = size or ModelSize()
    torch.set_num_threads(settings.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / EXAMPLES_FILE).exists():  # the checkpoint keeps what it learnt from (`ship` lists its sentences)
        shutil.copyfile(examples_file, out / EXAMPLES_FILE)
    train, held = [tuple(e) for e in record["train"]], [tuple(e) for e in record["heldout"]]
    log(f"[model] {len(train)} training and {len(held)} held-out utterances of {', '.join(settings.voices)}")
    model, tokenizer, device = _fresh_model(out, settings, size)
    optimizer, scheduler = adamw_with_schedule(model, settings)
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    pad_id = tokenizer.pad_token_id
    about = {
        "settings": asdict(settings),
        "size": asdict(size),
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "utterances": {"train": len(train), "heldout": len(held)},
    }
    history, queue, seen_tokens, best = [], [], 0, (0, math.inf)
    start = time.monotonic()
    for step in range(settings.steps):
        if not queue:
            queue = batches(train, settings.tokens_per_batch, rng)
        batch = collate([train[i] for i in queue.pop()], pad_id)
        seen_tokens += int(batch[1].sum())
        ids, mask, labels = (t.to(device) for t in batch)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        elapsed = time.monotonic() - start
        out_of_time = settings.max_minutes is not None and elapsed > 60 * settings.max_minutes
        if (step + 1) % settings.eval_every == 0 or step + 1 == settings.steps or out_of_time:
            held_loss = heldout_loss(model, held, pad_id, settings.tokens_per_batch)
            history.append({"step": step + 1, "train_loss": loss.item(), "heldout_loss": held_loss, "s": elapsed})
            log(
                f"[model] step {step + 1}/{settings.steps}  loss {loss.item():.3f}  held-out {held_loss:.3f}  "
                f"{seen_tokens / elapsed:.0f} tokens/s  {elapsed:.0f}s"
            )
            if held_loss < best[1]:
                best = (step + 1, held_loss)
                save_checkpoint(model, tokenizer, out, extra={"size": asdict(size), "seed": settings.seed})
            progress = {"steps_done": step + 1, "best_step": best[0], "history": history}
            record = {**about, **progress, "seconds": round(time.monotonic() - start, 1)}
            (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
            if out_of_time:
                log(f"[model] stopped at step {step + 1}: max_minutes {settings.max_minutes} reached")
                break
    return out


def _fresh_model(out: Path, settings: TrainSettings, size: ModelSize):
    """A randomly initialised mini-llasa built in ``out`` (`build_model`), loaded for training on
    ``settings.device`` with its residual dropout; ``(model, tokenizer, device)``."""
    from transformers import AutoModelForCausalLM

    build_model(
        out,
        size,
        seed=settings.seed,
        text_frontend=settings.text_frontend,
        speaker=settings.speaker,
        speakers=settings.speakers,
    )
    device = torch.device(settings.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(device)
    model.train()
    if settings.dropout:
        residual_dropout(model, settings.dropout)
    return model, build_tokenizer(settings.text_frontend, settings.speaker, settings.speakers), device


def adamw_with_schedule(model, settings) -> tuple:
    """AdamW (betas 0.9, 0.95; weight decay on matrices only) and its schedule: linear warm-up over
    ``warmup_steps``, then a cosine from ``lr`` down to a tenth of it at ``steps`` (``settings``: any settings with
    those fields and ``weight_decay``: the model's and the code ear's)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
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

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, rate)


def utterance_frames(rows: list[Utterance]) -> np.ndarray:
    """Codes per utterance (50 per second) of manifest rows."""
    return np.array([int(u.seconds * MINI_LLASA.frame_rate) for u in rows])
