"""The `hf` rollout server batches concurrent requests: same tokens and log-probs as one by one, own stops, own params.

Runs `HFRolloutServer` in-process (the Ray actor's class, without Ray) on the tiny Llasa-shaped model.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, RepetitionPenaltyLogitsProcessor

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_lab.data.tiny_llasa import build_tiny_llasa
from maspo_verl.cpu.generation import RowRepetitionPenalty
from maspo_verl.cpu.hf_rollout import HFRolloutServer, batching_from_env, sampling_key

BUDGET = 24
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
SAMPLED = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
PROMPT_LENS = [9, 1, 17, 4, 12, 6]  # ragged, one of length 1


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_llasa(tmp_path_factory.mktemp("tiny_llasa"), seed=0)


def _server(path, **settings) -> HFRolloutServer:
    config = SimpleNamespace(response_length=BUDGET, prompt_length=64, seed=0)
    return HFRolloutServer(config, {"path": str(path)}, **settings)


def _prompts(lengths, seed=0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(lt.CODEC_OFFSET, lt.VOCAB_SIZE, (n,), generator=gen).tolist() for n in lengths]


def _concurrently(server, requests):
    """All requests sent at once, as veRL's agent loop does: ``[(prompt, params)] -> [TokenOutput]``."""

    async def run():
        return await asyncio.gather(*(server.generate(p, dict(params)) for p, params in requests))

    return asyncio.run(run())


def _one_by_one(server, requests):
    async def run():
        return [await server.generate(p, dict(params)) for p, params in requests]

    return asyncio.run(run())


