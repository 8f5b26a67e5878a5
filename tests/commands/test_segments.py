"""`maspo-verl segments`: segmenters scored against the synthetic task's true unit boundaries, histograms written;
on the speech task (the default), real codes in mini-llasa's layout: held-out recordings encoded by the shipped
codec, the shipped model's sampled responses, a file of its responses."""

import json

import pytest

from maspo_lab.cli import main as cli
from maspo_lab.methods import MASPO_KEY

SEGMENTER = f"{MASPO_KEY}.segmenter"


def _table(output: str) -> dict[str, list[float]]:
    rows = {}
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("maspo-") and len(parts) > 2:
            rows[parts[0]] = [float(x) for x in parts[1:]]
    return rows


def test_fsq_recovers_the_synthetic_unit_boundaries(tmp_path, capsys):
    assert (
        cli(
            [
                "segments",
                *("--task", "synthetic"),
                "maspo-fixed4",
                "maspo-token-jump",  # with the synthetic task's threshold, 64 (trainer_config/task/synthetic.yaml)
                "maspo-fsq",
                "--count",
                "60",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    rows = _table(capsys.readouterr().out)
    # columns: segments/response, mean length, precision, recall, F1
    assert rows["maspo-fsq"][4] > 0.99  # units are runs of lattice neighbours; centres lie >= 6 steps apart
    assert rows["maspo-fixed4"][4] < 0.6  # windows ignore the content
    token_jump = rows["maspo-token-jump"]
    assert token_jump[3] > 0.99 and token_jump[2] < 0.8  # raw ids also jump inside a unit: extra cuts
    png = tmp_path / "segments.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_responses_from_a_file_with_old_log_probs(tmp_path, capsys):
    path = tmp_path / "rollout.jsonl"
    rows = [
        {"response_ids": [128264 + 5, 128264 + 5, 128264 + 900, 128261], "old_log_probs": [-0.1, -0.1, -3.0, -0.2]},
        {"response_ids": [128264 + 7, 128261], "old_log_probs": [-0.5, -0.4]},
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    assert (
        cli(
            [
                *("segments", "--task", "synthetic", "maspo-logprob", "--responses", str(path), "--out", str(tmp_path)),
                *("--set", f"{SEGMENTER}.threshold=1.0", "--set", f"{SEGMENTER}.mode=absolute"),
            ]
        )
        == 0
    )
    table = _table(capsys.readouterr().out)
    # row 1 cuts at the 2.9-nat drop: 2 segments; row 2: 1 segment -> 1.5 per response, no boundary truth columns
    assert table["maspo-logprob"] == [1.5, 2.0]


def test_bad_rows_and_settings_are_named(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"ids": [1, 2]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: no `response_ids` field"):
        cli(["segments", "--responses", str(path), "--out", str(tmp_path)])
    with pytest.raises(SystemExit):  # when the method is read, before any response
        cli(["segments", "maspo-fixed4", "--set", f"{SEGMENTER}.window=wide", "--count", "4", "--out", str(tmp_path)])
    assert "'maspo-fixed4'" in (err := capsys.readouterr().err) and "segmenter.window must be an integer" in err


def test_a_method_without_a_segmenter_and_an_unknown_method_are_named(tmp_path, capsys):
    for spec, message in (("grpo", "'grpo' selects no MASPO segmenter"), ("maspo-nope", "unknown name 'maspo-nope'")):
        with pytest.raises(SystemExit):
            cli(["segments", spec, "--count", "4", "--out", str(tmp_path)])
        assert message in capsys.readouterr().err


def test_the_synthetic_refinement_is_not_applied_to_real_responses(tmp_path, capsys):
    path = tmp_path / "rollout.jsonl"
    # jumps of 100 between codes: the synthetic task's threshold (64) would cut at both, the method's own (4096) at
    # neither; the end tag starts a segment of its own either way
    path.write_text(json.dumps({"response_ids": [128264 + 5, 128264 + 105, 128264 + 205, 128261]}))
    cli(["segments", "--task", "synthetic", "maspo-token-jump", "--responses", str(path), "--out", str(tmp_path)])
    assert _table(capsys.readouterr().out)["maspo-token-jump"][0] == 2.0
    cli(
        [
            "segments",
            *("--task", "synthetic"),
            "maspo-token-jump",
            "--responses",
            str(path),
            "--out",
            str(tmp_path),
            "--set",
            f"{SEGMENTER}.threshold=64",
        ]
    )
    assert _table(capsys.readouterr().out)["maspo-token-jump"][0] == 4.0


def test_speech_corpus_codes_are_cut_in_mini_llasas_layout(tmp_path, capsys):
    from maspo_base.speech_tokens.layouts import MINI_LLASA

    assert cli(["segments", "--source", "corpus", "--count", "3", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "3 held-out recordings encoded by the mini codec" in printed
    rows = _table(printed)
    assert set(rows) == {"maspo-fixed4", "maspo-token-jump", "maspo-fsq", "maspo-logprob"}  # log-probs: the model's
    # columns: segments/response, mean length. Windows of 4 tokens over 1-4 s of codes and the end tag; the
    # segmenters that read codes find runs of alike codes (read with Llasa-1B's ids, no token would be a code and
    # each would be a segment of its own: mean length 1)
    segments, length = rows["maspo-fixed4"]
    assert 3.5 < length <= 4.0 and 50 / 4 < segments < 4 * MINI_LLASA.frame_rate / 4 + 2
    assert rows["maspo-fsq"][1] > 1.0 and rows["maspo-token-jump"][1] > 1.0
    assert (tmp_path / "segments.png").stat().st_size > 0


def test_speech_responses_sampled_from_the_shipped_model():
    from maspo_base.speech_tokens.layouts import MINI_LLASA
    from maspo_lab.commands.segments import sampled_responses

    ids, log_probs = sampled_responses(2, max_new_tokens=8)
    assert len(ids) == 2 and [len(r) for r in ids] == [len(lp) for lp in log_probs]
    assert all(1 <= len(r) <= 8 for r in ids) and all(v <= 0 for lp in log_probs for v in lp)
    assert all(t >= MINI_LLASA.offset or t in (MINI_LLASA.end_id, 4) for r in ids for t in r)  # codes, end, eot


def test_a_file_of_mini_llasa_responses_takes_the_speech_refinements(tmp_path, capsys):
    from maspo_base.speech_tokens.layouts import MINI_LLASA

    path = tmp_path / "rollout.jsonl"
    path.write_text(json.dumps({"response_ids": [MINI_LLASA.offset + 5] * 6 + [MINI_LLASA.end_id]}))
    cli(["segments", "maspo-fsq", "--responses", str(path), "--out", str(tmp_path)])
    assert _table(capsys.readouterr().out)["maspo-fsq"][0] == 2.0  # 6 equal codes, the end tag (Llasa-1B's ids: 7)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--task", "synthetic", "--source", "corpus"], "unrecognized arguments: --source"),
        (["--source", "nowhere"], "invalid choice: 'nowhere'"),
        (["--model", "/nowhere"], "--model /nowhere: no checkpoint"),
        (["--count", "0"], "--count must be >= 1"),
        (["maspo-heard", "--set", f"{SEGMENTER}.fallback_window=x", "--source", "corpus"], "fallback_window"),
    ],
)
def test_speech_arguments_are_checked_before_any_response_is_made(argv, named, tmp_path, capsys):
    with pytest.raises((SystemExit, ValueError)) as error:
        cli(["segments", *argv, "--out", str(tmp_path)])
    assert named in capsys.readouterr().err + str(error.value)
    assert not (tmp_path / "segments.png").exists()
