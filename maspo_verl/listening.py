"""Hearing what the policy says during training: ``samples.html``, a player per response with its text and scores.

veRL 0.9.1 writes the generations it validates (``trainer.validation_data_dir``, every ``trainer.test_freq`` steps)
and the rollouts it trains on (``trainer.rollout_data_dir``, every step) as JSONL through the trainer's
``_dump_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)``, in both trainers; nothing
of it is audio. `maspo_verl.verl_patches` wraps that method (`trainer.wrap_dump_generations`): after veRL's own
dump, `write_samples` takes ``count`` of the responses, spread evenly over the batch, and

- decodes each to a wav with the reward's own decoder (`maspo_base.llasa_response.parse_response` with the codec's
  codebook, then the codec `maspo_base.codecs.load_codec` loads from the reward's ``reward_kwargs.codec``, or
  ``trainer.samples.codec``: XCodec2 or the mini codec); a response with no speech codes, or one the decoder fails
  on, keeps its row with the reason and no player;
- appends one JSON line per response to ``<dir>/samples.jsonl`` (step, kind, text, score, every numeric reward
  part, every short text part such as the transcript, the wav's path) and writes ``<dir>/samples.html`` from all
  of them, newest step first;
- when ``trainer.logger`` includes ``wandb`` or ``tensorboard``, logs the same wavs there (``wandb.Audio``,
  ``SummaryWriter.add_audio`` under veRL's tensorboard folder).

A reward without a codec (the synthetic task, a reward server without ``trainer.samples.codec``) gets the same
page without players. Settings, ``+trainer.samples.<key>``: `SampleSettings`. Training rollouts are sampled only
when ``trainer.rollout_data_dir`` is set and ``train_every`` > 0; the v1 trainer hands its rollout dump no reward
parts (only the score), the legacy one does.
"""

from __future__ import annotations

import html
import json
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from maspo_base.typed_settings import InvalidSetting, SettingsError, build

SETTINGS_KEY = "trainer.samples"
PAGE = "samples.html"
RECORDS = "samples.jsonl"
SETS = "sets.json"
"""Optional, beside the page: ``{text: set name}`` ("training", "held-out"), shown in the before/after table."""
AUDIO_DIR = "audio"
SKIPPED_PARTS = frozenset({"score", "reward", "uid", "request_id", "frame_errors", "frame_likelihood", "frame_words"})
"""Extras not shown as parts: the score itself (``reward`` is veRL's copy of it), ids, the encoded per-frame signals."""
MAX_TEXT_PART = 200
"""A text part longer than this (characters) is not shown (an encoded signal, not something to read)."""


@dataclass(frozen=True)
class SampleSettings:
    """``+trainer.samples.<key>`` settings of the listening page."""

    count: int = 8
    """Responses per validation (and per sampled training step); 0 turns the page off."""
    train_every: int = 0
    """Every N-th training step's rollouts get samples too (needs ``trainer.rollout_data_dir``); 0: validation only."""
    dir: str | None = None
    """The page's folder; default ``<trainer.default_local_dir>/samples`` (the run's checkpoint folder)."""
    codec: str | None = None
    """The codec spec that decodes the responses (`maspo_base.codecs`: ``NAME:PATH`` or ``PATH``); default the
    reward's ``reward_kwargs.codec`` (none: no audio)."""

    def validate(self) -> None:
        if self.count < 0:
            raise InvalidSetting("count", f"count must be >= 0 (0: no samples page), got {self.count}")
        if self.train_every < 0:
            raise InvalidSetting(
                "train_every", f"train_every must be >= 0 (0: validation only), got {self.train_every}"
            )


def sample_settings(config: Any) -> SampleSettings:
    """The checked `SampleSettings` of a whole veRL config (``trainer.samples``), with ``dir`` and ``codec`` filled."""
    trainer = config.get("trainer", {}) or {}
    settings = build(SampleSettings, trainer.get("samples", None), SETTINGS_KEY)
    if settings.train_every and settings.count and not trainer.get("rollout_data_dir", None):
        raise SettingsError(
            f"{SETTINGS_KEY}.train_every={settings.train_every} needs trainer.rollout_data_dir: veRL hands over "
            "training rollouts only when it dumps them there (set trainer.rollout_data_dir=DIR, or train_every=0)"
        )
    folder = settings.dir or str(Path(trainer.get("default_local_dir", "checkpoints")) / "samples")
    codec = settings.codec
    if codec is None:
        reward = config.get("reward", {}) or {}
        kwargs = (reward.get("custom_reward_function", {}) or {}).get("reward_kwargs", {}) or {}
        codec = kwargs.get("codec", None)
    return SampleSettings(count=settings.count, train_every=settings.train_every, dir=folder, codec=codec)


