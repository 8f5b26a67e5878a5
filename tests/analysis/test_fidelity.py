"""The gradient-fidelity instrument on a tiny random Llasa-shaped model (float64 where gradients must be equal).

A random model's responses all score alike, so the equivalence tests give the sampled batch fixed, varied
advantages: what is tested is that the losses reduce to one another, not the reward."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from maspo_lab.analysis import fidelity, fidelity_scoring, policy_gradients
from maspo_lab.commands import fidelity as command
from maspo_lab.data import synthetic_tts
from maspo_lab.data.tiny_llasa import build_tiny_llasa
from maspo_lab.sampler import Sampler, load_model

TEMPERATURE = 0.8
ESTIMATORS = fidelity.builtin_estimators()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model dir, train parquet) of the synthetic task, no warm start."""
    root = tmp_path_factory.mktemp("fidelity")
    texts = synthetic_tts.make_texts(4)
    model_dir = build_tiny_llasa(root / "model", corpus=texts)
    train, _ = synthetic_tts.write_dataset(root / "data", n_train=3, n_val=1)
    return model_dir, train


@pytest.fixture(scope="module")
def policy64(tiny):
    model, tokenizer = load_model(tiny[0], "float64", "cpu")
    return model, tokenizer, fidelity_scoring.load_prompts(tiny[1], tokenizer)


def _stale_batch(policy64, updates: int, lr: float = 0.05):
    """pi_old's batch (2 prompts x 3 responses, varied fixed advantages) and pi_theta after ``updates`` GRPO updates
    on it, with the log-probs under both."""
    model, tokenizer, prompts = policy64
    sampler = Sampler(model, tokenizer, seed=0, temperature=TEMPERATURE, max_new_tokens=5)
    chosen = prompts[:2]
    responses = sampler.sample([p.ids for p in chosen for _ in range(3)], version=1)
    batch = policy_gradients.grpo_batch(chosen, responses, 3, fidelity_scoring.SyntheticScorer(tokenizer), "cpu")
    batch.advantages = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.3, 0.9], dtype=torch.float64)[:, None] * batch.mask
    with torch.no_grad():
        batch.old_log_prob = policy_gradients.response_log_probs(model, batch, TEMPERATURE, sampler.pad_id)
    policy = model
    if updates:
        import copy

        policy = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
        config = fidelity.grpo_estimator().actor_config(False)
        for _ in range(updates):
            policy_gradients.grpo_update(policy, optimizer, batch, config, TEMPERATURE, sampler.pad_id, clip_grad=1.0)
    with torch.no_grad():
        log_prob = policy_gradients.response_log_probs(policy, batch, TEMPERATURE, sampler.pad_id)
    return policy, batch, log_prob, sampler.pad_id


def _gradients(policy, batch, log_prob, pad_id, estimators, clipped, vocabulary=False):
    configs = {(e.name, c): e.actor_config(c) for e in estimators for c in (True, False)}
    keys, upstream, _ = policy_gradients.estimator_upstreams(estimators, configs, batch, log_prob)
    chosen = [g for (_, c), g in zip(keys, upstream) if c == clipped]
    return policy_gradients.parameter_gradients(policy, batch, chosen, TEMPERATURE, pad_id, 4, vocabulary=vocabulary)


def test_at_k0_every_estimator_is_the_on_policy_gradient(policy64):
    policy, batch, log_prob, pad_id = _stale_batch(policy64, updates=0)
    assert torch.equal(log_prob, batch.old_log_prob)  # every ratio is 1
    assert batch.advantages.abs().sum() > 0
    estimators = list(fidelity.builtin_estimators().values())
    configs = {(e.name, c): e.actor_config(c) for e in estimators for c in (True, False)}
    keys, upstream, clipfracs = policy_gradients.estimator_upstreams(estimators, configs, batch, log_prob)
    onpolicy = policy_gradients.onpolicy_upstream(batch)
    for key, g in zip(keys, upstream):
        torch.testing.assert_close(g, onpolicy, rtol=1e-12, atol=1e-15, msg=str(key))
    assert clipfracs == [0.0] * len(keys)
    # equal upstream gradients make equal parameter gradients; checked through the model for three granularities
    (reference,) = policy_gradients.parameter_gradients(policy, batch, [onpolicy], TEMPERATURE, pad_id, 4)
    assert reference.norm() > 0
    chosen = [g for (name, clipped), g in zip(keys, upstream) if clipped and name in ("grpo", "maspo-fixed4", "gspo")]
    for grad in policy_gradients.parameter_gradients(policy, batch, chosen, TEMPERATURE, pad_id, 4):
        assert policy_gradients.cosine(grad, reference) == pytest.approx(1.0, abs=1e-12)
        torch.testing.assert_close(grad, reference, rtol=1e-10, atol=1e-14)


