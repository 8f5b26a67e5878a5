"""``maspo-verl eval``: checkpoints -> speech on a Seed-TTS-eval list -> CER/WER, speaker similarity, table and plots.

For each checkpoint (a Hugging Face directory, or a veRL FSDP checkpoint merged first by veRL's own model merger,
``python -m verl.model_merger merge --backend fsdp``) and each row ``utt|prompt_text|prompt_wav|text`` of the list:

1. prompt: Llasa's format with the prompt speech's codes after ``<|SPEECH_GENERATION_START|>`` (the codec's
   encoder, or a codes file), the text ``prompt_text + " " + text``;
2. generate: vLLM on a GPU, the lab's sampler on ``transformers`` otherwise (`maspo_lab.sampler.Sampler`, the
   CPU rollout's own generation), stopping at the checkpoint's stop ids
   (`maspo_base.speech_tokens.llasa_generation.stop_ids`: its own end ids and ``<|SPEECH_GENERATION_END|>``);
   sampled (temperature 0.8, Llasa's model card), each utterance from its own random stream. Each checkpoint's
   speech-token layout is its own (`maspo_lab.speaking_model.model.layout_of_checkpoint`: mini-llasa by its
   ``speech_tokens.json``, Llasa-1B otherwise), and its codebook must be the codec's;
3. decode the response's codes with ``--codec`` (a codec spec, `maspo_base.codecs`: XCodec2 for Llasa-1B, the mini
   codec for mini-llasa; a response that fails the reward's gate, e.g. no end tag, is still
   decoded when it has codes, and counted in ``failed gates``; one with no codes scores error rate 1);
4. recognise (paraformer-zh for Chinese, Whisper large-v3 for English, as Seed-TTS-eval) and score as Seed-TTS-eval:
   its normalisation (`reward_fns.text_norm`) and the mean of per-utterance error rates (unclipped);
5. speaker similarity of the output to the prompt wav, cosine of speaker embeddings of the 16 kHz audio: with
   ``--speaker-checkpoint wavlm_large_finetune.pth`` Seed-TTS-eval's own model (WavLM-large + ECAPA-TDNN,
   `reward_fns.wavlm_ecapa`); without one, ``--speaker resemblyzer`` (GE2E) is the fallback. Every output names
   the model that computed SIM;
6. sound quality: DNSMOS P.835 overall MOS (1-5) of each output (``--quality dnsmos``, the default;
   `reward_fns.quality`), per utterance and as mean and 10th percentile per checkpoint.

Outputs under ``--out``: ``utterances.csv`` (one row per checkpoint and utterance), ``summary.json``, the printed
table, ``error_rates.png`` (distribution per checkpoint) and ``checkpoints.png`` (bars), wavs under ``wavs/``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from maspo_base.typed_settings import add_arguments, parse_arguments_or_exit
from maspo_base.xcodec2_decoder import HOP_LENGTH, SAMPLE_RATE
from maspo_lab.data.prepare import (
    BadRow,
    CodesFile,
    PromptEncoder,
    detect_language,
    prompt_codes_of,
    read_records,
    spoken_text,
)
from maspo_lab.figures import pyplot, save
from maspo_lab.runs.checkpoints import resolve_checkpoint
from maspo_lab.speaking_model.speaker import Sampling, generate_hf, generate_vllm


class CodecMismatch(ValueError):
    """A checkpoint whose speech tokens are not the codes of ``--codec`` (another codebook)."""


@dataclass
class EvalItem:
    utt: str
    text: str
    language: str
    spoken: str
    """What the model is asked to say: the prompt's transcript and the target when cloning a voice."""
    prompt_wav: str | None
    prompt_codes: list[int] | None


@dataclass
class UtteranceResult:
    checkpoint: str
    utt: str
    language: str
    text: str
    transcript: str
    error_rate: float
    unit: str
    similarity: float | None
    quality_mos: float | None
    """DNSMOS overall MOS of the output (empty without audio, or with ``--quality none``)."""
    duration_s: float
    n_codes: int
    gate: str
    wav: str


_START = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)


