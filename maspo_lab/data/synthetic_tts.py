"""A synthetic, speech-like TTS task: no audio, no model weights, scored in milliseconds.

**Speaking.** Each letter of the alphabet ``PHONEMES`` is a phoneme with a *centre*: a point of the XCodec2 FSQ lattice
(8 digits in {0..3}, codec id ``sum_k d_k 4**k``; `maspo_base.speech_tokens.xcodec2_fsq`). A text is spoken as one run
per phoneme, 2-4 frames long, each frame the centre or a lattice neighbour (one digit moved by 1): runs of neighbouring
codec codes, as real speech is runs of similar frames. A space is a pause, spoken at the lattice's zero point (id 43690,
all digits 2). A reference utterance ends with ``<|SPEECH_GENERATION_END|>``.

**Listening** (`hear`, `transcribe`). Each code of a response is labelled with the nearest centre in L1 digit
distance ``|d - c|_1`` (or as noise if no centre is within `LABEL_RADIUS`); a run of equal labels is heard as one
unit if it lasts at least `MIN_UNIT_FRAMES` frames. A shorter run (one frame, 20 ms at XCodec2's 50 Hz) is not heard,
as a recogniser does not hear a 20 ms blip as a phoneme, and a unit interrupted only by such a blip is heard once.
That is the synthetic ASR.

**Reward** (`compute_score`), what a TTS reward scores, in [0, 1]:

    score = 0.6 * content + 0.2 * duration + 0.2 * end
    unit error rate = edit_distance(units, target units) / len(target units)          (can exceed 1)
    content  = max(0, 1 - unit error rate)
    duration = exp(-| ln(frames / expected frames) |),  expected = 3 frames per unit   (sensible length)
    end      = 1 if the response closes with <|SPEECH_GENERATION_END|> and holds speech codes only, else 0

**Where the errors are** (`frame_errors`, reported as the ``frame_errors`` extra for ``adv_estimator=maspo``):
exact, from aligning the heard units to the target units; the rule is in `frame_errors`' docstring.

`write_dataset` writes the parquet files veRL's ``RLHFDataset`` reads (prompt messages in Llasa's format, the text
as ground truth); ``reward.custom_reward_function.path=pkg://maspo_lab.data.synthetic_tts`` and
``.name=compute_score`` score it.
`warm_start` gives a freshly built tiny model a short supervised pass on reference utterances, as a real TTS
model is fine-tuned before RL; it leaves it imperfect, so the RL run has something to improve.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from maspo_base.frame_errors import NO_ALIGNMENT, encode_frame_errors
from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens.xcodec2_fsq import FSQ_DIMS, FSQ_LEVELS, ZERO_DIGIT, code_of, digits_of

DATA_SOURCE = "maspo_verl/synthetic_tts"
PHONEMES = "abdikmos"
"""The task's alphabet; every letter is one phoneme."""
PAUSE = " "
LABEL_RADIUS = 2
"""A code further than this (L1 over digits) from every centre is heard as noise."""
MIN_UNIT_FRAMES = 2
"""The shortest run of equally labelled frames the synthetic ASR hears as a unit (40 ms); shorter runs are blips."""
FRAMES_PER_UNIT = 3.0
WEIGHTS = {"content": 0.6, "duration": 0.2, "end": 0.2}


def _l1(a: Sequence[int], b: Sequence[int]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b))


def _make_centres(seed: int = 0, min_distance: int = 2 * LABEL_RADIUS + 2) -> dict[str, tuple[int, ...]]:
    """Phoneme centres at least ``min_distance`` apart (L1), so a neighbour of one centre is never nearer another."""
    rng = random.Random(seed)
    centres = {PAUSE: (ZERO_DIGIT,) * FSQ_DIMS}
    for phoneme in PHONEMES:
        while True:
            candidate = tuple(rng.randrange(FSQ_LEVELS) for _ in range(FSQ_DIMS))
            if all(_l1(candidate, c) >= min_distance for c in centres.values()):
                centres[phoneme] = candidate
                break
    return centres


CENTRES = _make_centres()
"""Phoneme (and pause) -> FSQ digits of its centre."""