def _recomputed_log_probs(model, prompt, response, temperature):
    """``log softmax(z_t / T)[y_t]`` from one plain forward over prompt + response (no padding)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_greedy_batch_equals_one_by_one(model_path):
    server = _server(model_path)
    requests = [(p, GREEDY) for p in _prompts(PROMPT_LENS)]
    alone = _one_by_one(server, requests)
    together = _concurrently(server, requests)
    assert list(server.batch_sizes) == [1] * len(requests) + [len(requests)]
    for single, batched in zip(alone, together, strict=True):
        assert len(single.token_ids) == BUDGET  # random weights: no stop id within the budget
        assert batched.token_ids == single.token_ids
        torch.testing.assert_close(torch.tensor(batched.log_probs), torch.tensor(single.log_probs), atol=1e-5, rtol=0)
        assert all(lp <= 0 for lp in batched.log_probs)


def test_batch_size_cap_splits_the_waiting_requests_in_arrival_order(model_path):
    server = _server(model_path, max_batch_size=2)
    requests = [(p, GREEDY) for p in _prompts([5, 3, 8, 2, 6])]
    together = _concurrently(server, requests)
    assert list(server.batch_sizes) == [2, 2, 1]
    server.max_batch_size = 64
    for alone, batched in zip(_concurrently(server, requests), together, strict=True):
        assert alone.token_ids == batched.token_ids


def test_sampled_batch_log_probs_match_a_plain_forward_float32(model_path):
    server = _server(model_path)
    requests = [(p, SAMPLED) for p in _prompts(PROMPT_LENS, seed=1)]
    outputs = _concurrently(server, requests)
    assert list(server.batch_sizes) == [len(requests)]
    model = server.model
    for (prompt, _), out in zip(requests, outputs, strict=True):
        expected = _recomputed_log_probs(model, prompt, out.token_ids, SAMPLED["temperature"])
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=0)
    # sampled, not greedy: the rows do not all follow their argmax
    greedy = _concurrently(server, [(p, GREEDY) for p, _ in requests])
    assert any(g.token_ids != s.token_ids for g, s in zip(greedy, outputs, strict=True))


def test_sampled_tokens_do_not_depend_on_batching_or_arrival_order(model_path):
    requests = [(p, SAMPLED) for p in _prompts(PROMPT_LENS, seed=2)]
    together = _concurrently(_server(model_path), requests)
    alone = _one_by_one(_server(model_path), requests)
    reordered = _concurrently(_server(model_path), requests[::-1])[::-1]
    capped = _concurrently(_server(model_path, max_batch_size=4), requests)
    tokens = [o.token_ids for o in together]
    assert [o.token_ids for o in alone] == tokens
    assert [o.token_ids for o in reordered] == tokens
    assert [o.token_ids for o in capped] == tokens
    # another seed (config.seed + replica rank) samples other tokens
    other = _concurrently(_server(model_path, replica_rank=1), requests)
    assert [o.token_ids for o in other] != tokens


def test_the_responses_to_one_prompt_are_drawn_from_different_streams_and_repeat_as_a_set(model_path):
    prompt = _prompts([7], seed=3)[0]
    server = _server(model_path)
    group = [o.token_ids for o in _concurrently(server, [(prompt, SAMPLED)] * 4)]
    assert len({tuple(t) for t in group}) > 1  # n responses to a prompt are not copies of one
    # a fresh server with the same weights gives the same set, whatever order the group's requests arrive in
    again = [o.token_ids for o in _one_by_one(_server(model_path), [(prompt, SAMPLED)] * 4)]
    assert again == group
    # more requests for the prompt under the same weights continue its streams instead of repeating them
    more = [o.token_ids for o in _concurrently(server, [(prompt, SAMPLED)] * 4)]
    assert more != group


def test_a_weight_update_starts_new_streams(model_path):
    server = _server(model_path)
    requests = [(p, SAMPLED) for p in _prompts([5, 8], seed=7)]
    before = [o.token_ids for o in _concurrently(server, requests)]
    same_weights = {name: p.detach().clone() for name, p in server.model.named_parameters()}
    assert asyncio.run(server.update_weights(same_weights)) == 1
    after = [o.token_ids for o in _concurrently(server, requests)]
    assert after != before  # same weights, version 1: other draws
    assert [o.token_ids for o in _concurrently(_server(model_path), requests)] == before


def test_streams_follow_the_trainers_step_so_a_resumed_run_draws_what_the_uninterrupted_one_drew(model_path):
    requests = [(p, SAMPLED) for p in _prompts([5, 8, 3], seed=11)]
    weights = {name: p.detach().clone() for name, p in _server(model_path).model.named_parameters()}
    uninterrupted = _server(model_path)
    drawn = []
    for step in range(3):  # loaded at the start (step 0) and after steps 1 and 2
        asyncio.run(uninterrupted.update_weights(weights, global_steps=step))
        drawn.append([o.token_ids for o in _concurrently(uninterrupted, requests)])
    assert drawn[0] != drawn[1] != drawn[2]
    resumed = _server(model_path)  # a new process loading the step-2 checkpoint: one load, at step 2
    assert asyncio.run(resumed.update_weights(weights, global_steps=2)) == 1
    first_after_resume = [o.token_ids for o in _concurrently(resumed, requests)]
    assert first_after_resume == drawn[2]
    # keyed by the loads since the process started (before the fix), the resumed run's first draws were the
    # uninterrupted run's first (same weights at lr 0): the long runs' control, seed 0, resumed at step 175,
    # evaluated at steps 175 and 200 exactly as at steps 0 and 25 (docs/long-runs.md)
    assert first_after_resume != drawn[0]
    # loaded again at the same step (veRL reloads after a colocated reward model): the prompts' streams go on
    asyncio.run(resumed.update_weights(weights, global_steps=2))
    again = [o.token_ids for o in _concurrently(resumed, requests)]
    assert again != drawn[2]
    assert again == [o.token_ids for o in _concurrently(uninterrupted, requests)]


def test_the_fidelity_sampler_draws_what_the_served_rollout_draws(model_path):
    from transformers import AutoTokenizer

    from maspo_lab.sampler import Sampler

    prompts = _prompts([5, 8], seed=11)
    requests = [(p, SAMPLED) for p in prompts for _ in range(2)]  # two requests per prompt: occurrences 0 and 1
    served = [o.token_ids for o in _one_by_one(_server(model_path), requests)]
    server = _server(model_path)  # its model, outside the server
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    sampler = Sampler(server.model, tokenizer, seed=0, temperature=SAMPLED["temperature"], max_new_tokens=BUDGET)
    assert sampler.sample([p for p, _ in requests], version=0) == served
    assert sampler.sample([p for p, _ in requests], version=1) != served  # the version keys the streams


def _greedy_alone(model, prompt, steps):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=steps)
    return out[0, len(prompt) :].tolist()


def test_each_row_stops_at_its_own_first_stop_id_and_a_row_at_the_budget_has_none(model_path, tmp_path):
    # the tiny model's greedy rows repeat a token, some switching to another one later (seen for these prompts)
    prompts = _prompts([7, 3, 11], seed=1) + _prompts([7], seed=0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    full = [_greedy_alone(model, p, BUDGET) for p in prompts]  # the rows' greedy tokens with nothing stopping them

    def first_token_of_its_own(row, after):
        """First step >= after whose token the row had not produced before and no other row produces."""
        others = {t for r, tokens in enumerate(full) if r != row for t in tokens}
        return next(
            (k for k in range(after, BUDGET) if full[row][k] not in full[row][:k] and full[row][k] not in others),
            None,
        )

    # rows 0 and 1 stop mid-way, row 3 at its first token (a length-1 response), row 2 runs to the budget
    stop_steps = {0: first_token_of_its_own(0, 1), 1: first_token_of_its_own(1, 1), 3: first_token_of_its_own(3, 0)}
    assert None not in stop_steps.values() and stop_steps[3] == 0, f"precondition: no separating stops in {full}"
    assert lt.SPEECH_GENERATION_END_ID not in {t for tokens in full for t in tokens}  # the end tag stops them too
    assert stop_steps[0] != stop_steps[1]
    stops = [full[row][k] for row, k in stop_steps.items()]
    stopping = tmp_path / "model"
    shutil.copytree(model_path, stopping)
    config_file = stopping / "generation_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "eos_token_id": stops}))

    server = _server(stopping)
    assert server.stop_ids == [*stops, lt.SPEECH_GENERATION_END_ID]  # the checkpoint's end ids, then the end tag
    outputs = _concurrently(server, [(p, GREEDY) for p in prompts])
    assert list(server.batch_sizes) == [4]
    for row, k in stop_steps.items():
        assert outputs[row].token_ids == full[row][: k + 1] and outputs[row].stop_reason == "completed", row
    # the row that ran to the budget: all its tokens, no stop id, no padding
    assert outputs[2].token_ids == full[2] and outputs[2].stop_reason is None
    assert not set(outputs[2].token_ids) & {*stops, server.pad_id}
    for prompt, out in zip(prompts, outputs, strict=True):
        assert len(out.log_probs) == len(out.token_ids)
        torch.testing.assert_close(
            torch.tensor(out.log_probs), _recomputed_log_probs(model, prompt, out.token_ids, 1.0), atol=1e-4, rtol=0
        )


def test_requests_with_different_sampling_params_are_batched_apart(model_path):
    server = _server(model_path)
    short = {**GREEDY, "max_tokens": 5}
    penalised = {**GREEDY, "repetition_penalty": 1.3}
    other_greedy = {**GREEDY, "top_p": 0.5, "top_k": 7}  # greedy ignores top_p/top_k: same batch as GREEDY
    kinds = [GREEDY, SAMPLED, other_greedy, short, SAMPLED, penalised, GREEDY, short, penalised]
    requests = [(p, kind) for p, kind in zip(_prompts([6, 9, 2, 12, 5, 8, 3, 10, 4], seed=4), kinds, strict=True)]
    batches = []
    generate_batch = server.generate_batch

    def spy(prompts, key, streams, on_finished=None):
        batches.append(([requests_by_prompt[tuple(p)] for p in prompts], key))
        return generate_batch(prompts, key, streams, on_finished)

    requests_by_prompt = {tuple(p): i for i, (p, _) in enumerate(requests)}
    server.generate_batch = spy
    outputs = _concurrently(server, requests)
    # grouped by the oldest waiting request's parameters, each group in arrival order
    assert [rows for rows, _ in batches] == [[0, 2, 6], [1, 4], [3, 7], [5, 8]]
    assert [key.temperature for _, key in batches] == [0.0, 0.7, 0.0, 0.0]
    assert [key.max_new_tokens for _, key in batches] == [BUDGET, BUDGET, 5, BUDGET]
    assert [key.repetition_penalty for _, key in batches] == [1.0, 1.0, 1.0, 1.3]

    server.generate_batch = generate_batch
    alone = _one_by_one(_server(model_path), requests)  # a fresh server: the sampled prompts' first streams again
    for i, (prompt, kind) in enumerate(requests):
        if kind is SAMPLED:  # log-probs at the request's own temperature
            expected = _recomputed_log_probs(server.model, prompt, outputs[i].token_ids, 0.7)
            torch.testing.assert_close(torch.tensor(outputs[i].log_probs), expected, atol=1e-4, rtol=0)
        assert outputs[i].token_ids == alone[i].token_ids, (i, kind)
    assert [len(outputs[i].token_ids) for i in (3, 7)] == [5, 5]
    # the penalty acted (the plain greedy responses repeat tokens, the penalised ones differ from them)
    plain = _concurrently(server, [(requests[i][0], GREEDY) for i in (5, 8)])
    assert [o.token_ids for o in plain] != [outputs[i].token_ids for i in (5, 8)]


def test_row_repetition_penalty_ignores_left_padding_and_equals_hf_on_unpadded_rows():
    gen = torch.Generator().manual_seed(0)
    vocab, pad = 12, 11
    rows = [[3, 5, 3, 0], [7, 2], [pad, 4, 1]]  # the last row's own first token is the pad id
    width = max(map(len, rows))
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    scores = torch.randn(len(rows), vocab, generator=gen) * 3
    pad_widths = torch.tensor([width - len(r) for r in rows])
    got = RowRepetitionPenalty(1.7, pad_widths)(input_ids, scores.clone())
    hf = RepetitionPenaltyLogitsProcessor(1.7)
    for i, row in enumerate(rows):
        expected = hf(torch.tensor([row]), scores[i : i + 1].clone())[0]
        torch.testing.assert_close(got[i], expected, atol=0, rtol=0)
    # the pad id is untouched in the padded row that does not contain it
    assert got[1, pad] == scores[1, pad]
    assert got[0, 3] != scores[0, 3] and got[1, 3] == scores[1, 3]


def test_a_weight_update_waits_for_the_running_batch(model_path):
    server = _server(model_path)
    requests = [(p, GREEDY) for p in _prompts([5, 8, 3], seed=5)]
    before = _concurrently(server, requests)
    new_weights = {name: p.detach() * 1.5 for name, p in server.model.named_parameters()}

    async def run():
        generating = asyncio.gather(*(server.generate(p, dict(params)) for p, params in requests))
        while len(server.batch_sizes) < 2:  # the batch has started
            await asyncio.sleep(0.001)
        version = await server.update_weights(new_weights)
        return await generating, version

    during, version = asyncio.run(run())
    assert version == 1
    assert [o.token_ids for o in during] == [o.token_ids for o in before]  # the whole batch on the old weights
    after = _concurrently(server, requests)
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    assert all(o.extra_fields["weight_version"] == 1 for o in after)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"temperature": float("nan")}, "'temperature'"),
        ({"temperature": -0.5}, "'temperature'"),
        ({"top_p": 0.0}, "'top_p'"),
        ({"repetition_penalty": float("inf")}, "'repetition_penalty'"),
    ],
)
def test_bad_sampling_params_name_the_key(params, key):
    with pytest.raises(ValueError, match=key):
        sampling_key(params, prompt_len=4, response_length=8, max_model_len=16)


def test_sampling_key_budget_and_greedy_normalisation():
    key = sampling_key({"temperature": 0, "top_p": 0.3, "top_k": 5, "max_tokens": 6}, 4, 8, 16)
    assert key == (0.0, 1.0, 0, 1.0, 6)
    assert sampling_key({"top_k": -1}, prompt_len=13, response_length=8, max_model_len=16).max_new_tokens == 3
    assert sampling_key({}, prompt_len=16, response_length=8, max_model_len=16).max_new_tokens == 1


def test_batching_settings_from_env():
    assert batching_from_env({}) == {}
    env = {"MASPO_VERL_CPU_ROLLOUT_MAX_BATCH": "8", "MASPO_VERL_CPU_ROLLOUT_BATCH_WINDOW_MS": "2.5"}
    assert batching_from_env(env) == {"max_batch_size": 8, "batch_window_ms": 2.5}
    for name, value in [
        ("MASPO_VERL_CPU_ROLLOUT_MAX_BATCH", "0"),
        ("MASPO_VERL_CPU_ROLLOUT_MAX_BATCH", "2.5"),
        ("MASPO_VERL_CPU_ROLLOUT_BATCH_WINDOW_MS", "nan"),
        ("MASPO_VERL_CPU_ROLLOUT_BATCH_WINDOW_MS", "-1"),
    ]:
        with pytest.raises(ValueError, match=name):
            batching_from_env({name: value})


def test_the_server_checks_its_batching_arguments_as_the_environment_is_checked(tmp_path):
    # the check comes before the model is loaded: no model at tmp_path is needed to see it
    with pytest.raises(
        ValueError, match=r"MASPO_VERL_CPU_ROLLOUT_MAX_BATCH \(max_batch_size\) must be an integer >= 1"
    ):
        _server(tmp_path, max_batch_size=0)
    with pytest.raises(ValueError, match=r"MASPO_VERL_CPU_ROLLOUT_BATCH_WINDOW_MS \(batch_window_ms\)"):
        _server(tmp_path, batch_window_ms=float("inf"))


def test_a_failing_batch_fails_its_own_requests_and_the_server_goes_on(model_path):
    server = _server(model_path)
    requests = [(p, GREEDY) for p in _prompts([4, 7], seed=6)]
    generate_batch = server.generate_batch

    def fail_once(prompts, key, streams, on_finished=None):
        server.generate_batch = generate_batch
        raise RuntimeError("out of memory")

    server.generate_batch = fail_once

    async def run():
        return await asyncio.gather(
            *(server.generate(p, dict(params)) for p, params in requests), return_exceptions=True
        )

    failed = asyncio.run(run())
    assert [str(e) for e in failed] == ["out of memory", "out of memory"]
    assert [len(o.token_ids) for o in _concurrently(server, requests)] == [BUDGET, BUDGET]


def test_a_response_that_ends_early_is_returned_while_its_batch_runs_on(model_path):
    server = _server(model_path)
    prompts = _prompts([7, 5, 9], seed=7)
    greedy = _concurrently(_server(model_path), [(p, GREEDY) for p in prompts])
    # a token of the first response that no other response holds, made a stop id: the first response ends there
    first = greedy[0].token_ids
    end = next(
        j + 1
        for j, token in enumerate(first)
        if token not in first[:j] and all(token not in o.token_ids for o in greedy[1:])
    )
    assert end < BUDGET
    server.stop_ids = [first[end - 1]]

    async def run():
        async def one(prompt):
            out = await server.generate(prompt, dict(GREEDY))
            return out, server._lock.locked()  # the batch holds the lock until its last row is done

        return await asyncio.gather(*(one(p) for p in prompts))

    (short, batch_running), *rest = asyncio.run(run())
    assert batch_running and not any(running for _, running in rest)
    assert short.token_ids == first[:end] and short.stop_reason == "completed"
    torch.testing.assert_close(
        torch.tensor(short.log_probs), torch.tensor(greedy[0].log_probs[:end]), atol=1e-5, rtol=0
    )
    assert [o.token_ids for o, _ in rest] == [o.token_ids for o in greedy[1:]]
