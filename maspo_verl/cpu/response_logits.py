"""Logits at the response positions only: the actor's LM head skips the prompt, the largest CPU cost of a step.

veRL's FSDP engine (``use_remove_padding=False``, the CPU setting) runs the model on the right-padded
``(B, L)`` micro-batch and turns the ``(B, L, V)`` logits into log-probs and entropies at *every* position;
veRL then keeps only the positions that predict a response token, ``[prompt_len_i - 1, seq_len_i - 1)`` of row
``i`` (``verl.workers.utils.padding.no_padding_2_padding``). With Llasa's 193,800-id vocabulary and a tiny model,
the ``hidden @ W_vocab^T`` product and the vocabulary-wide softmaxes are nearly all of a CPU step, and a Llasa
prompt is longer than a short utterance.

With this installed, the engine asks the model for the last ``K = L - (min_i prompt_len_i - 1)`` positions only
(HF ``logits_to_keep=K``: every row's response positions lie in that window of the right-padded batch) and
computes log-probs and entropies there; positions before the window get 0, and veRL discards them. The values at
the positions veRL keeps are the same computation as veRL's (``log_softmax(z / T)[y]`` and the entropy of
``softmax(z / T)``), so the loss, its gradients and every metric are unchanged.

`wrap_prepare_model_inputs` and `wrap_prepare_model_outputs` are installed on veRL's ``FSDPEngineWithLMHead`` through
`maspo_verl.verl_patches.CPU_PATCHES`. It applies to the plain path only (no remove-padding, no fused kernels,
no-padding batch layout, no distillation, no sum of squared probabilities, text-only model inputs); anything else goes
through veRL's own code unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

WINDOW_KEY = "maspo_cpu_logits_window"
"""``output_args`` key holding ``K``, the number of trailing positions the model returned logits for."""


def _flag(micro_batch: Any, key: str, default: Any) -> Any:
    from verl.utils import tensordict_utils as tu

    return tu.get_non_tensor_data(data=micro_batch, key=key, default=default)


def prompt_lengths(micro_batch: Any) -> torch.Tensor | None:
    """Prompt length of each row, read as ``no_padding_2_padding`` reads it; ``None`` when the batch lacks them."""
    keys = set(micro_batch.keys())
    if "prompts" not in keys:
        return None
    prompts = micro_batch["prompts"]
    if prompts.is_nested:
        return prompts.offsets().diff()
    if "attention_mask" not in keys:
        return None
    return micro_batch["attention_mask"][:, : prompts.shape[1]].sum(dim=1)


def logits_window(micro_batch: Any) -> int | None:
    """``K``: trailing positions of the padded batch that hold every response-predicting position; ``None`` when
    the micro-batch takes another path of veRL's engine (see the module docstring)."""
    from verl.utils.dataset.dataset_utils import DatasetPadMode

    plain = (
        not _flag(micro_batch, "use_remove_padding", True)
        and not _flag(micro_batch, "use_fused_kernels", False)
        and _flag(micro_batch, "pad_mode", DatasetPadMode.NO_PADDING) == DatasetPadMode.NO_PADDING
        and not _flag(micro_batch, "distillation_use_topk", False)
        and not _flag(micro_batch, "distillation_only", False)
        and not _flag(micro_batch, "calculate_sum_pi_squared", False)
    )
    if not plain:
        return None
    input_ids = micro_batch["input_ids"]
    if not input_ids.is_nested or input_ids.dim() != 2:
        return None
    prompt_lens = prompt_lengths(micro_batch)
    if prompt_lens is None or prompt_lens.numel() == 0 or int(prompt_lens.min()) < 1:
        return None
    max_seq_len = int(input_ids.offsets().diff().max())
    return max_seq_len - (int(prompt_lens.min()) - 1)


def window_log_probs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: torch.Tensor,
    calculate_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of a nested ``(B, j)`` batch from logits of its last ``K`` padded positions.

    ``logits`` is ``(B, K, V)`` for positions ``L-K .. L-1`` of the right-padded batch (``L`` its longest row);
    position ``t`` of row ``i`` scores ``y = input_ids[i, t + 1]`` with ``log softmax(z_t / T_i)[y]``. Positions
    before the window and each row's last position (no next token) get 0. Returns nested tensors shaped as
    ``input_ids``.
    """
    from verl.utils import torch_functional as verl_F

    offsets = input_ids.offsets()
    seq_lens = offsets.diff()
    batch, window, vocab = logits.shape
    length = int(seq_lens.max())
    padded = torch.nested.to_padded_tensor(input_ids, padding=0, output_size=(batch, length))
    labels = torch.nn.functional.pad(padded[:, 1:], (0, 1))[:, length - window :]
    logits = logits / temperature.to(logits.dtype).view(batch, 1, 1)
    log_probs = verl_F.logprobs_from_logits(logits.reshape(-1, vocab), labels.reshape(-1)).view(batch, window)
    entropy = verl_F.entropy_from_logits(logits) if calculate_entropy else None

    valid = torch.arange(length, device=seq_lens.device)[None, :] < seq_lens[:, None]

    def to_nested(window_values: torch.Tensor) -> torch.Tensor:
        before = window_values.new_zeros(batch, length - window)
        full = torch.cat([before, window_values], dim=1)
        return torch.nested.nested_tensor_from_jagged(full[valid], offsets)

    return to_nested(log_probs), (to_nested(entropy) if entropy is not None else None)


TEXT_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids"})
"""Model inputs of a text-only micro-batch (a multi-modal one adds its own and is left to veRL)."""


def wrap_prepare_model_inputs(prepare_model_inputs):
    @functools.wraps(prepare_model_inputs)
    def prepare_response_logits_inputs(self, micro_batch):
        model_inputs, output_args = prepare_model_inputs(self, micro_batch)
        window = logits_window(micro_batch) if set(model_inputs) <= TEXT_INPUTS else None
        if window is not None:
            model_inputs["logits_to_keep"] = window
            output_args[WINDOW_KEY] = window
        return model_inputs, output_args

    return prepare_response_logits_inputs


def wrap_prepare_model_outputs(prepare_model_outputs):
    @functools.wraps(prepare_model_outputs)
    def prepare_response_logits_outputs(self, output, output_args, micro_batch, logits_processor_func):
        window = output_args.get(WINDOW_KEY)
        if window is None:
            return prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func)
        logits = output.logits
        if logits.shape[1] != window:
            raise RuntimeError(f"asked the model for logits at {window} positions, got {tuple(logits.shape)}")
        calculate_entropy = _flag(micro_batch, "calculate_entropy", False)
        log_probs, entropy = window_log_probs(
            logits, micro_batch["input_ids"], output_args["temperature"], calculate_entropy
        )
        model_output = {"log_probs": log_probs}
        if calculate_entropy:
            model_output["entropy"] = entropy
        return model_output

    return prepare_response_logits_outputs