def test_window_one_is_vanilla_and_one_window_per_response_is_gspo_on_stale_data(policy64):
    policy, batch, log_prob, pad_id = _stale_batch(policy64, updates=2)
    ratios = (log_prob - batch.old_log_prob)[batch.mask.bool()]
    assert ratios.abs().max() > 1e-2  # stale: the ratios are not 1
    width = batch.mask.shape[1]
    vanilla, window_one, gspo, whole = (
        ESTIMATORS["grpo"],
        fidelity.Estimator("fixed-1", "maspo", {"name": "fixed", "window": 1}),
        ESTIMATORS["gspo"],
        fidelity.Estimator(f"fixed-{width}", "maspo", {"name": "fixed", "window": width}),
    )
    # the clip as configured: MASPO's 0.2/0.28 shrunk as L**-0.5 is GRPO's at L = 1, dual clip 3 for both
    g_vanilla, g_one = _gradients(policy, batch, log_prob, pad_id, [vanilla, window_one], clipped=True)
    torch.testing.assert_close(g_one, g_vanilla, rtol=1e-10, atol=1e-14)
    # clip off (GSPO's published range differs from MASPO's): one segment per response is GSPO's sequence ratio
    g_gspo, g_whole, g_vanilla_off = _gradients(policy, batch, log_prob, pad_id, [gspo, whole, vanilla], clipped=False)
    torch.testing.assert_close(g_whole, g_gspo, rtol=1e-10, atol=1e-14)
    assert policy_gradients.cosine(g_gspo, g_vanilla_off) < 1 - 1e-6  # and the two granularities do differ here


def test_body_gradient_is_the_full_gradient_without_the_vocabulary_matrix(policy64):
    policy, batch, log_prob, pad_id = _stale_batch(policy64, updates=1)
    estimators = [ESTIMATORS["grpo"], ESTIMATORS["gspo"]]
    body = _gradients(policy, batch, log_prob, pad_id, estimators, clipped=False)
    full = _gradients(policy, batch, log_prob, pad_id, estimators, clipped=False, vocabulary=True)
    all_params = policy_gradients.gradient_parameters(policy, vocabulary=True)
    body_ids = {id(p) for p in policy_gradients.gradient_parameters(policy, vocabulary=False)}
    keep = torch.cat([torch.full((p.numel(),), id(p) in body_ids) for p in all_params])
    assert 0 < int(keep.sum()) < keep.numel()
    for b, f in zip(body, full):
        torch.testing.assert_close(b, f[keep], rtol=1e-9, atol=1e-14)


def test_estimators_are_the_methods_as_the_synthetic_task_runs_them():
    assert list(ESTIMATORS) == [
        "grpo",
        *(f"maspo-fixed{w}" for w in fidelity.DEFAULT_WINDOWS),
        "maspo-token-jump",
        "maspo-fsq",
        "maspo-logprob",
        "gspo",
    ]
    # clip ranges from the method files (gspo.yaml: 3e-4 / 4e-4), segmenters with the task's refinement
    assert ESTIMATORS["gspo"].clip == {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}
    assert ESTIMATORS["gspo"].actor_config(True).clip_ratio_high == 4e-4
    assert ESTIMATORS["maspo-token-jump"].segmenter == {"name": "token_jump", "threshold": 64}
    assert ESTIMATORS["maspo-fixed8"].segmenter == {"name": "fixed", "window": 8}
    # any other method that selects a policy loss is an estimator too
    (sapo,) = fidelity.estimators_of(["sapo"])
    assert (sapo.loss_mode, sapo.clip) == ("sapo", {})


