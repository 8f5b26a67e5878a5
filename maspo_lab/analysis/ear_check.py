"""How well the code ear agrees with the audio ears on what mini-llasa says, and what it costs: ``build-ear``'s check.

Each of ``sentences`` held-out sentences is said ``samples`` times by the shipped model (temperature 0.8, one stream
per sample, `maspo_lab.speaking_model.speaker.Speaker`); every finished response is scored by the speech reward as
the speech task runs it (the mini codec decodes it, Whisper tiny.en and PocketSphinx hear it, CER in characters) and
by the code ear (its PER and CTC likelihood per phoneme). GRPO's advantages are made of the differences between the
samples of one sentence, so the agreement that matters is within a sentence:

    r_within(x, y) = corr(x_{s,k} - mean_k x_{s,k}, y_{s,k} - mean_k y_{s,k})     over sentences s, samples k

with a 95 % interval from 2,000 bootstrap resamples of the sentences (samples of one sentence are not independent).
The two audio ears' own ``r_within`` on the same responses is the yardstick.

Cost: the same responses scored through the real reward, audio (decode + Whisper tiny.en) and ear (phonemes + the
ear), in alternating rounds, the median round's seconds per response each; the ratio is audio / ear.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

PAIRS = {
    "ear_per~whisper": ("ear_per", "whisper_cer"),
    "ear_per~pocketsphinx": ("ear_per", "pocketsphinx_cer"),
    "ear_nll~whisper": ("ear_nll", "whisper_cer"),
    "ear_nll~pocketsphinx": ("ear_nll", "pocketsphinx_cer"),
    "whisper~pocketsphinx": ("whisper_cer", "pocketsphinx_cer"),
}
"""The within-sentence correlations reported: the ear's PER and likelihood against each audio ear, and the two
audio ears against each other."""


def _rewards(codec_dir: Path, ear_dir: Path, layout: str):
    """The speech task's reward as the testbed runs it (`maspo_lab.analysis.fidelity_scoring.speech_task_reward`)
    in the checkpoint's ``layout``: heard by Whisper tiny.en and the second ear, and scored by the code ear."""
    from maspo_lab.analysis.fidelity_scoring import speech_task_reward

    audio = speech_task_reward(codec_dir, layout, second_ear=True, num_threads=2)
    ear = speech_task_reward(codec_dir, layout, ear=ear_dir, num_threads=2)
    return audio, ear


def hear_responses(
    model_dir: Path, codec_dir: Path, ear_dir: Path, texts: list[str], samples: int, seed: int = 0, log=print
) -> tuple[list[dict], dict]:
    """One row per finished response (text, sample, the three ears' figures) and the cost comparison."""
    from maspo_lab.speaking_model.speaker import Speaker

    speaker = Speaker(model_dir)
    said = [(text, k, codes) for k in range(samples) for text, codes in zip(texts, speaker.codes(texts, seed=seed + k))]
    finished = [(text, k, codes) for text, k, codes in said if len(codes)]
    log(f"[ear] check: {len(finished)} of {len(said)} responses finished")
    layout = speaker.layout
    requests = [
        {"token_ids": [layout.offset + int(c) for c in codes] + [layout.end_id], "ground_truth": text}
        for text, _, codes in finished
    ]
    audio, ear = _rewards(codec_dir, ear_dir, layout.name)  # the layout the speaker's checkpoint declares
    heard = audio.score_batch([{**r, "second_ear": True} for r in requests])
    read = ear.score_batch(requests)
    rows = [
        {
            "text": text,
            "sample": k,
            "codes": len(codes),
            "whisper_cer": h["speech_error_rate"],
            "pocketsphinx_cer": h["speech_second_error_rate"],
            "ear_per": r["speech_ear_per"],
            "ear_nll": r["speech_ear_nll"],
            "ear_aligned": r["speech_ear_aligned"],
            "ear_reason": r["speech_reason"],
        }
        for (text, k, codes), h, r in zip(finished, heard, read)
    ]
    return rows, measure_cost(audio, ear, requests)