def spread(total: int, count: int) -> list[int]:
    """``min(count, total)`` indices spread evenly over ``range(total)`` (first and last included): with responses
    grouped by prompt, the samples cover as many prompts as they can."""
    if total <= 0 or count <= 0:
        return []
    if count >= total:
        return list(range(total))
    return sorted({int(round(i * (total - 1) / (count - 1))) for i in range(count)}) if count > 1 else [0]


def _finite_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(float(value))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else value


def sample_parts(extras: dict[str, list], index: int) -> tuple[dict[str, float], dict[str, str]]:
    """Response ``index``'s numeric reward parts and short text parts (`SKIPPED_PARTS`, `MAX_TEXT_PART`)."""
    numeric, text = {}, {}
    for key, values in extras.items():
        if key in SKIPPED_PARTS or values is None or index >= len(values):
            continue
        value = _plain(values[index])
        if _finite_number(value):  # bools count, as in `maspo_verl.reward_metrics`
            numeric[key] = float(value)
        elif isinstance(value, str) and len(value) <= MAX_TEXT_PART:
            text[key] = value
    return numeric, text


def reference_text(gt: Any) -> str:
    if isinstance(gt, dict):
        gt = gt.get("text", gt.get("ground_truth", ""))
    return "" if gt is None else str(gt)


_decoders: dict[str, Any] = {}


def decoder_for(codec: str):
    """The reward's decoder for the codec spec ``codec`` (`maspo_base.codecs.load_codec`), loaded once per process,
    on CPU."""
    if codec not in _decoders:
        from maspo_base.codecs import load_codec

        _decoders[codec] = load_codec(codec)
    return _decoders[codec]


def decode_response(response: str, codec: str) -> tuple[np.ndarray | None, str]:
    """``(wav at maspo_base.xcodec2_decoder.SAMPLE_RATE, "")`` of a Llasa response, or ``(None, why not)``.

    The reward's parse finds the codes, range-checked against the codec's codebook; a response its gate refuses
    (cut at the length limit, say) is still decoded when it holds codes in range, since hearing it is the point."""
    from maspo_base.codecs import codec_layout
    from maspo_base.llasa_response import parse_response

    try:
        decoder = decoder_for(codec)
    except Exception as exc:  # noqa: BLE001 - the page still shows the response, saying why it has no audio
        return None, f"codec failed to load: {type(exc).__name__}: {exc}"
    layout = codec_layout(decoder)
    parsed = parse_response(response, layout=layout)
    codes = parsed.codes
    if codes.size == 0:
        return None, f"no speech codes ({parsed.reason})"
    if codes.min() < 0 or codes.max() >= layout.codebook_size:
        return None, f"codes out of range ({parsed.detail})"
    try:
        return decoder.decode([codes])[0], ""
    except Exception as exc:  # noqa: BLE001 - one response's problem: its row says why it has no audio
        return None, f"decode failed: {type(exc).__name__}: {exc}"


def write_wav(path: Path, wav: np.ndarray) -> float:
    """16-bit PCM wav (clipped to [-1, 1]); returns its duration in seconds."""
    import soundfile

    from maspo_base.xcodec2_decoder import SAMPLE_RATE

    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), np.clip(np.asarray(wav, dtype=np.float32), -1.0, 1.0), SAMPLE_RATE, subtype="PCM_16")
    return len(wav) / SAMPLE_RATE


def write_samples(
    *,
    settings: SampleSettings,
    step: int,
    kind: str,
    inputs: list[str],
    outputs: list[str],
    gts: list[Any],
    scores: list[float],
    extras: dict[str, list],
    loggers: tuple[str, ...] = (),
    tensorboard_dir: str | None = None,
) -> list[dict]:
    """Decode, record and page ``settings.count`` of one dump's responses (see the module docstring); the rows."""
    folder = Path(settings.dir)
    rows, wavs = [], []
    for position, i in enumerate(spread(len(outputs), settings.count)):
        numeric, text = sample_parts(extras, i)
        row = {
            "step": int(step),
            "kind": kind,
            "index": i,
            "text": reference_text(gts[i] if i < len(gts) else None) or inputs[i][-MAX_TEXT_PART:],
            "score": float(scores[i]),
            "parts": numeric,
            "texts": text,
            "audio": None,
            "note": "",
        }
        wav = None
        if settings.codec:
            wav, row["note"] = decode_response(outputs[i], settings.codec)
            if wav is not None:
                relative = Path(AUDIO_DIR) / f"step{step:06d}_{kind}_{position:03d}.wav"
                row["duration_s"] = write_wav(folder / relative, wav)
                row["audio"] = relative.as_posix()
        rows.append(row)
        wavs.append(wav)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / RECORDS, "a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    write_page(folder)
    log_audio(rows, wavs, step, kind, loggers, tensorboard_dir)
    return rows