def units_of_text(text: str) -> list[str]:
    """Target units of a text: its letters, a doubled letter one (long) phoneme, each run of spaces one pause.

    Raises ``ValueError`` on a character outside PHONEMES and space."""
    bad = sorted(set(text) - set(PHONEMES) - {PAUSE})
    if bad:
        raise ValueError(f"text {text!r} has characters {bad} outside the task alphabet {PHONEMES!r} and space")
    text = text.strip()
    return [ch for i, ch in enumerate(text) if i == 0 or ch != text[i - 1]]


def speak(text: str, rng: random.Random, durations: Sequence[int] = (2, 3, 4)) -> list[int]:
    """A reference utterance: codec ids, one run of 2-4 neighbouring frames per unit (no end tag)."""
    codes = []
    for unit in units_of_text(text):
        centre = list(CENTRES[unit])
        for _ in range(rng.choice(durations)):
            frame = list(centre)
            if rng.random() < 0.5:  # move one digit to a lattice neighbour
                k = rng.randrange(FSQ_DIMS)
                frame[k] = min(FSQ_LEVELS - 1, max(0, frame[k] + rng.choice((-1, 1))))
            codes.append(code_of(frame))
    return codes


def label(code: int) -> str | None:
    """The unit a codec id is heard as: the nearest centre within LABEL_RADIUS, else None (noise)."""
    d = digits_of(code)
    unit, dist = min(((u, _l1(d, c)) for u, c in CENTRES.items()), key=lambda x: x[1])
    return unit if dist <= LABEL_RADIUS else None


class HeardUnit(NamedTuple):
    """A unit the synthetic ASR heard and the frames it spans, ``[start, end)``."""

    unit: str
    start: int
    end: int


def hear(codes: Sequence[int], min_unit_frames: int = MIN_UNIT_FRAMES) -> list[HeardUnit]:
    """Synthetic ASR with frame spans: label every code, keep the runs of one label at least ``min_unit_frames``
    long, and merge two kept runs of the same unit separated by fewer than ``min_unit_frames`` unheard frames.

    A unit's span runs from its first to its last heard frame, so it covers a blip it was merged across."""
    return _merge_heard_runs(_heard_runs(codes, min_unit_frames), min_unit_frames)


def _heard_runs(codes: Sequence[int], min_unit_frames: int) -> list[HeardUnit]:
    """The maximal runs of one `label` (not noise) at least ``min_unit_frames`` long, in order."""
    runs: list[tuple[str | None, int, int]] = []
    for k, code in enumerate(codes):
        unit = label(code)
        if runs and runs[-1][0] == unit:
            runs[-1] = (unit, runs[-1][1], k + 1)
        else:
            runs.append((unit, k, k + 1))
    return [HeardUnit(*run) for run in runs if run[0] is not None and run[2] - run[1] >= min_unit_frames]


def _merge_heard_runs(runs: list[HeardUnit], min_unit_frames: int) -> list[HeardUnit]:
    """One unit per heard run, a run merged into the unit before it when both have the same label and fewer than
    ``min_unit_frames`` frames lie between them."""
    units: list[HeardUnit] = []
    for run in runs:
        if units and units[-1].unit == run.unit and run.start - units[-1].end < min_unit_frames:
            units[-1] = units[-1]._replace(end=run.end)
        else:
            units.append(run)
    return units


def transcribe(codes: Sequence[int], min_unit_frames: int = MIN_UNIT_FRAMES) -> list[str]:
    """Synthetic ASR: the units `hear` hears."""
    return [heard.unit for heard in hear(codes, min_unit_frames)]


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance (substitution, insertion, deletion cost 1)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


class EditOp(NamedTuple):
    """One step of an alignment of heard units to target units: ``op`` is ``match``, ``sub`` (heard[i] for
    target[j]), ``ins`` (heard[i] has no target) or ``del`` (target[j] was not heard; i is where it is missing:
    the index of the next heard unit)."""

    op: str
    i: int
    j: int | None