def read_recordings(ear_dir: Path, codec_dir: Path, recordings: list[dict], root: Path) -> dict:
    """The ear's pooled phoneme error rate on recordings (``{"text", "audio"}`` rows, audio under ``root``) as the
    codec encodes them: what it reads of real speech, the floor of what it can read of the model's."""
    import soundfile

    from maspo_base.mel_codec import MelFsqCodec
    from reward_fns.code_ear import CodeEar

    codec, ear = MelFsqCodec.from_pretrained(codec_dir), CodeEar.from_pretrained(ear_dir)
    codes = codec.encode_waveforms([soundfile.read(root / r["audio"], dtype="float32")[0] for r in recordings])
    heard = ear.hear(codes, [ear.targets(r["text"]) for r in recordings])
    edits = sum(h.per * len(h.targets) for h in heard)
    return {"utterances": len(heard), "per": round(edits / sum(len(h.targets) for h in heard), 4)}


def measure_cost(audio, ear, requests: list[dict], rounds: int = 3, limit: int = 96) -> dict:
    """Seconds per response of the audio reward (decode + Whisper) and the ear's on the first ``limit`` responses,
    alternating rounds (module docstring); the ear's phonemes are cached from the first call, as a training run's
    repeated sentences are."""
    requests = requests[:limit]
    ear.score_batch(requests[:1])
    times: dict[str, list[float]] = {"audio": [], "ear": []}
    for _ in range(rounds):
        for name, reward in (("audio", audio), ("ear", ear)):
            start = time.perf_counter()
            reward.score_batch(requests)
            times[name].append((time.perf_counter() - start) / len(requests))
    audio_s, ear_s = float(np.median(times["audio"])), float(np.median(times["ear"]))
    return {
        "responses": len(requests),
        "rounds": rounds,
        "audio_s_per_response": round(audio_s, 5),
        "ear_s_per_response": round(ear_s, 6),
        "audio_over_ear": round(audio_s / ear_s, 1),
        "seconds": {k: [round(v, 6) for v in vs] for k, vs in times.items()},
    }


def within_correlation(rows: list[dict], x: str, y: str, resamples: int = 2000, seed: int = 0) -> dict:
    """``r_within`` of columns ``x`` and ``y`` (module docstring) with its bootstrap interval over sentences."""
    by_text: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        by_text.setdefault(row["text"], []).append((row[x], row[y]))
    groups = [np.array(v, dtype=float) for v in by_text.values() if len(v) > 1]
    centred = [g - g.mean(axis=0) for g in groups]

    def corr(parts: list[np.ndarray]) -> float:
        stacked = np.concatenate(parts)
        return float(np.corrcoef(stacked[:, 0], stacked[:, 1])[0, 1])

    rng = np.random.default_rng(seed)
    draws = [corr([centred[i] for i in rng.integers(0, len(centred), len(centred))]) for _ in range(resamples)]
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    return {
        "r": round(corr(centred), 3),
        "ci95": [round(float(low), 3), round(float(high), 3)],
        "sentences": len(groups),
    }


def agreement(rows: list[dict]) -> dict:
    """Every pair of `PAIRS` (module docstring), and each ear's mean."""
    means = {k: round(float(np.mean([r[k] for r in rows])), 4) for k in ("whisper_cer", "pocketsphinx_cer", "ear_per")}
    return {"means": means, **{name: within_correlation(rows, *pair) for name, pair in PAIRS.items()}}


def write_check(out: Path, rows: list[dict], cost: dict, recordings: dict | None = None) -> dict:
    """``check.json`` (agreement, cost and the recordings' PER), ``check_responses.jsonl`` and ``check.png`` in
    ``out``."""
    report = {"responses": len(rows), "agreement": agreement(rows), "cost": cost, "recordings": recordings}
    (out / "check.json").write_text(json.dumps(report, indent=1) + "\n")
    with open(out / "check_responses.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    _plot(out / "check.png", rows, report["agreement"])
    return report


def _plot(path: Path, rows: list[dict], agreement: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def centred(key: str) -> np.ndarray:
        means: dict[str, list[float]] = {}
        for r in rows:
            means.setdefault(r["text"], []).append(r[key])
        return np.array([r[key] - np.mean(means[r["text"]]) for r in rows])

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for ax, name in zip(axes, ("ear_per~whisper", "ear_per~pocketsphinx", "whisper~pocketsphinx")):
        x, y = PAIRS[name]
        ax.scatter(centred(x), centred(y), s=8, alpha=0.5)
        a = agreement[name]
        ax.set_title(f"{name}: r {a['r']:+.2f} ({a['ci95'][0]:+.2f} .. {a['ci95'][1]:+.2f})", fontsize=10)
        ax.set_xlabel(f"{x} - sentence mean")
        ax.set_ylabel(f"{y} - sentence mean")
    fig.suptitle("Within-sentence agreement on the shipped mini-llasa's responses (95 % bootstrap over sentences)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