def read_eval_list(path: Path, coder, language: str | None = None) -> list[EvalItem]:
    """The rows of a Seed-TTS-eval list with their prompt codes; a bad row is reported and skipped."""
    items = []
    for record in read_records(path, "seedtts"):
        if isinstance(record, BadRow):
            log(f"skipped {record}")
            continue
        codes, problem = prompt_codes_of(record, coder)
        if problem is not None:
            log(f"skipped {record.source}:{record.line}: {problem}")
            continue
        text = record.text.strip()
        items.append(
            EvalItem(
                utt=record.utt or str(record.line),
                text=text,
                language=language or detect_language(text),
                spoken=spoken_text(record, codes is not None),
                prompt_wav=record.prompt_wav,
                prompt_codes=codes,
            )
        )
    return items


def prompt_ids(tokenizer, item: EvalItem) -> list[int]:
    from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids

    return render_prompt_ids(tokenizer, item.spoken, item.prompt_codes)


def evaluate_checkpoint(
    name: str,
    model_dir: Path,
    items: list[EvalItem],
    reward,
    speaker,
    sampling: Sampling,
    backend: str,
    device: str,
    out: Path,
    quality=None,
) -> list[UtteranceResult]:
    """Generate, decode, recognise and score every item with one checkpoint (`CodecMismatch` when the checkpoint's
    speech tokens are not the codec's codes)."""
    import soundfile as sf
    from transformers import AutoTokenizer

    from maspo_base.codecs import codec_layout
    from maspo_base.llasa_response import parse_token_ids
    from maspo_lab.speaking_model.model import layout_of_checkpoint
    from reward_fns.error_rate import error_rate

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    try:
        layout = codec_layout(reward.codec, layout_of_checkpoint(model_dir, tokenizer))
    except ValueError as error:
        raise CodecMismatch(f"checkpoint {name} ({model_dir}): {error}") from None
    prompts = [prompt_ids(tokenizer, item) for item in items]
    log(f"[{name}] generating {len(items)} utterances ({layout.name}) with {backend}")
    if backend == "vllm":
        responses = generate_vllm(model_dir, prompts, sampling)
    else:
        responses = generate_hf(model_dir, tokenizer, prompts, sampling, device, progress=log)

    parsed = [parse_token_ids(r, layout, prompt_codes=item.prompt_codes) for r, item in zip(responses, items)]
    with_codes = [i for i, p in enumerate(parsed) if len(p.codes)]
    log(f"[{name}] decoding {len(with_codes)} responses with the codec")
    audio = dict(zip(with_codes, reward.codec.decode([parsed[i].codes for i in with_codes])))
    wav_dir = out / "wavs" / name
    wav_dir.mkdir(parents=True, exist_ok=True)
    log(f"[{name}] recognising")
    scored = reward.score_audio(
        [audio[i] for i in with_codes], [items[i].text for i in with_codes], [items[i].language for i in with_codes]
    )
    transcripts = {i: s["speech_transcript"] for i, s in zip(with_codes, scored)}
    similarity = speaker_similarity(name, items, audio, speaker) if speaker is not None else {}
    mos = sound_quality(name, items, audio, quality) if quality is not None and audio else {}

    results = []
    for i, item in enumerate(items):
        transcript = transcripts.get(i, "")
        er = error_rate(item.text, transcript, item.language)  # empty transcript (or no speech): 1
        wav = ""
        if i in audio:
            wav = str(wav_dir / f"{item.utt}.wav")
            sf.write(wav, audio[i], SAMPLE_RATE)
        results.append(
            UtteranceResult(
                checkpoint=name,
                utt=item.utt,
                language=item.language,
                text=item.text,
                transcript=transcript,
                error_rate=er.raw,
                unit=er.unit,
                similarity=similarity.get(i),
                quality_mos=mos.get(i),
                duration_s=len(parsed[i].codes) * HOP_LENGTH / SAMPLE_RATE,
                n_codes=len(parsed[i].codes),
                gate=parsed[i].reason,
                wav=wav,
            )
        )
    return results