def write_page(folder: str | Path) -> Path:
    """``samples.html`` from the folder's records, with the sentence sets of ``sets.json`` where it exists."""
    folder = Path(folder)
    sets = json.loads((folder / SETS).read_text()) if (folder / SETS).exists() else {}
    (folder / PAGE).write_text(render_page(read_rows(folder), sets))
    return folder / PAGE


def read_rows(folder: str | Path) -> list[dict]:
    """The folder's records, one per (step, kind, response): a run resumed from a checkpoint samples that step again
    into the same wavs, and its later row is the one they hold."""
    path = Path(folder) / RECORDS
    if not path.exists():
        return []
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[(row["step"], row["kind"], row["index"])] = row
    return list(rows.values())


def _caption(row: dict) -> str:
    parts = " ".join(f"{k}={v:.3g}" for k, v in row["parts"].items())
    heard = " ".join(f"{k}: {v!r}" for k, v in row["texts"].items())
    return f"{row['text']!r} score={row['score']:.3g} {parts} {heard}".strip()


def log_audio(rows: list[dict], wavs: list, step: int, kind: str, loggers: tuple[str, ...], tb_dir: str | None):
    """The decoded samples to wandb (``samples/<kind>``) and tensorboard (``samples/<kind>/<n>``) when logging there."""
    from maspo_base.xcodec2_decoder import SAMPLE_RATE

    heard = [(row, wav) for row, wav in zip(rows, wavs) if wav is not None]
    if not heard:
        return
    if "wandb" in loggers:
        import wandb

        if wandb.run is not None:
            clips = [
                wandb.Audio(np.asarray(w, np.float32), sample_rate=SAMPLE_RATE, caption=_caption(r)) for r, w in heard
            ]
            wandb.log({f"samples/{kind}": clips}, step=step)
    if "tensorboard" in loggers and tb_dir:
        import torch

        writer = _tensorboard_writer(tb_dir)
        for n, (row, wav) in enumerate(heard):
            clip = torch.from_numpy(np.clip(np.asarray(wav, np.float32), -1.0, 1.0))[None]
            writer.add_audio(f"samples/{kind}/{n}", clip, step, sample_rate=SAMPLE_RATE)
            writer.add_text(f"samples/{kind}/{n}", _caption(row), step)
        writer.flush()


_writers: dict[str, Any] = {}


def _tensorboard_writer(folder: str):
    if folder not in _writers:
        from torch.utils.tensorboard import SummaryWriter

        _writers[folder] = SummaryWriter(log_dir=folder)
    return _writers[folder]


