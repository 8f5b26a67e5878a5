"""`maspo-verl demo --method NAME --set KEY=VALUE`: the method vocabulary of every command, checked before anything
is built."""

import pytest

from maspo_lab.commands.demo import parse_args, planned_paths, run_overrides
from maspo_lab.methods import MASPO_KEY, compose_config
from maspo_lab.runs.synthetic_run import task_paths


def maspo_block(args, tmp_path):
    paths = planned_paths(args) if args.task == "speech" else task_paths(tmp_path)
    return compose_config(run_overrides(args, paths)).actor_rollout_ref.actor.policy_loss.maspo


def segmenter(args, tmp_path):
    return maspo_block(args, tmp_path).segmenter


def test_the_synthetic_default_is_maspo_fixed4_and_a_method_runs_with_the_tasks_refinement(tmp_path):
    synthetic = ["--task", "synthetic"]
    assert segmenter(parse_args(synthetic), tmp_path) == {"name": "fixed", "window": 4}
    # maspo-token-jump.yaml says 4096; the synthetic task refines it to 64 (trainer_config/task/synthetic.yaml)
    jump = parse_args([*synthetic, "--method", "maspo-token-jump"])
    assert segmenter(jump, tmp_path) == {"name": "token_jump", "threshold": 64}
    refined = parse_args([*synthetic, "--method", "maspo-fsq", "--set", f"{MASPO_KEY}.segmenter.threshold=3"])
    assert segmenter(refined, tmp_path) == {"name": "fsq", "metric": "l1", "threshold": 3}


def test_the_speech_demo_runs_maspo_over_the_ears_phonemes_with_their_credit_and_under_whisper_maspo_fsq(tmp_path):
    args = parse_args(["--out", str(tmp_path / "out")])
    assert args.method.name == "maspo-phoneme-credit"
    config = compose_config(run_overrides(args, planned_paths(args)))
    assert config.actor_rollout_ref.actor.policy_loss.maspo.segmenter.name == "heard_words"
    assert config.algorithm.maspo.credit_mode == "per_unit" and config.algorithm.maspo.codec.layout == "mini-llasa"
    args = parse_args(["--recogniser", "audio", "--out", str(tmp_path / "out")])
    assert args.task == "speech" and args.method.name == "maspo-fsq"
    block = maspo_block(args, tmp_path)
    assert block.codec.layout == "mini-llasa" and block.segmenter.name == "fsq"
    jump = parse_args(["--method", "maspo-token-jump", "--recogniser", "audio", "--out", str(tmp_path / "out")])
    assert (
        segmenter(jump, tmp_path).threshold == 256
    )  # the top FSQ digit of 1,024 codes (trainer_config/task/speech.yaml)
    fsq = parse_args(["--recogniser", "audio", "--out", str(tmp_path / "out")])
    assert segmenter(fsq, tmp_path).threshold == 4  # phoneme-sized segments on the mini codec


def test_the_speech_demo_runs_the_tasks_shape_with_its_demo_changes_and_the_synthetic_one_unchanged(tmp_path):
    from maspo_lab.runs import speech_run, synthetic_run

    keys = ("steps", "batch", "n", "mini_batches", "lr", "kl_coef", "texts", "eval_samples", "temperature")
    for recogniser, shape in speech_run.DEMO_SHAPES.items():
        speech = vars(parse_args(["--recogniser", recogniser, "--out", str(tmp_path / "out")]))
        assert {k: speech[k] for k in keys} == {k: {**speech_run.TASK_DEFAULTS, **shape}[k] for k in keys}
        assert speech["heldout"] == shape["heldout"]
        assert speech["batch"] % speech["mini_batches"] == 0 and speech["mini_batches"] > 1  # off-policy ratios
        assert speech["kl_coef"] == 0.0  # no reference log-probs in the demo's minutes
    ear = vars(parse_args(["--out", str(tmp_path / "out")]))  # the task's groups of 16, 8 prompts, 2 updates, lr 1e-4
    assert (ear["recogniser"], ear["n"], ear["batch"], ear["mini_batches"], ear["lr"]) == ("ear", 16, 8, 2, 1e-4)
    with pytest.raises(SystemExit):
        parse_args(["--kl-coef", "nan", "--out", str(tmp_path / "out")])
    synthetic = vars(parse_args(["--task", "synthetic"]))
    assert {k: synthetic[k] for k in keys} == {k: synthetic_run.TASK_DEFAULTS[k] for k in keys}


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--method", "maspo-nope"], "unknown name 'maspo-nope'"),
        (["--set", "window"], "--set ['window']"),
        (["--set", f"{MASPO_KEY}.segmenter.windoww=3"], "unknown key(s) ['windoww']"),
    ],
)
def test_a_bad_method_or_refinement_fails_before_anything_is_built(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_speech_demo_is_rewarded_by_the_code_ear_by_default_and_by_whisper_on_request(tmp_path):
    from maspo_lab.speaking_model import SHIPPED_EAR

    def reward_of(argv):
        args = parse_args([*argv, "--out", str(tmp_path / "out")])
        return compose_config(run_overrides(args, planned_paths(args))).reward.custom_reward_function.reward_kwargs

    ear = reward_of([])
    assert ear.reward_config.recogniser == "ear" and ear.ear == str(SHIPPED_EAR)
    audio = reward_of(["--recogniser", "audio"])
    assert "ear" not in audio and audio.reward_config.get("recogniser", "audio") == "audio"