def speaker_similarity(name: str, items: list[EvalItem], audio: dict[int, np.ndarray], speaker) -> dict[int, float]:
    """SIM of each decoded item whose prompt wav exists, by item index; a pair the model cannot embed (e.g. a few
    milliseconds of audio) is left out, as Seed-TTS-eval skips a pair that raises (its CSV cell stays empty)."""
    from maspo_base.xcodec2_encoder import load_audio
    from reward_fns.score_record import per_item

    pairs = [i for i in audio if items[i].prompt_wav and Path(items[i].prompt_wav).exists()]
    sims = per_item(
        lambda batch: list(
            speaker.similarity([audio[i] for i in batch], [load_audio(items[i].prompt_wav) for i in batch])
        ),
        pairs,
        "speaker similarity",
    )
    similarity = {}
    for i, (sim, problem) in zip(pairs, sims):
        if problem is None:
            similarity[i] = float(sim)
        else:
            log(f"[{name}] {items[i].utt}: no SIM ({problem})")
    return similarity


def sound_quality(name: str, items: list[EvalItem], audio: dict[int, np.ndarray], quality) -> dict[int, float]:
    """DNSMOS overall of each decoded item, by item index (an item whose score fails is left out, said so)."""
    from reward_fns.score_record import per_item

    log(f"[{name}] scoring sound quality")
    decoded = list(audio)
    mos = {}
    for i, (score, problem) in zip(
        decoded, per_item(lambda batch: quality.score([audio[i] for i in batch]), decoded, "quality")
    ):
        if problem is None:
            mos[i] = score.ovrl_mos
        else:
            log(f"[{name}] {items[i].utt}: no quality score ({problem})")
    return mos


def summarise(results: list[UtteranceResult]) -> list[dict]:
    """Per checkpoint and language: mean of per-utterance error rates (x100), SIM, DNSMOS mean and 10th percentile,
    durations, failed gates."""
    rows = []
    for key in dict.fromkeys((r.checkpoint, r.language) for r in results):
        group = [r for r in results if (r.checkpoint, r.language) == key]
        sims = [r.similarity for r in group if r.similarity is not None]
        mos = [r.quality_mos for r in group if r.quality_mos is not None]
        durations = np.array([r.duration_s for r in group])
        rows.append(
            {
                "checkpoint": key[0],
                "language": key[1],
                "metric": "CER" if group[0].unit == "char" else "WER",
                "n": len(group),
                "error_rate_pct": 100 * float(np.mean([r.error_rate for r in group])),
                "similarity": float(np.mean(sims)) if sims else None,
                "quality_mos_mean": float(np.mean(mos)) if mos else None,
                "quality_mos_p10": float(np.percentile(mos, 10)) if mos else None,
                "duration_mean_s": float(durations.mean()),
                "duration_p90_s": float(np.percentile(durations, 90)),
                "failed_gates": sum(r.gate != "ok" for r in group),
                "failed_gate_reasons": dict(sorted(Counter(r.gate for r in group if r.gate != "ok").items())),
            }
        )
    return rows


def table(summary: list[dict], speaker_label: str) -> str:
    head = f"{'checkpoint':<28} {'lang':<5} {'n':>4} {'metric':>6} {'ER %':>7} {'SIM':>6} {'MOS':>5} {'p10':>5} "
    head += f"{'dur s':>6} {'p90 s':>6} {'failed':>6}"
    lines = [head, "-" * len(head)]
    for row in summary:
        sim = "-" if row["similarity"] is None else f"{row['similarity']:.3f}"
        mos, p10 = ("-" if row[k] is None else f"{row[k]:.2f}" for k in ("quality_mos_mean", "quality_mos_p10"))
        lines.append(
            f"{row['checkpoint'][:28]:<28} {row['language']:<5} {row['n']:>4} {row['metric']:>6} "
            f"{row['error_rate_pct']:>7.2f} {sim:>6} {mos:>5} {p10:>5} {row['duration_mean_s']:>6.2f} "
            f"{row['duration_p90_s']:>6.2f} {row['failed_gates']:>6}"
        )
    lines.append(f"ER: mean of per-utterance error rates, Seed-TTS-eval normalisation. SIM: {speaker_label}.")
    lines.append("MOS: DNSMOS P.835 overall quality (1-5), mean and 10th percentile over the outputs.")
    return "\n".join(lines)


