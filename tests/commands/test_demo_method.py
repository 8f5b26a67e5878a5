"""`maspo-verl demo --method NAME --set KEY=VALUE`: the method vocabulary of every command, checked before anything
is built."""

import pytest

from maspo_verl.commands.demo import parse_args, run_overrides
from maspo_verl.methods import MASPO_KEY, compose_config
from maspo_verl.runs.synthetic_run import task_paths


def segmenter(args, tmp_path):
    config = compose_config(run_overrides(args, task_paths(tmp_path)))
    return config.actor_rollout_ref.actor.policy_loss.maspo.segmenter


def test_the_default_is_maspo_fixed4_and_a_method_runs_with_the_tasks_refinement(tmp_path):
    assert segmenter(parse_args([]), tmp_path) == {"name": "fixed", "window": 4}
    # maspo-token-jump.yaml says 4096; the synthetic task refines it to 64 (trainer_config/task/synthetic.yaml)
    assert segmenter(parse_args(["--method", "maspo-token-jump"]), tmp_path) == {"name": "token_jump", "threshold": 64}
    refined = parse_args(["--method", "maspo-fsq", "--set", f"{MASPO_KEY}.segmenter.threshold=3"])
    assert segmenter(refined, tmp_path) == {"name": "fsq", "metric": "l1", "threshold": 3}


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
