"""Policy gradients of a scored batch, as veRL's actor computes them: the batch with GRPO advantages (`grpo_batch`),
log-probs recomputed by a forward pass, veRL's registered policy losses (`policy_loss`), their gradients with respect
to the parameters (`parameter_gradients`: one backward per micro-batch, one ``autograd.grad`` per loss), the
on-policy surrogate, a GRPO update, and the cosine that compares two gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from maspo_lab.analysis.fidelity_scoring import Prompt, ScoreMeter


@dataclass
class Batch:
    """Responses to prompts, right-padded ``(N, T)``, prompt-major (the ``G`` responses of a prompt adjacent)."""

    prompt_ids: list[list[int]]
    response_ids: torch.Tensor
    mask: torch.Tensor
    scores: torch.Tensor
    advantages: torch.Tensor
    old_log_prob: torch.Tensor | None = None

    def rows(self, index: slice) -> Batch:
        return Batch(
            self.prompt_ids[index],
            self.response_ids[index],
            self.mask[index],
            self.scores[index],
            self.advantages[index],
            None if self.old_log_prob is None else self.old_log_prob[index],
        )


def grpo_batch(prompts: list[Prompt], responses: list[list[int]], group: int, scorer, device, what: str = "") -> Batch:
    """Score responses with ``scorer`` (a `Scorer`'s ``score``, or a `ScoreMeter`; ``what`` names the batch in its
    progress) and take GRPO advantages with veRL's ``compute_grpo_outcome_advantage``; ``responses[i]`` answers
    ``prompts[i // group]``."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    width = max(1, max(len(r) for r in responses))
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), width)
    rewards = torch.zeros(len(responses), width)
    answered = [prompts[i // group] for i in range(len(responses))]
    scores = scorer(answered, responses, what) if isinstance(scorer, ScoreMeter) else scorer.score(answered, responses)
    for i, (response, score) in enumerate(zip(responses, scores, strict=True)):
        ids[i, : len(response)] = torch.tensor(response, dtype=torch.long)
        mask[i, : len(response)] = 1
        rewards[i, max(len(response), 1) - 1] = score
    index = np.array([i // group for i in range(len(responses))])
    advantages, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    return Batch(
        [prompts[i // group].ids for i in range(len(responses))],
        ids.to(device),
        mask.to(device),
        torch.tensor(scores),
        advantages.to(device),
    )


def response_hidden(model, batch: Batch, pad_id: int) -> torch.Tensor:
    """The final hidden states at the positions that predict response tokens, ``(N, T, d)``, as veRL's actor runs
    the model: prompts left-padded, responses right-padded, positions from the attention mask."""
    rows, width = batch.response_ids.shape
    prompt_width = max(len(p) for p in batch.prompt_ids)
    device = batch.response_ids.device
    ids = torch.full((rows, prompt_width + width), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros_like(ids)
    for i, prompt in enumerate(batch.prompt_ids):
        ids[i, prompt_width - len(prompt) : prompt_width] = torch.tensor(prompt, device=device)
        attention[i, prompt_width - len(prompt) : prompt_width] = 1
    ids[:, prompt_width:] = torch.where(batch.mask.bool(), batch.response_ids, pad_id)
    attention[:, prompt_width:] = batch.mask.long()
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attention, position_ids=positions).last_hidden_state
    return hidden[:, prompt_width - 1 : prompt_width + width - 1]


def response_log_probs(model, batch: Batch, temperature: float, pad_id: int) -> torch.Tensor:
    """``log softmax(z_t / T)[y_t]`` at every response position, ``(N, T)`` (0 on padding), logits at the response
    positions only (`response_hidden` through the LM head)."""
    logits = model.get_output_embeddings()(response_hidden(model, batch, pad_id))
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return log_probs.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) * batch.mask


def policy_loss(config, batch: Batch, log_prob: torch.Tensor):
    """veRL's registered policy loss that the ``ActorConfig`` ``config`` selects (``policy_loss.loss_mode``), on
    ``batch`` (token-mean), response ids visible to MASPO."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    import maspo_verl.loss  # noqa: F401 - registers loss_mode=maspo
    from maspo_verl.loss_inputs import provide_loss_inputs

    with provide_loss_inputs(response_ids=batch.response_ids):
        return get_policy_loss_fn(config.policy_loss.loss_mode)(
            old_log_prob=batch.old_log_prob.to(log_prob.dtype),
            log_prob=log_prob,
            advantages=batch.advantages.to(log_prob.dtype),
            response_mask=batch.mask,
            loss_agg_mode="token-mean",
            config=config,
            rollout_is_weights=None,
        )


def log_prob_gradient(loss_fn: Callable[[torch.Tensor], torch.Tensor], log_prob: torch.Tensor) -> torch.Tensor:
    """d loss / d log_prob, ``(N, T)``: what the backward pass carries into the model."""
    leaf = log_prob.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss_fn(leaf), leaf)
    return grad


def estimator_upstreams(estimators: Sequence, configs: dict, batch: Batch, log_prob: torch.Tensor):
    """Per estimator (`maspo_lab.analysis.fidelity.Estimator`; ``configs[(name, clipped)]`` its actor config),
    clip on then off: its key ``(name, clipped)``, d loss / d log pi_theta ``(N, T)`` and its clip
    fraction (response tokens whose gradient the clip zeroes where the unclipped loss's is not zero)."""
    keys, upstream, clipfracs = [], [], []
    for estimator in estimators:
        grads = {
            clipped: log_prob_gradient(
                lambda lp, c=configs[(estimator.name, clipped)]: policy_loss(c, batch, lp)[0], log_prob
            )
            for clipped in (True, False)
        }
        for clipped in (True, False):
            zeroed = (grads[clipped] == 0) & (grads[False] != 0) & batch.mask.bool()
            keys.append((estimator.name, clipped))
            upstream.append(grads[clipped])
            clipfracs.append(float(zeroed.sum() / batch.mask.sum()))
    return keys, upstream, clipfracs


def gradient_parameters(model, vocabulary: bool) -> list[torch.nn.Parameter]:
    """The parameters theta of the measured gradient: every trainable one, or (``vocabulary=False``) all but the
    LM head's and the input embedding's (one tied matrix in Llasa-shaped models)."""
    vocab = {id(model.get_output_embeddings().weight), id(model.get_input_embeddings().weight)}
    return [p for p in model.parameters() if p.requires_grad and (vocabulary or id(p) not in vocab)]


def parameter_gradients(
    model,
    batch: Batch,
    upstream: list[torch.Tensor],
    temperature: float,
    pad_id: int,
    micro_batch: int,
    vocabulary: bool = False,
) -> list[torch.Tensor]:
    """For each ``(N, T)`` upstream gradient ``g`` (d loss / d log pi_theta), the parameter gradient ``J^T g``
    flattened over `gradient_parameters`: one forward per micro-batch, one backward per ``g``.

    Without the vocabulary matrix the backward pass starts at the final hidden states ``h_t``: with ``W`` the LM
    head and ``p_t = softmax(W h_t / T)``, ``d log pi(y_t) / d h_t = u_t = (W[y_t] - p_t W) / T`` is the same for
    every ``g``, so ``J^T g`` is the gradient of ``sum_t g_t <sg[u_t], h_t>``: the vocabulary-wide product is
    computed once per micro-batch instead of once per ``g`` (exact, not an approximation)."""
    params = gradient_parameters(model, vocabulary)
    totals = [torch.zeros(sum(p.numel() for p in params), dtype=torch.float64) for _ in upstream]
    rows = batch.response_ids.shape[0]
    for start in range(0, rows, micro_batch):
        part = batch.rows(slice(start, start + micro_batch))
        if vocabulary:
            outputs = response_log_probs(model, part, temperature, pad_id)
            directions = None
        else:
            outputs = response_hidden(model, part, pad_id)
            with torch.no_grad():
                head = model.get_output_embeddings().weight
                probs = torch.softmax(outputs @ head.T / temperature, dim=-1)
                directions = (head[part.response_ids] - probs @ head) / temperature
        for i, g in enumerate(upstream):
            g_part = g[start : start + micro_batch].to(outputs.dtype)
            target = outputs if directions is None else (outputs * directions * g_part.unsqueeze(-1)).sum()
            grads = torch.autograd.grad(
                target,
                params,
                grad_outputs=g_part if directions is None else None,
                retain_graph=i < len(upstream) - 1,
                allow_unused=True,
            )
            totals[i] += torch.cat(
                [
                    (gr if gr is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64).cpu()
                    for gr, p in zip(grads, params)
                ]
            )
    return totals


def onpolicy_upstream(batch: Batch) -> torch.Tensor:
    """d/d log pi of the on-policy surrogate ``-sum_t A_t log pi(y_t) / N_tokens`` (token-mean, every ratio 1)."""
    return -batch.advantages * batch.mask / batch.mask.sum().clamp(min=1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else float("nan")


def noise_ceiling(half_split_cosine: float) -> float:
    """Spearman-Brown: the cosine of a reference made of two halves (cosine ``c`` to each other) with the truth,
    ``sqrt(2c / (1 + c))``, when each half is the truth plus independent noise; NaN for ``c <= 0``."""
    c = half_split_cosine
    return math.sqrt(2 * c / (1 + c)) if c > 0 else float("nan")


def grpo_update(model, optimizer, batch: Batch, config, temperature: float, pad_id: int, clip_grad: float) -> float:
    """One optimizer update of the loss ``config`` selects (GRPO's: veRL's ``vanilla``) on a mini-batch; returns its
    ``ppo_kl``."""
    log_prob = response_log_probs(model, batch, temperature, pad_id)
    loss, metrics = policy_loss(config, batch, log_prob)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    optimizer.step()
    return float(metrics["actor/ppo_kl"])


def pad_cat(tensors: list[torch.Tensor], value=0) -> torch.Tensor:
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])


def grouped_batch(chosen, picked, per_prompt, group, scorer, device, what: str = "") -> Batch:
    """``per_prompt`` responses to each of ``chosen`` (prompt-major) as GRPO groups of ``group``."""
    repeated = [chosen[i // per_prompt] for i in range(0, len(picked), group)]
    return grpo_batch(repeated, picked, group, scorer, device, what)