def align_units(heard: Sequence[str], target: Sequence[str]) -> list[EditOp]:
    """A minimal edit script from ``target`` to ``heard`` (Levenshtein table, traceback from the end).

    Ties are broken toward ``match``/``sub``, then ``ins``, then ``del``, so a run of errors is explained with as
    few insertions and deletions as the distance allows. ``len`` of the non-match ops is `edit_distance`."""
    n, m = len(heard), len(target)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        table[i][0] = i
    for j in range(m + 1):
        table[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            table[i][j] = min(
                table[i - 1][j - 1] + (heard[i - 1] != target[j - 1]), table[i - 1][j] + 1, table[i][j - 1] + 1
            )
    ops: list[EditOp] = []
    i, j = n, m
    while i or j:
        if i and j and table[i][j] == table[i - 1][j - 1] + (heard[i - 1] != target[j - 1]):
            ops.append(EditOp("match" if heard[i - 1] == target[j - 1] else "sub", i - 1, j - 1))
            i, j = i - 1, j - 1
        elif i and table[i][j] == table[i - 1][j] + 1:
            ops.append(EditOp("ins", i - 1, None))
            i -= 1
        else:
            ops.append(EditOp("del", i, j - 1))
            j -= 1
    return ops[::-1]


def frame_errors(codes: Sequence[int], text: str) -> list[float]:
    """Where the synthetic ASR heard errors: one value per frame (code) of the response, 1 = error.

    Rule: align the heard units to the text's units (`align_units`). Frames not heard as their own label (noise,
    and blips shorter than `MIN_UNIT_FRAMES`, also inside a unit merged across them) are errors; the frames of a
    substituted or inserted unit are errors; a deleted unit marks the frames at the place it is
    missing: the last frame of the heard unit before it and the first frame of the heard unit after it (only
    one of them at either end; every frame when nothing was heard). Frames of matched units are not errors."""
    runs = _heard_runs(codes, MIN_UNIT_FRAMES)
    heard = _merge_heard_runs(runs, MIN_UNIT_FRAMES)
    errors = [1.0] * len(codes)
    for run in runs:
        errors[run.start : run.end] = [0.0] * (run.end - run.start)
    for op in align_units([h.unit for h in heard], units_of_text(text)):
        if op.op in ("sub", "ins"):
            errors[heard[op.i].start : heard[op.i].end] = [1.0] * (heard[op.i].end - heard[op.i].start)
        elif op.op == "del":
            if not heard:
                errors = [1.0] * len(codes)
            if op.i > 0:
                errors[heard[op.i - 1].end - 1] = 1.0
            if op.i < len(heard):
                errors[heard[op.i].start] = 1.0
    return errors


class Score(NamedTuple):
    """A response's score and its parts (see the module docstring)."""

    score: float
    content: float
    duration: float
    end: float
    frames: int
    unit_error_rate: float
    expected_frames: float
    frame_errors: str = ""
    """Where errors were heard (`frame_errors`), encoded for the advantage estimator (`maspo_base.frame_errors`)."""
    heard: str = ""
    """The units heard (`transcribe`), joined: the synthetic ASR's transcript, shown on the samples page."""

    def as_dict(self) -> dict[str, float | str]:
        return {
            "score": self.score,
            "content": self.content,
            "duration": self.duration,
            "end": self.end,
            "frames": float(self.frames),
            "unit_error_rate": self.unit_error_rate,
            "expected_frames": self.expected_frames,
            "frame_errors": self.frame_errors,
            "heard": self.heard,
        }


def score_response(response: str, text: str) -> Score:
    """Score a decoded response (``<|s_N|>`` strings, maybe the end tag) against the text it should speak."""
    target = units_of_text(text)
    end_tag = lt.SPEECH_GENERATION_END
    body = response.strip()
    ended = body.endswith(end_tag)
    if ended:
        body = body[: -len(end_tag)]
    codes = [int(m) for m in lt.SPEECH_TOKEN_RE.findall(body)]
    tokens = lt.SPECIAL_TOKEN_RE.findall(body)
    only_speech = lt.SPECIAL_TOKEN_RE.sub("", body).strip() == "" and all(map(lt.SPEECH_TOKEN_RE.fullmatch, tokens))
    units = transcribe(codes)
    unit_error_rate = edit_distance(units, target) / len(target)
    content = max(0.0, 1.0 - unit_error_rate)
    expected = FRAMES_PER_UNIT * len(target)
    duration = math.exp(-abs(math.log(max(len(codes), 1) / expected))) if codes else 0.0
    end = 1.0 if ended and only_speech else 0.0
    total = WEIGHTS["content"] * content + WEIGHTS["duration"] * duration + WEIGHTS["end"] * end
    heard_errors = encode_frame_errors(frame_errors(codes, text)) if codes else NO_ALIGNMENT
    return Score(
        score=total,
        content=content,
        duration=duration,
        end=end,
        frames=len(codes),
        unit_error_rate=unit_error_rate,
        expected_frames=expected,
        frame_errors=heard_errors,
        heard="".join(units),
    )


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """veRL ``reward.custom_reward_function``: the synthetic TTS score and its parts (`score_response`)."""
    if data_source != DATA_SOURCE:
        raise ValueError(f"synthetic_tts.compute_score scores data_source={DATA_SOURCE!r}, got {data_source!r}")
    return score_response(solution_str, ground_truth).as_dict()


WORDS_PER_TEXT = {"default": (1, 1, 1, 2), "long": (4, 5, 5, 6)}
"""Text lengths of the task: words per text, drawn uniformly from the tuple (a pause between words is a unit too).
``long`` texts have several times the target units of ``default`` ones (their means: docs/fidelity.md)."""


def make_texts(
    n: int, seed: int = 0, min_len: int = 2, max_len: int = 3, words: Sequence[int] = WORDS_PER_TEXT["default"]
) -> list[str]:
    """``n`` distinct texts: ``random.choice(words)`` words of ``min_len..max_len`` phonemes each."""
    rng = random.Random(seed)
    texts: list[str] = []
    seen: set[str] = set()
    while len(texts) < n:
        text = PAUSE.join(
            "".join(rng.choice(PHONEMES) for _ in range(rng.randint(min_len, max_len)))
            for _ in range(rng.choice(words))
        )
        if text not in seen:
            seen.add(text)
            texts.append(text)
    return texts


def rows(texts: Sequence[str], split: str) -> list[dict]:
    """RLHFDataset rows: Llasa prompt messages, the text as ground truth."""
    from maspo_base.speech_tokens.llasa_prompt import tts_messages

    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": tts_messages(text),
            "ability": "tts",
            "reward_model": {"style": "rule", "ground_truth": text},
            "extra_info": {"index": i, "split": split, "text": text},
        }
        for i, text in enumerate(texts)
    ]


