"""`maspo_verl.cpu.response_logits`: logits at the response positions give veRL's own log-probs and entropies there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from verl.utils import tensordict_utils as tu
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.padding import no_padding_2_padding

from maspo_verl.cpu import response_logits

VOCAB = 50


def _micro_batch(prompt_lens, response_lens, *, nested_prompts: bool, **flags):
    """A legacy-trainer-shaped no-padding micro-batch: nested input_ids, prompts/responses, flags."""
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, VOCAB, (p + r,), generator=gen) for p, r in zip(prompt_lens, response_lens)]
    input_ids = torch.nested.as_nested_tensor(seqs, layout=torch.jagged)
    if nested_prompts:
        prompts = torch.nested.as_nested_tensor([s[:p] for s, p in zip(seqs, prompt_lens)], layout=torch.jagged)
        responses = torch.nested.as_nested_tensor([s[p:] for s, p in zip(seqs, prompt_lens)], layout=torch.jagged)
        fields = {"input_ids": input_ids, "prompts": prompts, "responses": responses}
    else:  # left-padded prompts, right-padded responses, attention mask over both (the legacy layout)
        pw, rw = max(prompt_lens), max(response_lens)
        prompts = torch.zeros(len(seqs), pw, dtype=torch.long)
        responses = torch.zeros(len(seqs), rw, dtype=torch.long)
        mask = torch.zeros(len(seqs), pw + rw, dtype=torch.long)
        for i, (s, p, r) in enumerate(zip(seqs, prompt_lens, response_lens)):
            prompts[i, pw - p :] = s[:p]
            responses[i, :r] = s[p:]
            mask[i, pw - p : pw + r] = 1
        fields = {"input_ids": input_ids, "prompts": prompts, "responses": responses, "attention_mask": mask}
    data = TensorDict(fields, batch_size=[len(seqs)])
    tu.assign_non_tensor(data, use_remove_padding=False, use_fused_kernels=False, max_response_len=max(response_lens))
    tu.assign_non_tensor(data, **flags)
    return data


@pytest.mark.parametrize("nested_prompts", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_window_matches_verl_full_logits_at_response_positions_float64(nested_prompts, temperature):
    prompt_lens, response_lens = [5, 7, 6, 9], [4, 1, 6, 3]  # ragged prompts and responses, a length-1 response
    batch = _micro_batch(prompt_lens, response_lens, nested_prompts=nested_prompts, calculate_entropy=True)
    seq_lens = [p + r for p, r in zip(prompt_lens, response_lens)]
    length = max(seq_lens)
    logits = torch.randn(len(seq_lens), length, VOCAB, dtype=torch.float64) * 3
    temps = torch.full((len(seq_lens),), temperature, dtype=torch.float64)
    roll = torch.roll(batch["input_ids"].values(), shifts=-1, dims=0)
    engine = SimpleNamespace(engine_config=SimpleNamespace(entropy_checkpointing=False))
    verl_prepare_outputs = getattr(  # veRL's own code, unwrapped where the CPU switch installed the window
        FSDPEngineWithLMHead.prepare_model_outputs, "__wrapped__", FSDPEngineWithLMHead.prepare_model_outputs
    )
    output_args = {"temperature": temps, "input_ids_rmpad_rolled": roll}
    full = verl_prepare_outputs(engine, SimpleNamespace(logits=logits), output_args, batch, None)

    window = response_logits.logits_window(batch)
    assert window == length - (min(prompt_lens) - 1)
    log_probs, entropy = response_logits.window_log_probs(logits[:, -window:], batch["input_ids"], temps, True)

    for name, ours in (("log_probs", log_probs), ("entropy", entropy)):
        expected = no_padding_2_padding(full[name], batch)
        got = no_padding_2_padding(ours, batch)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12, msg=name)
        assert got.shape == (len(seq_lens), max(response_lens))


def test_window_covers_every_response_position_and_skips_the_shared_prompt():
    batch = _micro_batch([10, 12], [3, 2], nested_prompts=True)
    # longest row 14 tokens; the earliest response-predicting position is 10 - 1 = 9: the last 5 positions
    assert response_logits.logits_window(batch) == 14 - 9


@pytest.mark.parametrize(
    "flags",
    [
        {"use_remove_padding": True},
        {"use_fused_kernels": True},
        {"distillation_use_topk": True},
        {"calculate_sum_pi_squared": True},
    ],
)
def test_other_engine_paths_are_left_to_verl(flags):
    batch = _micro_batch([4, 5], [2, 3], nested_prompts=True, **flags)
    assert response_logits.logits_window(batch) is None


def test_gradient_reaches_only_the_window():
    batch = _micro_batch([6, 4], [2, 3], nested_prompts=True)
    window = response_logits.logits_window(batch)
    logits = torch.randn(2, window, VOCAB, dtype=torch.float64, requires_grad=True)
    log_probs, _ = response_logits.window_log_probs(logits, batch["input_ids"], torch.ones(2), False)
    no_padding_2_padding(log_probs, batch).sum().backward()
    # row 0 (prompt 6) does not use window position 0 (absolute position 3 < 6 - 1)
    assert logits.grad[0, 0].abs().sum() == 0
    assert logits.grad[1, 0].abs().sum() > 0


def test_inputs_wrapper_asks_for_the_window_for_text_only_inputs():
    batch = _micro_batch([6, 4], [2, 3], nested_prompts=True)
    text_only = ({"input_ids": 0, "attention_mask": 0, "position_ids": 0}, {})
    with_images = ({"input_ids": 0, "attention_mask": 0, "position_ids": 0, "pixel_values": 0}, {})
    for inputs, expected in ((text_only, 8 - (4 - 1)), (with_images, None)):
        wrapped = response_logits.wrap_prepare_model_inputs(lambda self, mb, inputs=inputs: (dict(inputs[0]), {}))
        model_inputs, output_args = wrapped(None, batch)
        assert model_inputs.get("logits_to_keep") == expected
        assert output_args.get(response_logits.WINDOW_KEY) == expected