def plot(results: list[UtteranceResult], summary: list[dict], out: Path, speaker_label: str) -> list[Path]:
    plt = pyplot()

    names = list(dict.fromkeys(r.checkpoint for r in results))
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in names:
        ax.hist([r.error_rate for r in results if r.checkpoint == name], bins=20, alpha=0.5, label=name)
    ax.set_xlabel("per-utterance error rate (CER for zh, WER otherwise)")
    ax.set_ylabel("utterances")
    ax.legend()
    paths = [save(fig, out / "error_rates.png", dpi=120)]

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    labels = [f"{row['checkpoint']}\n{row['language']}" for row in summary]
    axes[0].bar(labels, [row["error_rate_pct"] for row in summary])
    axes[0].set_ylabel("CER / WER (%)")
    axes[1].bar(labels, [row["similarity"] or 0.0 for row in summary])
    axes[1].set_ylabel(f"SIM ({speaker_label})")
    axes[2].bar(labels, [row["quality_mos_mean"] or 0.0 for row in summary], label="mean")
    axes[2].scatter(labels, [row["quality_mos_p10"] or 0.0 for row in summary], color="k", marker="_", s=400)
    axes[2].set_ylabel("DNSMOS overall (bar: mean, line: p10)")
    axes[2].set_ylim(1, 5)
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
    paths.append(save(fig, out / "checkpoints.png", dpi=120))
    return paths


def speaker_spec(speaker: str | None, checkpoint: Path | None) -> str | None:
    """The speaker backend spec (`reward_fns.speaker_similarity.build_speaker_backend`) of ``--speaker`` and
    ``--speaker-checkpoint``: Seed-TTS-eval's WavLM-ECAPA with a checkpoint, else resemblyzer unless ``--speaker
    none``; a ValueError names the option at fault."""
    from reward_fns.speaker_similarity import parse_speaker_spec

    if checkpoint is not None and speaker not in (None, "wavlm_ecapa"):
        raise ValueError(f"--speaker-checkpoint is Seed-TTS-eval's WavLM-ECAPA model; --speaker {speaker} has its own")
    if checkpoint is None and speaker == "wavlm_ecapa":
        raise ValueError(
            "--speaker wavlm_ecapa needs --speaker-checkpoint PATH (Seed-TTS-eval's wavlm_large_finetune.pth)"
        )
    if speaker == "none":
        return None
    spec = f"wavlm_ecapa:{checkpoint}" if checkpoint is not None else speaker or "resemblyzer"  # the labelled fallback
    parse_speaker_spec(spec)  # an absent checkpoint file, named
    return spec