def test_noise_ceiling():
    assert policy_gradients.noise_ceiling(1.0) == 1.0
    assert policy_gradients.noise_ceiling(0.5) == pytest.approx((2 * 0.5 / 1.5) ** 0.5)
    assert policy_gradients.noise_ceiling(-0.1) != policy_gradients.noise_ceiling(-0.1)  # NaN


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--estimators", "grpo,segments"], "--estimators"),
        (["--estimators", "maspo-credit"], "sets nothing else"),
        (["--updates=0,-1"], "--updates"),
        (["--target-length", "4,0"], "--target-length"),
        (["--reference-groups", "3"], "--reference-groups"),
        (["--reference-groups=-2"], "--reference-groups"),
        (["--batch", "6", "--mini-batches", "4"], "--batch"),
    ],
)
def test_bad_arguments_fail_before_anything_is_built(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        command.main([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_model_path_that_does_not_exist_fails_naming_it(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit):
        command.main(["--model", str(tmp_path / "nowhere"), "--data", str(tiny[1]), "--out", str(tmp_path / "o")])
    assert "--model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        command.main(["--task", "synthetic", "--model", str(tiny[0]), "--out", str(tmp_path / "o")])
    assert "--model and --data go together" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_model_and_data_run_writes_its_outputs(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "--task",
        "synthetic",
        "--model",
        str(tiny[0]),
        "--data",
        str(tiny[1]),
        "--repeats",
        "2",
        "--updates",
        "0,2",
    ]
    argv += ["--batch", "2"]
    argv += ["--n", "2", "--mini-batches", "2", "--reference-groups", "2", "--response-length", "4"]
    argv += ["--estimators", "grpo,maspo-fixed2,gspo", "--target-length", "2", "--lr", "0.05", "--out", str(out)]
    assert command.main(argv) == 0
    printed = capsys.readouterr().out
    assert "cosine with the on-policy gradient" in printed and "repeat 2/2 k=2" in printed
    for name in ("fidelity.png", "log_ratios.png", "fidelity.csv", "fidelity.json"):
        assert (out / name).stat().st_size > 0
    rows = list(csv.DictReader((out / "fidelity.csv").open()))
    assert len(rows) == 3 * 2 * 2  # estimators x clip x k
    result = json.loads((out / "fidelity.json").read_text())
    assert {r["k"] for r in result["references"]} == {0, 2}
    # at k = 0 every estimator's gradient is the same on-policy one: equal cosines within a repeat
    for repeat in (0, 1):
        at_zero = [r["cosine"] for r in result["rows"] if r["k"] == 0 and r["repeat"] == repeat]
        assert max(at_zero) - min(at_zero) < 1e-5
    stale = [r for r in result["references"] if r["k"] == 2]
    assert all(r["ppo_kl"] != 0 for r in stale)
    assert [r["k"] for r in result["log_ratios"]] == [2]
    assert result["task"] == "synthetic" and result["scoring"]["responses"] == 2 * (4 + 2 * 8)
    assert {(t["segmenter"], t["target_length"]) for t in result["thresholds"]} == {
        ("fsq", 2),
        ("token_jump", 2),
        ("logprob", 2),
    }
    assert "share of the variance in the responses' means" in printed

    # no reference: the log-ratios alone, the same as the full run's, and no cosines to write
    alone = tmp_path / "alone"
    assert command.main([*argv[:-1], str(alone), "--reference-groups", "0"]) == 0
    assert "no reference" in capsys.readouterr().out
    assert (alone / "log_ratios.png").stat().st_size > 0
    assert not (alone / "fidelity.csv").exists() and not (alone / "fidelity.png").exists()
    only = json.loads((alone / "fidelity.json").read_text())
    assert only["estimators"] == [] and only["scoring"]["responses"] == 2 * 4
    assert only["log_ratios"] == result["log_ratios"]


def test_the_cli_dispatches_fidelity(capsys):
    from maspo_lab.cli import main as cli

    with pytest.raises(SystemExit):
        cli(["fidelity", "--estimators", "nope"])
    assert "--estimators: unknown ['nope']" in capsys.readouterr().err