def tensorboard_dir(project: str, experiment: str) -> str:
    """veRL's tensorboard folder (``verl.utils.tracking._TensorboardAdapter``): ``$TENSORBOARD_DIR`` or
    ``tensorboard_log/<project>/<experiment>``."""
    import os

    return os.environ.get("TENSORBOARD_DIR", f"tensorboard_log/{project}/{experiment}")


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; margin-bottom: 2em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; font-size: 13px; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #a33; }
"""


def _number_cell(key: str, value: float | None) -> str:
    if value is None:
        return '<td class="num">-</td>'
    return f'<td class="num" data-key="{html.escape(key)}" data-value="{value!r}">{value:.4g}</td>'


def _player(row: dict) -> str:
    if row.get("audio"):
        return f'<audio controls preload="metadata" src="{html.escape(row["audio"])}"></audio>'
    return f'<span class="note">no audio: {html.escape(row.get("note", ""))}</span>'


def before_after(rows: list[dict], sets: dict[str, str] | None = None) -> str:
    """A table of the sentences heard at both the first and the last validation: per sentence its set (``sets``),
    its text, and each validation's first response (player, score, CER) side by side; empty with fewer than two
    validations."""
    steps = sorted({r["step"] for r in rows if r["kind"] == "validation"})
    if len(steps) < 2:
        return ""
    first, last = ({}, {})
    for row in rows:
        if row["kind"] == "validation" and row["step"] in (steps[0], steps[-1]):
            (first if row["step"] == steps[0] else last).setdefault(row["text"], row)
    texts = [t for t in first if t in last]
    if not texts:
        return ""
    sets = sets or {}

    def cell(row: dict) -> str:
        cer = row["parts"].get("speech_error_rate_raw")
        heard = row["texts"].get("speech_transcript", "")
        figures = f"score {row['score']:.3g}" + (f", CER {cer:.3g}" if cer is not None else "")
        player = f"{_player(row)}<br>" if row.get("audio") or row.get("note") else ""
        return f"<td>{player}{figures}<br><i>{html.escape(heard)}</i></td>"

    lines = [
        f'<h2 id="before-after">The same sentence before (step {steps[0]}) and after (step {steps[-1]})</h2>',
        '<table class="before-after">',
        "<tr><th>set</th><th>text</th><th>before</th><th>after</th></tr>",
    ]
    for text in texts:
        where = html.escape(sets.get(text, "-"))
        lines.append(
            f'<tr data-set="{where}"><td>{where}</td><td>{html.escape(text)}</td>'
            f"{cell(first[text])}{cell(last[text])}</tr>"
        )
    lines.append("</table>")
    return "\n".join(lines)


def render_page(rows: list[dict], sets: dict[str, str] | None = None) -> str:
    """The whole page: the same sentences before and after training side by side (`before_after`), then one table
    per (step, kind), newest step first (validation before training within a step)."""
    groups: dict[tuple[int, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["step"], row["kind"]), []).append(row)
    order = sorted(groups, key=lambda g: (-g[0], g[1] != "validation", g[1]))
    body = [table for table in (before_after(rows, sets),) if table]
    for step, kind in order:
        members = groups[(step, kind)]
        numeric = sorted({k for r in members for k in r["parts"]})
        texts = sorted({k for r in members for k in r["texts"]})
        players = any(r.get("audio") for r in members) or any(r.get("note") for r in members)
        head = ["#", "text"] + (["audio"] if players else []) + ["score", *numeric, *texts]
        lines = [
            f'<h2 id="step{step}-{kind}">step {step}, {kind} ({len(members)} responses)</h2>',
            f'<table class="samples" data-step="{step}" data-kind="{kind}">',
            "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>",
        ]
        for row in members:
            cells = [f"<td>{row['index']}</td>", f"<td>{html.escape(row['text'])}</td>"]
            if players:
                cells.append(f"<td>{_player(row)}</td>")
            cells.append(_number_cell("score", row["score"]))
            cells += [_number_cell(k, row["parts"].get(k)) for k in numeric]
            cells += [f'<td data-key="{html.escape(k)}">{html.escape(row["texts"].get(k, ""))}</td>' for k in texts]
            lines.append(f'<tr data-index="{row["index"]}">' + "".join(cells) + "</tr>")
        lines.append("</table>")
        body.append("\n".join(lines))
    if not body:
        body.append("<p>No samples yet: they are written at each validation (trainer.test_freq).</p>")
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>maspo-verl samples</title>'
        f"<style>{_STYLE}</style></head><body>\n<h1>Samples, newest step first</h1>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def dump_kind(trainer_config: Any, dump_path: str) -> str | None:
    """``validation`` or ``training`` for a veRL dump folder, None for neither."""
    if dump_path == trainer_config.get("validation_data_dir", None):
        return "validation"
    if dump_path == trainer_config.get("rollout_data_dir", None):
        return "training"
    return None


def after_dump(trainer: Any, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path) -> None:
    """What the `verl_patches` wrapper runs after veRL's ``_dump_generations``: samples of this dump, if due."""
    config = trainer.config
    settings = sample_settings(config)
    kind = dump_kind(config.trainer, dump_path)
    step = int(trainer.global_steps)
    if settings.count == 0 or kind is None:
        return
    if kind == "training" and (settings.train_every == 0 or step % settings.train_every):
        return
    loggers = tuple(config.trainer.get("logger", ()) or ())
    if isinstance(loggers, str):
        loggers = (loggers,)
    write_samples(
        settings=settings,
        step=step,
        kind=kind,
        inputs=list(inputs),
        outputs=list(outputs),
        gts=list(gts),
        scores=[float(s) for s in scores],
        extras={k: list(v) for k, v in (reward_extra_infos_dict or {}).items()},
        loggers=loggers,
        tensorboard_dir=tensorboard_dir(config.trainer.project_name, config.trainer.experiment_name),
    )