def parse_args(argv: list[str]) -> argparse.Namespace:
    from reward_fns.speaker_similarity import SPEAKER_BACKEND_REGISTRY

    parser = argparse.ArgumentParser(
        prog="maspo-verl eval",
        description="Evaluate Llasa checkpoints on a Seed-TTS-eval list: CER/WER, speaker similarity, table, plots.",
    )
    parser.add_argument("--checkpoint", action="append", required=True, type=Path, help="HF dir or veRL FSDP ckpt")
    parser.add_argument("--list", required=True, type=Path, help="Seed-TTS-eval list utt|prompt_text|prompt_wav|text")
    parser.add_argument(
        "--codec",
        required=True,
        help="codec spec NAME:PATH or PATH: xcodec2 (a local XCodec2 checkpoint) or mel_fsq (the mini codec); its "
        "decoder, and its encoder for prompt wavs",
    )
    parser.add_argument("--codes-file", type=Path, default=None, help="precomputed prompt codes instead of encoding")
    parser.add_argument(
        "--asr",
        action="append",
        required=True,
        metavar="LANG=BACKEND:MODEL",
        help="e.g. zh=paraformer:/m/paraformer-zh",
    )
    parser.add_argument(
        "--speaker",
        default=None,
        choices=[*sorted(SPEAKER_BACKEND_REGISTRY), "none"],
        help="speaker-similarity model (default: wavlm_ecapa with --speaker-checkpoint, else resemblyzer)",
    )
    parser.add_argument(
        "--speaker-checkpoint",
        type=Path,
        default=None,
        metavar="PATH",
        help="Seed-TTS-eval's wavlm_large_finetune.pth: SIM with its WavLM-large + ECAPA-TDNN",
    )
    parser.add_argument(
        "--quality",
        choices=("dnsmos", "none"),
        default="dnsmos",
        help="sound-quality score of each output: DNSMOS P.835 overall MOS (speechmos' bundled models), or none",
    )
    parser.add_argument("--language", default=None, help="language of every row (default: detected per row)")
    parser.add_argument("--backend", choices=("auto", "vllm", "hf"), default="auto", help="generation backend")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    add_arguments(parser, Sampling)
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N rows only")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.sampling = parse_arguments_or_exit(parser, args, Sampling, "eval")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch

    from reward_fns.pipeline import SpeechReward

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = args.backend if args.backend != "auto" else ("vllm" if device.startswith("cuda") else "hf")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()

    try:
        speaker_model = speaker_spec(args.speaker, args.speaker_checkpoint)
    except ValueError as error:
        print(f"maspo-verl eval: {error}", file=sys.stderr)
        return 2
    asr = {}
    for spec in args.asr:
        lang, sep, model = spec.partition("=")
        if not sep:
            print(f"maspo-verl eval: --asr {spec!r}: expected LANG=BACKEND:MODEL", file=sys.stderr)
            return 2
        asr[lang] = model
    coder = CodesFile(args.codes_file) if args.codes_file else PromptEncoder(args.codec, device=device)
    items = read_eval_list(args.list, coder, args.language)[: args.limit]
    if not items:
        print(f"maspo-verl eval: no usable rows in {args.list}", file=sys.stderr)
        return 2
    no_asr = languages_without_asr([item.language for item in items], asr)
    if no_asr:
        print(f"maspo-verl eval: rows in languages {no_asr} but --asr covers only {sorted(asr)}", file=sys.stderr)
        return 2
    log(f"{len(items)} utterances from {args.list}; loading codec and ASR")
    reward = SpeechReward.from_spec(codec=args.codec, asr=asr, device=device, default_language="en")
    items = within_codebook(items, reward.codec.codebook_size)
    if not items:
        print(f"maspo-verl eval: no row of {args.list} has prompt codes the codec can decode", file=sys.stderr)
        return 2
    speaker, speaker_label = None, "none (--speaker none)"
    if speaker_model:
        from reward_fns.speaker_similarity import build_speaker_backend

        speaker = build_speaker_backend(speaker_model, device)
        speaker_label = speaker.label
    quality = None
    if args.quality != "none":
        from reward_fns.quality import build_quality_backend

        quality = build_quality_backend(args.quality)

    results: list[UtteranceResult] = []
    for path in args.checkpoint:
        model_dir = resolve_checkpoint(path, args.out)
        name = path.name if path.name not in ("actor", "huggingface") else "_".join(path.parts[-2:])
        try:
            results += evaluate_checkpoint(
                name, model_dir, items, reward, speaker, args.sampling, backend, device, args.out, quality
            )
        except CodecMismatch as error:
            print(f"maspo-verl eval: {error}", file=sys.stderr)
            return 2

    summary = summarise(results)
    with open(args.out / "utterances.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(results[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in results)
    payload = {"speaker_model": speaker_label, "sampling": asdict(args.sampling), "backend": backend, "rows": summary}
    (args.out / "summary.json").write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    plots = plot(results, summary, args.out, speaker_label)
    print(table(summary, speaker_label))
    print(f"wrote {args.out / 'utterances.csv'}, {args.out / 'summary.json'}, {', '.join(map(str, plots))}")
    log(f"done in {time.monotonic() - start:.0f} s")
    return 0


def languages_without_asr(languages: list[str], asr: dict[str, str]) -> list[str]:
    """The rows' languages no ``--asr`` recogniser hears, compared as the reward compares them: by base code
    (`reward_fns.text_norm.base_language`: ``en-US``, ``en_us`` and ``EN`` are ``en``)."""
    from reward_fns.text_norm import base_language

    return sorted({base_language(lang) for lang in languages} - {base_language(lang) for lang in asr})


def within_codebook(items: list[EvalItem], codebook_size: int) -> list[EvalItem]:
    """The items whose prompt codes the codec has (a codes file may hold another codec's); the others are reported
    and skipped."""
    kept = []
    for item in items:
        bad = [c for c in item.prompt_codes or () if c >= codebook_size]
        if bad:
            log(f"skipped {item.utt}: prompt codes out of the codec's range [0, {codebook_size}): {bad[:3]}")
        else:
            kept.append(item)
    return kept