def write_dataset(
    out_dir: str | Path,
    n_train: int = 64,
    n_val: int = 16,
    seed: int = 0,
    words: Sequence[int] = WORDS_PER_TEXT["default"],
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` (disjoint texts, `make_texts` with ``words``); returns their
    paths."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = make_texts(n_train + n_val, seed=seed, words=words)
    paths = out / "train.parquet", out / "val.parquet"
    pd.DataFrame(rows(texts[:n_train], "train")).to_parquet(paths[0])
    pd.DataFrame(rows(texts[n_train:], "val")).to_parquet(paths[1])
    return paths


def reference_ids(tokenizer, text: str, rng: random.Random) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a reference utterance: the Llasa prompt, then `speak` codes and the end tag."""
    from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids

    response = [lt.CODEC_OFFSET + code for code in speak(text, rng)] + [lt.SPEECH_GENERATION_END_ID]
    return render_prompt_ids(tokenizer, text), response


def warm_start(
    model_dir: str | Path,
    *,
    steps: int = 40,
    n_texts: int = 64,
    batch: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    words: Sequence[int] = WORDS_PER_TEXT["default"],
) -> list[float]:
    """Supervised pass over reference utterances of the first ``n_texts`` task texts (`make_texts` with ``words``),
    saved back to ``model_dir``.

    Cross-entropy on the response tokens only, ``-mean_t log p(y_t | prompt, y_<t)``; logits are computed at the
    response positions only (the vocabulary is 193,800 wide). Returns the loss per step.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    texts = make_texts(n_texts, seed=seed, words=words)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        pairs = [reference_ids(tokenizer, rng.choice(texts), rng) for _ in range(batch)]
        width = max(len(p) + len(r) for p, r in pairs)
        ids = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        target = torch.zeros((batch, width), dtype=torch.bool)  # positions whose next token is a response token
        for i, (prompt, response) in enumerate(pairs):
            seq = prompt + response
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
            target[i, len(prompt) - 1 : len(seq) - 1] = True
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = model.lm_head(hidden[target])
        labels = ids[:, 1:][target[:, :-1]]
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    model.save_pretrained(model_dir)
    return losses
