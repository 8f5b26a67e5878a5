"""The gradient-fidelity instrument on the speech task: the shipped mini-llasa, its training sentences, a scorer
(hand-set scores where the reward is not what is tested; the real speech reward on two responses), the methods in
mini-llasa's layout, and `maspo-verl fidelity --task speech` end to end at a tiny size."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from maspo_base.speech_tokens.layouts import MINI_LLASA
from maspo_lab.analysis import fidelity, fidelity_scoring, policy_gradients
from maspo_lab.commands import fidelity as command
from maspo_lab.runs import speech_run
from maspo_lab.sampler import Sampler, load_model
from maspo_lab.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_MODEL

TEMPERATURE = 0.8


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: where other jobs share the cores, two threads spin-wait for each other (a mini-llasa
    forward and backward took 6 s with two threads and 0.25 s with one on the shared 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class HandScores:
    """Scores set by hand, in turn, whatever the response; records what it was asked."""

    sources = tuple(speech_run.SOURCES.values())

    def __init__(self, scores=(0.9, 0.1, 0.3, 0.7, 0.5)):
        self.scores, self.calls = scores, []

    def score(self, prompts, responses):
        self.calls.append(([p.ground_truth for p in prompts], [list(r) for r in responses]))
        done = sum(len(r) for _, r in self.calls[:-1])
        return [self.scores[(done + i) % len(self.scores)] for i in range(len(responses))]


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """(model, tokenizer, prompts) of the speech task: the shipped mini-llasa, its first 3 training sentences."""
    task = speech_run.prepare_task(tmp_path_factory.mktemp("speech"), n_train=3, n_heldout=0)
    model, tokenizer = load_model(SHIPPED_MODEL, "float32", "cpu")
    return model, tokenizer, fidelity_scoring.load_prompts(task.train, tokenizer, HandScores.sources)


def test_the_speech_estimators_read_mini_llasas_codes():
    estimators = fidelity.builtin_estimators(task="speech")
    assert list(estimators) == list(fidelity.builtin_estimators())  # the same comparison on both tasks
    for name, estimator in estimators.items():
        if estimator.loss_mode == "maspo":
            assert estimator.maspo == {"codec": {"layout": "mini-llasa"}}, name
            config = estimator.actor_config(clipped=True).policy_loss.maspo
            assert config.codec.speech_tokens == MINI_LLASA, name
    assert estimators["maspo-token-jump"].segmenter == {"name": "token_jump", "threshold": 256}
    assert estimators["maspo-fsq"].segmenter == {"name": "fsq", "metric": "l1", "threshold": 4}
    assert fidelity.builtin_estimators()["maspo-fsq"].maspo == {}  # the synthetic task keeps Llasa-1B's ids
    candidates = fidelity.threshold_candidates("mini-llasa")
    assert candidates["fsq"] == tuple(range(16))  # 5 digits in 0..3
    assert candidates["token_jump"][-1] == 1024 and fidelity.threshold_candidates()["token_jump"][-1] == 65536


def test_settings_for_the_speech_task():
    settings = fidelity.FidelitySettings.for_task("speech", repeats=8)
    d = speech_run.TASK_DEFAULTS
    # the task's prompts and temperature; the groups, updates and lr docs/fidelity.md measured at
    assert (settings.batch, settings.temperature) == (d["batch"], d["temperature"])
    assert (settings.n, settings.mini_batches, settings.lr) == (4, 4, 2e-5) != (d["n"], d["mini_batches"], d["lr"])
    from maspo_lab.commands import fidelity as command

    assert command.parse_args(["--task", "speech"]).texts == 16 < d["texts"]  # the prompts docs/fidelity.md measured
    assert settings.response_length == 201 and settings.repeats == 8  # 4 s of codes and the end tag
    assert settings.window_lengths[-1] == 64 and settings.max_lag == 50
    assert fidelity.planned_responses(settings) == 8 * 32 * (1 + 4 * 2)
    with pytest.raises(ValueError, match="--task"):
        fidelity.FidelitySettings(task="nope").validate()


def test_segments_of_a_stale_speech_batch_follow_the_codes(speech):
    """On pi_theta after a GRPO update, MASPO's windows are segments of mini-llasa's codes (with Llasa-1B's ids they
    would be one-token segments, and every window's gradient would be GRPO's)."""
    model, tokenizer, prompts = speech
    sampler = Sampler(model, tokenizer, seed=0, temperature=TEMPERATURE, max_new_tokens=12)
    responses = sampler.sample([p.ids for p in prompts[:2] for _ in range(2)], version=1)
    assert all(MINI_LLASA.offset <= t or t in sampler.stop_ids for r in responses for t in r)
    scorer = HandScores()
    batch = policy_gradients.grpo_batch(prompts[:2], responses, 2, scorer, "cpu")
    assert scorer.calls[0][0] == [p.ground_truth for p in prompts[:2] for _ in range(2)]
    assert torch.equal(batch.scores, torch.tensor([0.9, 0.1, 0.3, 0.7]))
    with torch.no_grad():
        batch.old_log_prob = policy_gradients.response_log_probs(model, batch, TEMPERATURE, sampler.pad_id)
    import copy

    policy = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.01)
    grpo = fidelity.grpo_estimator()
    policy_gradients.grpo_update(policy, optimizer, batch, grpo.actor_config(True), TEMPERATURE, sampler.pad_id, 1.0)
    with torch.no_grad():
        log_prob = policy_gradients.response_log_probs(policy, batch, TEMPERATURE, sampler.pad_id)
    estimators = fidelity.builtin_estimators(task="speech")
    chosen = [estimators["grpo"], estimators["maspo-fixed4"]]
    configs = {(e.name, c): e.actor_config(c) for e in chosen for c in (True, False)}
    keys, upstream, _ = policy_gradients.estimator_upstreams(chosen, configs, batch, log_prob)
    unclipped = dict((name, g) for (name, clipped), g in zip(keys, upstream) if not clipped)
    assert not torch.allclose(unclipped["maspo-fixed4"], unclipped["grpo"])
    old = batch.old_log_prob.float()
    layout = (
        estimators["maspo-fixed4"]
        .actor_config(True)
        .policy_loss.maspo.segment_layout(old, batch.mask.bool(), batch.response_ids)
    )
    codes = int(sum(sum(1 for t in r if t >= MINI_LLASA.offset) for r in responses))
    assert layout.num_segments < codes  # windows of 4 codes, not one segment per token


def test_the_instrument_on_the_speech_task_with_hand_set_scores(speech):
    model, tokenizer, prompts = speech
    settings = fidelity.FidelitySettings.for_task(
        "speech",
        updates=(0, 1),
        estimators=("grpo", "maspo-fixed4"),
        repeats=1,
        batch=1,
        n=2,
        mini_batches=1,
        reference_groups=2,  # a reference of 4 fresh responses at every k, 2 per half
        response_length=10,
        lr=0.01,
        target_lengths=(2,),
        window_lengths=(1, 2, 4),
        max_lag=3,
        score_batch=2,
    )
    scorer, lines = HandScores(), []
    result = fidelity.measure(model, tokenizer, prompts, scorer, settings, progress=lines.append)
    # pi_old's batch, then the reference's two halves at k = 0 and at k = 1, 2 responses per scorer call
    assert sum(len(r) for _, r in scorer.calls) == fidelity.planned_responses(settings) == 2 + 2 * 4
    assert all(len(r) == 2 for _, r in scorer.calls)
    assert {t for texts, _ in scorer.calls for t in texts} <= set(speech_run.training_texts()[:3])
    scoring = result["scoring"]
    assert scoring["responses"] == 10 and scoring["seconds"] >= 0 and scoring["seconds_per_response"] >= 0
    assert any("scored 10/10" in line for line in lines)
    at_zero = [r["cosine"] for r in result["rows"] if r["k"] == 0]
    assert len(at_zero) == 4 and max(at_zero) - min(at_zero) < 1e-4  # every estimator is the on-policy gradient
    assert [r["k"] for r in result["references"]] == [0, 1] and result["references"][1]["ppo_kl"] != 0
    (stats,) = result["log_ratios"]
    assert len(stats["autocorrelation"]) == 3 and set(stats["window_std"]) == {"1", "2", "4"}
    assert {t["segmenter"] for t in result["thresholds"]} == {"fsq", "token_jump", "logprob"}
    fsq = next(t for t in result["thresholds"] if t["segmenter"] == "fsq")
    assert fsq["threshold"] in range(16)


class ResponseScores(HandScores):
    """A score that is a function of the response alone (its ids' sum mod 97, over 97), whatever came before."""

    def score(self, prompts, responses):
        super().score(prompts, responses)
        return [sum(r) % 97 / 97 for r in responses]


def test_without_a_reference_the_log_ratios_are_those_of_the_full_measurement(speech):
    """``reference_groups=0`` skips the reference and the estimators' gradients: only pi_old's batches are scored,
    and the batches, log-ratio statistics and thresholds are those of the measurement with a reference, repeat
    after repeat (the reference's sampling streams are spent either way)."""
    model, tokenizer, prompts = speech
    results, scorers = {}, {}
    for groups in (2, 0):
        settings = fidelity.FidelitySettings.for_task(
            "speech",
            updates=(0, 1, 2),
            estimators=("grpo", "maspo-fixed4"),
            repeats=2,
            batch=2,
            n=2,
            mini_batches=1,
            reference_groups=groups,
            response_length=12,
            lr=0.01,
            target_lengths=(2,),
            window_lengths=(1, 2, 4),
            max_lag=3,
        )
        scorers[groups] = ResponseScores()
        results[groups] = fidelity.measure(
            model, tokenizer, prompts, scorers[groups], settings, progress=lambda line: None
        )
    full, alone = results[2], results[0]
    assert alone["rows"] == [] and alone["scoring"]["responses"] == 2 * 2 * 2  # repeats x batch x n
    # per repeat the full measurement scores pi_old's batch, then two reference halves at each of 3 k's
    assert [r for _, r in scorers[0].calls] == [r for _, r in scorers[2].calls][:: 1 + 3 * 2]
    assert alone["batches"] == full["batches"]
    assert alone["log_ratios"] == full["log_ratios"] and len(alone["log_ratios"]) == 2 * 2  # repeats x (k > 0)
    assert alone["thresholds"] == full["thresholds"]
    assert [r["ppo_kl"] for r in alone["references"]] == [r["ppo_kl"] for r in full["references"]]
    assert all(math.isnan(r["half_split_cosine"]) for r in alone["references"])
    assert all(r["ppo_kl"] > 0 for r in alone["references"] if r["k"] > 0)
    with pytest.raises(ValueError, match="--reference-groups must be 0"):
        fidelity.FidelitySettings.for_task("speech", reference_groups=-2).validate()


def test_the_speech_reward_scores_a_batch_in_process():
    """The real scorer on two responses: a held-out recording's codes (the shipped codec's encoder) with the end tag,
    and the same codes without it (not ended: the reward's invalid score, no recognition)."""
    import soundfile

    from maspo_base.codecs import load_encoder

    held = speech_run.heldout_texts()[0]
    audio, _ = soundfile.read(SHIPPED / "heldout" / held["audio"], dtype="float32")
    codes = load_encoder(f"mel_fsq:{SHIPPED_CODEC}").encode(audio)
    ids = [MINI_LLASA.offset + int(c) for c in codes]
    scorer = fidelity_scoring.SpeechTaskScorer.load(SHIPPED_CODEC, threads=1)
    assert scorer.sources == (speech_run.TRAIN_SOURCE, speech_run.HELDOUT_SOURCE)
    meter = fidelity_scoring.ScoreMeter(scorer, chunk=2)
    prompt = fidelity_scoring.Prompt([], speech_run.TRAIN_SOURCE, held["text"])
    ended, unended = meter([prompt, prompt], [ids + [MINI_LLASA.end_id], ids])
    assert unended == scorer.reward.config.invalid_score
    assert 0.0 <= ended <= 1.0 and ended > unended  # scored: 1 - tanh(3 CER) > 0 even at CER 1
    assert meter.responses == 2 and meter.seconds > 0


def test_speech_arguments(tmp_path, capsys):
    args = command.parse_args([])
    assert args.task == "speech" and args.settings.task == "speech"
    assert args.settings.response_length == 201 and args.settings.max_lag == 50
    for argv, named in (
        (["--long-texts"], "unrecognized arguments: --long-texts"),
        (["--warm-start-steps", "3"], "unrecognized arguments: --warm-start-steps"),
        (["--codec", str(tmp_path)], f"--codec {tmp_path}: no mini codec"),
        (["--model", str(tmp_path)], f"--model {tmp_path}: no HF checkpoint"),
        (["--texts", "0"], "--texts must be in [1,"),
        (["--score-batch", "0"], "--score-batch must be >= 1"),
        (["--reward-threads", "0"], "--reward-threads must be >= 1"),
    ):
        with pytest.raises(SystemExit):
            command.parse_args(argv)
        assert named in capsys.readouterr().err, argv


def test_the_speech_command_end_to_end_at_a_tiny_size(tmp_path, capsys):
    """The shipped model, the real speech reward (responses this short never end: gated, not heard), every file."""
    out = tmp_path / "out"
    argv = ["--texts", "2", "--repeats", "1", "--updates", "0,1", "--batch", "1", "--n", "2", "--mini-batches", "1"]
    argv += ["--reference-groups", "2", "--response-length", "6", "--estimators", "grpo,maspo-fsq", "--lr", "0.01"]
    argv += ["--target-length", "2", "--reward-threads", "1", "--out", str(out)]
    assert command.main(argv) == 0
    printed = capsys.readouterr().out
    assert "loading the speech reward" in printed and "scored 10 responses" in printed
    for name in ("fidelity.png", "log_ratios.png", "fidelity.csv", "fidelity.json"):
        assert (out / name).stat().st_size > 0
    result = json.loads((out / "fidelity.json").read_text())
    assert result["task"] == "speech" and result["model"] == str(SHIPPED_MODEL)
    assert result["codec"] == str(SHIPPED_CODEC) and result["settings"]["response_length"] == 6
    assert result["scoring"]["responses"] == 10 and result["scoring"]["seconds_per_response"] >= 0
    assert len(list(csv.DictReader((out / "fidelity.csv").open()))) == 2 * 2 * 2  # estimators x clip x k
